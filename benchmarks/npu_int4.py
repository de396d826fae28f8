"""NPU-ready int4 through GenAI's NPU pipeline, judged by `validate --device NPU`, and the page `docs/npu-int4.md`.

For each shape: a random-init model of a released checkpoint's widths (`optimum_shared_graph.released`, 6 layers, as
`scripts/coverage.py --npu-only` builds them) saved in fp16 as checkpoints are published; exported with
`--task text-generation-shared` in the form the NPU pipeline wants (`--weight-format int4 --sym --group-size -1
--ratio 1.0`: symmetric, channel-wise, every matmul), data-free and data-aware (`--awq --scale-estimation` on a
local text file, calibrated on both stages: docs/quantization.md); then `optimum-cli shared-graph validate ARTIFACT
--consumer genai --device NPU` in a fresh process, with NPUW's partitions on the CPU at `testing.npu_precision()`
(`NPU_ON_CPU`: no NPU here). Recorded per artifact: the export's comparison with PyTorch (the quantization's
error, in the manifest), the verdict of the NPU pipeline against the exported graph's stored reference (for
quantized weights the reference is the graph's own logits: docs/deploy.md), its greedy tokens and margins, the
wall time and peak RSS of each command. Results are written after each artifact (a stopped run keeps its rows).

Usage:
    python benchmarks/npu_int4.py                                 # the default shapes, both variants
    python benchmarks/npu_int4.py --shapes qwen2-0.5b --variants data-free
    python benchmarks/npu_int4.py --report-only docs/npu-int4.json   # the page again from the committed results
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import children  # noqa: E402
import context  # noqa: E402

PAGE = HERE.parent / "docs" / "npu-int4.md"
NPU_INT4 = ["--weight-format", "int4", "--sym", "--group-size", "-1", "--ratio", "1.0"]
CALIBRATION_TEXTS = 16  # lines of the local text file (each: one prefill call and 4 decode calls calibrated)
VARIANTS = {
    "data-free": [],
    "data-aware": ["--awq", "--scale-estimation", "--dataset", "{texts}", "--num-samples", str(CALIBRATION_TEXTS)],
}
# name -> (model type, released checkpoint, overrides of released.py's widths for that type). None: released.py's
# own entry (its checkpoint named there). The overrides are the named checkpoint's public config.json widths.
SHAPES = {
    "qwen2-0.5b": ("qwen2", "Qwen/Qwen2-0.5B", dict(
        hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
        max_position_embeddings=131072)),
    "qwen3-0.6b": ("qwen3", "Qwen/Qwen3-0.6B", dict(
        hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128)),
    "qwen3-1.7b": ("qwen3", "Qwen/Qwen3-1.7B", dict(
        hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8, head_dim=128)),
    "llama-3.2-1b": ("llama", None, {}),
    "phi3-mini": ("phi3", None, {}),
    "mistral-7b": ("mistral", None, {}),
    # not a checkpoint: a smoke test of this script (`--shapes toy`), not in the default run
    "toy": ("qwen2", "no checkpoint (a smoke test)", dict(
        hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, vocab_size=4096)),
}
DEFAULT_SHAPES = [name for name in SHAPES if name != "toy"]
# The export holds PyTorch's model in float32 (4 bytes a parameter) beside the graph: a shape over this is not run,
# to keep each process within the ~6 GB this shared machine gives one job.
MAX_FP32_GB = 4.5


def _parameters(config) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def _texts(out: Path) -> Path:
    """The local calibration text file: lines of the Python standard library's docstrings (benchmarks/calibration.py)."""
    from calibration import stdlib_text_lines

    path = out / "calibration.txt"
    if not path.exists():
        path.write_text("\n".join(stdlib_text_lines(CALIBRATION_TEXTS)) + "\n", encoding="utf-8")
    return path


def _npu_properties() -> list[str]:
    from optimum_shared_graph.testing import NPU_ON_CPU

    return [arg for k, v in NPU_ON_CPU.items() for arg in ("-p", f"{k}={v}")]


def _cli() -> str:
    return shutil.which("optimum-cli") or "optimum-cli"


