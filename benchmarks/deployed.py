"""`validate()` on exported artifacts, each consumer in a fresh process, and the page `docs/benchmarks-validate.md`.

For each model shape: the model is exported with `--task text-generation-shared` (once, reused by later runs),
then `python -m optimum_shared_graph validate ARTIFACT --consumer C --device D -p ... --json` runs for every
consumer the check supports, GenAI's NPU pipeline included (NPUW with its partitions on the CPU, as on a machine
without an NPU). The page gives, per consumer: the verdict, the rule and tolerance, the figures, the wall time of
the whole command (load, compile, the stored calls) and its peak RSS; and the stored reference's size against
the artifact's.

Usage:
    python benchmarks/deployed.py                      # Qwen2-0.5B's shape, writes docs/benchmarks-validate.md
    python benchmarks/deployed.py --shape qwen2-0.5b=/path/to/model --weight-format int4
    python benchmarks/deployed.py --report-only results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import children  # noqa: E402
import context  # noqa: E402

EXACT = ["-p", "INFERENCE_PRECISION_HINT=f32", "-p", "KV_CACHE_PRECISION=f32"]
NPUW = ["-p", "NPU_USE_NPUW=YES", "-p", "NPUW_DEVICES=CPU"]
# (label, consumer, device, properties)
CHECKS = [
    ("OpenVINO Runtime, f32", "openvino", "CPU", EXACT),
    ("OpenVINO Runtime, the artifact's runtime options", "openvino", "CPU", []),
    ("OVModelForCausalLM, f32", "optimum", "CPU", EXACT),
    ("runtime()", "runtime", "CPU", []),
    ("GenAI LLMPipeline", "genai", "CPU", []),
    ("GenAI NPU pipeline (NPUW on the CPU)", "genai", "NPU", NPUW),
    ("GenAI ContinuousBatchingPipeline", "continuous-batching", "CPU", []),
]
DEFAULT_SHAPES = {"qwen2-0.5b": Path("/work/bench/qwen2-0.5b")}
PAGE = HERE.parent / "docs" / "benchmarks-validate.md"


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(name: str, model: Path, out_root: Path, weight_format: str | None) -> dict:
    artifact = out_root / f"{name}-{weight_format or 'default'}"
    result: dict = {"shape": name, "model": str(model), "weight_format": weight_format or "default", "checks": []}
    if not (artifact / "shared_graph.json").exists():
        extra = ["--weight-format", weight_format] if weight_format else []
        export = children.run_child(["optimum-cli", "export", "openvino", "-m", str(model), "--task",
                                     "text-generation-shared", str(artifact), *extra], log=out_root / f"{name}-export.log")
        result["export_s"] = round(export.wall_s, 1)
        if export.returncode != 0:
            result["error"] = export.error_line()
            return result
    manifest = json.loads((artifact / "shared_graph.json").read_text())
    record = manifest["validation"].get("reference") or {}
    result.update(artifact_bytes=_size(artifact), reference_bytes=record.get("bytes"), calls=record.get("calls"),
                  judged_against=record.get("judged_against"), export_validation=manifest["validation"]["status"])
    for label, consumer, device, props in CHECKS:
        child = children.run_child([sys.executable, "-m", "optimum_shared_graph", "validate", str(artifact),
                                    "--consumer", consumer, "--device", device, *props, "--json"],
                                   log=out_root / f"{name}-{consumer}-{device}.log")
        try:  # --json prints the report (indented) on stdout
            report = json.loads(child.stdout[child.stdout.index("{"):])
        except ValueError:
            report = {}
        result["checks"].append({"label": label, "consumer": consumer, "device": device, "returncode": child.returncode,
                                 "wall_s": round(child.wall_s, 1), "peak_rss_mb": round(child.peak_rss_mb),
                                 "line": child.stderr.strip().splitlines()[-1][:400] if child.stderr.strip() else "",
                                 "report": report})
        print(f"{name} {label}: rc={child.returncode} {child.wall_s:.1f}s", file=sys.stderr)
    return result


def _figures(report: dict) -> str:
    if not report:
        return "-"
    if "max_abs_diff_prefill" in report:
        text = (f"max abs dlogits {report['max_abs_diff_prefill']:.2e} / {report['max_abs_diff_decode']:.2e} "
                f"(prefill / decode), top-1 {report['top1_agreement']:.2f}")
    else:
        text = f"{sum(report['compared_tokens'])} of {report['greedy_tokens']} greedy tokens compared"
        if any(report.get("restarts") or []):
            text += f", {sum(report['restarts'])} restart(s)"
    ties = [d for d in report.get("differing_steps", []) if d.get("near_tie")]
    return text + (f", {len(ties)} near-tie(s)" if ties else "")


def render(results: list[dict], info: dict) -> str:
    lines = [
        "# `validate()` on exported artifacts",
        "",
        "Generated by `python benchmarks/deployed.py` (do not edit by hand). Each model is exported with "
        "`--task text-generation-shared`; then `python -m optimum_shared_graph validate ARTIFACT --consumer C "
        "--device D --json` runs in a fresh process per consumer (the same command as `optimum-cli shared-graph "
        "validate`). Wall time is the whole command: imports, the manifest and reference checks, loading and "
        "compiling the artifact, the stored calls. How to read the verdicts: [Deploying](deploy.md#prove-it-on-the-target-device).",
        "",
        context.run_line(info),
        "",
    ]
    for r in results:
        lines += [f"## {r['shape']} ({r['weight_format']} weights)", ""]
        if r.get("error"):
            lines += [f"The export failed: {r['error']}", ""]
            continue
        ratio = r["reference_bytes"] / r["artifact_bytes"] if r.get("reference_bytes") else float("nan")
        lines += [f"Model `{r['model']}`. The stored reference: {r['reference_bytes'] / 1e6:.1f} MB "
                  f"({r['calls']} calls, judged against {r['judged_against']}), {100 * ratio:.2f}% of the "
                  f"{r['artifact_bytes'] / 1e9:.2f} GB artifact. Export validation: {r['export_validation']}"
                  + (f" (export {r['export_s']} s)." if r.get("export_s") else "."), "",
                  "| consumer | device | verdict | rule (tolerance) | figures | wall (s) | peak RSS (MB) |",
                  "| --- | --- | --- | --- | --- | ---: | ---: |"]
        for c in r["checks"]:
            rep = c["report"]
            verdict = rep.get("status") or ("passed" if c["returncode"] == 0 else "error")
            if c["returncode"] != 0 and not rep:
                verdict = "error: " + c["line"].removeprefix("error: ")[:200]
            rule = f"{rep['rule']} ({rep['tolerance']:.3g})" if rep.get("rule") else "-"
            lines.append(f"| {c['label']} | {c['device']} | {verdict} | {rule} | {_figures(rep)} | {c['wall_s']} | "
                         f"{c['peak_rss_mb']} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", action="append", default=[], metavar="NAME=MODEL_DIR")
    parser.add_argument("--weight-format", action="append", default=[], help="also export with this weight format")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "deployed")
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--results", type=Path, default=None, help="write the results JSON here too")
    parser.add_argument("--report-only", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.report_only:
        context.rerender(args.report_only, args.page, render)
        return 0
    shapes = dict(s.split("=", 1) for s in args.shape) if args.shape else DEFAULT_SHAPES
    args.out.mkdir(parents=True, exist_ok=True)
    results = [measure(name, Path(model), args.out, fmt) for name, model in shapes.items()
               for fmt in [None, *args.weight_format]]
    context.write_results_and_page(results, render, args.results or args.out / "results.json", args.page)
    print(args.page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
