"""Static artifacts (`--shape-mode static`) quantized with calibration on the calls their runtime makes.

Each calibration sample is a call `StaticSession` makes on the stateless static graph: C prompt
tokens per prefill call, one real token plus C - 1 masked slots per decode call, the fixed-capacity
KV buffers as inputs. Real OpenVINO, NNCF and optimum-intel throughout.
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

from conftest import HELD_OUT, EXACT, error_line, run_cli, tree_snapshot, unloadable_copy, widest_int8_weight

import optimum_shared_graph as osg
from optimum_shared_graph import InvalidOptionsError, read_manifest
from optimum_shared_graph.testing import CORPUS

CAPACITY = 48
DECODE_STEPS = 3
NEW_TOKENS = 10
LONG_TEXT = " ".join(CORPUS[:4])  # longer than CAPACITY - DECODE_STEPS tokens: truncated for calibration
CALIBRATION_TEXTS = [line for text in CORPUS for line in text.splitlines() if line.strip()] + [LONG_TEXT]


@pytest.fixture(scope="module")
def dataset_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "calibration.txt"
    path.write_text("\n".join(CALIBRATION_TEXTS) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def reference(quantizable_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(quantizable_model).eval(), AutoTokenizer.from_pretrained(quantizable_model)


def _expected_calls(tokenizer, query_len: int, capacity: int = CAPACITY, steps: int = DECODE_STEPS) -> dict[str, int]:
    """Prefill calls: each text's tokens (its first `capacity - steps`) in chunks of C; decode: `steps` per text."""
    lengths = [min(len(tokenizer(text)["input_ids"]), capacity - steps) for text in CALIBRATION_TEXTS]
    return {"prefill": sum(math.ceil(n / query_len) for n in lengths), "decode": steps * len(lengths)}


def _agreement(out, reference) -> dict[str, float]:
    """Greedy tokens through `optimum_shared_graph.runtime()` against PyTorch's, over the held-out texts.

    `free_running`: position-wise equality of `generate()`'s greedy tokens and PyTorch's.
    `teacher_forced`: the artifact's top-1 pick at every call of the runtime's static session
    (prefill calls, then decode calls fed PyTorch's own tokens) equals PyTorch's.
    """
    import torch

    pt, tok = reference
    model = osg.runtime(out, ov_config=EXACT)  # f32 inference: the error is the quantization's alone
    free, forced = [], []
    for text in HELD_OUT:
        ids = tok(text, return_tensors="pt")["input_ids"]
        kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                      do_sample=False, pad_token_id=0)
        with torch.no_grad():
            ref = pt.generate(ids, **kwargs)[0, ids.shape[1]:].tolist()
        ours = model.generate(ids, **kwargs)[0, ids.shape[1]:].tolist()
        free += [a == b for a, b in zip(ours, ref)]
        session = model.static_session
        session.reset()
        picks = [int(np.argmax(session.step(ids.numpy())[0, -1]))]
        for token in ref[:-1]:
            picks.append(int(np.argmax(session.step(np.array([[token]]))[0, -1])))
        forced += [a == b for a, b in zip(picks, ref)]
    return {"free_running": float(np.mean(free)), "teacher_forced": float(np.mean(forced))}


def _api_config(mode: str):
    from optimum.intel.openvino.configuration import OVQuantizationConfig, OVWeightQuantizationConfig

    if mode == "int8":
        return OVQuantizationConfig(dataset=list(CALIBRATION_TEXTS), num_samples=len(CALIBRATION_TEXTS))
    return OVWeightQuantizationConfig(bits=4, group_size=64, ratio=1.0, quant_method="awq",
                                      dataset=list(CALIBRATION_TEXTS), num_samples=len(CALIBRATION_TEXTS))


