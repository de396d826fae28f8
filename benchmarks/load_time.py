"""Load time of `optimum_shared_graph.runtime(path)` against `OVModelForCausalLM.from_pretrained(path)` on
existing artifacts, each load in a fresh process, and the page `docs/benchmarks-load.md`.

A load is timed from the call until it returns the compiled model (read the manifest and check the graph
files, read the graph, compile it), with the same `ov_config` for both; imports are done before the clock
starts. Rows, for `runtime()`:

- warm: the graph files were verified before on this machine (the cache of verified files holds them);
- cold: the cache is empty, as at the first load of a copied artifact (the load hashes every graph file);
- full: `OPTIMUM_SHARED_GRAPH_VERIFY=full`, every graph file hashed at every load (the behaviour before the cache).

Each round runs every row once, in a rotated order; the page gives medians and per-round paired ratios of
the wall time and of the loading process's CPU time (less disturbed by other work on a shared machine).

Usage:
    python benchmarks/load_time.py                       # both shapes, 5 rounds, writes docs/benchmarks-load.md
    python benchmarks/load_time.py --rounds 3 --shape qwen2-0.5b=/path/to/artifact
    python benchmarks/load_time.py --report-only /tmp/load-time-results.json   # the page from a run's results
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))  # the source tree, as in the children

import children  # noqa: E402
import context  # noqa: E402

DEFAULT_SHAPES = {
    "qwen2-0.5b": Path("/work/bench/artifacts/qwen2-0.5b/shared"),
    "qwen3-4b": Path("/work/bench/artifacts/qwen3-4b/shared"),
}
OV_CONFIG = {"PERFORMANCE_HINT": "LATENCY"}  # optimum-intel's own default, given to both explicitly
ROWS = ("optimum-intel", "warm", "cold", "full")
# Beside them, where the page cache can be dropped (root): the same loads with the graph files on disk only.
DISK_ROWS = ("optimum-intel-disk", "cold-disk")
LABELS = {
    "optimum-intel": "`OVModelForCausalLM.from_pretrained(path)`",
    "warm": "`runtime(path)`, warm (verified before)",
    "cold": "`runtime(path)`, cold (cache empty: first load of a copy)",
    "full": "`runtime(path)`, full check (`OPTIMUM_SHARED_GRAPH_VERIFY=full`)",
    "optimum-intel-disk": "`OVModelForCausalLM.from_pretrained(path)`, page cache dropped",
    "cold-disk": "`runtime(path)`, cold, page cache dropped",
}
BASE = {"optimum-intel-disk": "optimum-intel-disk", "cold-disk": "optimum-intel-disk"}


def warm_page_cache(path: Path) -> None:
    """Read every graph file of the artifact through, so the page cache holds all of it (an OpenVINO load
    alone reads only part of the `.bin` before the first inference)."""
    for name in ("openvino_model.xml", "openvino_model.bin"):
        with open(path / name, "rb") as fh:
            while fh.read(64 << 20):
                pass


def drop_page_cache() -> bool:
    """Drop the kernel's page cache (root only); False where the machine does not allow it."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------------ child


def child(row: str, path: str, cache_dir: str) -> int:
    """Load `path` as `row` says, print {"load_s": wall seconds, "cpu_s": CPU seconds of every thread}."""
    os.environ["OPTIMUM_SHARED_GRAPH_CACHE_DIR"] = cache_dir
    row = row.removesuffix("-disk")
    if row == "full":
        os.environ["OPTIMUM_SHARED_GRAPH_VERIFY"] = "full"
    else:
        os.environ.pop("OPTIMUM_SHARED_GRAPH_VERIFY", None)
    import openvino  # noqa: F401
    import transformers  # noqa: F401
    from optimum.intel import OVModelForCausalLM

    import optimum_shared_graph as osg
    import optimum_shared_graph.runtimes.openvino  # noqa: F401  (the provider's module, imported by both)

    cpu = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    if row == "optimum-intel":
        model = OVModelForCausalLM.from_pretrained(path, device="CPU", ov_config=dict(OV_CONFIG))
    else:
        model = osg.runtime(path, device="CPU", ov_config=dict(OV_CONFIG))
    load_s = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
    if getattr(model, "request", None) is None:
        raise SystemExit("the model was not compiled at load")
    answer = {"load_s": load_s, "cpu_s": cpu_s}
    if row == "warm":  # the check on its own, as runtime() ran it: the cache as it was, nothing hashed
        start = time.perf_counter()
        osg.read_manifest(path)
        answer["check_s"] = time.perf_counter() - start
    print(json.dumps(answer))
    return 0


# ----------------------------------------------------------------------------------------- parent


