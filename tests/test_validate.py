"""Validation at export (pipeline/validate.py): near-ties tell rounding from errors, every differing step is
reported with PyTorch's margin, and the quality figures mean something at any weight format."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import optimum_shared_graph as osg
from optimum_shared_graph import ExportValidationError
from optimum_shared_graph.pipeline.decompose import capture_generation
from optimum_shared_graph.pipeline.validate import validate_graph


@pytest.fixture(scope="module")
def graph_and_capture(tiny_model, tmp_path_factory):
    """The fp32 shared graph of a tiny llama and the PyTorch calls of its generate()."""
    import openvino as ov
    import torch
    from transformers import AutoModelForCausalLM

    model = tiny_model("llama")
    out = tmp_path_factory.mktemp("validate") / "ov"
    osg.export(str(model), out, quiet=True)
    pt = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    ids = torch.arange(5, 17)[None]
    capture = capture_generation(pt, ids, torch.ones_like(ids), 16)
    return ov.Core().read_model(out / "openvino_model.xml"), capture


def _with_last_pick_flipped(capture, margin: float):
    """The capture as if PyTorch had picked its runner-up at the last step, ahead by `margin`."""
    doctored = copy.deepcopy(capture)
    last = doctored.calls[-1]
    logits = last.last_logits.copy()
    top, runner_up = np.argsort(logits[0])[-1], np.argsort(logits[0])[-2]
    logits[0, runner_up] = logits[0, top] + margin
    last.last_logits = logits
    doctored.tokens[0, -1] = runner_up
    return doctored, int(top), int(runner_up)


def test_identical_graph_passes_with_a_quality_figure(graph_and_capture):
    graph, capture = graph_and_capture
    report = validate_graph(graph, capture, "fp32")
    assert report["status"] == "passed" and report["greedy_match"] and report["differing_steps"] == []
    assert report["top1_agreement"] == 1.0 and 0 <= report["kl_prefill"] < 1e-6 and 0 <= report["kl_decode"] < 1e-6


def test_a_flip_at_a_near_tie_passes_and_is_reported(graph_and_capture):
    graph, capture = graph_and_capture
    doctored, ours, theirs = _with_last_pick_flipped(capture, margin=0.01)  # fp16 tolerance: 3e-2 x max|logit|
    report = validate_graph(graph, doctored, "fp16")
    assert report["status"] == "passed" and not report["greedy_match"]
    (step,) = report["differing_steps"]
    assert step == {"step": 15, "pytorch": theirs, "openvino": ours, "pytorch_margin": pytest.approx(0.01, rel=1e-3),
                    "near_tie": True}
    assert report["top1_agreement"] == pytest.approx(15 / 16)


def test_a_flip_with_a_clear_margin_fails_and_states_the_margin(graph_and_capture):
    graph, capture = graph_and_capture
    doctored, _, _ = _with_last_pick_flipped(capture, margin=1.0)  # far above the fp32 tolerance
    with pytest.raises(ExportValidationError, match=r"greedy token 15 differs .* top-2 margin is 1 , above the "
                                                    r"tolerance|greedy token 15 differs .* top-2 margin is 1, above"):
        validate_graph(graph, doctored, "fp32")


def test_quantized_weights_record_top1_agreement_and_kl(graph_and_capture):
    graph, capture = graph_and_capture
    doctored, _, _ = _with_last_pick_flipped(capture, margin=1.0)
    report = validate_graph(graph, doctored, "int8")  # recorded, not enforced
    assert report["status"] == "recorded" and report["top1_agreement"] == pytest.approx(15 / 16)
    assert report["kl_decode"] > 0 and report["tolerance"] is None


def test_fp16_export_of_the_quickstart_model_passes(tiny_model, tmp_path):
    """The README's `export(..., weight_format="fp16")` on the quickstart's model: a near-tie at step 4 (PyTorch's
    own top-2 margin 0.002) failed it; the flip is now reported as a near-tie."""
    model = tiny_model("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=4)
    manifest = osg.export(str(model), tmp_path / "ov", weight_format="fp16", quiet=True)
    v = manifest.validation
    assert v["status"] == "passed", v
    assert all(d["near_tie"] and d["pytorch_margin"] <= v["tolerance"] for d in v["differing_steps"])


def test_a_raw_argmax_at_eos_inside_the_captured_tokens_passes(tmp_path):
    """generate() suppresses EOS until min_new_tokens is reached, so its pick differs from the raw argmax where
    that is EOS: the graph's argmax is compared with PyTorch's raw argmax, and the feed is generate()'s pick."""
    import json

    from optimum_shared_graph.pipeline.decompose import sample_inputs
    from optimum_shared_graph.testing import build_tiny_model

    model = tmp_path / "eos-llama"
    pt = build_tiny_model("llama", model)
    ids, mask = sample_inputs(str(model), pt, osg.ExportOptions())  # the prompt the export validates on
    eos = int(capture_generation(pt, ids, mask, 6).tokens[0, 4])  # the raw argmax at step 4
    for name in ("config.json", "generation_config.json"):
        config = json.loads((model / name).read_text())
        config["eos_token_id"] = eos
        (model / name).write_text(json.dumps(config))
    pt.generation_config.eos_token_id = eos
    capture = capture_generation(pt, ids, mask, 16)
    raw = np.stack([call.last_logits.argmax(-1) for call in capture.calls], axis=1)
    assert raw[0, 4] == eos and capture.tokens[0, 4] != eos  # the case: generate()'s pick is not the raw argmax

    manifest = osg.export(str(model), tmp_path / "ov", quiet=True)
    v = manifest.validation
    assert v["status"] == "passed" and v["greedy_match"] and v["differing_steps"] == [], v


def test_validation_in_parts_passes_and_is_recorded(tiny_model, tmp_path, monkeypatch):
    """Where the memory available cannot hold the whole compiled graph, it is validated in parts, with the
    same verdict and figures, and the manifest says so; the capture then records the minimum 4 tokens (each call
    rereads the weights), unless the options ask for more."""
    from optimum_shared_graph.pipeline.memory import MEMORY_ENV, RESERVE

    model = tiny_model("llama")
    whole = osg.export(str(model), tmp_path / "whole", quiet=True).validation
    assert whole["run"] == {"mode": "whole", "parts": 1} and whole["greedy_tokens"] == 16
    monkeypatch.setenv(MEMORY_ENV, str(RESERVE + 300_000))
    parts = osg.export(str(model), tmp_path / "parts", quiet=True).validation
    assert parts["status"] == "passed" and parts["run"]["mode"] == "parts" and parts["run"]["parts"] >= 2
    assert parts["greedy_tokens"] == 4 and parts["decode_steps"] == 3
    assert parts["max_abs_diff_decode"] == pytest.approx(whole["max_abs_diff_decode"], abs=1e-5)
    more = osg.export(str(model), tmp_path / "more", quiet=True, validation_new_tokens=16).validation
    assert more["run"]["mode"] == "parts" and more["greedy_tokens"] == 16
    assert more["max_abs_diff_decode"] == pytest.approx(whole["max_abs_diff_decode"], abs=1e-5)