def _check_quantized(out, mode: str, query_len: int, stateful: bool, reference, floor: float):
    import openvino as ov

    manifest = read_manifest(out)
    assert manifest.shape_mode == "static" and manifest.stateful == stateful
    assert manifest.static == {"batch_size": 1, "query_len": query_len, "cache_len": CAPACITY}
    quant = manifest.quantization
    assert quant["calibration_samples"] == _expected_calls(reference[1], query_len)
    assert quant["calibration_decode_steps"] == DECODE_STEPS and quant["calibration_graph"] == "stateless"
    graph = ov.Core().read_model(out / "openvino_static_model.xml")
    assert not graph.is_dynamic()
    names = [p.get_any_name() for p in graph.inputs]
    assert ("beam_idx" in names) == stateful and any(n.startswith("past_key_values") for n in names) != stateful
    ops = graph.get_ops()
    if mode == "int8":
        assert any(op.get_type_name() == "FakeQuantize" for op in ops)
    else:
        assert any(op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.u4 for op in ops)
    assert graph.has_rt_info(["optimum", "transformers_version"])  # optimum-intel's rt_info, as the static path keeps it
    agreement = _agreement(out, reference)
    print(f"\nstatic C={query_len} {mode} {'stateful' if stateful else 'stateless'}: token agreement with PyTorch "
          f"over {len(HELD_OUT)} held-out texts {agreement}")
    assert agreement["teacher_forced"] >= floor, agreement
    return manifest


# (C, mode, stateful, teacher-forced floor). Chance is 1/512; see the measured values in the commit/report.
API_CASES = [pytest.param(1, "int8", False, 0.6, marks=pytest.mark.slow),  # 14 to 17 s; int8 stays in the CLI test
             (1, "int4-awq", True, 0.4),
             pytest.param(8, "int4-awq", False, 0.4, marks=pytest.mark.slow)]  # 10 s; C>1 stays in the CLI test (C=4)


@pytest.mark.parametrize("query_len,mode,stateful,floor", API_CASES)
def test_static_quantization_calibrated_on_static_calls(query_len, mode, stateful, floor, quantizable_model, reference,
                                                         tmp_path):
    out = tmp_path / "out"
    osg.export(str(quantizable_model), out, shape_mode="static", max_cache_len=CAPACITY, static_query_len=query_len,
               stateful=stateful, quantization_config=_api_config(mode), calibration_decode_steps=DECODE_STEPS,
               quiet=True)
    manifest = _check_quantized(out, mode, query_len, stateful, reference, floor)
    assert manifest.quantization["quant_mode"] == ("int8" if mode == "int8" else None)


def test_cli_static_int8_with_a_text_file(quantizable_model, dataset_file, reference, tmp_path):
    out = tmp_path / "static-int8-c4"
    proc = run_cli("export", "openvino", "-m", str(quantizable_model), "--task", "text-generation-shared",
                   "--shape-mode", "static", "--max-cache-len", str(CAPACITY), "--static-query-len", "4",
                   "--quant-mode", "int8", "--dataset", str(dataset_file),
                   "--calibration-decode-steps", str(DECODE_STEPS), str(out), check=True)
    assert "static" in proc.stderr
    # the calibration graph is stateless on purpose: optimum-intel's "please reexport" warning is not shown
    assert "does not contain state" not in proc.stderr
    manifest = _check_quantized(out, "int8", 4, True, reference, 0.6)
    assert manifest.quantization["quant_mode"] == "int8" and manifest.quantization["dataset"] == str(dataset_file)
    assert 0 < widest_int8_weight(out / "openvino_static_model.xml") <= 64  # 7-bit weights: no CPU's int8 sums saturate
    assert manifest.quantization["overflow_fix"] == "enable"


