"""Where a text-generation-shared export spends its time and memory, step by step, beside optimum-intel's own export.

    python benchmarks/export_stages.py                 # Qwen2-0.5B and Qwen3-4B shapes, 4B also under a limit (root)
    python benchmarks/export_stages.py --models qwen2-0.5b --limits none
    python benchmarks/export_stages.py --report-only docs/export-stages.json

For each model shape and each memory limit (`none`, or GiB: a cgroup v1 limit on the process tree, as
`benchmarks/memory.py` sets it), one fresh process runs optimum-intel's `text-generation-with-past` export (its
wall and peak memory), then one runs `optimum_shared_graph.export()` while a thread samples its memory every
50 ms (VmRSS, RssAnon, RssFile from /proc/self/status) and the export marks where each of its steps starts
(`progress.step()`: the plan, optimum-intel's model load, the capture, optimum-intel's conversion and save, the
graph edits, the tokenizer, each validation part's compile and run, the reference, the hashing, the move). Writes
the results to `docs/export-stages.json` and the stage tables into docs/export-cost.md, between its
`<!-- export-stages -->` markers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import children  # noqa: E402
import context  # noqa: E402
import models  # noqa: E402
import memory  # noqa: E402
from memory import Limit, cgroup_available  # noqa: E402

BEGIN, END = "<!-- export-stages -->", "<!-- /export-stages -->"


def measure_in_process(model: str, out: str, weight_format: str, task: str = "text-generation-shared") -> dict:
    """One export in this process (the child's job): each step's start, length and peak memory."""
    start = time.perf_counter()
    samples: list[tuple[float, int, int, int]] = []
    done = threading.Event()

    def sample() -> None:
        keys = ("VmRSS", "RssAnon", "RssFile")
        while not done.is_set():
            fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines()
                          if line.startswith(keys))
            samples.append((time.perf_counter(), *(int(fields[k].split()[0]) // 1024 for k in keys)))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    import optimum_shared_graph as osg
    from optimum_shared_graph import progress

    imported = time.perf_counter()
    with progress.recording_steps() as marks:
        manifest = osg.export(model, out, task=task, weight_format=weight_format, quiet=True)
    end = time.perf_counter()
    time.sleep(0.1)
    done.set()
    marks = [(start, "imports")] + [(imported, marks[0][1])] + marks[1:] + [(end, "end")]
    steps = []
    for (at, name), (until, _) in zip(marks, marks[1:]):
        window = [s for s in samples if at <= s[0] <= until] or [min(samples, key=lambda s: abs(s[0] - at))]
        steps.append({"step": name, "start_s": round(at - start, 2), "seconds": round(until - at, 2),
                      "peak_rss_mb": max(s[1] for s in window), "peak_anon_mb": max(s[2] for s in window),
                      "peak_file_mb": max(s[3] for s in window)})
    v = manifest.validation
    return {"wall_s": round(end - start, 1), "steps": steps, "peak_rss_mb": max(s[1] for s in samples),
            "peak_anon_mb": max(s[2] for s in samples),
            "validation": {"status": v.get("status"), "run": v.get("run"), "greedy_tokens": v.get("greedy_tokens")}}


def with_past(model: Path, out: Path, weight_format: str, limit_gib: float | None, log: Path) -> dict:
    """optimum-intel's own export in a fresh process tree under `limit_gib` (`memory.export`): wall, peak anonymous."""
    row = memory.export(model, out, "text-generation-with-past", weight_format, limit_gib, log)
    return {"completed": row["completed"], "wall_s": row["wall_s"], "peak_anon_mb": row["peak_anon_mb"],
            "error": row.get("error")}


def shared(model: Path, out: Path, weight_format: str, limit_gib: float | None) -> dict:
    """This task's export, measured step by step in a fresh process under `limit_gib`."""
    shutil.rmtree(out, ignore_errors=True)
    limit = Limit(limit_gib, f"osg-stages-{os.getpid()}")
    args = [sys.executable, __file__, "--child", str(model), str(out), weight_format]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=children.child_env(), preexec_fn=limit.enter)
    wall = time.perf_counter() - start
    limit.close()
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        return {"completed": False, "wall_s": round(wall, 1), "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"completed": True, "process_wall_s": round(wall, 1), **row}


def run(args) -> dict:
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for name in args.models:
        model = work / name
        subprocess.run([sys.executable, str(HERE / "models.py"), name, str(model)], check=True, env=children.child_env())
        for limit in args.limits:
            gib = None if limit == "none" else float(limit)
            if gib is not None and (why := cgroup_available()):
                print(f"skipped {name} under {gib:g} GiB: {why}", flush=True)
                continue
            log = work / "logs-stages" / f"with-past-{name}-{limit}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            theirs = with_past(model, work / "stages-with-past", args.weight_format, gib, log)
            ours = shared(model, work / "stages-shared", args.weight_format, gib)
            runs.append({"model": name, "shape": models.describe(name), "limit_gib": gib,
                         "checkpoint_gb": round(sum(p.stat().st_size for p in model.glob("*.safetensors")) / 1e9, 2),
                         "with_past": theirs, "shared": ours})
            print(json.dumps(runs[-1]["with_past"]), json.dumps({k: v for k, v in ours.items() if k != "steps"}), flush=True)
    return {"weight_format": args.weight_format, "runs": runs, "machine": context.machine(),
            "versions": context.versions(), "date": time.strftime("%Y-%m-%d"), "note": args.note}


def render(results: dict) -> list[str]:
    lines = [f"Generated by `python benchmarks/export_stages.py` on {results['date']} (one run; results in "
             f"`docs/export-stages.json`): {context.describe_machine(results['machine'])}. `--weight-format "
             f"{results['weight_format']}`, random-init models with the shapes of public checkpoints saved in fp16; each "
             "export a fresh process, optimum-intel's `text-generation-with-past` right before this task's. Peak memory "
             "per step is sampled every 50 ms: RSS counts the file pages of memory-mapped weights (reclaimed under a "
             "limit), anonymous memory is what cannot be reclaimed."]
    if results.get("note"):
        lines += ["", f"Conditions: {results['note']}"]
    for r in results["runs"]:
        theirs, ours = r["with_past"], r["shared"]
        limit = "no memory limit" if r["limit_gib"] is None else f"under a {r['limit_gib']:g} GiB cgroup limit"
        lines += ["", f"### {r['model']}, {limit}", "",
                  f"{r['shape']['model_type']}, hidden {r['shape']['hidden_size']}, {r['shape']['num_hidden_layers']} "
                  f"layers, vocabulary {r['shape']['vocab_size']:,}; fp16 checkpoint of {r['checkpoint_gb']} GB."]
        if not ours.get("completed"):
            lines += ["", f"text-generation-shared did not complete: {ours.get('error')}"]
            continue
        ratio = ours["process_wall_s"] / theirs["wall_s"] if theirs.get("completed") else None
        lines += ["", f"optimum-intel's export: {theirs['wall_s']:.1f} s" +
                  (f", peak anonymous {theirs['peak_anon_mb']:,} MB" if theirs.get("completed") else f" (failed: {theirs.get('error')})") +
                  f". This task's: {ours['process_wall_s']:.1f} s as a process" +
                  (f" ({ratio:.2f}x)" if ratio else "") +
                  f", validation {ours['validation']['status']} ({_run(ours['validation'])}).", "",
                  "| step | start | seconds | share | peak RSS | peak anonymous | peak file-backed |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        total = sum(s["seconds"] for s in ours["steps"])
        for s in ours["steps"]:
            lines.append(f"| {s['step']} | {s['start_s']:.1f} s | {s['seconds']:.1f} | {100 * s['seconds'] / total:.0f}% | "
                         f"{s['peak_rss_mb']:,} MB | {s['peak_anon_mb']:,} MB | {s['peak_file_mb']:,} MB |")
    v = results["versions"]
    lines += ["", "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + "."]
    return lines


def _run(v: dict) -> str:
    run_ = v.get("run") or {}
    how = "whole" if run_.get("mode") == "whole" else f"{run_.get('parts')} parts"
    return f"{v.get('greedy_tokens')} tokens, {how}"


def write_docs(results: dict, docs: Path) -> None:
    (docs / "export-stages.json").write_text(json.dumps(results, indent=1) + "\n")
    page = docs / "export-cost.md"
    text = page.read_text()
    if BEGIN not in text:
        raise SystemExit(f"error: {page} has no {BEGIN} marker: add the markers where the tables go")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + BEGIN + "\n" + "\n".join(render(results)) + "\n" + END + tail)


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        print(json.dumps(measure_in_process(*sys.argv[2:6])))  # model, out, format[, task]
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["qwen2-0.5b", "qwen3-4b"], choices=list(models.MODELS))
    parser.add_argument("--limits", nargs="+", default=["none"],
                        help="'none' and/or GiB limits, each run for every model (e.g. none 3)")
    parser.add_argument("--weight-format", default="fp16")
    parser.add_argument("--workdir", type=Path, default=HERE / "results")
    parser.add_argument("--docs-dir", type=Path, default=HERE.parent / "docs")
    parser.add_argument("--note", default="", help="the run's conditions, printed on the page")
    parser.add_argument("--report-only", type=Path, help="re-render docs/export-cost.md's tables from a results JSON")
    args = parser.parse_args(argv)
    results = json.loads(args.report_only.read_text()) if args.report_only else run(args)
    write_docs(results, args.docs_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
