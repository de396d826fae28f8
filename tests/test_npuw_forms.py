"""graph/npuw_forms.py: a tied head's extra reads of the embedding table and the ids, in forms NPUW partitions.

The unit tests build the two forms by hand and check the edit computes the same numbers on the CPU. The export
tests run tiny tied GPT-2 and GPT-NeoX-Japanese (the forms of gpt2/opt and gpt_neox_japanese) through optimum-cli
and then GenAI's NPU pipeline (NPUW, on the CPU, in f16): without the edit NPUW refuses both at load ("Key
opset1::MatMul __module.lm_head/... is not found in a map"); with it, greedy decoding is judged against PyTorch.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from conftest import NPU_PRECISION, PROMPTS, judged_greedy, pytorch_reference, run_cli_in_process
from openvino import opset13 as ops

from optimum_shared_graph.graph.npuw_forms import drop_identity_reshapes, fold_weight_shapes, npuw_forms

NPUW = {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU", "MAX_PROMPT_LEN": 64, "MIN_RESPONSE_LEN": 64}
VOCAB, HIDDEN = 16, 8


def _table():
    rng = np.random.default_rng(0)
    return ops.convert(ops.constant(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float16)), np.float32)


def _run(model, feeds):
    return ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(feeds)[0]


def _ops(model, kind):
    return [op for op in model.get_ops() if op.get_type_name() == kind]


def test_identity_reshape_of_ids_is_dropped_with_the_same_result():
    ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    reshaped = ops.reshape(ids, ops.constant(np.array([-1, 0], np.int64)), special_zero=True)
    table = _table()
    embedded = ops.gather(table, ops.convert(reshaped, np.int32), ops.constant(np.int32(0)))
    logits = ops.matmul(embedded, table, False, True)
    model = ov.Model([ops.result(logits)], [ids], "tied")
    feeds = {"input_ids": np.array([[1, 5, 7], [2, 3, 15]], np.int64)}
    before = _run(model, feeds)

    assert drop_identity_reshapes(model) == 1
    model.validate_nodes_and_infer_types()
    assert not _ops(model, "Reshape")
    np.testing.assert_array_equal(_run(model, feeds), before)


@pytest.mark.parametrize("pattern, special_zero, shape", [
    ([-1, 0], True, [-1, -1, -1]),  # rank 3: [-1, 0] merges the leading axes
    ([-1, 4], True, [-1, -1]),  # a fixed width: not the identity
    ([0, -1], True, [-1, -1]),  # not the form the trace writes (identity too, but not claimed)
])
def test_other_reshapes_are_kept(pattern, special_zero, shape):
    data = ops.parameter(shape, np.float32, name="x")
    model = ov.Model([ops.result(ops.reshape(data, ops.constant(np.array(pattern, np.int64)), special_zero))], [data])
    assert drop_identity_reshapes(model) == 0
    assert len(_ops(model, "Reshape")) == 1


def test_shape_of_a_weight_becomes_a_constant_with_the_same_result():
    ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    table = _table()
    embedded = ops.gather(table, ops.convert(ids, np.int32), ops.constant(np.int32(0)))
    hidden = ops.gather(ops.shape_of(table), ops.constant(np.array([1], np.int64)), ops.constant(np.int64(0)))
    target = ops.concat([ops.constant(np.array([-1], np.int64)), hidden], 0)
    flat = ops.reshape(embedded, target, False)
    dynamic = ops.shape_of(ids)  # a shape read of an input: kept
    model = ov.Model([ops.result(ops.matmul(flat, table, False, True)), ops.result(dynamic)], [ids], "tied")
    feeds = {"input_ids": np.array([[1, 5, 7]], np.int64)}
    before = [_run(model, feeds)]

    assert fold_weight_shapes(model) == 1
    model.validate_nodes_and_infer_types()
    assert [op.input_value(0).get_node().get_friendly_name() for op in _ops(model, "ShapeOf")] == ["input_ids"]
    np.testing.assert_array_equal(_run(model, feeds), before[0])


@pytest.mark.parametrize("model_type, edit", [("gpt2", "identity_reshapes"), ("gpt_neox_japanese", "weight_shapes")])
def test_tied_head_export_runs_through_npuw(model_type, edit, tiny_model, tmp_path):
    """The raw graph optimum-intel writes has the form (so the edit is what makes NPUW load ours); the artifact
    has it no longer, and NPUW's greedy decoding of it is judged against PyTorch's logits."""
    import openvino_genai as ov_genai
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model(model_type, tie_word_embeddings=True)
    out = tmp_path / "shared"
    run_cli_in_process("export", "openvino", "-m", str(path), "--task", "text-generation-shared",
                       "--weight-format", "fp16", str(out))
    graph = ov.Core().read_model(out / "openvino_model.xml")
    assert npuw_forms(graph) == {"identity_reshapes": 0, "weight_shapes": 0}

    theirs = tmp_path / "with-past"
    run_cli_in_process("export", "openvino", "-m", str(path), "--task", "text-generation-with-past",
                       "--weight-format", "fp16", str(theirs))
    assert npuw_forms(ov.Core().read_model(theirs / "openvino_model.xml"))[edit] >= 1

    pipe = ov_genai.LLMPipeline(str(out), "NPU", **NPUW, **NPU_PRECISION)
    tok = AutoTokenizer.from_pretrained(path)
    pt = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for prompt in PROMPTS[:2]:
        reference = pytorch_reference(pt, tok([prompt], return_tensors="pt"), 12)
        why = judged_greedy(pipe, reference, NPU_PRECISION)
        assert why is None, f"{prompt}: {why}"
