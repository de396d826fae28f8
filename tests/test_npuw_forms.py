"""graph/npuw_forms.py: forms of the graph NPUW partitions, computing the same numbers.

The unit tests build each form by hand and check the edit computes the same numbers on the CPU. The export tests
run tiny tied GPT-2 and GPT-NeoX-Japanese (the forms of gpt2/opt and gpt_neox_japanese) and a tiny GPT-BigCode
(a learned position table and multi-query attention) through optimum-cli and then GenAI's NPU pipeline (NPUW, on
the CPU, in f16): without the edits NPUW refuses the two tied ones at load ("Key opset1::MatMul __module.lm_head/...
is not found in a map"); with them, greedy decoding is judged against PyTorch. The tiny GPT-BigCode's tables are
narrower than NPUW's host gather takes (2048), so its export test checks the edits are made and keep NPUW running;
the failure they remove was measured at released width (docs/architectures.md). Tiny bloom (ALiBi) has no `position_ids`
input, and NPUW fails at its first `generate()` ("unordered_map::at") without the one the edit declares. A sliding
window counted along the mask (architectures/_counted_window.py: gpt_neo's local layers) is checked against
transformers' slot-index window by hand, and tiny gpt_neo with a window of 4 through NPUW.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import pytest
from conftest import NPU_PRECISION, PROMPTS, judged_greedy, pytorch_reference, run_cli_in_process
from openvino import opset13 as ops

from optimum_shared_graph.graph.npuw_forms import (declare_position_ids, drop_identity_reshapes, fold_weight_shapes,
                                                   gather_positions_on_device, npuw_forms, slice_split_kv)

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
    data = ops.parameter(shape, np.int64, name="input_ids")
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


def _wide_table(width=2048):
    rng = np.random.default_rng(3)
    return ops.convert(ops.constant(rng.standard_normal((VOCAB, width)).astype(np.float16)), np.float32)


@pytest.mark.parametrize("width", [2048, 768])
def test_second_wide_table_reads_its_ids_through_an_identity_reshape(width):
    """Two tables of rows at least 2048 wide (what NPUW's host gather takes) gathered by inputs: the second one's ids
    through the identity Reshape. Narrower tables are left alone (the host gather does not take them)."""
    ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    positions = ops.parameter([-1, -1], np.int64, name="position_ids")
    words, places = _wide_table(width), _wide_table(width)
    zero = ops.constant(np.int32(0))
    hidden = ops.add(ops.gather(words, ops.convert(ids, np.int32), zero),
                     ops.gather(places, ops.convert(positions, np.int32), zero))
    model = ov.Model([ops.result(ops.matmul(hidden, words, False, True))], [ids, positions], "positions")
    feeds = {"input_ids": np.array([[1, 5, 7]], np.int64), "position_ids": np.array([[3, 4, 5]], np.int64)}
    before = _run(model, feeds)

    if width < 2048:
        assert gather_positions_on_device(model) == 0 and not _ops(model, "Reshape")
        return
    assert gather_positions_on_device(model) == 1
    model.validate_nodes_and_infer_types()
    (reshape,) = _ops(model, "Reshape")
    assert reshape.input_value(0).get_node().get_friendly_name() == "position_ids"
    np.testing.assert_array_equal(_run(model, feeds), before)
    assert gather_positions_on_device(model) == 0  # one table gathered by an input now: nothing to move


def test_one_table_keeps_its_ids():
    ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    table = _table()
    embedded = ops.gather(table, ops.convert(ids, np.int32), ops.constant(np.int32(0)))
    model = ov.Model([ops.result(ops.matmul(embedded, table, False, True))], [ids], "one")
    assert gather_positions_on_device(model) == 0 and not _ops(model, "Reshape")


def _kv_graph(split_kind):
    """A layer whose fused projection is split into query, new key and new value (multi-query attention), the key
    and value appended to their states."""
    from openvino.op.util import Variable, VariableInfo

    x = ops.parameter([-1, -1, HIDDEN], np.float32, name="x")
    beam_idx = ops.parameter([-1], np.int32, name="beam_idx")
    rng = np.random.default_rng(1)
    fused = ops.matmul(x, ops.constant(rng.standard_normal((HIDDEN, 3 * 4)).astype(np.float32)), False, False)
    if split_kind == "VariadicSplit":
        split = ops.variadic_split(fused, ops.constant(np.int64(2)), ops.constant(np.array([4, -1, 4], np.int64)))
    else:
        split = ops.split(fused, ops.constant(np.int64(-1)), 3)
    sinks, outputs = [], [ops.result(split.output(0))]
    for index, kind in ((1, "key"), (2, "value")):
        info = VariableInfo()
        info.data_shape = ov.PartialShape([-1, -1, 4])
        info.data_type = ov.Type.f32
        info.variable_id = f"past_key_values.0.{kind}present.0.{kind}"
        variable = Variable(info)
        read = ops.read_value(ops.constant(np.zeros([1, 0, 4], np.float32)), variable)
        present = ops.concat([ops.gather(read, beam_idx, ops.constant(np.int64(0))), split.output(index)], 1)
        sinks.append(ops.assign(present, variable))
        outputs.append(ops.result(present))
    return ov.Model(outputs, sinks, [x, beam_idx], "kv")


@pytest.mark.parametrize("split_kind", ["VariadicSplit", "Split"])
def test_split_new_kv_becomes_slices_with_the_same_states(split_kind):
    def steps(model):
        request = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
        rng = np.random.default_rng(2)
        outs = []
        for length in (3, 1, 1):
            result = request.infer({"x": rng.standard_normal((1, length, HIDDEN)).astype(np.float32),
                                    "beam_idx": np.array([0], np.int32)})
            outs.append([result[i].copy() for i in range(3)])
        return outs

    model = _kv_graph(split_kind)
    before = steps(model)
    assert slice_split_kv(model) == 1
    model.validate_nodes_and_infer_types()
    assert not _ops(model, split_kind) and len(_ops(model, "Slice")) == 3
    for old, new in zip(before, steps(model)):
        for a, b in zip(old, new):
            np.testing.assert_array_equal(a, b)


def test_split_not_feeding_a_state_is_kept():
    x = ops.parameter([-1, HIDDEN], np.float32, name="x")
    split = ops.split(x, ops.constant(np.int64(1)), 2)
    model = ov.Model([ops.result(split.output(0)), ops.result(split.output(1))], [x])
    assert slice_split_kv(model) == 0 and len(_ops(model, "Split")) == 1


@pytest.mark.parametrize("form", ["mask_positions", "rotary", "shape_positions"])
def test_position_ids_declared_only_where_positions_come_from_the_mask(form):
    """Declared where the graph counts positions along the mask (bloom's ALiBi); not where a rotary embedding is
    (NPUW declares its own), nor where positions come from a shape (a seq2seq decoder's past length)."""
    ids = ops.parameter([-1, -1], np.int64, name="input_ids")
    mask = ops.parameter([-1, -1], np.int64, name="attention_mask")
    table = _table()
    embedded = ops.gather(table, ops.convert(ids, np.int32), ops.constant(np.int32(0)))
    if form == "mask_positions":
        positions = ops.cumsum(ops.convert(mask, np.float32), ops.constant(np.int64(1)))
    elif form == "rotary":
        positions = ops.cos(ops.convert(mask, np.float32))
    else:
        positions = ops.convert(ops.gather(ops.shape_of(mask), ops.constant(np.int64(1)), ops.constant(np.int64(0))),
                                np.float32)
    scaled = ops.multiply(embedded, ops.unsqueeze(positions, ops.constant(np.int64(-1))))
    model = ov.Model([ops.result(ops.matmul(scaled, table, False, True))], [ids, mask], "positions")
    feeds = {"input_ids": np.array([[1, 5, 7]], np.int64), "attention_mask": np.array([[1, 1, 1]], np.int64)}
    before = _run(model, feeds)

    declared = form == "mask_positions"
    assert declare_position_ids(model) == int(declared)
    names = [port.get_any_name() for port in model.inputs]
    assert names == ["input_ids", "attention_mask"] + (["position_ids"] if declared else [])
    if declared:  # read by nothing: any values give the same logits
        assert model.input("position_ids").get_element_type() == ov.Type.i64
        for positions in (np.array([[0, 1, 2]]), np.array([[7, 3, 9]])):
            np.testing.assert_array_equal(_run(model, dict(feeds, position_ids=positions)), before)
    assert declare_position_ids(model) == 0  # never a second one


# On a CPU without f16 units (AMD EPYC with avx512_bf16, OpenVINO 2026.4), NPUW's CPU run of the tiny gpt_bigcode
# artifact answers token 0 at every prefill (prompts of 2, 10, 33 and 63 tokens) and other tokens after it, with
# the f32 hint or none, with NPUW_ONLINE_PIPELINE=NONE, NPUW_LLM_SHARED_HEAD=NO, NPUW_HOST_GATHER=NO, NPUW_DQ=NO or
# a prefill chunk size of 0; the CPU plugin's own LLMPipeline gives PyTorch's tokens, and NPUW does not load
# optimum-intel's artifact at all. On the Intel Xeon with AMX (f16 units, the f16 hint) it passed. Not located:
# pinned (strict), so a change shows.
_NO_F16_UNITS = NPU_PRECISION["INFERENCE_PRECISION_HINT"] != "f16"
_BIGCODE_ON_THIS_CPU = pytest.mark.xfail(_NO_F16_UNITS, strict=True, raises=AssertionError,
                                         reason="NPUW on a CPU without f16 units: tiny gpt_bigcode answers token 0")


@pytest.mark.parametrize("model_type, edit", [("gpt2", "identity_reshapes"), ("gpt_neox_japanese", "weight_shapes"),
                                              pytest.param("gpt_bigcode", "split_kv", marks=_BIGCODE_ON_THIS_CPU),
                                              ("bloom", "position_ids")])
def test_export_runs_through_npuw(model_type, edit, tiny_model, tmp_path):
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
    assert set(npuw_forms(graph).values()) == {0}

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


# architectures/_counted_window.py: a sliding window counted along the mask (gpt_neo's local layers)
def _slot_window(queries: int, keys: int, window: int, pads: int = 0) -> np.ndarray:
    """transformers' slot-index sliding window, causal and padding: True where a query may attend a key."""
    q = np.arange(keys - queries, keys)[:, None]
    k = np.arange(keys)[None, :]
    return (k <= q) & (k > q - window) & (k >= pads)


@pytest.mark.parametrize("queries, pads", [(9, 0), (9, 3), (1, 0), (1, 2)])
def test_counted_window_is_the_slot_window_where_slots_are_positions(queries, pads):
    """Every slot a token (or left pads before them): the counted window is transformers' slot-index window,
    additive and boolean alike."""
    import torch

    from optimum_shared_graph.architectures._counted_window import MASKED, counted_window

    keys, window = 9, 3
    causal = _slot_window(queries, keys, keys + 1, pads)  # the causal and padding mask, no window
    boolean = torch.from_numpy(causal)[None, None]
    additive = torch.where(boolean, 0.0, MASKED)
    expected = _slot_window(queries, keys, window, pads)
    np.testing.assert_array_equal(counted_window(boolean, window)[0, 0].numpy(), expected)
    np.testing.assert_array_equal((counted_window(additive, window)[0, 0] == 0).numpy(), expected)


def test_counted_window_skips_the_empty_slots_of_a_static_cache():
    """NPUW's decode: 5 past tokens in slots 0-4, empty slots 5-7, the new token in slot 8. The window of 3 keeps
    the new token and the 2 tokens before it (slots 3, 4), where a slot-index window would keep only the empty ones."""
    import torch

    from optimum_shared_graph.architectures._counted_window import MASKED, counted_window

    row = np.array([1, 1, 1, 1, 1, 0, 0, 0, 1], bool)
    additive = torch.where(torch.from_numpy(row)[None, None, None], 0.0, MASKED)
    kept = (counted_window(additive, 3)[0, 0, 0] == 0).numpy()
    np.testing.assert_array_equal(kept, [0, 0, 0, 1, 1, 0, 0, 0, 1])


@pytest.mark.parametrize("model_type, overrides", [("gpt_neo", {"window_size": 4})])
def test_counted_window_runs_through_npuw(model_type, overrides, tiny_model, tmp_path):
    """A window of 4, shorter than the prompts: this package's artifact (its window counted along the mask) through
    NPUW, greedy judged against PyTorch's logits. (Measured once on this tiny GPT-Neo: optimum-intel's artifact
    loads there and its greedy tokens differ from the first steps, at PyTorch margins of 0.11 to 0.26.)"""
    import openvino_genai as ov_genai
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_shared_graph.manifest import read_manifest

    path = tiny_model(model_type, **overrides)
    out = tmp_path / "shared"
    run_cli_in_process("export", "openvino", "-m", str(path), "--task", "text-generation-shared",
                       "--weight-format", "fp16", str(out))
    assert [f["fix"] for f in read_manifest(out).model.get("fixes") or []] == [
        f"optimum_shared_graph.architectures.{model_type}"]
    pipe = ov_genai.LLMPipeline(str(out), "NPU", **NPUW, **NPU_PRECISION)
    tok = AutoTokenizer.from_pretrained(path)
    pt = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for prompt in PROMPTS[:3]:
        enc = tok([prompt], return_tensors="pt")
        reference = pytorch_reference(pt, enc, 12)
        why = judged_greedy(pipe, reference, NPU_PRECISION)
        assert why is None, f"{prompt}: {why}"
    assert max(len(tok(p)["input_ids"]) for p in PROMPTS[:3]) > 4  # the window really cuts

