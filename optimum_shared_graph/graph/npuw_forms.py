"""Forms of the graph GenAI's NPU pipeline (NPUW) can partition, computing the same numbers.

Each edit below replaces a form NPUW refuses at load, in optimum-intel's artifact and this package's alike, with
one computing the same numbers; each was found by editing exported graphs until NPUW ran them (docs/architectures.md,
"NPU pipeline at real width", has the model types). No weight is copied, and every export is validated against
PyTorch after them.

A tied head reads the embedding table through the same `Convert` as the embedding `Gather`. NPUW cuts the head
into a model of its own (`CutLMHead`, `NPUW_LLM_SHARED_HEAD`) and leaves that `Convert` shared between the head
model and the decoder; its online partitioning (`Snapshot::buildGraph`, which looks up every reader of a node among
its own model's nodes) then fails with "Key opset1::MatMul __module.lm_head/... is not found in a map" unless the
embedding `Gather` is lifted above the `Convert` first (NPUW's `DQLiftGather*`, when folding), which needs the table
read by nothing else and gathered with `Convert(input_ids)`:

- `drop_identity_reshapes`: GPT-2 and OPT reshape `input_ids` with `view(-1, seq)` before the `Gather`, which the
  trace writes as `Reshape(input_ids, [-1, 0], special_zero=True)`: on a rank-2 input that is the identity, so its
  readers read `input_ids` itself;
- `fold_weight_shapes`: GPT-NeoX-Japanese reads the hidden size as `ShapeOf(Convert(table))` (OpenVINO's shape
  optimisation chose the table as the source of that dimension): the shape of a weight is a constant.

NPUW gathers one embedding table on the host (`HostGather`, a table at least 2048 wide gathered by a model input):
with a second such table, the learned position embedding of GPT-BigCode and GPT-Neo gathered by `position_ids`, the
first one's host-gather input is left undeclared ("Model references undeclared parameters: ... f16[1,1,2048]"):

- `gather_positions_on_device`: where more than one weight table of rows at least 2048 wide (what `HostGather`
  takes) is gathered by a model input, every such table but `input_ids`' reads its ids through
  `Reshape(ids, [-1, 0], special_zero=True)` (the identity on the rank-2 ids,
  GPT-2's own `view(-1, seq)` form), which `HostGather` does not match: that table is gathered in the graph.

NPUW's decoding feeds `position_ids` on every call (its infer request looks the input up in a map) and declares that
input itself only where it finds a rotary embedding to take positions from (`AddPositionIdsParam`): a graph with
neither fails at the first `generate()` with "unordered_map::at". NPUW runs the graph on a static cache, its slots
not the tokens' positions, so a graph that takes positions from shapes or slot indices computes wrong ones there
(measured: the causal LM of bart with the input declared decodes wrongly from its second token, mpt too); a graph
that takes them from the mask's running count computes the right ones:

- `declare_position_ids`: a graph without a `position_ids` input and without a rotary embedding (`Sin`, `Cos`) whose
  positions are a `CumSum` computed from `attention_mask` (bloom's ALiBi; mpt's with `architectures/mpt.py`) gets a `position_ids` input ([batch, seq] int64, as
  optimum-intel's other graphs have) that nothing in it reads, so its values change no output; OVModelForCausalLM,
  GenAI and `runtime()` compute and feed it as for any graph that has one.

GPT-BigCode's multi-query attention takes the new key and value as outputs 1 and 2 of the fused projection's
`VariadicSplit`; once NPUW makes the new key and value outputs of its decode model (`RedirectNewKvToOutput`), its
partitioning leaves a parameter undeclared ("... f16[1,1,1,128]"):

- `slice_split_kv`: a split whose outputs a KV state's `Concat` appends becomes one `Slice` per output (the same
  ranges of the same tensor).
"""

from __future__ import annotations

import numpy as np

IDS = "input_ids"


def _constant(node):
    return node.get_data() if node.get_type_name() == "Constant" else None


