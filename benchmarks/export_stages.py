"""Where one text-generation-shared export spends its time and memory, stage by stage.

    python benchmarks/export_stages.py MODEL_DIR OUT_DIR [--weight-format fp16]

Runs `optimum_shared_graph.export()` in this process while a thread samples its memory every 50 ms
(VmRSS, RssAnon, RssFile from /proc/self/status), and prints, for each stage of the export (the progress
stages of `pipeline/export.py`, and the validation's own compile and run), when it started and its peak
resident, anonymous and file-backed memory. The figures explain the export's totals against
optimum-intel's own export (`python benchmarks/run.py --suite export`).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--weight-format", default="fp16")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    samples: list[tuple[float, int, int, int]] = []
    marks: list[tuple[float, str]] = []

    def sample() -> None:
        keys = ("VmRSS", "RssAnon", "RssFile")
        while True:
            fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
                          if line.startswith(keys))
            samples.append((time.perf_counter() - start, *(int(fields[k].split()[0]) // 1024 for k in keys)))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    from optimum_shared_graph import progress
    from optimum_shared_graph.pipeline import validate

    stage = progress.stage
    progress.stage = lambda name: (marks.append((time.perf_counter() - start, name)), stage(name))[1]
    validate_export = validate.validate_export  # stage 5, called through the module by pipeline/export.py

    def timed_validation(*a, **k):
        marks.append((time.perf_counter() - start, "validation: compile and run"))
        try:
            return validate_export(*a, **k)
        finally:
            marks.append((time.perf_counter() - start, "validation done"))

    validate.validate_export = timed_validation
    import optimum_shared_graph as osg

    marks.append((time.perf_counter() - start, "imports done"))
    osg.export(args.model, args.out, weight_format=args.weight_format, quiet=True)
    marks.append((time.perf_counter() - start, "end"))
    time.sleep(0.1)
    rows = []
    for (at, name), (until, _) in zip(marks, marks[1:]):
        window = [s for s in samples if at <= s[0] <= until] or [(at, 0, 0, 0)]
        rows.append({"stage": name, "start_s": round(at, 1), "seconds": round(until - at, 1),
                     "peak_rss_mb": max(s[1] for s in window), "peak_anon_mb": max(s[2] for s in window),
                     "peak_file_mb": max(s[3] for s in window)})
    for r in rows:
        print(f"{r['start_s']:7.1f} s  {r['stage']:30s} {r['seconds']:6.1f} s   peak RSS {r['peak_rss_mb']:6,} MB"
              f"  anonymous {r['peak_anon_mb']:6,} MB  file {r['peak_file_mb']:6,} MB")
    print(json.dumps({"model": args.model, "weight_format": args.weight_format, "stages": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
