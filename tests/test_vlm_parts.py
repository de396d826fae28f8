"""A vision-language export's language model validated in consecutive parts (`pipeline/vlm.py`,
`language_model_logits`): where the memory available cannot hold it compiled whole (`memory.validation_parts`, as
for text-generation-shared; `OPTIMUM_SHARED_GRAPH_MEMORY` forces it here), the graph fed `inputs_embeds` and the
family's inputs (Qwen3.5's (4, batch, seq) M-RoPE positions, Gemma 3's `token_type_ids`) is cut at decoder-layer
boundaries (`graph/parts.py`) and run part by part on every captured call, with the whole graph's report; a graph
with its decode logits negated still fails; and the PyTorch model is gone when the graph compiles (one load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import break_decode

import optimum_shared_graph as osg
from optimum_shared_graph import ExportValidationError
from optimum_shared_graph.pipeline import memory
from optimum_shared_graph.pipeline.vlm import LANGUAGE_XML, capture_reference, parts_inputs, validate_parts
from optimum_shared_graph.pipeline.vlm_reference import processor_validation_inputs

TASK = "image-text-to-text-shared"
# What a part may hold here: the tiny language models' graphs (1.7 MB for qwen3_5_moe) run in several parts
IN_PARTS = str(memory.RESERVE + 600_000)
# The report's figures that must not depend on how the graph ran
SAME = ("greedy_tokens", "greedy_match", "differing_steps", "prompt_tokens", "decode_steps", "vision", "enforced",
        "status")


@pytest.fixture(scope="module")
def in_parts(tmp_path_factory):
    """`in_parts("qwen3_5_moe")` -> (checkpoint, artifact, its validation report): a tiny checkpoint with its
    processor, exported once with validation forced into parts."""
    from optimum_shared_graph.testing import build_tiny_multimodal

    built = {}

    def get(model_type: str):
        if model_type not in built:
            root = tmp_path_factory.mktemp("vlm-parts")
            build_tiny_multimodal(model_type, root / model_type, processor=True)
            os.environ[memory.MEMORY_ENV] = IN_PARTS
            try:
                manifest = osg.export(str(root / model_type), root / "out", task=TASK, quiet=True, convert_tokenizer=False)
            finally:
                del os.environ[memory.MEMORY_ENV]
            built[model_type] = (root / model_type, root / "out", manifest.validation)
        return built[model_type]

    return get


def _reference(path: Path, tokens: int):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    processed, _image, _why = processor_validation_inputs(path)
    return capture_reference(model, tokens, parts_inputs(model.config, processed))  # what the export ran


def _whole(monkeypatch):
    monkeypatch.setenv(memory.MEMORY_ENV, str(2**40))  # memory to spare: the graph compiled whole


def _check_same_as_whole(path, out, parts, monkeypatch):
    assert parts["status"] == "passed", parts
    assert parts["run"]["mode"] == "parts" and parts["run"]["parts"] >= 2, parts["run"]
    assert parts["run"]["largest_part_bytes"] < parts["run"]["weight_bytes"]
    _whole(monkeypatch)
    whole = validate_parts(out, _reference(path, parts["greedy_tokens"]), None)  # the export's reference again
    assert whole["run"]["mode"] == "whole" and whole["run"]["parts"] == 1
    assert whole["run"]["image"] == parts["run"]["image"]
    assert {k: whole[k] for k in SAME} == {k: parts[k] for k in SAME}
    for key in ("max_abs_diff_prefill", "max_abs_diff_decode"):
        assert parts[key] == pytest.approx(whole[key], abs=1e-5), key


# the export (optimum-intel's conversion of five graphs, the capture), then the whole graph once: 38 s at a load
# average of 3 on this 2-core machine, 80 s at 9 (the file's default run: 41 s of tests, 47 s of CPU time in all)
def test_qwen3_5_moe_in_parts_gives_the_whole_graphs_report(in_parts, monkeypatch):
    """The (4, batch, seq) M-RoPE positions and the gated-delta-net and attention states, in parts: the export
    records how it ran, and its report is the whole graph's."""
    path, out, parts = in_parts("qwen3_5_moe")
    _check_same_as_whole(path, out, parts, monkeypatch)


def test_cuts_fall_between_the_layers_of_qwen3_5(in_parts):
    """Each gated-delta-net state is read and written within its layer, and values read layers after they are
    computed do not rule out the boundaries between: in as many parts as the graph allows, none holds more than a
    quarter of the weights (before, one held 92%, from the first layer to the last)."""
    import openvino as ov

    from optimum_shared_graph.graph.parts import build_parts, plan_parts

    _, out, _ = in_parts("qwen3_5_moe")
    graph = ov.Core().read_model(out / LANGUAGE_XML)
    plan = plan_parts(graph, 1)
    assert max(plan.part_bytes) < plan.total_bytes / 4, plan.part_bytes
    states = {a.get_variable_id() for a in graph.get_sinks()}
    seen = []
    for part in build_parts(graph.clone(), plan):
        reads = {op.get_variable_id() for op in part.get_ordered_ops() if op.get_type_name() == "ReadValue"}
        assert reads == {a.get_variable_id() for a in part.get_sinks()}  # a state read and written in one part
        seen += sorted(reads)
    assert sorted(seen) == sorted(states)