def _is_identity_reshape(op) -> bool:
    """`Reshape(x, [-1, 0], special_zero=True)` of a rank-2 `x`: the identity."""
    if op.get_type_name() != "Reshape" or not op.get_attributes().get("special_zero"):
        return False
    pattern = _constant(op.input_value(1).get_node())
    rank = op.input_value(0).get_partial_shape().rank
    return (pattern is not None and rank.is_static and rank.get_length() == 2
            and list(pattern.reshape(-1)) == [-1, 0])


def drop_identity_reshapes(ov_model) -> int:
    """Bypass every identity `Reshape(input_ids, [-1, 0], special_zero=True)`; return how many."""
    dropped = 0
    for op in ov_model.get_ordered_ops():
        data = op.input_value(0) if op.get_input_size() else None
        if data is None or data.get_node().get_friendly_name() != IDS or data.get_node().get_type_name() != "Parameter":
            continue
        if not _is_identity_reshape(op):
            continue
        for target in list(op.output(0).get_target_inputs()):
            target.replace_source_output(data)
        dropped += 1
    return dropped


def _is_weight(node) -> bool:
    """A constant, or a constant's (decompression) `Convert`."""
    if node.get_type_name() == "Convert":
        node = node.input_value(0).get_node()
    return node.get_type_name() == "Constant"


def fold_weight_shapes(ov_model) -> int:
    """Replace every `ShapeOf` of a weight (static shape) with the constant it computes; return how many."""
    from openvino import opset13 as ops

    folded = 0
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "ShapeOf":
            continue
        source = op.input_value(0)
        if not _is_weight(source.get_node()) or not source.get_partial_shape().is_static:
            continue
        dtype = np.int32 if op.get_output_element_type(0).get_type_name() == "i32" else np.int64
        shape = ops.constant(np.array(list(source.get_partial_shape().to_shape()), dtype))
        for target in list(op.output(0).get_target_inputs()):
            target.replace_source_output(shape.output(0))
        folded += 1
    return folded


def _table_gathers(ov_model) -> list[tuple[object, object, object]]:
    """(the ids' input port, the model input, the `Gather`) of every `Gather` of a weight table by a model input, read directly
    or through a `Convert`."""
    found = []
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "Gather" or not _is_weight(op.input_value(0).get_node()):
            continue
        port = op.input(1)
        node = port.get_source_output().get_node()
        if node.get_type_name() == "Convert":
            port = node.input(0)
            node = port.get_source_output().get_node()
        if node.get_type_name() == "Parameter":
            found.append((port, node, op))
    return found


# NPUW's HostGather takes a table whose rows are at least this wide (partitioning/patterns/opt.cpp)
HOST_GATHER_WIDTH = 2048


def _row_width(gather) -> int:
    """The width of the rows `gather` reads (its table's last axis), 0 where unknown."""
    shape = gather.input_value(0).get_partial_shape()
    return shape[-1].get_length() if shape.rank.is_static and shape[-1].is_static else 0


def gather_positions_on_device(ov_model) -> int:
    """Where several weight tables of rows at least `HOST_GATHER_WIDTH` wide are gathered by model inputs, read every
    such one's ids but `input_ids`' through an identity `Reshape(ids, [-1, 0], special_zero=True)`; return how many."""
    from openvino import opset13 as ops

    gathers = [(port, parameter) for port, parameter, gather in _table_gathers(ov_model)
               if _row_width(gather) >= HOST_GATHER_WIDTH]
    if len({id(parameter) for _, parameter in gathers}) < 2:
        return 0
    moved = 0
    for port, parameter in gathers:
        shape = parameter.get_output_partial_shape(0)
        if parameter.get_friendly_name() == IDS or shape.rank.is_dynamic or shape.rank.get_length() != 2:
            continue
        reshape = ops.reshape(parameter.output(0), ops.constant(np.array([-1, 0], np.int64)), special_zero=True)
        port.replace_source_output(reshape.output(0))
        moved += 1
    return moved


