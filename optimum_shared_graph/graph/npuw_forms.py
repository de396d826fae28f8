"""Forms of the graph GenAI's NPU pipeline (NPUW) can partition, computing the same numbers.

A tied head reads the embedding table through the same `Convert` as the embedding `Gather`. NPUW's
LLM pipeline cuts the head into a model of its own (`CutLMHead`, `NPUW_LLM_SHARED_HEAD`, on by default)
and leaves that `Convert` shared between the head model and the decoder models; its online partitioning
then fails while building the decoder's groups with

    Key opset1::MatMul __module.lm_head/... (Parameter, Convert <embedding table>) is not found in a map

(`Snapshot::buildGraph` looks up every reader of a node among its own model's nodes). Measured on
optimum-intel's and this package's artifacts alike: it fails when the decoder reads the table, or the ids
it is gathered with, in a way other than Llama's plain `Gather(Convert(table), Convert(input_ids))`,
and runs once those extra reads are gone:

- `drop_identity_reshapes`: GPT-2 and OPT reshape `input_ids` with `view(-1, seq)` before the `Gather`,
  which the trace writes as `Reshape(input_ids, [-1, 0], special_zero=True)`: on a rank-2 input that is
  the identity, so its readers read the input itself;
- `fold_weight_shapes`: GPT-NeoX-Japanese reads the hidden size as `ShapeOf(Convert(table))` (OpenVINO's
  shape optimisation chose the table as the source of that dimension): the shape of a weight is a
  constant, so the `ShapeOf` becomes that constant.

Both edits are exact (the graph computes the same numbers, and every export is validated against
PyTorch after them); no weight is copied.
"""

from __future__ import annotations

import numpy as np


def _constant(node):
    return node.get_data() if node.get_type_name() == "Constant" else None


def drop_identity_reshapes(ov_model) -> int:
    """Bypass every `Reshape(x, [-1, 0], special_zero=True)` of a rank-2 `x` (the identity); return how many."""
    dropped = 0
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "Reshape" or not op.get_attributes().get("special_zero"):
            continue
        pattern = _constant(op.input_value(1).get_node())
        data = op.input_value(0)
        rank = data.get_partial_shape().rank
        if pattern is None or rank.is_dynamic or rank.get_length() != 2 or list(pattern.reshape(-1)) != [-1, 0]:
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


def npuw_forms(ov_model) -> dict[str, int]:
    """Both edits, in place; how many nodes each changed."""
    return {"identity_reshapes": drop_identity_reshapes(ov_model), "weight_shapes": fold_weight_shapes(ov_model)}