def model_for(name: str, out: Path) -> tuple[Path | None, dict]:
    """Build the shape's model once (reused by later runs); returns its directory (None: not run) and facts."""
    from optimum_shared_graph.released import released_checkpoint, released_width_config, widths

    model_type, checkpoint, overrides = SHAPES[name]
    config = released_width_config(model_type, **overrides)
    parameters = _parameters(config)
    facts = {"shape": name, "model_type": model_type, "checkpoint": checkpoint or released_checkpoint(model_type),
             "widths": widths(config), "parameters": parameters}
    if parameters * 4 / 1e9 > MAX_FP32_GB:
        facts["skipped"] = (f"not run: {parameters / 1e9:.2f} B parameters, {parameters * 4 / 1e9:.1f} GB in float32 "
                            f"at export, over this machine's {MAX_FP32_GB} GB budget per process")
        return None, facts
    model = out / "models" / name
    if not (model / "config.json").exists():  # built in a child: this process stays small beside the measured ones
        built = children.run_child([sys.executable, "-c", BUILD, model_type, str(model), json.dumps(overrides)],
                                   log=out / "logs" / f"{name}-build.log")
        if built.returncode != 0:
            facts["skipped"] = f"the model build failed: {built.error_line()}"
            return None, facts
    return model, facts


BUILD = ("import json, sys; from optimum_shared_graph.released import build_released_width_model; "
         "build_released_width_model(sys.argv[1], sys.argv[2], **json.loads(sys.argv[3]))")


def measure(name: str, model: Path, facts: dict, variant: str, out: Path) -> dict:
    artifact = out / "artifacts" / f"{name}-{variant}"
    flags = [f.format(texts=_texts(out)) for f in NPU_INT4 + VARIANTS[variant]]
    result: dict = {**facts, "variant": variant, "flags": flags}
    logs = out / "logs"
    if artifact.exists():  # one export per run: a previous run's artifact is replaced
        shutil.rmtree(artifact)
    export = children.run_child([_cli(), "export", "openvino", "-m", str(model), "--task", "text-generation-shared",
                                 *flags, str(artifact)], log=logs / f"{name}-{variant}-export.log")
    result["export"] = {"returncode": export.returncode, "wall_s": round(export.wall_s, 1),
                        "peak_rss_mb": round(export.peak_rss_mb)}
    if export.returncode != 0:
        result["export"]["error"] = export.error_line()
        return result
    manifest = json.loads((artifact / "shared_graph.json").read_text())
    validation = manifest.get("validation") or {}
    result["export"]["bytes"] = (artifact / "openvino_model.bin").stat().st_size
    result["quantization"] = manifest.get("quantization")
    result["against_pytorch"] = {k: validation.get(k) for k in (
        "status", "greedy_tokens", "greedy_match", "first_mismatch_step", "top1_agreement", "max_abs_diff_prefill",
        "max_abs_diff_decode", "kl_prefill", "kl_decode")}
    check = children.run_child([_cli(), "shared-graph", "validate", str(artifact), "--consumer", "genai", "--device",
                                "NPU", *_npu_properties(), "--json"], log=logs / f"{name}-{variant}-validate.log")
    try:  # --json prints the report (indented) on stdout, also when the check failed
        report = json.loads(check.stdout[check.stdout.index("{"):])
    except ValueError:
        report = {}
    line = check.stderr.strip().splitlines()[-1][:400] if check.stderr.strip() else ""
    result["npu"] = {"returncode": check.returncode, "wall_s": round(check.wall_s, 1),
                     "peak_rss_mb": round(check.peak_rss_mb), "line": line,
                     "report": {k: v for k, v in report.items() if k != "properties"}}
    print(f"{name} {variant}: export rc={export.returncode} {export.wall_s:.0f}s, validate rc={check.returncode} "
          f"{check.wall_s:.0f}s", file=sys.stderr)
    return result


def _verdict(npu: dict) -> str:
    report = npu.get("report") or {}
    if npu["returncode"] == 0:
        return "**passed**"
    if report.get("error"):
        return "failed: " + report["error"].removeprefix("validation failed: ")[:300]
    return "error: " + npu.get("line", "").removeprefix("error: ")[:300]


