"""Measure the machine's memory read bandwidth: summing a large array, on 1 thread and on every core.

Prints one JSON line: {"read_gb_s": best of the two, "one_thread_gb_s": ..., "all_threads_gb_s": ..., "threads": n}.
The array (1 GiB by default) is far larger than the caches, so every byte comes from DRAM.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def _rate(fn, nbytes: int, reps: int = 5) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def main(argv: list[str]) -> int:
    mib = int(argv[0]) if argv else 1024
    data = np.ones(mib * 2**20 // 4, dtype=np.float32)
    data.sum()  # touch every page
    threads = os.cpu_count() or 1
    chunks = np.array_split(data, threads)
    with ThreadPoolExecutor(threads) as pool:  # numpy releases the GIL inside reductions
        one = _rate(data.sum, data.nbytes)
        many = _rate(lambda: list(pool.map(np.sum, chunks)), data.nbytes)
    print(json.dumps({"read_gb_s": max(one, many), "one_thread_gb_s": one, "all_threads_gb_s": many,
                      "threads": threads, "array_mib": mib}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
