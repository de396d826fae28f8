"""Vision-language exports at released widths: wall and memory against optimum-intel's own export, the smallest
memory limit, and GenAI `VLMPipeline` parity.

    python benchmarks/vlm.py                                  # gemma3 and qwen3_5 at 2 and 4 text layers (~1 h)
    python benchmarks/vlm.py --types gemma3 --layers 2
    python benchmarks/vlm.py --report-only docs/benchmarks-vlm.json

For each family and depth, a random-init checkpoint of the released checkpoint's widths (`released.RELEASED_MULTIMODAL`:
Gemma 3 4B, Qwen3.5-4B; fp16, laid out as published, with its processor; the full vision tower, `--layers` text
layers) is exported with `--weight-format fp16` by the baseline and by `--task image-text-to-text-shared`, one fresh
`optimum-cli` process each, one after the other, while the process tree's RSS, anonymous memory (`Pss_Anon`) and PSS
are sampled every 0.1 s (`moe.export`). The baseline is optimum-intel's own `image-text-to-text` export where it runs
(Gemma 3); for Qwen3.5, whose optimum-intel export stops at its transformers cap, that failure is recorded and the
baseline is this package's `text-generation-shared` export of the same checkpoint's language model, plus optimum-intel's
own conversion of the vision graphs alone in a fresh process after it (`vision_graphs_child`; walls added, each peak
the larger of the two). Then this task's export runs again under hard memory limits (a cgroup v1 limit, as root: `memory.Limit`),
from its unlimited peak anonymous memory rounded down to a 0.5 GiB grid upward, until one completes validated; GenAI's `VLMPipeline` runs the artifact's
stored image and prompt greedily against the PyTorch reference the export recorded (`validate(consumer="genai-vlm")`,
f32 properties, EOS ignored on both sides); where a target is missed, one more export runs in-process with its steps
timed and sampled (`export_stages.measure_in_process`). Writes `docs/benchmarks-vlm.json` and `docs/benchmarks-vlm.md`.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import children  # noqa: E402
import context  # noqa: E402
import moe  # noqa: E402
from memory import cgroup_available  # noqa: E402

TASK = "image-text-to-text-shared"
# family -> the baseline export's task, and optimum-intel's own export tried beside it where it is not the baseline
BASELINES = {"gemma3": ("image-text-to-text", None), "qwen3_5": ("text-generation-shared", "image-text-to-text")}
# the families whose baseline is the language model's export plus optimum-intel's conversion of the vision graphs
# alone (`vision_graphs_child`): wall added, peaks the larger of the two
VISION_GRAPHS = ("qwen3_5",)
WALL_TARGET, MEMORY_TARGET = 1.3, 1.2
F32 = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}
LIMIT_TRIES, LIMIT_STEP = 3, 0.5


def build(model_type: str, layers: int, out: Path) -> dict:
    """The checkpoint, in a child process (its memory is gone after); its shape as the page lists it."""
    if not (out / "config.json").is_file():
        code = ("import sys; from optimum_shared_graph import released; "
                f"released.build_released_multimodal({model_type!r}, sys.argv[1], layers={layers})")
        subprocess.run([sys.executable, "-c", code, str(out)], check=True, env=children.child_env(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    config = json.loads((out / "config.json").read_text())
    text, vision = config["text_config"], config["vision_config"]
    from optimum_shared_graph import released

    entry = released.RELEASED_MULTIMODAL[model_type]
    return {"model_type": model_type, "layers": layers, "released": entry["checkpoint"],
            "released_layers": entry["layers"],
            "text": {k: text.get(k) for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                              "intermediate_size", "vocab_size", "layer_types")},
            "vision": {"layers": vision.get("num_hidden_layers") or vision.get("depth"),
                       "hidden_size": vision["hidden_size"], "intermediate_size": vision["intermediate_size"],
                       "heads": vision.get("num_attention_heads") or vision.get("num_heads"),
                       "patch_size": vision["patch_size"], "image_size": vision.get("image_size")},
            "checkpoint_bytes": sum(p.stat().st_size for p in out.glob("*.safetensors"))}


def parity_child(artifact: str) -> dict:
    """In a fresh process: `validate()` through GenAI's VLMPipeline (greedy, EOS ignored) under f32 properties."""
    import optimum_shared_graph as osg
    from optimum_shared_graph import ArtifactValidationError

    keys = ("status", "rule", "tolerance", "greedy_match", "greedy_tokens", "compared_tokens", "not_compared",
            "differences", "restarts")
    start = time.perf_counter()
    try:
        report = osg.validate(artifact, consumer="genai-vlm", properties=dict(F32))
    except ArtifactValidationError as err:
        report = {**(getattr(err, "report", None) or {}), "status": "failed", "error": str(err)[:300]}
    return {**{k: report[k] for k in (*keys, "error") if k in report}, "seconds": round(time.perf_counter() - start, 1)}