def test_samples_are_the_calls_static_session_makes(quantizable_model):
    """Every sample, KV buffers included, is bit-for-bit the feed `StaticSession` gives the graph: C = 4,
    a prompt truncated to the capacity minus the decode steps, and decode calls at the capacity's end,
    where the window slides back."""
    import openvino as ov
    import torch
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.quantization.static import StaticCalibrationSamples
    from optimum_shared_graph.graph.static import StaticShapes
    from optimum_shared_graph.pipeline.static import export_static_graph
    from optimum_shared_graph.runtimes.static_session import StaticSession

    capacity, C, steps = 16, 4, 3
    pt = AutoModelForCausalLM.from_pretrained(quantizable_model, dtype=torch.float32).eval()
    graph = export_static_graph(pt, StaticShapes(1, C, capacity), logits="last", stateful=False)
    prompts = [{"input_ids": np.arange(10, 15)[None], "attention_mask": np.ones((1, 5), np.int64)},
               {"input_ids": np.arange(20, 40)[None], "attention_mask": np.ones((1, 20), np.int64)}]
    samples = StaticCalibrationSamples(graph, prompts, steps, pad_token_id=0)
    # 5 tokens: 2 calls; 20 tokens truncated to 13: 4 calls; 3 decode calls each
    assert (samples.prefill_count, samples.decode_count, len(samples), samples.truncated) == (6, 6, 12, 1)

    class Keeping:  # the full feed of every call, copied
        def __init__(self, request):
            self.request, self.feeds = request, []

        def infer(self, feed):
            self.feeds.append({k: np.array(v, copy=True) for k, v in feed.items()})
            self.request.infer(feed)

        def get_tensor(self, name):
            return self.request.get_tensor(name)

    compiled = ov.Core().compile_model(graph, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    keeping = Keeping(compiled.create_infer_request())
    session = StaticSession(compiled, 0, request=keeping)
    for prompt in prompts:
        session.reset()
        ids = prompt["input_ids"][:, : capacity - steps]
        token = int(np.argmax(session.step(ids)[0, -1]))
        for _ in range(steps):
            token = int(np.argmax(session.step(np.array([[token]]))[0, -1]))
    assert len(keeping.feeds) == len(samples)
    for key, expected in zip(samples, keeping.feeds):
        feed = samples.feed(key)
        assert sorted(feed) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(feed[name], value, err_msg=f"{key} {name}")
    last = keeping.feeds[-1]  # the last decode call: window slid back to cap - C, one real new slot at its end
    assert last["cache_position"].tolist() == list(range(capacity - C, capacity)) and last["attention_mask"].sum() == capacity
    first_decode = keeping.feeds[2]  # text 0: 5 prompt tokens in slots 0..4, the first decode writes slot 5
    assert first_decode["cache_position"].tolist() == [5, 6, 7, 8]
    assert first_decode["attention_mask"][0, :9].tolist() == [1] * 6 + [0] * 3  # one real token, C - 1 masked slots


# ------------------------------------------------------------------------------ invalid combinations


def test_decode_steps_filling_the_capacity_are_refused_before_any_export_work(quantizable_model, tmp_path):
    model = unloadable_copy(quantizable_model, tmp_path / "unloadable")  # loading it would fail otherwise
    with pytest.raises(InvalidOptionsError, match=r"--calibration-decode-steps 16 leaves no room .* use "
                                                  r"--calibration-decode-steps 15 or less, or raise --max-cache-len"):
        osg.export(str(model), tmp_path / "x", shape_mode="static", max_cache_len=16,
                   quantization_config=_api_config("int8"), calibration_decode_steps=16)
    assert not (tmp_path / "x").exists()


def test_data_free_quantization_config_is_refused_before_any_export_work(quantizable_model, tmp_path):
    from optimum.intel.openvino.configuration import OVWeightQuantizationConfig

    model = unloadable_copy(quantizable_model, tmp_path / "unloadable")  # loading it would fail otherwise
    with pytest.raises(InvalidOptionsError, match="without calibration data is not applied to static graphs"):
        osg.export(str(model), tmp_path / "x", shape_mode="static", max_cache_len=16,
                   quantization_config=OVWeightQuantizationConfig(bits=4, group_size=64))
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("flags,expected", [
    (["--quant-mode", "int8", "--dataset", "{data}", "--max-cache-len", "16", "--calibration-decode-steps", "16"],
     "error: --calibration-decode-steps 16 leaves no room for a calibration prompt in the static KV capacity of 16: "
     "use --calibration-decode-steps 15 or less, or raise --max-cache-len"),
    (["--weight-format", "int4", "--awq", "--scale-estimation", "--max-cache-len", "16"],
     "error: --awq, --scale-estimation without --dataset is not available with --shape-mode static"),
])
def test_cli_invalid_static_quantization_is_one_error_line(flags, expected, quantizable_model, dataset_file, tmp_path):
    """Refused before any export work: the model's weights here are unreadable, and the error is still this one."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "shared_graph.json").write_text('{"schema_version": 1}')  # a previous artifact must survive untouched
    before = tree_snapshot(out)
    model = tmp_path / "unloadable"
    shutil.copytree(quantizable_model, model)
    for weights in model.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    flags = [flag.format(data=dataset_file) for flag in flags]
    proc = run_cli("export", "openvino", "-m", str(model), "--task", "text-generation-shared",
                   "--shape-mode", "static", *flags, str(out))
    assert proc.returncode != 0
    assert error_line(proc).startswith(expected), error_line(proc)
    assert tree_snapshot(out) == before
    assert not [p for p in tmp_path.iterdir() if p.name not in ("out", "unloadable")]  # no staging directory left
