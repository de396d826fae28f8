"""Does the export fit? Each export run under a hard memory limit on its process tree, as a user's machine or
container would impose it: which completes, and how long it takes. Writes `docs/benchmarks-memory.md`.

    python benchmarks/memory.py                       # Qwen3-4B shape: fp16, int8, int4; ~45 min on 2 cores
    python benchmarks/memory.py --formats fp16 --model qwen2-0.5b --limits 1 2

A limit is a cgroup (v1 memory controller, as root) holding the export's process tree: anonymous memory counts
against it and cannot be reclaimed (there is no swap); page cache counts too but is reclaimed under pressure, so
memory-mapped weights fit in a limit smaller than the model. The figure a user needs is the smallest limit under
which an export completes, not its peak RSS (which counts those reclaimable file pages).

For each weight format: optimum-intel's `text-generation-with-past` at increasing limits until one completes
(its smallest passing limit L), then `text-generation-shared` (validation on, default flags) at the target
`max(L + 1 GiB, 1.25 L)` and at L; then both without a limit, side by side. Every run is a fresh
`optimum-cli` process; its artifact is removed after its manifest is read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import children  # noqa: E402
import context  # noqa: E402
import models  # noqa: E402

CGROUP = Path("/sys/fs/cgroup/memory")
GIB = 2**30
# The export's wall under a limit of optimum-intel's smallest passing one + 1 GiB, at most this many times optimum-intel's there.
MEMORY_WALL_TARGET = 2.0


def cgroup_available() -> str | None:
    """Why a memory limit cannot be set here, or None when it can."""
    if not (CGROUP / "memory.limit_in_bytes").exists():
        return f"no cgroup v1 memory controller at {CGROUP}"
    if os.geteuid() != 0:
        return "setting a memory limit needs root"
    return None


class Limit:
    """A cgroup with a memory limit; a child moved into it (before exec) runs under it with its whole tree."""

    def __init__(self, gib: float | None, name: str):
        self.gib, self.path = gib, None
        if gib is not None:
            self.path = CGROUP / name
            if self.path.exists():
                self.path.rmdir()
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(int(gib * GIB)))

    def enter(self) -> None:  # runs in the child, before exec
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def oom_kills(self) -> int:
        if self.path is None:
            return 0
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return int((self.path / "memory.failcnt").read_text()) and -1

    def close(self) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def export(model: Path, out: Path, task: str, weight_format: str, limit_gib: float | None, log: Path, *,
           whole: bool = False) -> dict:
    """One `optimum-cli export openvino` under `limit_gib` (None: no limit): completed or not, wall, peak anonymous.
    `whole`: validation planned as if memory were plentiful (`OPTIMUM_SHARED_GRAPH_MEMORY`), so the graph is
    compiled whole, as before validation could run in parts."""
    shutil.rmtree(out, ignore_errors=True)
    args = ["optimum-cli", "export", "openvino", "-m", str(model), "--task", task, "--weight-format", weight_format]
    if task == "text-generation-shared":
        args.append("--quiet")
    limit = Limit(limit_gib, f"osg-memory-{os.getpid()}")
    start = time.perf_counter()
    with open(log, "w") as err:
        err.write(f"$ {' '.join(args)} {out}  # limit {limit_gib} GiB\n")
        err.flush()
        env = children.child_env()
        if whole:
            env["OPTIMUM_SHARED_GRAPH_MEMORY"] = str(2**50)
        proc = subprocess.Popen([*args, str(out)], stdout=err, stderr=err, env=env, preexec_fn=limit.enter)
        peak_anon = 0.0
        while proc.poll() is None:
            anon = children._rss_anon_mb(proc.pid)
            if anon == anon:
                peak_anon = max(peak_anon, anon)
            time.sleep(0.1)
    wall = time.perf_counter() - start
    kills = limit.oom_kills()
    limit.close()
    row = {"task": task + (" (whole-graph validation)" if whole else ""), "weight_format": weight_format,
           "limit_gib": limit_gib, "returncode": proc.returncode,
           "completed": proc.returncode == 0, "wall_s": round(wall, 1), "peak_anon_mb": round(peak_anon),
           "oom_kills": kills}
    manifest = out / "shared_graph.json"
    if manifest.is_file():
        data = json.loads(manifest.read_text())
        v = data.get("validation", {})
        row["validation"] = {k: v.get(k) for k in ("status", "run", "greedy_tokens", "max_abs_diff_prefill",
                                                    "max_abs_diff_decode", "top1_agreement")}
    if not row["completed"]:
        lines = [line for line in log.read_text().splitlines() if line.startswith("error:")]
        row["error"] = lines[-1][:300] if lines else ("killed by the kernel (out of memory)" if proc.returncode == -9
                                                      else f"exit code {proc.returncode}")
    shutil.rmtree(out, ignore_errors=True)
    print(json.dumps(row), flush=True)
    return row


def run(args) -> dict:
    why = cgroup_available()
    if why:
        raise SystemExit(f"error: {why}: the memory suite runs exports under a cgroup memory limit")
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    model = work / args.model
    subprocess.run([sys.executable, str(HERE / "models.py"), args.model, str(model)], check=True, env=children.child_env())
    logs = work / "logs-memory"
    logs.mkdir(exist_ok=True)
    out = work / "memory-artifact"
    rows: list[dict] = []

    def one(task, fmt, limit, whole=False):
        tag = f"{'shared' if task.endswith('shared') else 'with-past'}{'-whole' if whole else ''}-{fmt}-{limit or 'none'}"
        rows.append(export(model, out, task, fmt, limit, logs / f"{tag}.log", whole=whole))
        return rows[-1]

    for fmt in args.formats:
        smallest = None
        for limit in args.limits:
            if one("text-generation-with-past", fmt, limit)["completed"]:
                smallest = limit
                break
        if smallest is None:
            continue
        target = max(smallest + 1, 1.25 * smallest)
        one("text-generation-shared", fmt, target)
        if args.whole_too:
            one("text-generation-shared", fmt, target, whole=True)
        if args.at_smallest:
            one("text-generation-shared", fmt, smallest)
    if args.unlimited:
        for fmt in args.formats[:1]:
            for _ in range(args.rounds):
                one("text-generation-with-past", fmt, None)
                one("text-generation-shared", fmt, None)
    return {"model": args.model, "shape": models.describe(args.model), "rows": rows, "machine": context.machine(),
            "versions": context.versions(), "checkpoint_gb": round(sum(p.stat().st_size for p in model.glob("*.safetensors")) / 1e9, 2)}


def write_page(results: list[dict], docs: Path, note: str = "") -> Path:
    lines = ["# Export under a memory limit", "",
             f"Generated by `python benchmarks/memory.py` on {time.strftime('%Y-%m-%d')}: "
             f"{context.describe_machine(results[0]['machine'])}. Each export is a fresh `optimum-cli export openvino` "
             "process tree under a cgroup memory limit (anonymous memory cannot be reclaimed, there is no swap; page "
             "cache is charged and reclaimed under pressure). `completed` means the artifact was written; for "
             "`text-generation-shared` with its validation passed. Random-init models with the shapes of public "
             "checkpoints, saved in fp16.", ""]
    if note:
        lines += [f"Conditions: {note}", ""]
    for res in results:
        lines += [f"## {res['model']}", "",
                  f"{res['shape']['model_type']}, hidden {res['shape']['hidden_size']}, {res['shape']['num_hidden_layers']} "
                  f"layers, vocabulary {res['shape']['vocab_size']:,}; fp16 checkpoint of {res['checkpoint_gb']} GB.", "",
                  "| task | weight format | limit | completed | wall | peak anonymous | validation |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in res["rows"]:
            v = r.get("validation") or {}
            run_ = v.get("run") or {}
            how = ""
            if v:
                how = f"{v.get('status')}, {v.get('greedy_tokens')} tokens"
                if run_:
                    how += f", {'whole' if run_.get('mode') == 'whole' else str(run_.get('parts')) + ' parts'}"
            elif not r["completed"]:
                how = r.get("error", "")
            limit = "none" if r["limit_gib"] is None else f"{r['limit_gib']:g} GiB"
            lines.append(f"| {r['task']} | {r['weight_format']} | {limit} | {'yes' if r['completed'] else 'no'} | "
                         f"{r['wall_s']:.0f} s | {r['peak_anon_mb']:,} MB | {how} |")
        lines += ["", "Targets (the first row at each limit where a limit was run twice):", "",
                  "| figure | measured | target | |", "| --- | --- | --- | --- |"]
        lines += _targets(res["rows"])
        lines.append("")
    lines += ["Where a target is not met, [What an export costs](export-cost.md) has the export's steps under the same "
              "limit, side by side with optimum-intel's, and what bounds them.", ""]
    v = results[0]["versions"]
    lines.append("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + ".")
    page = docs / "benchmarks-memory.md"
    page.write_text("\n".join(lines) + "\n")
    return page


def _targets(rows: list[dict]) -> list[str]:
    out = []
    for fmt in dict.fromkeys(r["weight_format"] for r in rows):
        ours = [r for r in rows if r["weight_format"] == fmt and r["task"] == "text-generation-shared" and r["limit_gib"]]
        theirs = [r for r in rows if r["weight_format"] == fmt and r["task"].endswith("past") and r["limit_gib"] and r["completed"]]
        if not theirs:
            continue
        base = min(theirs, key=lambda r: r["limit_gib"])
        target = max(base["limit_gib"] + 1, 1.25 * base["limit_gib"])
        at = [r for r in ours if r["limit_gib"] == target]
        if at:
            r = at[0]
            # validated: passed, or recorded for quantized weights (compared with PyTorch, not enforced)
            ok = r["completed"] and (r.get("validation") or {}).get("status") in ("passed", "recorded")
            out.append(f"| {fmt}: shared completes, validated, under {target:g} GiB | {'yes' if ok else 'no'} | yes | "
                       f"{'met' if ok else '**not met**'} |")
            ratio = r["wall_s"] / base["wall_s"]
            out.append(f"| {fmt}: its wall / optimum-intel's at {base['limit_gib']:g} GiB | {ratio:.2f}x | <= 2x | "
                       f"{'met' if ok and ratio <= MEMORY_WALL_TARGET else '**not met**'} |")
    free = [r for r in rows if r["limit_gib"] is None and r["completed"]]
    ours = [r["wall_s"] for r in free if r["task"] == "text-generation-shared"]
    theirs = [r["wall_s"] for r in free if r["task"].endswith("past")]
    if ours and theirs:  # rounds ran optimum-intel's export, then ours: paired ratios, as the other pages give them
        paired = sorted(o / t for o, t in zip(ours, theirs))
        ratio = paired[len(paired) // 2] if len(paired) % 2 else sum(paired[len(paired) // 2 - 1:len(paired) // 2 + 1]) / 2
        out.append(f"| no limit: shared wall / optimum-intel's, median of {len(paired)} paired rounds "
                   f"({', '.join(f'{p:.2f}' for p in paired)}) | {ratio:.2f}x | | |")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-4b", choices=list(models.MODELS))
    parser.add_argument("--formats", nargs="+", default=["fp16", "int8", "int4"])
    parser.add_argument("--limits", nargs="*", type=float, default=[2, 3, 4, 6, 8],
                        help="GiB limits tried for optimum-intel's export, smallest first")
    parser.add_argument("--at-smallest", action="store_true", help="also run the shared export at optimum-intel's limit")
    parser.add_argument("--whole-too", action="store_true",
                        help="also run the shared export at the target with the graph compiled whole for validation")
    parser.add_argument("--unlimited", action="store_true", help="also time both exports without a limit")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=HERE / "results")
    parser.add_argument("--docs-dir", type=Path, default=HERE.parent / "docs")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--report-only", type=Path, nargs="+", help="re-render the page from results JSON files")
    parser.add_argument("--note", default="", help="the runs' conditions, printed on the page (what else ran)")
    args = parser.parse_args(argv)
    if args.report_only:
        results = [json.loads(p.read_text()) for p in args.report_only]
    else:
        results = [run(args)]
        path = args.json or args.workdir / f"results-memory-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        path.write_text(json.dumps(results[0], indent=1))
    print(write_page(results, args.docs_dir, args.note))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
