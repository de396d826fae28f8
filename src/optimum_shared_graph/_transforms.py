"""Graph transforms applied to optimum-intel's decoder graph."""

from __future__ import annotations

import numpy as np

from ._errors import ModelNotSupportedError

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


def slice_logits_to_last_position(model) -> None:
    """Compute logits for the last position only: gather the last position before the vocabulary projection.

    The graph keeps every input; `logits` becomes `[batch, 1, vocab]` for any prompt length. Slicing
    before the projection (not after) is what saves the `seq x hidden x vocab` multiply and the
    `seq x vocab` output buffer. Left padding keeps the last real token at the last position, so
    batches are handled too.
    """
    from openvino import opset13 as ops

    matmul, idx = find_logits_projection(model)
    port = matmul.input(idx)
    source = port.get_source_output()
    rank = source.get_partial_shape().rank
    if rank.is_dynamic or rank.get_length() != 3:
        raise ModelNotSupportedError(
            f"the vocabulary projection input has rank {rank}, expected 3 ([batch, seq, hidden]); "
            "export with --logits all for this model"
        )
    # Gather with index [-1] (not Slice) so the sequence axis becomes exactly 1, not the interval 0..1.
    sliced = ops.gather(source, ops.constant(np.array([-1], dtype=np.int64)), ops.constant(np.array(1, dtype=np.int64)))
    sliced.set_friendly_name("shared_graph/last_position")
    port.replace_source_output(sliced.output(0))
    model.validate_nodes_and_infer_types()
