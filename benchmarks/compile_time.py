"""Time `ov.Core().compile_model()` of one layout's graph files, in a fresh process (no model cache).

Usage: python benchmarks/compile_time.py GRAPH.xml [GRAPH.xml ...]  -> one JSON line: {"compile_s": ...}
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import openvino as ov

    core = ov.Core()
    start = time.perf_counter()
    compiled = [core.compile_model(xml, "CPU") for xml in argv]
    elapsed = time.perf_counter() - start
    # VmHWM: this process image's own peak (ru_maxrss would include the parent's size before exec).
    hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:")) / 1024
    print(json.dumps({"compile_s": elapsed, "graphs": len(compiled), "peak_mb": hwm}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
