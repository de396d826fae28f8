"""Time `ov.Core().compile_model()` of one layout's graph files in a fresh process (no model cache), and the
time until each graph has run once ("ready": the CPU plugin defers part of its work, such as weight
repacking for dynamic shapes, to the first inference).

Usage: python benchmarks/compile_time.py GRAPH.xml [GRAPH.xml ...]
Prints one JSON line: {"compile_s": ..., "ready_s": ... or null, "graphs": n, "peak_mb": VmHWM}.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def tiny_inputs(compiled) -> dict:
    """One-token inputs (a one-token past where the graph takes one); zeros, shapes from the graph."""
    has_past = any(p.get_any_name().startswith("past_key_values") for p in compiled.inputs)
    feed = {}
    for port in compiled.inputs:
        name = port.get_any_name()
        shape = [d.get_length() if d.is_static else 1 for d in port.get_partial_shape()]
        if name == "attention_mask" and has_past and not port.get_partial_shape()[-1].is_static:
            shape[-1] = 2
        dtype = port.get_element_type().to_dtype()
        feed[name] = np.ones(shape, dtype=dtype) if name == "attention_mask" else np.zeros(shape, dtype=dtype)
    return feed


def main(argv: list[str]) -> int:
    import openvino as ov

    core = ov.Core()
    start = time.perf_counter()
    compiled = [core.compile_model(xml, "CPU") for xml in argv]
    compile_s = time.perf_counter() - start
    try:
        for c in compiled:
            c.create_infer_request().infer(tiny_inputs(c))
        ready_s = time.perf_counter() - start
    except Exception as err:  # a graph whose inputs this generic feed does not fit
        print(f"first inference skipped: {err}", file=sys.stderr)
        ready_s = None
    # VmHWM: this process image's own peak (ru_maxrss would include the parent's size before exec).
    hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")) / 1024
    print(json.dumps({"compile_s": compile_s, "ready_s": ready_s, "graphs": len(compiled), "peak_mb": hwm}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
