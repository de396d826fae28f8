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
