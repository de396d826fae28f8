"""graph/sliding_window.py and architectures/starcoder2.py: transformers' sliding-window mask with its window
comparing positions counted along the attention mask, in transformers' own chain.

The unit tests build the mask's chain by hand as transformers' trace writes it (`Greater(key slots, query slots -
window)` and `LessEqual(key slots, query slots)` in a chain of `BitwiseAnd`s with the padding mask); the tiny
Starcoder2 with a window of 4, shorter than the prompts, runs the real graph through GenAI's default CPU backend
(OpenVINO's PagedAttention rewrite, which takes the window from that chain) and its NPU pipeline (NPUW, whose rewrite
of the slot-index window failed to compile: docs/npu-real-width.md).
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from openvino import opset13 as ops

from conftest import EXACT, NPU_PRECISION, judged_greedy, pytorch_reference, run_cli_in_process

from optimum_shared_graph.graph.sliding_window import counted_window

WINDOW = 3


def _unsqueeze3(x, axes):
    for axis in axes:
        x = ops.unsqueeze(x, ops.constant(np.int64(axis)))
    return x


def _mask_graph():
    """[batch, 1, queries, keys] of transformers' sliding-window causal mask with padding, as int32 (1: attend)."""
    mask = ops.parameter([-1, -1], np.int64, name="attention_mask")
    ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    zero, one = ops.constant(np.int64(0)), ops.constant(np.int64(1))
    keys = ops.gather(ops.shape_of(mask), one, zero)
    new = ops.gather(ops.shape_of(ids), one, zero)
    past = ops.subtract(keys, new)
    key_row = _unsqueeze3(ops.range(zero, ops.add(past, new), one, "i64"), (0, 1, 2))  # [1, 1, 1, keys]
    query_col = _unsqueeze3(ops.add(ops.range(zero, new, one, "i64"), past), (0, 1, 3))  # [1, 1, queries, 1]
    window = ops.greater(key_row, ops.add(query_col, ops.constant(np.int64(-WINDOW))))
    true = ops.constant(np.array(True))
    chain = ops.bitwise_and(ops.bitwise_and(true, window), ops.less_equal(key_row, query_col))
    padding = ops.unsqueeze(ops.convert(mask, "boolean"), ops.constant(np.array([1, 2], np.int64)))  # [b, 1, 1, k]
    chain = ops.bitwise_and(ops.bitwise_and(true, chain), padding)
    return ov.Model([ops.result(ops.convert(chain, np.int32))], [mask, ids], "mask")


def _run(model, mask, queries):
    compiled = ov.Core().compile_model(model, "CPU")
    out = compiled({"attention_mask": np.array(mask, np.int64), "input_ids": np.ones((len(mask), queries), np.int64)})
    return out[0][:, 0]


@pytest.mark.parametrize("mask, queries", [([[1] * 9], 9), ([[1] * 9], 1), ([[0, 0, 0] + [1] * 6], 6),
                                           ([[0, 0] + [1] * 7, [1] * 9], 1)])
def test_the_counted_window_is_the_slot_window_where_slots_are_positions(mask, queries):
    """Every slot a token, or left pads before them: the same mask as transformers' slot-index window."""
    model = _mask_graph()
    before = _run(model, mask, queries)
    assert counted_window(model) == 1
    model.validate_nodes_and_infer_types()
    np.testing.assert_array_equal(_run(model, mask, queries), before)
    assert counted_window(model) == 0  # once is all: the window no longer compares slot indices


def test_the_counted_window_skips_the_empty_slots_of_a_static_cache():
    """NPUW's decode: 5 past tokens in slots 0-4, empty slots 5-7, the new token in slot 8. The window of 3 keeps the
    new token and the 2 tokens before it (slots 3, 4), where the slot-index window keeps only the new token."""
    model = _mask_graph()
    row = [[1, 1, 1, 1, 1, 0, 0, 0, 1]]
    np.testing.assert_array_equal(_run(model, row, 1)[0, 0], [0, 0, 0, 0, 0, 0, 0, 0, 1])
    counted_window(model)
    np.testing.assert_array_equal(_run(model, row, 1)[0, 0], [0, 0, 0, 1, 1, 0, 0, 0, 1])


def test_the_chain_keeps_the_form_pagedattention_takes_the_window_from():
    """OpenVINO's PagedAttention rewrite (`gpt_oss_sliding_window_pattern`) reads `BitwiseAnd(any, Greater(kv,
    Add(q, offset)))` and takes the window from the constant `offset`: that part of the chain is unchanged."""
    model = _mask_graph()
    counted_window(model)
    greater = next(op for op in model.get_ordered_ops() if op.get_type_name() == "Greater")
    assert [t.get_node().get_type_name() for t in greater.output(0).get_target_inputs()] == ["BitwiseAnd"]
    assert next(iter(greater.output(0).get_target_inputs())).get_index() == 1
    left = greater.input_value(1).get_node()
    assert left.get_type_name() == "Add" and left.input_value(1).get_node().get_data() == -WINDOW


@pytest.mark.timeout(900)
def test_tiny_starcoder2_window_kept_by_genai_default_backend_and_npuw(tiny_model, tmp_path):
    """A window of 4, shorter than the prompts, 6 layers (NPUW's folding of repeated layers is what its own rewrite
    of the window failed under): greedy parity through GenAI's default CPU backend (PagedAttention, which takes the
    window from the mask's chain; with the window's comparison moved out of the chain every prompt differs there,
    measured) and through NPUW judged against PyTorch's logits (without the edit: "Argument shapes are inconsistent",
    optimum-intel's artifact too)."""
    import openvino_genai as ov_genai
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_shared_graph import architectures, read_manifest
    from optimum_shared_graph.testing import NPU_ON_CPU

    path = tiny_model("starcoder2", sliding_window=4, num_hidden_layers=6)
    out = tmp_path / "shared"
    run_cli_in_process("export", "openvino", "-m", str(path), "--task", "text-generation-shared", str(out))
    manifest = read_manifest(out)
    assert manifest.validation["status"] == "passed"
    assert [f["fix"] for f in manifest.model.get("fixes") or []] == [architectures.fix_module("starcoder2").__name__]
    assert counted_window(ov.Core().read_model(out / "openvino_model.xml")) == 0  # the export wrote it

    tok = AutoTokenizer.from_pretrained(path)
    pt = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts = ["The quick brown fox jumps over the lazy dog",
               "Static graphs fix every shape: the batch, the query length and the cache capacity. " * 2]
    pipe = ov_genai.LLMPipeline(str(out), "CPU", **EXACT)  # the default backend: PagedAttention
    npu = ov_genai.LLMPipeline(str(out), "NPU", **NPU_ON_CPU, MAX_PROMPT_LEN=64, MIN_RESPONSE_LEN=64)
    config = ov_genai.GenerationConfig(max_new_tokens=12, min_new_tokens=12, ignore_eos=True)
    for prompt in prompts:
        enc = tok([prompt], return_tensors="pt")
        assert enc["input_ids"].shape[1] > 4  # the window really cuts
        with torch.no_grad():
            ref = pt.generate(**enc, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        assert list(pipe.generate(inputs, config).tokens[0]) == ref[0, enc["input_ids"].shape[1]:].tolist(), prompt
        why = judged_greedy(npu, pytorch_reference(pt, enc, 12), NPU_PRECISION)
        assert why is None, f"{prompt}: {why}"