def _tokens(report: dict) -> str:
    if not report.get("greedy_tokens"):
        return "-"
    text = f"{sum(report.get('compared_tokens') or [0])} of {report['greedy_tokens']}"
    steps = report.get("differing_steps") or []
    ties = [d for d in steps if d.get("near_tie")]
    if ties:
        text += "; near-tie(s) at " + ", ".join(f"step {d['step']} (margin {d['margin']:.3g})" for d in ties)
    decisive = [d for d in steps if not d.get("near_tie")]
    if decisive:
        text += "; **differs** at " + ", ".join(f"step {d['step']} (margin {d['margin']:.3g})" for d in decisive)
    if not steps:
        text += ", every one the reference's"
    return text


def _pytorch(r: dict) -> str:
    a = r.get("against_pytorch") or {}
    if a.get("top1_agreement") is None:
        return "-"
    greedy = ("greedy tokens PyTorch's" if a.get("greedy_match") else
              f"greedy differs from step {a.get('first_mismatch_step')}")
    return (f"top-1 {a['top1_agreement']:.2f}, KL {a['kl_prefill']:.3g} / {a['kl_decode']:.3g}, max \\|dlogits\\| "
            f"{a['max_abs_diff_prefill']:.3g} / {a['max_abs_diff_decode']:.3g}; {greedy}")


