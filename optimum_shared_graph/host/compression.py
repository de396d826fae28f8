"""NNCF's weight compression: a large weight compressed a slice of rows at a time, its compressed values in a file."""

from __future__ import annotations

import contextlib
import itertools
import os
from pathlib import Path
from typing import Iterator

from ._swap import replaced

# NNCF compresses a weight with temporaries of about 2.3x its float32 size (measured: a 151,936 x 2,048 float16
# matrix, 594 MB, took 2.7 GB above its own bytes), so the widest weights of a model (the vocabulary's, a layer's
# stacked experts) set the export's peak; compressed a slice of this many elements at a time, they hold ~300 MB
SLICE_ELEMENTS = 1 << 25


@contextlib.contextmanager
def weights_compressed_in_slices(scratch: Path, slice_elements: int | None = None) -> Iterator[None]:
    """While active, NNCF's integer compression of an OpenVINO weight of more than `slice_elements` elements
    (`SLICE_ELEMENTS` when None, read on entry), without precomputed scales, compresses it a slice of its first axis
    at a time, when that axis is not one it reduces over (each row's groups are quantized on their own, so the values
    are the same as whole), and writes
    each slice's compressed values and zero points into one file per weight, in a directory of its own under
    `scratch`; the weight's new constants are those files' memory-mapped pages, not new anonymous memory. Any
    other weight is NNCF's own path. On exit NNCF's function is back and the files are removed: the graphs that
    used them must be saved by then (optimum-intel compresses a graph just before it saves it)."""
    import shutil
    import tempfile

    import numpy as np
    import openvino as ov
    from nncf.quantization.algorithms.weight_compression import openvino_backend
    from nncf.quantization.algorithms.weight_compression.constants import MIN_INPUT_SIZE_FOR_OPTIMIZED_COMPRESSION
    from nncf.quantization.algorithms.weight_compression.parameters import CompressedWeight
    from nncf.tensor import Tensor

    slice_elements = slice_elements or SLICE_ELEMENTS
    original = openvino_backend.compress_weight
    numbered = itertools.count()
    mapped = []  # the files' mappings: an OpenVINO tensor over a NumPy array does not keep the array alive

    def compress_weight(weight, reduction_axes, config, precomputed_compressed_weight=None):
        axes = (reduction_axes,) if isinstance(reduction_axes, int) else tuple(reduction_axes or ())
        data = weight.data
        if (precomputed_compressed_weight is not None or not config.is_integer or config.is_codebook
                or config.is_symmetric_represented_by_unsigned or config.num_bits not in (4, 8)
                or not isinstance(data, ov.Tensor) or data.get_element_type() not in (ov.Type.f16, ov.Type.f32)
                or weight.size <= slice_elements or len(weight.shape) < 2 or not axes
                or any(a % len(weight.shape) == 0 for a in axes)):
            return original(weight, reduction_axes, config, precomputed_compressed_weight)
        values = data.data  # the constant's own memory, viewed
        rows = values.shape[0]
        per_row = values.size // rows
        # each slice large enough for NNCF's OpenVINO implementation (the whole weight's; smaller inputs go to its
        # NumPy one, whose rounding can differ), an even number of rows (4-bit values pack into whole bytes), and a
        # short last slice joined to the one before
        step = max(slice_elements // per_row, -(-MIN_INPUT_SIZE_FOR_OPTIMIZED_COMPRESSION // per_row), 1)
        step += step % 2
        starts = list(range(0, rows, step))
        if len(starts) > 1 and (rows - starts[-1]) * per_row < MIN_INPUT_SIZE_FOR_OPTIMIZED_COMPRESSION:
            starts.pop()
        kind = {(4, True): ov.Type.u4, (4, False): ov.Type.i4, (8, True): ov.Type.u8,
                (8, False): ov.Type.i8}[config.num_bits, config.is_asym_mode]
        path = Path(directory) / f"weight-{next(numbered)}"
        files = {}  # "tensor" / "zero_point": [open file, shape], written slice by slice
        scales = []
        try:
            for start, end in zip(starts, [*starts[1:], rows]):
                part = original(Tensor(ov.Tensor(values[start:end], shared_memory=True)), reduction_axes, config)
                scales.append(part.scale.as_numpy_tensor().data)
                for name in ("tensor", "zero_point"):
                    got = getattr(part, name)
                    if got is None:
                        continue
                    if name not in files:  # the weight's shape: its rows, the first slice's other axes
                        files[name] = [open(path.with_suffix(f".{name}"), "wb"), [rows, *got.shape[1:]]]
                    # 4-bit values come as OpenVINO tensors of packed bytes, 8-bit ones as NumPy arrays (zero points
                    # of a wider type)
                    files[name][0].write(got.data.data if isinstance(got.data, ov.Tensor) else
                                         got.data.astype(kind.to_dtype()).tobytes())
        except BaseException:
            for file, _ in files.values():
                file.close()
            raise
        out = {}
        for name, (file, shape) in files.items():
            with file:  # written back before it is mapped: clean pages, which the kernel can drop under a memory
                file.flush()  # limit (dirty ones it must write first, and a cgroup's limit can kill before it has)
                os.fsync(file.fileno())
            mapped.append(np.memmap(file.name, np.uint8, "r"))
            out[name] = Tensor(ov.Tensor(mapped[-1], shape, kind))
        return CompressedWeight(out["tensor"], Tensor(np.concatenate(scales)), out.get("zero_point"))

    scratch.mkdir(parents=True, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="compressed-", dir=scratch)
    try:
        with replaced(openvino_backend, "compress_weight", compress_weight):
            yield
    finally:
        mapped.clear()  # unmapped once nothing else holds them
        shutil.rmtree(directory, ignore_errors=True)