def parity(artifact: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--parity-child", str(artifact)], capture_output=True, text=True,
                          env=children.child_env())
    if proc.returncode != 0:
        return {"status": "error", "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def smallest_limit(model: Path, out: Path, peak_anon_mb: float, logs: Path, most: int = LIMIT_TRIES) -> list[dict]:
    """This task's export under hard limits on a `LIMIT_STEP` grid, from its unlimited peak anonymous memory
    rounded down to the grid (at least 1.5 GiB) upward until one completes validated, at most `most` tries; where
    the first completes, one step below it too. Each try's row (the artifact removed). Starting lower only spends
    tries: the last run's 0.75x start failed twice below the peak (gemma3, qwen3_5 at 2 layers)."""
    gib = max(1.5, math.floor(peak_anon_mb / 1024 / LIMIT_STEP) * LIMIT_STEP)
    tries: list[dict] = []
    while len(tries) < most:
        row = moe.export(model, out, TASK, gib, logs / f"{model.name}-shared-{gib:g}.log")
        shutil.rmtree(out, ignore_errors=True)
        tries.append(row)
        if _validated(row):
            if len(tries) > 1 or gib - LIMIT_STEP < 1.0:  # a failure below it, or a second success: stop
                break
            gib -= LIMIT_STEP  # the first try completed: one step below it
        else:
            if any(_validated(t) for t in tries):  # a failure below a success: the grid's bound
                break
            gib += LIMIT_STEP
    return tries


def _validated(row: dict) -> bool:
    return bool(row.get("completed")) and (row.get("validation") or {}).get("status") == "passed"


def run(args) -> dict:
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs-vlm"
    logs.mkdir(exist_ok=True)
    results = {"rows": [], "machine": context.machine(), "versions": context.versions(),
               "date": time.strftime("%Y-%m-%d"), "note": args.note}
    rows = results["rows"]

    def keep() -> None:  # what a crash or a stop leaves: renderable with --report-only
        results["machine"] = context.machine()
        (work / "vlm-partial.json").write_text(json.dumps(results, indent=1) + "\n")

    # 1. each family and depth: the checkpoint, the baseline, this task's export, VLMPipeline on its artifact; every
    # family at the first depth before any at the next, so a stopped run has the most rows it could
    for layers in args.layers:
        for model_type in args.types:
            model = work / f"{model_type}-{layers}"
            row = build(model_type, layers, model)
            base_task, tried = BASELINES[model_type]
            if tried:
                row["optimum_intel"] = moe.export(model, work / "vlm-base", tried, None, logs / f"{model.name}-{tried}.log")
            row["baseline"] = moe.export(model, work / "vlm-base", base_task, None, logs / f"{model.name}-{base_task}.log")
            if model_type in VISION_GRAPHS:
                row["vision_graphs"] = moe.export(
                    model, work / "vlm-base", "vision graphs (optimum-intel)", None, logs / f"{model.name}-vision.log",
                    command=[sys.executable, __file__, "--vision-graphs-child", str(model), str(work / "vlm-base")])
            shutil.rmtree(work / "vlm-base", ignore_errors=True)
            ours = row["shared"] = moe.export(model, work / "vlm-shared", TASK, None, logs / f"{model.name}-shared.log")
            if ours["completed"]:
                row["parity"] = parity(work / "vlm-shared")
            shutil.rmtree(work / "vlm-shared", ignore_errors=True)
            rows.append(row)
            keep()
            if not args.keep_models and layers not in (*args.limit_layers, *args.stages_layers):
                shutil.rmtree(model, ignore_errors=True)
    # 2. the smallest hard limit, at the depths asked; 3. the steps of an export that missed a target
    for row in rows:
        model = work / f"{row['model_type']}-{row['layers']}"
        if row["shared"]["completed"] and row["layers"] in args.limit_layers:
            if (why := cgroup_available()) is None:
                row["limits"] = smallest_limit(model, work / "vlm-shared", row["shared"]["peak_anon_mb"], logs,
                                               args.limit_tries)
            else:
                row["limits"] = [{"skipped": why}]
            keep()
    for row in rows:
        model = work / f"{row['model_type']}-{row['layers']}"
        if args.stages and row["layers"] in args.stages_layers and any(not t["met"] for t in targets(row)):
            row["stages"] = moe.stages(model, work / "vlm-stages", "fp16", TASK)
            keep()
        if not args.keep_models:
            shutil.rmtree(model, ignore_errors=True)
    return results


def vision_graphs_child(model: str, out: str) -> None:
    """optimum-intel's own conversion of the graphs of `model` but its language model (the vision graphs and the text
    embeddings), into `out`: its `image-text-to-text`
    export config for the model type and its `export_models`, the checkpoint loaded and converted as
    `optimum-cli export openvino --weight-format fp16` does (fp16, its 16-bit patching, weights saved in fp16); the
    language model part is left out (the baseline exports it with `text-generation-shared`), and the export
    config's transformers cap is lifted (the vision graphs do not depend on it)."""
    import torch
    from optimum.exporters.openvino.convert import _get_multi_modal_submodels_and_export_configs, export_models
    from optimum.intel.openvino.configuration import OVConfig
    from transformers import AutoModelForImageTextToText

    pt = AutoModelForImageTextToText.from_pretrained(model, dtype=torch.float16).eval()
    _main, parts, _stateful = _get_multi_modal_submodels_and_export_configs(
        pt, "image-text-to-text", "transformers", "int64", "fp32")
    vision = {}
    for name, (module, config) in parts.items():
        if name != "language_model":  # the baseline exports it with text-generation-shared
            config.MAX_TRANSFORMERS_VERSION = None
            vision[name] = (module, config)
    Path(out).mkdir(parents=True, exist_ok=True)
    export_models(vision, Path(out), ov_config=OVConfig(dtype="fp16"), stateful=False, patch_16bit_model=True,
                  library_name="transformers")
    print(json.dumps(sorted(vision)))


def baseline_of(row: dict) -> dict:
    """The row's baseline export: with `vision_graphs` (`VISION_GRAPHS`), the language model's export and the vision
    graphs' conversion one after the other: their walls added, each peak the larger of the two."""
    b, v = row["baseline"], row.get("vision_graphs")
    if not v:
        return b
    return {"completed": b.get("completed") and v.get("completed"), "wall_s": round(b["wall_s"] + v["wall_s"], 1),
            **{k: max(b[k], v[k]) for k in ("peak_rss_mb", "peak_anon_mb", "peak_pss_mb")},
            "error": b.get("error") or v.get("error")}


def targets(row: dict) -> list[dict]:
    """The row's figures against the targets: this task / the baseline for wall, peak anonymous memory and RSS."""
    b, o = baseline_of(row), row["shared"]
    if not (b.get("completed") and o.get("completed")):
        return []
    out = []
    for name, key, bound in (("wall", "wall_s", WALL_TARGET), ("peak anonymous memory", "peak_anon_mb", MEMORY_TARGET),
                             ("peak RSS", "peak_rss_mb", MEMORY_TARGET)):
        ratio = o[key] / b[key]
        out.append({"figure": name, "ratio": round(ratio, 2), "bound": bound, "met": ratio <= bound})
    return out


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def _export_cell(e: dict) -> str:
    if not e.get("completed"):
        return f"failed: {e.get('error')} (peak anonymous {e['peak_anon_mb']:,} MB)"
    return f"{e['wall_s']:.0f} s, {e['peak_anon_mb']:,} MB anonymous, {e['peak_rss_mb']:,} MB RSS"


def _limits_cell(tries: list[dict]) -> str:
    if not tries:
        return "not run"
    if "skipped" in tries[0]:
        return f"skipped ({tries[0]['skipped']})"
    done = [t for t in tries if _validated(t)]
    said = ", ".join(f"{t['limit_gib']:g} GiB " + ("validated" if _validated(t) else
                                                   f"failed ({t.get('error') or (t.get('validation') or {}).get('status')})")
                     for t in sorted(tries, key=lambda t: t["limit_gib"]))
    smallest = f"**{min(t['limit_gib'] for t in done):g} GiB**" if done else "none tried"
    return f"{smallest} ({said})"


def _parity_cell(p: dict | None) -> str:
    if not p:
        return "-"
    if p.get("status") != "passed":
        return f"**{p.get('status')}**: {p.get('error', '')}"
    compared = sum(p.get("compared_tokens") or [0])
    extra = f"; not compared: {p['not_compared']}" if p.get("not_compared") else ""
    same = ", identical" if p.get("greedy_match") else f", differing within the {p.get('rule')} rule's margins"
    return f"passed, {compared} of {p.get('greedy_tokens')} greedy tokens compared{same}{extra}"


def render(results: dict) -> str:
    rows = results["rows"]
    lines = ["# Vision-language exports at released widths", "",
             f"Generated by `python benchmarks/vlm.py` on {results['date']} (one run; results in "
             f"`docs/benchmarks-vlm.json`): {context.describe_machine(results['machine'])}, CPU "
             f"\"{results['machine'].get('Model name', '?')}\" "
             f"({', '.join(results['machine'].get('isa', []))}).", ""]
    if results.get("note"):
        lines += [f"Conditions: {results['note']}", ""]
    if results.get("stopped"):
        lines += [f"**Stopped before the end**: {results['stopped']}", ""]
    lines += ["Random-init checkpoints of the released checkpoints' widths (`optimum_shared_graph.released."
              "build_released_multimodal`, fp16, laid out as published, with their processor: image processor at "
              "the release's sizes, a locally trained tokenizer with the image tokens, a chat template; "
              "`initializer_range` 0.02 as published), the full vision tower and 2 or 4 of the text model's layers "
              "(the release's first layers, the last a global-attention one where none of them is). Each export is "
              "`optimum-cli export openvino --weight-format fp16`, a fresh process, the baseline right before this "
              "task's; memory is the process tree's peak, sampled every 0.1 s: anonymous memory (`Pss_Anon`) is what "
              "cannot be reclaimed, RSS also counts the memory-mapped checkpoint's pages. Under a limit: a cgroup v1 "
              f"hard limit on the process tree (no swap), tried on a {LIMIT_STEP:g} GiB grid from the unlimited "
              "peak anonymous memory rounded down, upward; **bold** is the smallest that completed with validation passed. Parity: "
              "`validate(consumer=\"genai-vlm\")`, GenAI's `VLMPipeline` on the stored image and prompt (its own image "
              "preprocessing and chat template), greedy, EOS ignored, against the PyTorch `generate()` the export "
              f"recorded on them (EOS ignored there too), properties `{json.dumps(F32)}`.", "",
              "## Shapes", "",
              "| family | released checkpoint | text: hidden, heads / KV heads x head_dim, MLP, vocabulary | "
              "text layers here (released) | vision tower | image | checkpoint |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t, v = r["text"], r["vision"]
        image = f"{v['image_size']} px, patches of {v['patch_size']}" if v.get("image_size") else f"patches of {v['patch_size']}"
        lines.append(f"| {r['model_type']} | {r['released']} | {t['hidden_size']}, {t['num_attention_heads']} / "
                     f"{t['num_key_value_heads']} x {t['head_dim']}, {t['intermediate_size']}, {t['vocab_size']:,} | "
                     f"{r['layers']} ({r['released_layers']}): {', '.join(t['layer_types'])} | {v['layers']} x "
                     f"{v['hidden_size']} ({v['heads']} heads, MLP {v['intermediate_size']}) | {image} | "
                     f"{_gb(r['checkpoint_bytes'])} |")
    from optimum_shared_graph import released

    for model_type in dict.fromkeys(r["model_type"] for r in rows):
        entry = released.RELEASED_MULTIMODAL[model_type]
        lines += ["", f"Where {model_type}'s widths come from ({entry['checkpoint']}): {entry['source']}."]
    lines += ["", "## Results", "",
              "| family | layers | baseline | baseline: wall, peak | this task: wall, peak | wall ratio | "
              "anonymous ratio | RSS ratio | smallest hard limit (tries) | VLMPipeline parity (f32) | validation |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        b, o = baseline_of(r), r["shared"]
        base = BASELINES[r["model_type"]][0]
        base_name = ("optimum-intel `image-text-to-text`" if base == "image-text-to-text" else
                     f"`{base}` (language model) + optimum-intel's vision graphs ({_export_cell(r['baseline'])}; "
                     f"{_export_cell(r['vision_graphs'])})" if r.get("vision_graphs") else
                     f"`{base}` (language model only)")
        ratios = {t["figure"]: f"{t['ratio']:.2f}x" + ("" if t["met"] else " (**missed**)") for t in targets(r)}
        v = o.get("validation") or {}
        lines.append(f"| {r['model_type']} | {r['layers']} | {base_name} | {_export_cell(b)} | {_export_cell(o)} | "
                     f"{ratios.get('wall', '-')} | {ratios.get('peak anonymous memory', '-')} | "
                     f"{ratios.get('peak RSS', '-')} | {_limits_cell(r.get('limits', []))} | "
                     f"{_parity_cell(r.get('parity'))} | {v.get('status')}, {v.get('greedy_tokens')} tokens |")
    tried = [r for r in rows if r.get("optimum_intel")]
    if tried:
        lines += ["", "optimum-intel's own `image-text-to-text` export of the same checkpoints, where it is not the "
                  "baseline: " + "; ".join(f"{r['model_type']} at {r['layers']} layers: {_export_cell(r['optimum_intel'])}"
                                            for r in tried) + ". So for them the baseline is this package's "
                  "text-generation-shared export of the language model, plus, where the row names it, optimum-intel's "
                  "own conversion of the vision graphs alone (`vision_graphs_child`: its export config and "
                  "`export_models`, fp16, the config's transformers cap lifted), run after it: walls added, each "
                  "peak the larger of the two."]
    lines += ["", "## Targets", "",
              f"This task against the baseline: wall <= {WALL_TARGET:g}x, peak anonymous memory and peak RSS <= "
              f"{MEMORY_TARGET:g}x.", "", "| family | layers | figure | ratio | bound | |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        for t in targets(r):
            lines.append(f"| {r['model_type']} | {r['layers']} | {t['figure']} | {t['ratio']:.2f}x | <= {t['bound']:g}x | "
                         f"{'met' if t['met'] else '**missed**'} |")
    for r in rows:
        s = r.get("stages")
        if not s:
            continue
        lines += ["", f"### Where {r['model_type']} at {r['layers']} layers spends its time and memory", ""]
        if not s.get("completed"):
            lines.append(f"The step-timed export failed: {s.get('error')}.")
            continue
        lines += [f"One more export of the same checkpoint in-process (`osg.export`), each step's wall and its peak "
                  f"memory sampled every 50 ms: {s['wall_s']:.0f} s, peak anonymous {s['peak_anon_mb']:,} MB, "
                  f"peak RSS {s['peak_rss_mb']:,} MB. The baseline took {baseline_of(r)['wall_s']:.0f} s and "
                  f"{baseline_of(r)['peak_anon_mb']:,} MB anonymous in all.", ""] + moe.step_table(s["steps"])
    slopes = []
    by_type: dict[str, list] = {}
    for r in rows:
        if r["shared"].get("completed"):
            by_type.setdefault(r["model_type"], []).append(r)
    for model_type, rs in by_type.items():
        rs = sorted(rs, key=lambda r: r["layers"])
        if len(rs) >= 2:
            a, b = rs[0], rs[-1]
            n = b["layers"] - a["layers"]
            per = {k: (b["shared"][k] - a["shared"][k]) / n for k in ("peak_anon_mb", "wall_s")}
            base = ""
            ba, bb = baseline_of(a), baseline_of(b)
            if ba.get("completed") and bb.get("completed"):
                base = (f"; the baseline {(bb['peak_anon_mb'] - ba['peak_anon_mb']) / n:+,.0f} MB "
                        f"and {(bb['wall_s'] - ba['wall_s']) / n:+.1f} s per layer")
            grow = (b["checkpoint_bytes"] - a["checkpoint_bytes"]) / n
            full = a["released_layers"]
            est = a["shared"]["peak_anon_mb"] + per["peak_anon_mb"] * (full - a["layers"])
            slopes.append(f"{model_type}: this task {per['peak_anon_mb']:+,.0f} MB of peak anonymous memory and "
                          f"{per['wall_s']:+.1f} s per text layer between {a['layers']} and {b['layers']} layers{base} "
                          f"(the checkpoint grows {grow / 1e6:,.0f} MB per layer); linear to the release's {full} "
                          f"layers, this task's peak anonymous memory would be about {est / 1024:.1f} GiB (an "
                          "extrapolation, not measured)")
    if slopes:
        lines += ["", "## Slope with depth", "", "; ".join(slopes) + "."]
    lines += ["", "Versions: " + ", ".join(f"{k} {val}" for k, val in results["versions"].items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--parity-child"]:
        print(json.dumps(parity_child(sys.argv[2])))
        return 0
    if argv is None and sys.argv[1:2] == ["--vision-graphs-child"]:
        vision_graphs_child(sys.argv[2], sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", default=list(BASELINES), choices=list(BASELINES))
    parser.add_argument("--layers", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--workdir", type=Path, default=HERE / "results")
    parser.add_argument("--docs-dir", type=Path, default=HERE.parent / "docs")
    parser.add_argument("--keep-models", action="store_true")
    parser.add_argument("--limit-layers", nargs="*", type=int, default=[2],
                        help="the depths whose export is also run under hard limits (each try is a whole export)")
    parser.add_argument("--limit-tries", type=int, default=LIMIT_TRIES)
    parser.add_argument("--stages-layers", nargs="*", type=int, default=[2],
                        help="the depths whose export is step-timed where it misses a target")
    parser.add_argument("--no-stages", dest="stages", action="store_false",
                        help="no step-timed export where a target is missed")
    parser.add_argument("--note", default="", help="the run's conditions, printed on the page")
    parser.add_argument("--report-only", type=Path, help="re-render docs/benchmarks-vlm.md from a results JSON")
    parser.add_argument("--stopped", help="with --report-only on a stopped run's vlm-partial.json: what it did not "
                                          "run and why, printed on the page; its results written to the docs too")
    args = parser.parse_args(argv)
    results = json.loads(args.report_only.read_text()) if args.report_only else run(args)
    if args.stopped:
        results["stopped"] = args.stopped
    if not args.report_only or args.stopped:
        (args.docs_dir / "benchmarks-vlm.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.docs_dir / "benchmarks-vlm.md").write_text(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
