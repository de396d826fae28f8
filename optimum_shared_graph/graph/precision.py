"""fp16 weights without fp16 rotary frequencies: the vectors and scalars of a graph keep their float32 values.

`--weight-format fp16` saves the graph with OpenVINO's `compress_to_fp16`, which stores every float32
constant in 16 bits, the weight matrices and also the small constants computed at conversion: the rotary
embedding's inverse frequencies, attention scales, norm epsilons. Rounding the inverse frequencies to fp16
(a relative error up to 2^-11) shifts every rotary angle by an amount that grows with the position. Measured
on a random-init bitnet at microsoft/bitnet-b1.58-2B-4T's widths (6 layers, fp16 checkpoint): the graph with
every constant in fp16 differs from PyTorch by 0.0996 in the last logits of a 10-token prompt (max |logit| 21),
the same graph with its 27 vector and scalar constants kept at float32 precision by 0.0023, the fp32 graph by
0.0012; optimum-intel's fp16 artifacts round the rotary frequencies the same way.

`keep_vectors_exact(model)` rewrites each float32 constant with at most one dimension above 1 (a vector or a
scalar, never a weight matrix or an embedding table) whose value fp16 does not hold exactly as two constants
that it does hold closely: `hi` (the value rounded to fp16) and `lo` (the remainder, about 2^-11 of it), combined
as `hi - (-lo)` (`Subtract(hi, Negative(lo))`), so that after `compress_to_fp16` the float32 result is the
original to about 2^-22. OpenVINO folds it at compile time. The weights are compressed as before; the added
bytes are two fp16 copies of some vectors.

Why `Subtract(hi, Negative(lo))` and not `Add(hi, lo)`: GenAI's NPU pipeline (NPUW) rewrites a sliding-window
mask for its static cache (its `SlidingWindowMask` pass). Its pattern names the past length once for the mask's
key range `Range(0, past + new)` and its query positions, OpenVINO's matcher keeps whichever value it bound last,
and which one that is depends on details of the graph outside the mask: with the rotary frequencies as
`Add(hi, lo)` (or `Subtract(hi, -lo)`) of two decompressed constants it kept the prompt's length for cohere2
(8 layers, 3 sliding-window and 1 full alternating; hidden size 64 and Command R7B's widths alike), built an empty
`[0, 1]` padding mask and failed at compile ("Argument shapes are inconsistent"); as `Subtract(hi, Negative(lo))`,
as one float32 constant, or as one fp16 constant (optimum-intel's artifact) it runs, with PyTorch's tokens
(`tests/test_precision.py::test_fp16_cohere2_runs_through_npuw`). Writing the key range's end as `new + past`
instead made tiny cohere2, gemma2 and starcoder2 compile but gave gemma4_text wrong tokens through NPUW, so it is
not done; gemma2 (6 layers) still fails there. Starcoder2 (tiny with 6 layers, and at starcoder2-3b's widths) failed
the same way, optimum-intel's artifact too: there it is the rewrite's padding column under NPUW's folding, and
`architectures/starcoder2.py` writes the window so that the rewrite does not apply (`graph/sliding_window.py`).
"""

from __future__ import annotations

import numpy as np

# a constant with more than one dimension above 1 is a weight (matrix, embedding table, experts' stack, conv
# kernel): fp16 as --weight-format asks
_MAX_WIDE_DIMS = 1


def keep_vectors_exact(model) -> int:
    """Rewrite `model`'s float32 vectors and scalars that fp16 rounds into fp16-exact pairs (`hi - (-lo)`), in
    place, before it is saved with `compress_to_fp16`; return how many were rewritten."""
    import openvino as ov
    from openvino import opset13 as ops

    rewritten = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Constant" or node.get_element_type() != ov.Type.f32:
            continue
        shape = list(node.get_output_shape(0))
        if sum(d > 1 for d in shape) > _MAX_WIDE_DIMS:
            continue
        value = np.array(node.get_data(), dtype=np.float32)
        with np.errstate(over="ignore"):
            hi = value.astype(np.float16).astype(np.float32)
        if not np.all(np.isfinite(hi)) or not np.all(np.isfinite(value)):
            continue  # beyond fp16's range: compress_to_fp16 keeps such constants as they are
        lo = value - hi
        if not np.any(lo):
            continue  # fp16 holds it exactly (an fp16 checkpoint's norm weights)
        pair = ops.subtract(ops.constant(hi.reshape(shape)), ops.negative(ops.constant(lo.reshape(shape))))
        pair.set_friendly_name(node.get_friendly_name())
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(pair.output(0))
        rewritten += 1
    return rewritten