def _new_kv_producers(ov_model) -> list[object]:
    """The nodes whose outputs a KV state's `Concat` appends to the past (read through optimum-intel's beam Gather)."""
    producers = []
    for op in ov_model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        reads = [op.output(0)]
        for target in op.output(0).get_target_inputs():
            if target.get_node().get_type_name() == "Gather":
                reads.append(target.get_node().output(0))
        for read in reads:
            for target in read.get_target_inputs():
                concat = target.get_node()
                if concat.get_type_name() == "Concat" and concat.get_input_size() == 2 and target.get_index() == 0:
                    producers.append(concat.input_value(1).get_node())
    return producers


def slice_split_kv(ov_model) -> int:
    """Replace every split (`VariadicSplit`, `Split`) whose output a KV state appends with one `Slice` per output;
    return how many splits."""
    from openvino import opset13 as ops

    done = set()
    for split in _new_kv_producers(ov_model):
        if split.get_type_name() not in ("VariadicSplit", "Split") or id(split) in done:
            continue
        axis = _constant(split.input_value(1).get_node())
        data = split.input_value(0)
        rank = data.get_partial_shape().rank
        if axis is None or rank.is_dynamic:
            continue
        axis = int(axis.reshape(-1)[0]) % rank.get_length()
        if split.get_type_name() == "VariadicSplit":
            lengths = _constant(split.input_value(2).get_node())
            dim = data.get_partial_shape()[axis]
            if lengths is None or (-1 in lengths.reshape(-1).tolist() and dim.is_dynamic):
                continue
            lengths = [int(n) for n in lengths.reshape(-1)]
            if -1 in lengths:
                lengths[lengths.index(-1)] = dim.get_length() - (sum(lengths) + 1)
        else:
            dim = data.get_partial_shape()[axis]
            if dim.is_dynamic:
                continue
            parts = split.get_output_size()
            lengths = [dim.get_length() // parts] * parts
        start = 0
        for index, length in enumerate(lengths):
            piece = ops.slice(data, np.array([start], np.int64), np.array([start + length], np.int64),
                              np.array([1], np.int64), np.array([axis], np.int64))
            for target in list(split.output(index).get_target_inputs()):
                target.replace_source_output(piece.output(0))
            start += length
        done.add(id(split))
    return len(done)


POSITIONS = "position_ids"


def _reads_mask(op) -> bool:
    """Whether `op` computes from the `attention_mask` input (through any operations)."""
    seen, stack = set(), [op]
    while stack:
        node = stack.pop()
        if node.get_type_name() == "Parameter":
            if node.get_friendly_name() == "attention_mask":
                return True
            continue
        for value in node.input_values():
            source = value.get_node()
            if id(source) not in seen:
                seen.add(id(source))
                stack.append(source)
    return False


def declare_position_ids(ov_model) -> int:
    """Add a `position_ids` input nothing reads to a graph with neither that input nor a rotary embedding (`Sin` or
    `Cos`) whose positions are a `CumSum` computed from `attention_mask`; return 1 if added, else 0."""
    from openvino import opset13 as ops

    if any(POSITIONS in port.get_names() for port in ov_model.inputs):
        return 0
    ops_ = ov_model.get_ops()
    if any(op.get_type_name() in ("Sin", "Cos") for op in ops_):
        return 0
    if not any(op.get_type_name() == "CumSum" and _reads_mask(op) for op in ops_):
        return 0
    positions = ops.parameter([-1, -1], np.int64, name=POSITIONS)
    positions.output(0).set_names({POSITIONS})
    ov_model.add_parameters([positions])
    return 1


def npuw_forms(ov_model) -> dict[str, int]:
    """Every edit, in place; how many places each changed."""
    return {"identity_reshapes": drop_identity_reshapes(ov_model), "weight_shapes": fold_weight_shapes(ov_model),
            "positions_on_device": gather_positions_on_device(ov_model), "split_kv": slice_split_kv(ov_model),
            "position_ids": declare_position_ids(ov_model)}