def resident(path: Path) -> str:
    """How much of `path` is in the page cache, from util-linux's `fincore` ("unknown" without it)."""
    try:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", str(path)],
                             capture_output=True, text=True, timeout=60).stdout.split()
        res, size = int(out[0]), int(out[1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{100 * res / size:.0f}% of {size / 1e9:.2f} GB"


def load_once(row: str, path: Path, cache_dir: Path) -> dict[str, float]:
    result = children.run_child(children.python("load_time.py", "--child", row, str(path), str(cache_dir)),
                                timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{row} load of {path} failed: {result.error_line()}")
    return {k: float(v) for k, v in result.json().items()}


def measure(name: str, path: Path, rounds: int, work: Path, log) -> dict:
    """Interleaved rounds of every row on one artifact."""
    from optimum_shared_graph.manifest import read_manifest

    manifest = read_manifest(path, verify=False)
    graph_bytes = sum((path / f).stat().st_size for f in manifest.files)
    warm = work / f"{name}-warm"
    os.environ["OPTIMUM_SHARED_GRAPH_CACHE_DIR"] = str(warm)
    os.environ.pop("OPTIMUM_SHARED_GRAPH_VERIFY", None)
    log(f"{name}: priming the warm cache (one full check) and the page cache (one optimum-intel load)")
    read_manifest(path)  # hashes once and remembers: the warm rows then find every file verified
    load_once("optimum-intel", path, warm)  # brings the weights into the page cache; not counted
    before = resident(path / "openvino_model.bin")
    disk = drop_page_cache()
    warm_page_cache(path)
    rows = ROWS + (DISK_ROWS if disk else ())
    times: dict[str, list[dict[str, float]]] = {row: [] for row in rows}
    for r in range(rounds):
        for part in (ROWS, DISK_ROWS if disk else ()):
            order = part[r % len(part):] + part[: r % len(part)] if part else ()
            for row in order:
                cache = warm
                if row.startswith("cold"):
                    cache = work / f"{name}-{row}-{r}"
                    shutil.rmtree(cache, ignore_errors=True)
                if row.endswith("-disk"):
                    drop_page_cache()
                times[row].append(load_once(row, path, cache))
            if disk and part == DISK_ROWS:
                warm_page_cache(path)  # the whole artifact in the page cache again for the next round's rows
        log(f"{name} round {r + 1}/{rounds}: " + ", ".join(
            f"{row} {times[row][-1]['load_s']:.2f} s (CPU {times[row][-1]['cpu_s']:.2f} s)" for row in rows))
    after = resident(path / "openvino_model.bin")
    return {
        "path": str(path), "graph_bytes": graph_bytes, "model": _shape(path), "times": times,
        "page_cache_before": before, "page_cache_after": after,
    }


def _shape(path: Path) -> dict:
    config = json.loads((path / "config.json").read_text())
    keys = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "torch_dtype", "dtype")
    return {k: config[k] for k in keys if k in config}


def ratio_rows(times: dict[str, list[dict[str, float]]], key: str = "load_s") -> list[tuple[str, float, float, list[float]]]:
    """(row, median of `key`, median ratio to optimum-intel's load in the same page-cache state, per-round
    paired ratios)."""
    out = []
    for row in [r for r in ROWS + DISK_ROWS if r in times]:
        base = [t[key] for t in times[BASE.get(row, "optimum-intel")]]
        values = [t[key] for t in times[row]]
        paired = [v / b for v, b in zip(values, base)]
        out.append((row, statistics.median(values), statistics.median(paired), paired))
    return out


def render(results: dict) -> str:
    lines = ["# Load time: `runtime()` against `OVModelForCausalLM.from_pretrained`", ""]
    add = lines.append
    m = results["machine"]
    add(f"Generated by `{results['command']}` on {results['date']} ({results['minutes']:.1f} min): "
        f"{m.get('Model name', '?')}, {m.get('nproc')} CPUs, {m.get('ram_gb')} GB of memory. "
        f"Load average {results['load_start']} at the start, {results['load_end']} at the end (the machine is shared).")
    if results.get("note"):
        add("")
        add(f"Conditions: {results['note']}")
    add("")
    add("Each load runs in a fresh process and is timed from the call until the compiled model is returned "
        "(the manifest read and its check of the graph files, the graph read, `compile_model`), with "
        f"`ov_config={json.dumps(OV_CONFIG)}` for both; imports happen before the clock starts. The first "
        "inference (where the CPU plugin repacks weights) is the same for both and not counted. "
        f"{results['rounds']} rounds; each round runs every row once, in a rotated order. Ratios are to "
        "`OVModelForCausalLM.from_pretrained` on the same artifact: the median of the per-round paired ratios. "
        "CPU time is the loading process's own (every thread, user and system), which other processes on a shared "
        "machine disturb less than the wall time.")
    add("")
    for name, r in results["shapes"].items():
        shape = r["model"]
        add(f"## {name}")
        add("")
        add(f"`{r['path']}`: {shape.get('model_type')}, hidden {shape.get('hidden_size')}, "
            f"{shape.get('num_hidden_layers')} layers, {shape.get('num_attention_heads')} heads, "
            f"{shape.get('num_key_value_heads')} KV heads, vocabulary {shape.get('vocab_size'):,}; "
            f"graph files (`.xml` + `.bin`) {r['graph_bytes'] / 1e9:.2f} GB. "
            f"The `.bin` in the page cache: {r['page_cache_before']} before the rounds (read through once; and again after each round's page-cache-dropped rows), "
            f"{r['page_cache_after']} after.")
        add("")
        add("| load | wall, median | ratio to optimum-intel | per-round ratios | CPU time, median | CPU ratio |")
        add("| --- | --- | --- | --- | --- | --- |")
        for (row, med, ratio, paired), (_, cpu, cpu_ratio, _) in zip(ratio_rows(r["times"]), ratio_rows(r["times"], "cpu_s")):
            add(f"| {LABELS[row]} | {med * 1000:,.0f} ms | {ratio:.2f}x | {', '.join(f'{p:.2f}' for p in paired)} "
                f"| {cpu * 1000:,.0f} ms | {cpu_ratio:.2f}x |")
        checks = [t["check_s"] for t in r["times"]["warm"]]
        add("")
        add(f"The warm check on its own (`read_manifest(path)` in the warm rows' processes, after the load): "
            f"{statistics.median(checks) * 1000:.1f} ms median. The rest of `runtime()` is what "
            "`OVModelForCausalLM.from_pretrained` does (read the configs and the graph, compile it), plus finding "
            "the runtime provider through its entry point (tens of milliseconds).")
        add("")
    add("## Target")
    add("")
    add("| shape | figure | wall ratio | target | | CPU ratio |")
    add("| --- | --- | --- | --- | --- | --- |")
    for name, r in results["shapes"].items():
        walls = {row: ratio for row, _, ratio, _ in ratio_rows(r["times"])}
        cpus = {row: ratio for row, _, ratio, _ in ratio_rows(r["times"], "cpu_s")}
        for row, target in (("cold", 1.30), ("warm", 1.05)):
            add(f"| {name} | `runtime()` {row} / `OVModelForCausalLM` | {walls[row]:.2f}x | <= {target:.2f}x | "
                f"{'met' if walls[row] <= target else '**not met**'} | {cpus[row]:.2f}x |")
        if "cold-disk" in walls:
            add(f"| {name} | `runtime()` cold / `OVModelForCausalLM`, page cache dropped | {walls['cold-disk']:.2f}x | "
                f"(reported) | | {cpus['cold-disk']:.2f}x |")
    add("")
    add("A cold load reads every graph file once for its XXH3-128 digest (recorded at export beside the sha256) "
        "and remembers it; a warm one reads the cache of verified files and compares each file's identity. An "
        "artifact whose manifest has no XXH3-128 digest (made before 0.2) is checked with its sha256. "
        "[The runtime](runtime.md#the-sha256-check-and-what-is-remembered) says what is remembered and how a "
        "changed file is still caught.")
    add("")
    add("Rerun (about 15 minutes with both shapes on this machine; nothing is exported, the artifacts must exist):")
    add("")
    add("```bash")
    add("python benchmarks/load_time.py --rounds 5 \\")
    add("    --shape qwen2-0.5b=/work/bench/artifacts/qwen2-0.5b/shared --shape qwen3-4b=/work/bench/artifacts/qwen3-4b/shared")
    add("```")
    add("")
    v = results["versions"]
    add("Versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(*argv[1:4])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shape", action="append", metavar="NAME=ARTIFACT",
                        help="an artifact to measure (repeatable); default: the Qwen2-0.5B and Qwen3-4B shapes")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "benchmarks-load.md")
    parser.add_argument("--note", default="", help="the run's conditions, printed on the page (what else ran)")
    parser.add_argument("--report-only", type=Path, metavar="RESULTS.json",
                        help="write the page from a previous run's results (printed path at the end of a run)")
    args = parser.parse_args(argv)
    if args.report_only:
        args.out.write_text(render(json.loads(args.report_only.read_text())))
        return 0
    shapes = dict(s.split("=", 1) for s in args.shape) if args.shape else DEFAULT_SHAPES
    shapes = {k: Path(v) for k, v in shapes.items()}
    for name, path in shapes.items():
        if not (path / "shared_graph.json").is_file():
            parser.error(f"{name}: {path} is not a text-generation-shared artifact: export it first")
    started = time.time()
    load_start = " ".join(f"{x:.2f}" for x in os.getloadavg())

    def log(text: str) -> None:
        print(f"[{time.time() - started:6.0f} s] {text}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="load-time-") as work:
        measured = {name: measure(name, path, args.rounds, Path(work), log) for name, path in shapes.items()}
    results = {
        "command": " ".join(["python benchmarks/load_time.py"] + [a for a in argv if a != args.note]).replace("--note", "--note ...").strip(),
        "date": datetime.date.today().isoformat(), "minutes": (time.time() - started) / 60,
        "load_start": load_start, "load_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rounds": args.rounds, "note": args.note, "machine": context.machine(), "versions": context.versions(), "shapes": measured,
    }
    raw = Path(tempfile.gettempdir()) / "load-time-results.json"
    raw.write_text(json.dumps(results, indent=1))
    args.out.write_text(render(results))
    log(f"wrote {args.out} (results: {raw})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
