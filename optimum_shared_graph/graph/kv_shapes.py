"""Past-length reads from the key cache: nothing but the value concatenation reads a past value state.

OpenVINO's shape optimisations know a layer's past keys and values have the same batch, heads and
length (attention multiplies one by the other), so a length the model computes from its keys (say
the sequence axis `repeat_kv` broadcasts to, for grouped-query attention) may end up read from the
past *value* state instead. Which of the two a graph reads is an accident of node order: the
Qwen3.5 graph reads the values, Qwen3-Next's the keys.

OpenVINO GenAI's NPU pipeline (NPUW) transposes every past value state to `[batch, heads, head_dim,
length]` when it compiles (`NPUW_LLM_OPTIMIZE_V_TENSORS`, on by default) and rewires the value
concatenation, but not other readers of the state's shape: a length read there becomes `head_dim`
and compilation fails ("Broadcast incorrect target shape"). `read_lengths_from_keys()` points such
reads at the matching past key state, which has the same batch, heads and length. The graph computes
the same numbers; every export is validated against PyTorch after it.

NPUW also rewrites a sliding-window attention mask for its static cache (its `SlidingWindowMask` pass): it matches
the mask's key range `Range(0, x + past_length)` and its query positions `Range(0, new) + past_length`, and takes
the past length from the match. Its pattern names the past length once for both, and OpenVINO's matcher keeps
whichever value it bound last, so where the graph writes the key range's end as `past_length + new`, the length
it keeps can be the prompt's: the padding mask it builds from `attention_mask[past:past + new]` is then empty in
the prefill model, and compilation fails ("Argument shapes are inconsistent" at a `BitwiseAnd` of `[1, 1, 64, 64]`
and `[0, 1]`). Measured on tiny (hidden 64) cohere2 (8 layers), gemma2 and starcoder2 (6 layers): this package's
artifacts and optimum-intel's starcoder2 artifact failed so, and all of them ran with the end written the other way.
`present_length_first()` writes each such end as `new + past_length` (the same number), so either value the
matcher keeps is the past length.
"""

from __future__ import annotations


def _state_reads(ov_model) -> dict[str, object]:
    """Each state's variable id -> the output the graph reads it from (after the beam-search Gather)."""
    reads = {}
    for op in ov_model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        port = op.output(0)
        users = [target.get_node() for target in port.get_target_inputs()]
        if len(users) == 1 and users[0].get_type_name() == "Gather":  # optimum-intel's beam_idx reorder
            port = users[0].output(0)
        reads[op.get_variable_id()] = port
    return reads


def _same_leading_dims(key, value) -> bool:
    """Key and value states of one layout: rank 4, the same batch, heads and length axes."""
    k, v = key.get_partial_shape(), value.get_partial_shape()
    if k.rank.is_dynamic or v.rank.is_dynamic or k.rank.get_length() != 4 or v.rank.get_length() != 4:
        return False
    return all(k[i].is_dynamic == v[i].is_dynamic and (k[i].is_dynamic or k[i] == v[i]) for i in range(3))


def _reads_leading_dims_only(shape_of) -> bool:
    """True when every use of a ShapeOf takes constant dimensions among batch, heads and length."""
    for use in shape_of.output(0).get_target_inputs():
        gather = use.get_node()
        if gather.get_type_name() != "Gather" or use.get_index() != 0:
            return False
        indices, axis = gather.input_value(1).get_node(), gather.input_value(2).get_node()
        if indices.get_type_name() != "Constant" or axis.get_type_name() != "Constant":
            return False
        if int(axis.get_data().reshape(-1)[0]) != 0:
            return False
        if any(int(i) % 4 > 2 for i in indices.get_data().reshape(-1)):  # head_dim (3 or -1) differs
            return False
    return True


def read_lengths_from_keys(ov_model) -> int:
    """Point every shape read of a past value state (batch, heads, length) at its key state; return how many."""
    reads = _state_reads(ov_model)
    moved = 0
    for variable, value in reads.items():
        key = reads.get(variable.replace(".value", ".key")) if ".value" in variable else None
        if key is None or not _same_leading_dims(key, value):
            continue
        for target in list(value.get_target_inputs()):
            node = target.get_node()
            if node.get_type_name() == "ShapeOf" and _reads_leading_dims_only(node):
                target.replace_source_output(key)
                moved += 1
    return moved


def _past_length_reads(ov_model) -> set:
    """The outputs that read one axis of a past state's shape: `Gather(ShapeOf(state read), index, 0)`."""
    reads = {port.get_node().get_friendly_name() for port in _state_reads(ov_model).values()}
    found = set()
    for op in ov_model.get_ops():
        if op.get_type_name() != "ShapeOf" or op.input_value(0).get_node().get_friendly_name() not in reads:
            continue
        for use in op.output(0).get_target_inputs():
            if use.get_node().get_type_name() == "Gather" and use.get_index() == 0:
                found.add(use.get_node().get_friendly_name())
    return found


def present_length_first(ov_model) -> int:
    """Write each end of a `Range` computed as `past_length + new` as `new + past_length` (NPUW's sliding-window
    mask rewrite, above); return how many were rewritten."""
    from openvino import opset13 as ops

    past = _past_length_reads(ov_model)
    rewritten = 0
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "Add":
            continue
        first, second = op.input_value(0), op.input_value(1)
        if first.get_node().get_friendly_name() not in past or second.get_node().get_friendly_name() in past:
            continue
        if not any(use.get_node().get_type_name() == "Range" and use.get_index() == 1
                   for use in op.output(0).get_target_inputs()):
            continue
        swapped = ops.add(second, first)
        swapped.set_friendly_name(op.get_friendly_name())
        for target in list(op.output(0).get_target_inputs()):
            target.replace_source_output(swapped.output(0))
        rewritten += 1
    return rewritten
