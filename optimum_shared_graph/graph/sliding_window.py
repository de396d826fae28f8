"""A sliding-window mask whose window compares positions counted along the attention mask, in transformers' form.

transformers writes a sliding-window causal mask (`sliding_window_overlay`, Mistral's and Starcoder2's) as a chain of
`BitwiseAnd`s over slot indices: `Greater(k, q - window)` for the window, `LessEqual(k, q)` for the causal part and
the padding mask, then `Broadcast`, `Select` (0 or float16's minimum). Two consumers read that form:

- OpenVINO's PagedAttention rewrite (GenAI's default CPU backend; `StateManagementPattern` in
  `src/common/transformations/src/transformations/sdpa_to_paged_attention/state_management_pattern.cpp`,
  `gpt_oss_sliding_window_pattern`) recognises the chain, `BitwiseAnd(any, Greater(kv_idx, Add(q_idx, offset)))`,
  then three more `BitwiseAnd`s, `Broadcast`, `Select`, with `kv_idx` and `q_idx` any inputs, and takes the window
  from the constant `offset` (its PagedAttention's `sliding_window` = `-offset`); it drops the mask itself. A window
  of another form (counted along the mask with a `Less` and a `Select`, tried for Starcoder2 and backed out) it does
  not recognise, and then it attends to every key.
- GenAI's NPU pipeline (NPUW) rewrites the same chain for its static cache (`SlidingWindowMask`,
  `src/plugins/intel_npu/src/plugin/npuw/npuw_transformations/sliding_window_mask.cpp`,
  `rebuild_sliding_window_mask`), matching `Greater(Unsqueeze^3(Range(0, past + new)), Unsqueeze^3(query positions)
  + offset)`: it keeps the slot-index window for the new tokens, takes the past tokens' window from `position_ids`,
  and ANDs the result with `attention_mask[past:past + new]` as a column (its step 4). With NPUW's default folding
  (`NPUW_FOLD`, repeated layers compiled as one function), that last step fails to compile: "Argument shapes are
  inconsistent." (measured here on tiny Mistral and Starcoder2 with a window of 4, and on Starcoder2 at
  starcoder2-3b's widths, for optimum-intel's artifacts too; the same graph runs with `NPUW_FOLD=NO` or
  `NPUW_ONLINE_PIPELINE=NONE`, and steps 1 and 2 of the rewrite written into the graph beforehand run with folding).

`counted_window()` keeps the chain and its constant and changes only what the window's `Greater` compares: a key's
position counted along the attention mask (`CumSum(attention_mask) - 1`, the key's position where the key is a token)
against the query's (the same count at the query's slot, the last `Q` of the keys). Where every slot holds a token
(PyTorch's cache, OpenVINO's dynamic graph) the count is the slot index, so the mask is the same; in a left-padded row
the pads precede every token, so two tokens are as many positions apart as slots: the same mask again. In NPUW's
static cache (the past, then empty slots, then the new token in the last slot; its prefill left-padded) the count
skips the empty slots and the pads, so the window is the tokens' own. NPUW's rewrite no longer matches (the key side
is not `Range(0, past + new)`), and OpenVINO's PagedAttention rewrite still does, with the same window.

Every export is validated against PyTorch after this edit, as after any other.
"""

from __future__ import annotations

import numpy as np


def _key_range_row(output) -> bool:
    """`Unsqueeze^3(Range(0, ...))` (optionally through a `Convert`): transformers' key slot indices."""
    node = output.get_node()
    if node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    for _ in range(3):
        if node.get_type_name() != "Unsqueeze":
            return False
        node = node.input_value(0).get_node()
    return node.get_type_name() == "Range"


def _window_greaters(ov_model) -> list:
    """transformers' window comparisons: `Greater(key slots, Add(query slots, negative constant))` read by a
    `BitwiseAnd` of the mask's chain."""
    found = []
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "Greater" or not _key_range_row(op.input_value(0)):
            continue
        left = op.input_value(1).get_node()
        if left.get_type_name() != "Add" or left.input_value(1).get_node().get_type_name() != "Constant":
            continue
        offset = left.input_value(1).get_node().get_data()
        if offset.size != 1 or not float(offset.reshape(-1)[0]) < 0:
            continue
        if not all(t.get_node().get_type_name() == "BitwiseAnd" for t in op.output(0).get_target_inputs()):
            continue
        found.append(op)
    return found


def counted_window(ov_model) -> int:
    """Each window comparison of transformers' sliding-window mask compares positions counted along
    `attention_mask` instead of slot indices (the same mask where slots are positions); return how many."""
    from openvino import opset13 as ops

    masks = [p for p in ov_model.get_parameters() if "attention_mask" in p.output(0).get_names()]
    greaters = _window_greaters(ov_model)
    if len(masks) != 1 or not greaters:
        return 0
    mask = masks[0].output(0)
    counted = ops.cumsum(ops.convert(mask, "i64"), ops.constant(np.int64(1)))  # [batch, keys]
    keys = ops.subtract(counted, ops.constant(np.int64(1)))  # a token key's position
    for greater in greaters:
        key_row, left = greater.input_value(0), greater.input_value(1).get_node()
        query_col, offset = left.input_value(0), left.input_value(1)
        queries = ops.gather(ops.shape_of(query_col), ops.constant(np.array([2], np.int64)), ops.constant(np.int64(0)))
        query_positions = ops.slice(keys, ops.negative(queries), ops.constant(np.array([np.iinfo(np.int64).max])),
                                    ops.constant(np.array([1], np.int64)), ops.constant(np.array([1], np.int64)))
        kv_idx = ops.unsqueeze(keys, ops.constant(np.array([1, 2], np.int64)))  # [batch, 1, 1, keys]
        q_idx = ops.unsqueeze(query_positions, ops.constant(np.array([1, 3], np.int64)))  # [batch, 1, queries, 1]
        if key_row.get_element_type() != kv_idx.get_element_type():
            kv_idx = ops.convert(kv_idx, key_row.get_element_type())
            q_idx = ops.convert(q_idx, key_row.get_element_type())
        greater.input(0).replace_source_output(kv_idx.output(0))
        greater.input(1).replace_source_output(ops.add(q_idx, offset).output(0))
    return len(greaters)