def render(results: list[dict], info: dict) -> str:
    npu = info.get("npu_properties", [])
    command = ("optimum-cli export openvino -m MODEL --task text-generation-shared " + " ".join(NPU_INT4) + " OUT  "
               "# data-free\noptimum-cli export openvino -m MODEL --task text-generation-shared " + " ".join(NPU_INT4)
               + f" --awq --scale-estimation --dataset calibration.txt --num-samples {CALIBRATION_TEXTS} OUT  "
               "# data-aware\noptimum-cli shared-graph validate OUT --consumer genai --device NPU " + " ".join(npu)
               + " --json")
    run = [r for r in results if "variant" in r]
    passed = [r for r in run if r.get("npu", {}).get("returncode") == 0]
    lines = [
        "# NPU-ready int4 through the NPU pipeline",
        "",
        "Generated by `python benchmarks/npu_int4.py` (do not edit by hand), from one run. The form of int4 the NPU "
        "pipeline is given (symmetric, channel-wise, every matmul: `--sym --group-size -1 --ratio 1.0`), exported "
        "with `--task text-generation-shared`, data-free and data-aware (AWQ and scale estimation, calibrated on "
        f"both stages on a local text file of {CALIBRATION_TEXTS} lines of the Python standard library's docstrings: "
        "[quantization](quantization.md)); each artifact then checked by `validate` through GenAI's NPU pipeline "
        "([deploying](deploy.md#prove-it-on-the-target-device)). Models: random-init (`initializer_range` 0.1), "
        "a released checkpoint's widths with 6 layers (`optimum_shared_graph/released.py`, as the NPU column of "
        "[the NPU pipeline at real width](npu-real-width.md)), saved in fp16.",
        "",
        context.run_line(info),
        "",
        "Commands (no NPU on this machine: NPUW's partitions run on the CPU, at "
        f"`{' '.join(npu[1::2]) if npu else 'testing.NPU_ON_CPU'}`; an AMD EPYC without f16 units computes an "
        "f16 hint in bf16, so `testing.npu_precision()` asks f32 here; on a machine with an NPU leave the "
        "properties out):",
        "",
        "```bash",
        command,
        "```",
        "",
        "How to read it. For quantized weights the stored reference is the exported graph's own logits on the "
        "export machine's CPU (f32), not PyTorch's: **NPU pipeline** says whether the NPU pipeline computes what "
        "the export computed, each greedy token compared with the reference's argmax in the reference's context, "
        "a difference allowed only where the reference's own top-2 margin is within the tolerance (a near-tie). "
        "**Against PyTorch** is the quantization's own error, measured by the export (teacher-forced on "
        "PyTorch's greedy tokens, PyTorch computing in f32 on the fp16 weights; prefill / decode) and recorded in "
        "the manifest, not enforced: on random weights, which int4 fits worse than a trained checkpoint's, it is "
        "large, and what it is on a trained checkpoint is not measured here (nothing can be downloaded on this "
        "machine).",
        "",
        f"Summary: {len(passed)} of {len(run)} artifacts pass `validate --device NPU`."
        + "".join(f" {r['shape']} {r['variant']} does not: {_verdict(r['npu'])}." for r in run
                  if r.get("npu") and r["npu"]["returncode"] != 0)
        + "".join(f" The {r['shape']} {r['variant']} export peaked at {r['export']['peak_rss_mb'] / 1000:.1f} GB "
                  f"(RSS), over the 6 GB this machine gives one job." for r in run
                  if r.get("export", {}).get("peak_rss_mb", 0) > 6000),
        "",
        "Data-aware artifacts run through the NPU pipeline since their KV state stays f32 (commit 7e6acae): "
        "before it, optimum-intel's load of the stateless graph for calibration gave its KV the CPU's bf16, saved "
        "with the quantized graph, and NPUW refused it at load (`RemoveEmptyKVInputs` failed; measured on this "
        "script's `toy` shape and the tests' tiny llama, not at these widths).",
        "",
        "| shape | variant | export (s, peak RSS MB, weights MB) | NPU pipeline | greedy tokens compared | tolerance "
        "(rule) | validate (s, peak RSS MB) | against PyTorch (export, CPU f32) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        label = f"{r['shape']} ({r['model_type']}, {r['checkpoint']}'s widths)"
        if "skipped" in r:
            lines.append(f"| {label} | - | {r['skipped']} | | | | | |")
            continue
        e = r["export"]
        if e["returncode"] != 0:
            lines.append(f"| {label} | {r['variant']} | {e['wall_s']}, {e['peak_rss_mb']} | export failed: "
                         f"{e.get('error', '')} | | | | |")
            continue
        n = r["npu"]
        rep = n.get("report") or {}
        rule = (f"{rep['tolerance']:.3g} ({rep['rule']}" + "".join(f" + {t}" for t in rep.get("terms") or []) + ")"
                if rep.get("tolerance") is not None else "-")
        lines.append(f"| {label} | {r['variant']} | {e['wall_s']}, {e['peak_rss_mb']}, {e['bytes'] / 1e6:.0f} | "
                     f"{_verdict(n)} | {_tokens(rep)} | {rule} | {n['wall_s']}, {n['peak_rss_mb']} | {_pytorch(r)} |")
    lines += ["", "Widths (6 layers each):", ""]
    seen = set()
    for r in results:
        if r["shape"] in seen:
            continue
        seen.add(r["shape"])
        w = r.get("widths", {})
        lines.append(f"- {r['shape']}: hidden {w.get('hidden')}, intermediate {w.get('intermediate')}, "
                     f"{w.get('heads')} heads of {w.get('head_dim')} ({w.get('kv_heads')} KV), vocabulary "
                     f"{w.get('vocab')}, {'tied' if w.get('tied') else 'untied'} head; "
                     f"{r.get('parameters', 0) / 1e9:.2f} B parameters")
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES, choices=list(SHAPES))
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "npu_int4")
    parser.add_argument("--page", type=Path, default=PAGE)
    parser.add_argument("--results", type=Path, default=None, help="write the results JSON here too")
    parser.add_argument("--keep-artifacts", action="store_true", help="keep each artifact (default: removed once checked)")
    parser.add_argument("--report-only", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.report_only:
        context.rerender(args.report_only, args.page, render)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.results or args.out / "results.json"
    results: list[dict] = []
    models = {}
    for name in args.shapes:  # every model first (built in this process, freed after each)
        models[name] = model_for(name, args.out)
    for variant in args.variants:  # variant by variant: a stopped run has the data-free rows of every shape
        for name in args.shapes:
            model, facts = models[name]
            if model is None:
                if variant == args.variants[0]:
                    results.append(facts)
                continue
            results.append(measure(name, model, facts, variant, args.out))
            if not args.keep_artifacts:
                shutil.rmtree(args.out / "artifacts" / f"{name}-{variant}", ignore_errors=True)
            _save(results, results_path, args.page)
    _save(results, results_path, args.page)
    print(args.page)
    return 0


def _save(results: list[dict], results_path: Path, page: Path) -> None:
    """The results and the page, with the run's date, machine, versions and the NPU properties used."""
    context.write_results_and_page(results, render, results_path, page)
    data = json.loads(results_path.read_text())
    data["info"]["npu_properties"] = _npu_properties()
    results_path.write_text(json.dumps(data, indent=2))
    context.rerender(results_path, page, render)


if __name__ == "__main__":
    raise SystemExit(main())
