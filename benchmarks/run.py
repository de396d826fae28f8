"""Benchmark text-generation-shared side by side with the alternatives, in one run; write docs/benchmarks.md.

Builds realistic random-init models from public configurations (no download), exports them in every
layout, then measures each runtime in fresh child processes, round after round with the order rotated,
so every layout sees the same machine noise. Every figure is a median over rounds (and runs per round).

    python benchmarks/run.py                 # the full suite, writes docs/benchmarks.md + .png
    python benchmarks/run.py --suite issue2  # TTFT/TPOT/peak memory at 1,024 tokens, shared vs with-past
    python benchmarks/run.py --quick         # a toy model, every layout, seconds; writes under --workdir
    python benchmarks/run.py --suite export  # export wall and peak memory against optimum-intel's, 0.5B and 4B
                                             # shapes, 3 interleaved exports each (about 25 min, 12 GB of disk)
    python benchmarks/run.py --suite large   # the same at the Qwen3-4B shape (8 GB fp16 checkpoint): one export
                                             # per task by default (about 15 min, 45 GB of disk, 24 GB of memory)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import children  # noqa: E402
import context  # noqa: E402
import models  # noqa: E402
import report  # noqa: E402


# ---- what is measured -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Artifact:
    """One exported layout on disk."""

    key: str
    label: str
    graphs: tuple[str, ...]  # graph files (relative), what compile time compiles

    def export_command(self, model_dir: Path, out: Path, weight_format: str, max_cache_len: int) -> list[str] | None:
        cli = [shutil.which("optimum-cli") or "optimum-cli", "export", "openvino", "-m", str(model_dir)]
        if self.key == "shared":
            return cli + ["--task", "text-generation-shared", "--weight-format", weight_format, str(out)]
        if self.key == "with-past":
            return cli + ["--task", "text-generation-with-past", "--weight-format", weight_format, str(out)]
        if self.key == "two-graph":
            return children.python("twograph.py", str(model_dir), str(out), "--weight-format", weight_format)
        if self.key.startswith("static-c"):
            c = self.key.removeprefix("static-c")
            return cli + ["--task", "text-generation-shared", "--weight-format", weight_format,
                          "--shape-mode", "static", "--static-query-len", c, "--max-cache-len", str(max_cache_len),
                          str(out)]
        return None  # pytorch: the checkpoint itself


ARTIFACTS = {a.key: a for a in [
    Artifact("shared", "text-generation-shared", ("openvino_model.xml",)),
    Artifact("with-past", "optimum-intel text-generation-with-past", ("openvino_model.xml",)),
    Artifact("two-graph", "two-graph (prefill + decode graphs)", ("prefill/openvino_model.xml", "decode/openvino_model.xml")),
    Artifact("static-c1", "text-generation-shared static C=1", ("openvino_static_model.xml",)),
    Artifact("static-c16", "text-generation-shared static C=16", ("openvino_static_model.xml",)),
    Artifact("pytorch", "PyTorch checkpoint", ()),
]}


# The prompt length of the static comparison: only the rows that compare there run it.
STATIC_PROMPT = 512
STATIC_ONLY = (STATIC_PROMPT,)
# Static artifacts hold this many KV slots: the longest static prompt plus its new tokens fits. A static
# graph attends over its whole capacity at every call, so a deployment picks the capacity it needs.
STATIC_CAPACITY = 1024


@dataclass(frozen=True)
class Row:
    """One runtime on one artifact: a line of the generation table."""

    key: str
    label: str
    artifact: str
    runtime: str  # worker.py --runtime
    max_prompt: int | None = None  # longer prompts are not run
    only: tuple[int, ...] | None = None  # run only these prompt lengths (diagnostic and static rows)
    skip: tuple[int, ...] = ()  # not these (the static comparison's 512 is run by the rows it compares)


ROWS = {r.key: r for r in [
    Row("shared-optimum", "text-generation-shared, OVModelForCausalLM", "shared", "optimum", skip=STATIC_ONLY),
    Row("withpast-optimum", "text-generation-with-past, OVModelForCausalLM", "with-past", "optimum", skip=STATIC_ONLY),
    Row("shared-runtime", "text-generation-shared, optimum_shared_graph.runtime()", "shared", "runtime"),
    Row("shared-genai", "text-generation-shared, openvino_genai.LLMPipeline", "shared", "genai"),
    Row("two-graph", "two-graph layout, prefill graph + decode graph", "two-graph", "twograph", max_prompt=1024,
        skip=STATIC_ONLY),
    Row("pytorch", "PyTorch eager generate() (fp32)", "pytorch", "torch", max_prompt=1024, skip=STATIC_ONLY),
    Row("shared-raw", "text-generation-shared, bare OpenVINO infer loop (diagnostic)", "shared", "raw", only=(1024, 64)),
    Row("withpast-raw", "text-generation-with-past, bare OpenVINO infer loop (diagnostic)", "with-past", "raw", only=(1024, 64)),
    # A C=1 static prefill is one call per prompt token: the static rows stop at the 512-token comparison.
    Row("static-c1", "static C=1, optimum_shared_graph.runtime()", "static-c1", "static", only=(16, 64, 128, 512)),
    Row("static-c16", "static C=16, optimum_shared_graph.runtime()", "static-c16", "static", only=(16, 64, 128, 512)),
]}


@dataclass
class Plan:
    """What one model is put through."""

    model: str
    artifacts: list[str]
    rows: list[str]
    prompt_lens: list[int]
    rounds: int | None = None  # generation rounds (fresh processes per layout); None: --rounds
    reps: int | None = None  # timed generations per prompt length per process; None: --reps


# The export suites: optimum-intel's own export, ours, and the static one, on these models.
EXPORT_LAYOUTS = ("with-past", "shared", "static-c16")
EXPORT_SUITES = {"export": ("qwen2-0.5b", "qwen3-4b"), "large": ("qwen3-4b",)}
# The static C=16 export is timed at the small shape only (at 4 B it would double the suite's time).
EXPORT_STATIC_UP_TO = 2 * 10**9
# Disk an export suite needs: the checkpoints, every layout's artifact and an export's staging copy.
EXPORT_DISK_GB = {"export": 40, "large": 40}

# --quick: what a smoke test needs to cross every code path that matters, in about a minute.
QUICK_ROWS = ["shared-optimum", "withpast-optimum", "shared-runtime", "shared-genai"]


def plans(args) -> list[Plan]:
    if args.quick and args.suite in EXPORT_SUITES:
        return [Plan("qwen2-toy", list(EXPORT_LAYOUTS), [], [])]
    if args.quick:
        rows = list(ROWS) if args.layouts == ["all"] else args.layouts or QUICK_ROWS
        needed = list(dict.fromkeys(ROWS[r].artifact for r in rows))
        return [Plan("qwen2-toy", needed, rows, [16, 64])]
    if args.layouts:
        rows = list(ROWS) if args.layouts == ["all"] else args.layouts
        needed = list(dict.fromkeys(["shared", "with-past"] + [ROWS[r].artifact for r in rows]))
        return [Plan(m, needed, rows, args.prompt_lens or [128, 1024, 2048]) for m in args.models or ["qwen2-0.5b"]]
    if args.suite in EXPORT_SUITES:  # export only: no compile or generation rows
        return [Plan(m, [k for k in EXPORT_LAYOUTS if not k.startswith("static")
                         or models.parameter_count(m) <= EXPORT_STATIC_UP_TO], [], [])
                for m in EXPORT_SUITES[args.suite]]
    if args.suite == "issue2":
        return [Plan("qwen2-0.5b", ["shared", "with-past"],
                     ["shared-optimum", "withpast-optimum", "shared-raw", "withpast-raw"], [1024])]
    main_rows = [r for r in ROWS if not r.endswith("-raw")]  # the bare infer loops are diagnostics
    return [
        Plan("qwen2-0.5b", list(ARTIFACTS), main_rows, args.prompt_lens or [128, STATIC_PROMPT, 1024, 2048]),
        # The 1.1B model: the layout comparisons that scale with size, at one prompt length, in one round of
        # two timed runs per layout, to stay in the 30-minute budget.
        Plan("tinyllama-1.1b", ["shared", "with-past", "two-graph", "pytorch"],
             ["shared-optimum", "withpast-optimum", "shared-runtime", "shared-genai"], [1024], rounds=1, reps=2),
    ]


# ---- the run --------------------------------------------------------------------------------------

@dataclass
class Progress:
    total: int
    enabled: bool
    bar: object = field(default=None)

    def __post_init__(self):
        if self.enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, unit="step", dynamic_ncols=True)

    def step(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_description(text[:60])

    def done(self) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def graph_bytes(path: Path) -> int:
    """Bytes of the decoder graph files (.xml + .bin), tokenizer graphs excluded."""
    return sum(p.stat().st_size for p in path.rglob("openvino_model*") if p.suffix in (".xml", ".bin"))


def checkpoint_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def export_all(plan: Plan, model_dir: Path, work: Path, args, progress: Progress) -> dict:
    """Export every artifact `--export-reps` times, layouts interleaved round by round (order rotated).

    Each round rewrites the artifact in place, so the last round's files are the ones measured next;
    the export figures are medians over the rounds.
    """
    out: dict[str, dict] = {}
    positions = models.MODELS[plan.model]["max_position_embeddings"]
    max_cache = min(positions, STATIC_CAPACITY if not args.quick else 128)
    keys = list(plan.artifacts)
    samples: dict[str, list] = {k: [] for k in keys}
    for key in keys:
        if not ARTIFACTS[key].graphs:  # pytorch: the checkpoint itself, not exported
            out[key] = {"path": str(model_dir), "bytes": checkpoint_bytes(model_dir)}
    for rnd in range(args.export_reps):
        for key in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
            if key in out:
                continue
            target = work / "artifacts" / plan.model / key
            command = ARTIFACTS[key].export_command(model_dir, target, args.weight_format, max_cache)
            progress.step(f"{plan.model}: export {key} ({rnd + 1}/{args.export_reps})")
            if target.exists():
                shutil.rmtree(target)
            res = children.run_child(command, log=work / "logs" / f"export-{plan.model}-{key}-{rnd}.log")
            if res.returncode != 0:
                out[key] = {"skipped": res.error_line()}
                progress.note(f"{plan.model}: {key} export skipped: {res.error_line()}")
            else:
                samples[key].append({"wall_s": res.wall_s, "peak_rss_mb": res.peak_rss_mb,
                                     "peak_anon_mb": res.peak_anon_mb, "peak_pss_mb": res.peak_pss_mb})
            progress.done()
    for key in keys:
        if key in out:
            continue
        target = work / "artifacts" / plan.model / key
        out[key] = {"path": str(target), "bytes": graph_bytes(target),
                    "export_wall_s": statistics.median(s["wall_s"] for s in samples[key]),
                    "export_peak_mb": statistics.median(s["peak_rss_mb"] for s in samples[key]),
                    "export_peak_anon_mb": statistics.median(s["peak_anon_mb"] for s in samples[key]),
                    "export_peak_pss_mb": statistics.median(s.get("peak_pss_mb", float("nan")) for s in samples[key]),
                    "export_samples": samples[key]}
        if key.startswith("static-c"):
            out[key]["static_capacity"] = max_cache
    return out


def compile_all(plan: Plan, exports: dict, work: Path, args, progress: Progress) -> None:
    keys = [k for k in plan.artifacts if ARTIFACTS[k].graphs and "skipped" not in exports[k]]
    samples: dict[str, list] = {k: [] for k in keys}
    for rnd in range(args.rounds):
        for key in keys[rnd % len(keys):] + keys[:rnd % len(keys)]:
            progress.step(f"{plan.model}: compile {key} ({rnd + 1}/{args.rounds})")
            xmls = [str(Path(exports[key]["path"]) / g) for g in ARTIFACTS[key].graphs]
            res = children.run_child(children.python("compile_time.py", *xmls),
                                     log=work / "logs" / f"compile-{plan.model}-{key}-{rnd}.log")
            if res.returncode == 0:
                answer = res.json()
                samples[key].append({"compile_s": answer["compile_s"], "ready_s": answer.get("ready_s"),
                                     "peak_rss_mb": answer["peak_mb"]})
            progress.done()
    for key in keys:
        if samples[key]:
            exports[key]["compile_s"] = statistics.median(s["compile_s"] for s in samples[key])
            exports[key]["compile_peak_mb"] = statistics.median(s["peak_rss_mb"] for s in samples[key])
            ready = [s["ready_s"] for s in samples[key] if s["ready_s"] is not None]
            exports[key]["ready_s"] = statistics.median(ready) if ready else None
            exports[key]["compile_samples"] = samples[key]


def generate_all(plan: Plan, exports: dict, work: Path, args, progress: Progress) -> dict:
    vocab = models.MODELS[plan.model]["vocab_size"]
    rows = [r for r in plan.rows if "skipped" not in exports.get(ROWS[r].artifact, {"skipped": "not exported"})]
    results: dict[str, dict] = {r: {"rounds": []} for r in plan.rows}
    for r in plan.rows:
        if r not in rows:
            results[r]["skipped"] = exports.get(ROWS[r].artifact, {}).get("skipped", "artifact not exported")
    for rnd in range(plan.rounds or args.rounds):
        order = rows[rnd % len(rows):] + rows[:rnd % len(rows)] if rows else []
        for key in order:
            row = ROWS[key]
            progress.step(f"{plan.model}: generate {key} ({rnd + 1}/{plan.rounds or args.rounds})")
            if "skipped" in results[key]:
                progress.done()
                continue
            load_before = os.getloadavg()[0]
            res = children.run_child(
                children.python("worker.py", "--runtime", row.runtime, "--path", exports[row.artifact]["path"],
                                "--prompt-lens", *map(str, row_lens(row, plan)), "--reps", str(plan.reps or args.reps),
                                "--new-tokens", str(args.new_tokens), "--vocab", str(vocab), "--seed", str(rnd)),
                log=work / "logs" / f"generate-{plan.model}-{key}-{rnd}.log",
            )
            if res.returncode != 0:
                results[key]["skipped"] = f"failed: {res.error_line()}"
                progress.note(f"{plan.model}: {key} failed: {res.error_line()}")
            else:
                answer = res.json()
                if "skipped" in answer:
                    results[key]["skipped"] = answer["skipped"]
                    progress.note(f"{plan.model}: {key} skipped: {answer['skipped']}")
                else:
                    answer["child_peak_rss_mb"] = answer["peak_rss_mb"]  # the worker's own VmHWM-based figure
                    answer["loadavg_1m_before"] = load_before
                    results[key]["rounds"].append(answer)
            progress.done()
    for key, res in results.items():
        if res["rounds"]:
            res.update(summarize(res["rounds"], row_lens(ROWS[key], plan)))
    return results


def row_lens(row: Row, plan: Plan) -> list[int]:
    lens = [n for n in plan.prompt_lens if (row.max_prompt is None or n <= row.max_prompt)
            and (row.only is None or n in row.only) and n not in row.skip]
    return lens or [min(plan.prompt_lens)]


def summarize(rounds: list[dict], prompt_lens: list[int]) -> dict:
    med = statistics.median
    out: dict = {"ttft_s": {}, "tpot_s": {}, "gen_peak_mb": {}, "n_samples": {}}
    for n in prompt_lens:
        k = str(n)
        ttft = [t for r in rounds for t in r["ttft_s"][k]]
        tpot = [t for r in rounds for t in r["tpot_s"][k]]
        out["ttft_s"][k] = med(ttft)
        out["tpot_s"][k] = med(tpot) if tpot else None
        out["gen_peak_mb"][k] = med(r["gen_peak_mb"][k] for r in rounds)
        out["n_samples"][k] = len(ttft)
    out["load_s"] = med(r["load_s"] for r in rounds)
    out["peak_rss_mb"] = med(r["child_peak_rss_mb"] for r in rounds)
    out["rss_after_load_mb"] = med(r["rss_after_load_mb"] for r in rounds)
    return out


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("--suite", choices=("full", "issue2", *EXPORT_SUITES), default="full",
                        help="full: every layout, two models; issue2: shared vs with-past at 1,024 tokens; "
                             "export: export time and memory at the 0.5B and 4B shapes; large: one export at 4B")
    parser.add_argument("--quick", action="store_true", help="smoke test: a toy model, every layout, seconds")
    parser.add_argument("--layouts", nargs="+", default=None, choices=["all", *ROWS],
                        help="only these layout rows (and the artifacts they need), on --models")
    parser.add_argument("--models", nargs="+", default=None, choices=list(models.MODELS), help="with --layouts")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=None, help="prompt lengths (full suite)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="fresh processes per layout, interleaved (default: 3; 5 for issue2; 1 with --quick)")
    parser.add_argument("--reps", type=int, default=1, help="timed generations per prompt length per process")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per generation (default 32; 8 --quick)")
    parser.add_argument("--export-reps", type=int, default=None,
                        help="exports per artifact, interleaved (export figures are medians; default 3; 1 with --quick)")
    parser.add_argument("--weight-format", default="fp16", choices=("fp16", "fp32"),
                        help="the same for every OpenVINO layout (default fp16)")
    parser.add_argument("--model-dtype", default="float16", choices=("float16", "float32", "bfloat16"),
                        help="dtype of the saved random-init checkpoints (default float16, like real ones)")
    parser.add_argument("--workdir", type=Path, default=HERE / "results", help="models, artifacts, logs, JSON")
    parser.add_argument("--docs-dir", type=Path, default=None,
                        help="where benchmarks.md and the plot go (default: docs/; with --quick: WORKDIR/quick)")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the memory-bandwidth measurement")
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("--note", default=None, help="a sentence the report prints about this run's conditions")
    parser.add_argument("--report-only", type=Path, default=None, metavar="RESULTS.json",
                        help="measure nothing: rewrite the docs from a results file an earlier run saved")
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 1 if args.quick else 5 if args.suite == "issue2" else 3
    if args.export_reps is None:
        args.export_reps = 1 if args.quick or args.suite == "large" else 3
    if args.new_tokens is None:
        args.new_tokens = 8 if args.quick else 32
    if args.quick:
        args.workdir = args.workdir / "quick"
    if args.docs_dir is None:
        args.docs_dir = args.workdir if args.quick else HERE.parent / "docs"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        saved = json.loads(args.report_only.read_text())
        if args.note:
            saved["settings"]["note"] = args.note
        writer = report.write_export if saved.get("suite") in EXPORT_SUITES else report.write
        md = writer(saved, args.docs_dir)
        print(f"wrote {md} from {args.report_only}", file=sys.stderr)
        return 0
    work: Path = args.workdir.absolute()
    work.mkdir(parents=True, exist_ok=True)
    need = (1 if args.quick else EXPORT_DISK_GB.get(args.suite, 24)) * 2**30  # models, artifacts, a staging copy
    free = shutil.disk_usage(work).free
    if free < need:
        raise SystemExit(f"error: {work} has {free / 2**30:.1f} GiB free; this suite needs about {need / 2**30:.0f} GiB "
                         "(models, artifacts and an export's staging copy): free space or pass --workdir on another disk")
    started = time.time()
    todo = plans(args)
    total = sum(1 + (args.export_reps + args.rounds) * len([a for a in p.artifacts if ARTIFACTS[a].graphs])
                + (p.rounds or args.rounds) * len(p.rows) for p in todo) + 1
    progress = Progress(total, enabled=not args.quiet and sys.stderr.isatty())
    results: dict = {"suite": "quick" if args.quick else args.suite, "machine": context.machine(), "versions": context.versions(),
                     "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                     "command": "python benchmarks/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                     "models": {}, "loadavg_start": os.getloadavg(),
                     # An export's peak (os.wait4 ru_maxrss) cannot be below its parent's RSS at fork time.
                     "parent_rss_mb": children.own_rss_mb()}
    try:
        for plan in todo:
            progress.step(f"{plan.model}: build")
            model_dir = work / "models" / plan.model
            res = children.run_child(children.python("models.py", plan.model, str(model_dir), "--dtype", args.model_dtype),
                                     log=work / "logs" / f"build-{plan.model}.log")
            if res.returncode != 0:
                raise SystemExit(f"building {plan.model} failed: {res.error_line()}")
            progress.done()
            exports = export_all(plan, model_dir, work, args, progress)
            if args.suite in EXPORT_SUITES:
                results["models"][plan.model] = {
                    "plan": asdict(plan), "shape": models.describe(plan.model),
                    "parameters": models.parameter_count(plan.model), "artifacts": exports,
                    "checkpoint_bytes": checkpoint_bytes(model_dir),
                }
                continue
            compile_all(plan, exports, work, args, progress)
            generation = generate_all(plan, exports, work, args, progress)
            results["models"][plan.model] = {
                "plan": asdict(plan), "shape": models.describe(plan.model),
                "parameters": models.parameter_count(plan.model), "artifacts": exports, "generation": generation,
            }
        progress.step("memory bandwidth")
        if not args.no_bandwidth and args.suite not in EXPORT_SUITES:
            res = children.run_child(children.python("bandwidth.py", "256" if args.quick else "1024"))
            results["bandwidth"] = res.json() if res.returncode == 0 else {"skipped": res.error_line()}
        progress.done()
    finally:
        progress.close()
    results["wall_s"] = time.time() - started
    results["loadavg_end"] = os.getloadavg()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (work / f"results-{results['suite']}-{stamp}.json").write_text(json.dumps(results, indent=1))
    md = report.write_export(results, args.docs_dir) if args.suite in EXPORT_SUITES else report.write(results, args.docs_dir)
    if not args.quiet:
        print(f"wrote {md} ({results['wall_s'] / 60:.1f} min)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