def test_a_broken_decode_still_fails_in_parts(in_parts, tmp_path, monkeypatch):
    """The language model with its decode logits negated is refused in parts as it is whole."""
    path, out, parts = in_parts("qwen3_5_moe")
    reference = _reference(path, 4)
    broken = break_decode(out, tmp_path / "broken", LANGUAGE_XML)
    monkeypatch.setenv(memory.MEMORY_ENV, IN_PARTS)
    with pytest.raises(ExportValidationError, match="does not reproduce Qwen3_5MoeForConditionalGeneration") as err:
        validate_parts(broken, reference, None)
    assert err.value.report["run"]["mode"] == "parts" and err.value.report["run"]["parts"] >= 2
    assert err.value.report["status"] == "failed"


@pytest.mark.slow  # the export: 62 s on the shared machine
def test_gemma3_in_parts_gives_the_whole_graphs_report(in_parts, monkeypatch):
    """Gemma 3's `token_type_ids` (the image attended bidirectionally) and its sliding and full attention layers,
    in parts."""
    path, out, parts = in_parts("gemma3")
    _check_same_as_whole(path, out, parts, monkeypatch)


@pytest.mark.slow  # the export of the test above, then about 5 s
def test_a_broken_gemma3_decode_still_fails_in_parts(in_parts, tmp_path, monkeypatch):
    path, out, _ = in_parts("gemma3")
    reference = _reference(path, 4)
    broken = break_decode(out, tmp_path / "broken", LANGUAGE_XML)
    monkeypatch.setenv(memory.MEMORY_ENV, IN_PARTS)
    with pytest.raises(ExportValidationError, match="does not reproduce Gemma3ForConditionalGeneration"):
        validate_parts(broken, reference, None)


def test_not_enough_memory_for_one_part_is_refused_before_any_work(tmp_path, monkeypatch):
    """As for text-generation-shared: the language model's smallest part is compared with the memory available at the
    first stage, before the model is loaded (here no weights exist to load)."""
    from optimum_shared_graph import NotEnoughMemoryError
    from optimum_shared_graph.testing import tiny_multimodal_config

    tiny_multimodal_config("qwen3_5_moe").save_pretrained(tmp_path / "config-only")
    monkeypatch.setenv(memory.MEMORY_ENV, str(100 * 2**20))
    with pytest.raises(NotEnoughMemoryError, match=r"^validating this export needs at least .* 0\.1 GiB available"):
        osg.export(str(tmp_path / "config-only"), tmp_path / "out", task=TASK, quiet=True)
    assert not (tmp_path / "out").exists()


# Runs an export with transformers' model loading counted (not changed), and at each compile of the language model
# (whole, or a part of it) how many of the loaded PyTorch models are still alive.
_WATCHED_EXPORT = """
import json, sys, weakref
import openvino as ov
from transformers import modeling_utils
loaded = []
original = modeling_utils.PreTrainedModel.from_pretrained.__func__
def counted(cls, *args, **kwargs):
    model = original(cls, *args, **kwargs)
    loaded.append(weakref.ref(model))
    return model
modeling_utils.PreTrainedModel.from_pretrained = classmethod(counted)
alive = []
compile_model = ov.Core.compile_model
def watched(self, model, *args, **kwargs):
    names = {n for port in getattr(model, "inputs", ()) for n in port.get_names()}
    if "inputs_embeds" in names or any(n.startswith("cut.") for n in names):
        alive.append(sum(ref() is not None for ref in loaded))
    return compile_model(self, model, *args, **kwargs)
ov.Core.compile_model = watched
import optimum_shared_graph as osg
manifest = osg.export(sys.argv[1], sys.argv[2], task="image-text-to-text-shared", quiet=True)
print(json.dumps({"loads": len(loaded), "alive_at_compile": alive, "run": manifest.validation["run"]}))
"""


@pytest.mark.slow  # one export in a fresh process: 90 s each on the shared machine
@pytest.mark.parametrize("memory_given", [None, IN_PARTS], ids=["whole", "parts"])
def test_the_pytorch_model_is_freed_before_the_language_model_compiles(tmp_path, memory_given):
    """One model load, as for text-generation-shared: optimum-intel's, and it is gone when the language model (or any
    part of it) is compiled for validation."""
    from optimum_shared_graph.testing import build_tiny_multimodal

    path = tmp_path / "qwen3_5_moe"
    build_tiny_multimodal("qwen3_5_moe", path, processor=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    env.pop(memory.MEMORY_ENV, None)
    if memory_given:
        env[memory.MEMORY_ENV] = memory_given
    proc = subprocess.run([sys.executable, "-c", _WATCHED_EXPORT, str(path), str(tmp_path / "ov")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loads"] == 1, result
    assert result["run"]["mode"] == ("parts" if memory_given else "whole"), result
    assert result["alive_at_compile"] and set(result["alive_at_compile"]) == {0}, result
