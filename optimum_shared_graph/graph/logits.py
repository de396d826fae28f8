"""The logits slice: the vocabulary projection computed for one position only (`--logits last`)."""

from __future__ import annotations

import numpy as np

from ..errors import ModelNotSupportedError

# Ops that may sit between the vocabulary projection and the `logits` output and act on each
# position independently (casts, soft-capping, scaling, bias), so slicing before them is exact.
_POSITIONWISE = {"Convert", "Multiply", "Divide", "Add", "Subtract", "Tanh", "Clamp", "Reshape"}


def _is_constant_like(output, depth: int = 0) -> bool:
    """True when a value is a weight: a Constant, possibly behind decompression ops."""
    node = output.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        return True
    if depth >= 8 or kind not in {"Convert", "Subtract", "Multiply", "Reshape", "Transpose"}:
        return False
    return all(_is_constant_like(inp.get_source_output(), depth + 1) for inp in node.inputs())


def find_logits_projection(model):
    """Return the MatMul that projects hidden states onto the vocabulary, and its activation input index."""
    try:
        result = model.output("logits")
    except RuntimeError as err:
        raise ModelNotSupportedError(
            "the exported graph has no 'logits' output; only causal language models can use --task text-generation-shared"
        ) from err
    node = result.get_node().input(0).get_source_output().get_node()  # past the Result
    for _ in range(16):
        kind = node.get_type_name()
        if kind == "MatMul":
            for idx, inp in enumerate(node.inputs()):
                if not _is_constant_like(inp.get_source_output()):
                    return node, idx
            break
        if kind not in _POSITIONWISE:
            break
        # Follow the data input: the non-constant one.
        data_inputs = [i for i in node.inputs() if not _is_constant_like(i.get_source_output())]
        if len(data_inputs) != 1:
            break
        node = data_inputs[0].get_source_output().get_node()
    raise ModelNotSupportedError(
        "could not find the vocabulary projection feeding 'logits' in the exported graph; "
        "export with --logits all for this model"
    )


def slice_logits(model, index=None, *, name: str = "shared_graph/last_position") -> None:  # noqa: E501 (the name is LAST_POSITION)
    """Compute logits for one position only: gather it before the vocabulary projection, in place.

    Slicing before the projection (not after) is what saves the `seq x hidden x vocab` multiply and
    the `seq x vocab` output buffer. `logits` becomes `[batch, 1, vocab]`.

    Args:
        model: the `openvino.Model` whose `logits` output to slice.
        index: a one-element i64 graph value, the position on the sequence axis to keep; None keeps
            the last position (left padding keeps the last real token there, so batches are handled).
            A static graph passes the last slot its attention mask marks as real.
        name: the friendly name of the gather node.
    """
    from openvino import opset13 as ops

    matmul, idx = find_logits_projection(model)
    port = matmul.input(idx)
    source = port.get_source_output()
    shape = source.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() != 3:
        raise ModelNotSupportedError(
            f"the vocabulary projection input has shape {shape}, expected [batch, seq, hidden]; "
            "export with --logits all for this model"
        )
    if index is None:  # Gather with index [-1] (not Slice) so the sequence axis becomes exactly 1, not 0..1
        index = ops.constant(np.array([-1], dtype=np.int64))
    sliced = ops.gather(source, index, ops.constant(np.array(1, dtype=np.int64)))
    sliced.set_friendly_name(name)
    port.replace_source_output(sliced.output(0))
    model.validate_nodes_and_infer_types()


LAST_POSITION = "shared_graph/last_position"


def is_sliced(model) -> bool:
    """Whether `slice_logits` already ran on this graph (its gather node is there)."""
    return any(node.get_friendly_name() == LAST_POSITION for node in model.get_ops())
