"""Which calibration set helps which algorithm: data-free, prefill only and decode calls added, on trained models.

For each model of the run, optimum-intel's stateless fp32 export (what `quantization.both_stages` quantizes) is made
once; then for every quantization mode and every calibration design the same graph is quantized in-process as an
export quantizes it (`both_stages.quantize_both_stages`: this package's calibration set, and its `--quant-mode int8`
settings), made stateful, and evaluated against PyTorch fp32 on held-out text: prompt windows in one prefill call,
then teacher-forced one-token decode calls (benchmarks/quality.py's evaluation), compiled with
`{"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}`.

Models: `real` (SmolLM2-135M-Instruct, calibrated on benchmarks/data/real_calibration.txt, evaluated on
real_eval.txt), `trained` (benchmarks/train_small.py's full model: calibrated on train-split files of the Python
standard library, evaluated on held-out ones), or a local directory (`--texts`, `--eval`).

Designs (same texts, same `--num-samples`):
    data-free  no calibration (weight compression only)
    prefill    prefill calls only (`--calibration-decode-steps 0`)
    grouped    + 4 decode calls per text, one sample per text's decode calls (the design before merging)
    merged     + 4 decode calls per text, all texts' decode calls merged into samples as long as a mean prompt
    merged16   + 16 decode calls per text (longer pasts), merged the same way (`--calibration-decode-steps 16`)

Besides the error, what the decode samples change in the statistics NNCF collects (`--stats`): for every MatMul
with a constant weight, the per-sample mean of its input (what NNCF's weight compression reduces each sample to:
`OVMeanReducer` over batch and sequence), AWQ's and scale estimation's channel magnitude `s` (the max over samples of
|mean|, `activation_stats.process_stats`), and the min-max range over every token (`--quant-mode int8` under MINMAX).

With `--models`, one run writes docs/quality.md's section and docs/calibration-designs.json.

Usage:
    nice -n 5 python benchmarks/calibration_design.py --models real trained --stats \\
        --modes int4-awq-se int4-gptq int4-mixed int8 --designs data-free prefill merged16   # the docs' run
    nice -n 5 python benchmarks/calibration_design.py --model PATH --eval FILE --texts FILE ...
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

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import context  # noqa: E402
import quality  # noqa: E402
import train_small  # noqa: E402

EXACT = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}
# name: (decode calls per text, how decode calls become samples); None: no calibration at all (weight modes only)
DESIGNS = {"data-free": (None, None), "prefill": (0, None), "grouped": (4, None), "merged": (4, "prompt"),
           "merged16": (16, "prompt"), "merged32": (32, "prompt"), "merged64": (64, "prompt")}
WEIGHT_MODES = ("int4-awq-se", "int4-awq", "int4-se", "int4-gptq", "int4-mixed")


def mode_config(mode: str, texts: list[str], num_samples: int) -> dict:
    """optimum-intel's config dict, as its CLI builds it for the flags named in the table."""
    data = {"dataset": texts, "num_samples": num_samples}
    if mode == "int4-awq-se":  # --weight-format int4 --awq --scale-estimation --group-size 64 --ratio 1.0
        return {"bits": 4, "group_size": 64, "ratio": 1.0, "quant_method": "awq", "scale_estimation": True, **data}
    if mode == "int4-awq":
        return {"bits": 4, "group_size": 64, "ratio": 1.0, "quant_method": "awq", **data}
    if mode == "int4-se":
        return {"bits": 4, "group_size": 64, "ratio": 1.0, "scale_estimation": True, **data}
    if mode == "int4-gptq":
        return {"bits": 4, "group_size": 64, "ratio": 1.0, "gptq": True, **data}
    if mode == "int4-mixed":  # data-aware mixed precision: int4 on 80% of the layers ranked by sensitivity
        return {"bits": 4, "group_size": 64, "ratio": 0.8, "sensitivity_metric": "hessian_input_activation", **data}
    if mode == "int8":  # --quant-mode int8 (prepare_q_config)
        return {"dtype": "int8", "bits": 8, "sym": False, "smooth_quant_alpha": None, **data}
    raise SystemExit(f"unknown mode {mode}")


def samples_of(model, prompts, design: str):
    from optimum_shared_graph.quantization.both_stages import BothStageSamples

    steps, merge = DESIGNS[design]
    per = None
    if merge == "prompt":
        per = int(round(np.mean([np.asarray(p["input_ids"]).shape[-1] for p in prompts])))
    return BothStageSamples(model.model, prompts, steps, decode_tokens_per_sample=per)


def quantize(base: Path, out: Path, mode: str, design: str, texts: list[str], num_samples: int, model_id: str):
    """The stateless graph at `base` quantized with `design`'s samples into `out`, made stateful; the samples'
    composition. Prefill-only and merged designs run the export's own calibrated quantization
    (`both_stages.quantize_both_stages`, this package's `--quant-mode int8` defaults included); `grouped` (one sample
    per text's decode calls, the design before) builds its samples here; `data-free` compresses with no data."""
    from optimum_shared_graph.quantization.both_stages import quantize_both_stages
    from optimum_shared_graph.quantization.calibration import (
        CalibrationReport, _apply_calibrated, _prepared_config, load_stateless, make_stateful, prompt_inputs,
    )

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    steps, merge = DESIGNS[design]
    start = time.perf_counter()
    if steps is None:  # optimum-intel's data-free weight compression of the same graph
        if mode not in WEIGHT_MODES:
            raise SystemExit(f"{mode} needs calibration data: no data-free design")
        model = load_stateless(out)
        config = {k: v for k, v in mode_config(mode, texts, num_samples).items()
                  if k not in ("dataset", "num_samples", "quant_method", "scale_estimation", "gptq",
                               "sensitivity_metric")}
        model._apply_quantization(_prepared_config(model, config, model_id), compile_only=False, compile_model=False,
                                  model_name_or_path=model_id, trust_remote_code=False, save_directory=out,
                                  immediate_save=True)
        info = {"samples": 0, "prefill_calls": 0, "decode_calls": 0}
    elif merge == "prompt" or not steps:
        report = CalibrationReport()
        quantize_both_stages(model_id, out, mode_config(mode, texts, num_samples), decode_steps=steps, stateful=False,
                             report=report)
        info = {"samples": report.samples, "prefill_calls": report.prefill, "decode_calls": report.decode}
        model = None
    else:
        model = load_stateless(out)
        config = _prepared_config(model, mode_config(mode, texts, num_samples), model_id)
        samples = samples_of(model, prompt_inputs(model, config), design)
        info = {"samples": len(samples), "prefill_calls": samples.prefill_count, "decode_calls": samples.decode_count}
        _apply_calibrated(model, config, samples, model_name_or_path=model_id, trust_remote_code=False,
                          save_directory=out, immediate_save=True)
        del samples
    info["quantize_seconds"] = time.perf_counter() - start
    del model
    from transformers import AutoConfig

    make_stateful(out / "openvino_model.xml", AutoConfig.from_pretrained(base))
    return info


def base_graph(model: Path, work: Path, base_task: str = "with-past") -> Path:
    """The fp32 stateless graph every design quantizes, exported once into `work / "fp32-stateless"`: optimum-intel's
    own stateless export; where its version cap refuses the model type (`base_task="shared"`), this package's task
    (which lifts the cap once validation passes) with every logit kept, stateless as well."""
    base = work / "fp32-stateless"
    if not (base / "openvino_model.xml").is_file():
        task = ["--task", "text-generation-with-past"] if base_task == "with-past" else [
            "--task", "text-generation-shared", "--logits", "all"]
        subprocess.run(["optimum-cli", "export", "openvino", "-m", str(model), *task,
                        "--weight-format", "fp32", "--disable-stateful", str(base)], check=True, capture_output=True)
    return base


def weight_inputs(ov_model):
    """(name, output) of the activation input of every MatMul whose other input is a constant (through Converts)."""
    found = []
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        src = op.input_value(1).get_node()
        while src.get_type_name() == "Convert":
            src = src.input_value(0).get_node()
        act = op.input_value(0)
        key = (act.get_node().get_friendly_name(), act.get_index())
        if src.get_type_name() == "Constant" and key not in {k for k, _ in found}:  # one per activation, as NNCF
            found.append((key, act))
    return found


def statistics(base: Path, prompts, designs: list[str]) -> dict:
    """What each design's samples give NNCF's weight-compression and min-max statistics, against prefill only."""
    import openvino as ov

    from optimum_shared_graph.quantization.both_stages import BothStageSamples

    core = ov.Core()
    ov_model = core.read_model(base / "openvino_model.xml")
    taps = weight_inputs(ov_model)
    names = [n for n, _ in taps]
    probe = core.read_model(base / "openvino_model.xml")
    probe_taps = weight_inputs(probe)
    probe.add_outputs([o for _, o in probe_taps])
    compiled = core.compile_model(probe, "CPU", EXACT)
    outputs = list(compiled.outputs)[-len(probe_taps):]
    request = compiled.create_infer_request()
    out = {"matmuls": len(names)}
    per_design = {}
    steps = max(DESIGNS[d][0] for d in designs)
    base_samples = BothStageSamples(ov_model, prompts, steps)  # generation once; designs re-key its calls
    prompt_len = int(round(np.mean([np.asarray(p["input_ids"]).shape[-1] for p in prompts])))
    for design in designs:
        dsteps, merge = DESIGNS[design]
        keys = [(i, 0) for i in range(base_samples.texts)]
        if dsteps:
            rows = [(i, k) for i in range(base_samples.texts) for k in range(1, dsteps + 1)]
            if merge:
                chunks = max(1, round(len(rows) / prompt_len))
                keys += [("rows", tuple(rows[c::chunks])) for c in range(chunks)]
            else:
                keys += [("rows", tuple(r for r in rows if r[0] == i)) for i in range(base_samples.texts)]
        means, tokens, lo, hi = [], [], None, None
        for key in keys:
            request.infer(base_samples.feed(key))
            acts = [request.get_tensor(o).data for o in outputs]
            means.append([a.reshape(-1, a.shape[-1]).mean(0) for a in acts])
            tokens.append(int(np.prod(acts[0].shape[:-1])))
            mins = np.array([a.min() for a in acts])
            maxs = np.array([a.max() for a in acts])
            lo = mins if lo is None else np.minimum(lo, mins)
            hi = maxs if hi is None else np.maximum(hi, maxs)
        per_design[design] = {"keys": keys, "means": means, "tokens": tokens, "range": hi - lo}
    ref = per_design["prefill"]
    for design in designs:
        d = per_design[design]
        n_pre = base_samples.texts
        ratios_s, decode_sets_s = [], []
        for m in range(len(names)):
            x = np.abs(np.stack([sample[m] for sample in d["means"]]))  # [samples, hidden]
            s_all, s_pre = x.max(0), x[:n_pre].max(0)
            ratios_s.append(float(np.median(s_all / np.maximum(s_pre, 1e-12))))
            decode_sets_s.append(float((x[n_pre:].max(0) > s_pre).mean()) if len(x) > n_pre else 0.0)
        # AWQ's subset (process_stats): sorted by tokens, every `step`-th of the longest, `subset` of them
        counts = {}
        for subset in (32, 64):
            n = len(d["keys"])
            if n > subset:
                step = n // subset
                order = [i for i, _ in sorted(enumerate(d["tokens"]), key=lambda t: -t[1])][::step]
            else:
                order = list(range(n))
            counts[subset] = {"prefill": sum(1 for i in order if i < n_pre), "decode": sum(1 for i in order if i >= n_pre)}
        total_tokens = sum(d["tokens"])
        decode_tokens = sum(d["tokens"][n_pre:])
        out[design] = {
            "samples": len(d["keys"]), "prefill_samples": n_pre, "decode_samples": len(d["keys"]) - n_pre,
            "decode_share_of_samples": (len(d["keys"]) - n_pre) / len(d["keys"]),
            "decode_share_of_tokens": decode_tokens / total_tokens,
            "mean_tokens_prefill_sample": float(np.mean(d["tokens"][:n_pre])),
            "mean_tokens_decode_sample": float(np.mean(d["tokens"][n_pre:])) if len(d["keys"]) > n_pre else None,
            "awq_subset_32": counts[32], "se_subset_64": counts[64],
            "s_ratio_median_over_matmuls": float(np.median(ratios_s)),
            "s_ratio_max_over_matmuls": float(np.max(ratios_s)),
            "channels_whose_s_a_decode_sample_sets": float(np.mean(decode_sets_s)),
            "minmax_range_ratio_median": float(np.median(d["range"] / ref["range"])),
            "minmax_range_ratio_max": float(np.max(d["range"] / ref["range"])),
            "minmax_ranges_widened": float(np.mean(d["range"] > ref["range"] * (1 + 1e-6))),
        }
    return out


LABELS = {"data-free": "data-free", "prefill": "prefill only", "grouped": "+ 4 decode calls per text, one sample per text",
          "merged": "+ 4 decode calls per text, merged to prompt-length samples",
          "merged16": "+ 16 decode calls per text, merged to prompt-length samples",
          "merged32": "+ 32 decode calls per text, merged to prompt-length samples",
          "merged64": "+ 64 decode calls per text, merged to prompt-length samples"}
MODES = {"int4-awq-se": "int4 AWQ + scale estimation (group size 64, ratio 1.0)", "int4-awq": "int4 AWQ",
         "int4-se": "int4 scale estimation", "int4-gptq": "int4 GPTQ", "int4-mixed": "int4/int8 mixed, hessian",
         "int8": "`--quant-mode int8` (MINMAX ranges, down projections in float, SmoothQuant 0.5, overflow fix)"}
BEGIN, END = "<!-- calibration-design:begin -->", "<!-- calibration-design:end -->"


def render(run: dict) -> str:
    """The docs section from one run (`run["runs"]`: one entry per model): per model, per mode and design, the error
    against PyTorch; the statistics; then what the defaults follow."""
    runs = run["runs"]
    lines = [BEGIN, "## Calibration designs: what the decode calls change, per algorithm", "",
             f"One run of `python benchmarks/calibration_design.py` ({run['minutes']:.0f} minutes, {runs[0]['date']}, "
             f"{run['machine']['cpu']}"
             + (f" ({run['machine']['isa']})" if run["machine"].get("isa") else "")
             + f", {run['machine']['nproc']} cores; "
             + ", ".join(f"{k} {v}" for k, v in run["versions"].items()) + "): each model's optimum-intel stateless "
             "fp32 graph quantized in-process as an export quantizes it (`quantize_both_stages`: this package's "
             "calibration set and its `--quant-mode int8` settings; *data-free*: optimum-intel's compression with no "
             "data), same texts, same `--num-samples`, made stateful, and evaluated against PyTorch fp32 on held-out "
             "text: prompt windows in one prefill call, then teacher-forced one-token decode calls, compiled with "
             f"`{json.dumps(EXACT)}`. KL is the mean KL(PyTorch || artifact) over every evaluated position, in nats; "
             "*vs prefill only*: the ratio of KLs, and in how many windows the design's KL was lower (paired). "
             "**Bold**: the export's default for the mode today (`--calibration-decode-steps` not given; "
             "`quantization.calibration.decode_steps_for`).", ""]
    for r in runs:
        heading = r["model"] if r["model_type"] in r["model"] else f"{r['model']} ({r['model_type']})"
        lines += [f"### {heading}", "",
                  f"{r['texts']} calibration texts ({r['calibration_file']}); {r['windows']} windows of "
                  f"{r['eval_file']} ({r['prompt']}-token prompt, {r['decode']} decode calls); PyTorch perplexity "
                  f"{r['pytorch_perplexity']:.2f} on them.", "",
                  "| mode | calibration | NNCF samples (prefill + decode) | perplexity vs PyTorch | KL | KL vs prefill only "
                  "| top-1 |", "|---|---|---|---|---|---|---|"]
        prefill = {row["mode"]: row["stats"] for row in r["rows"] if row["design"] == "prefill"}
        for row in r["rows"]:
            st, base = row["stats"], prefill.get(row["mode"])
            ratio = f"{st['kl'] / base['kl']:.3f}x" if base else ""
            if base and row["design"] != "prefill":  # paired: the same windows, this design against prefill only
                def per_window(x):
                    return [(a * r["prompt"] + b * r["decode"]) / (r["prompt"] + r["decode"])
                            for a, b in zip(x["kl_prefill_windows"], x["kl_decode_windows"])]
                lower = sum(a < b for a, b in zip(per_window(st), per_window(base)))
                ratio += f", lower in {lower} of {len(base['kl_decode_windows'])} windows"
            design = LABELS.get(row["design"], row["design"])
            samples = ("-" if row["design"] == "data-free" else f"{row['prefill_calls']} + "
                       f"{row['samples'] - row['prefill_calls']} ({row['decode_calls']} decode calls)")
            default = row["design"] == default_design(row["mode"], ["a text"], 1)
            lines.append(f"| {MODES.get(row['mode'], row['mode'])} | {f'**{design}**' if default else design}"
                         f" | {samples} | {100 * (st['perplexity'] / r['pytorch_perplexity'] - 1):+.2f}% | "
                         f"{st['kl']:.4g} | {ratio} | {100 * st['top1']:.2f}% |")
        stats = r.get("statistics")
        if stats:
            lines += ["", f"What each design's samples give NNCF ({stats['matmuls']} activations feeding weights):", "",
                      "| calibration | samples: decode share | tokens: decode share | mean tokens per prefill / decode "
                      "sample | AWQ subset (32): prefill + decode | AWQ/SE channel magnitude s, median ratio to "
                      "prefill only (max) | channels whose s a decode sample sets | int8 min-max ranges widened "
                      "(median ratio, max) |", "|---|---|---|---|---|---|---|---|"]
            for design, d in stats.items():
                if not isinstance(d, dict):
                    continue
                dec = f"{d['mean_tokens_decode_sample']:.1f}" if d["mean_tokens_decode_sample"] else "-"
                lines.append(
                    f"| {LABELS.get(design, design)} | {100 * d['decode_share_of_samples']:.0f}% | "
                    f"{100 * d['decode_share_of_tokens']:.1f}% | {d['mean_tokens_prefill_sample']:.1f} / {dec} | "
                    f"{d['awq_subset_32']['prefill']} + {d['awq_subset_32']['decode']} | "
                    f"{d['s_ratio_median_over_matmuls']:.3f}x ({d['s_ratio_max_over_matmuls']:.2f}x) | "
                    f"{100 * d['channels_whose_s_a_decode_sample_sets']:.1f}% | "
                    f"{100 * d['minmax_ranges_widened']:.0f}% ({d['minmax_range_ratio_median']:.3f}x, "
                    f"{d['minmax_range_ratio_max']:.2f}x) |")
        lines.append("")
    lines += ["### Both stages against prefill only, per mode", "",
              "KL of the both-stage calibration over prefill-only calibration's, per model (below 1: the decode calls "
              "help), and the export's default for the mode.", "",
              "| mode | " + " | ".join(r["model"] for r in runs) + " | default |",
              "|---|" + "---|" * len(runs) + "---|"]
    for mode in dict.fromkeys(row["mode"] for r in runs for row in r["rows"]):
        cells = []
        for r in runs:
            rows = {row["design"]: row for row in r["rows"] if row["mode"] == mode}
            both = [d for d in rows if DESIGNS[d][0]]
            cells.append(", ".join(f"{rows[d]['stats']['kl'] / rows['prefill']['stats']['kl']:.3f}x "
                                   f"({LABELS[d].removeprefix('+ ')})" for d in both) if "prefill" in rows else "")
        lines.append(f"| {MODES.get(mode, mode)} | " + " | ".join(cells) + f" | {LABELS[default_design(mode, ['a text'], 1)]} |")
    argv = [a for i, a in enumerate(run["argv"]) if a != "--work" and run["argv"][i - 1:i] != ["--work"]]
    lines += ["", "The sections above this one were measured before these defaults (their both-stage rows: 4 decode "
              "calls per text, one sample per text).", "",
              "```bash", "nice -n 5 python benchmarks/calibration_design.py " + " ".join(argv),
              "python benchmarks/calibration_design.py --docs docs/calibration-designs.json   # this section again",
              "```", "", END]
    return "\n".join(lines)


def write_docs(docs: Path, run: dict) -> None:
    page = docs.read_text()
    section = render(run)
    if BEGIN in page:
        page = page[:page.index(BEGIN)] + section + page[page.index(END) + len(END):]
    else:
        page = page.replace("\n## Reproduce", "\n" + section + "\n\n## Reproduce")
    docs.write_text(page)


def evaluation_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, the calibration and evaluation texts and their sizes: the options this script and
    benchmarks/activation_quantization.py share."""
    parser.add_argument("--model", default="real", help="'real' (SmolLM2-135M-Instruct) or a local HF directory")
    parser.add_argument("--texts", type=Path, default=quality.REAL_CALIBRATION)
    parser.add_argument("--eval", type=Path, default=quality.REAL_EVAL)
    parser.add_argument("--num-samples", type=int, default=32)
    parser.add_argument("--windows", type=int, default=29)
    parser.add_argument("--prompt", type=int, default=48)
    parser.add_argument("--decode", type=int, default=16)


def evaluation_data(tokenizer, args) -> tuple:
    """The held-out evaluation windows of `args.eval` (`args.windows` of them at most, each a prompt and its decode
    steps), their count, and the first `args.num_samples` calibration texts of `args.texts`."""
    tokens = np.asarray(tokenizer(args.eval.read_text(encoding="utf-8"))["input_ids"], dtype=np.int64)
    length = args.prompt + args.decode + 1
    count = min(args.windows, len(tokens) // length)
    wins = train_small.heldout_windows(tokens, count, length)
    texts = [line for line in args.texts.read_text(encoding="utf-8").splitlines() if line.strip()][:args.num_samples]
    return wins, count, texts


def model_data(which: str, work: Path, args) -> dict:
    """A model of the run and its texts: 'real' (SmolLM2-135M-Instruct, benchmarks/data's prose), 'trained'
    (`train_small.py`'s full model, trained here on the Python standard library: its held-out files and
    calibration texts from train-split files) or a local directory (evaluated on `--eval`, calibrated on `--texts`)."""
    from transformers import AutoTokenizer

    if which == "trained":
        model = train_small.ensure("full", quiet=True)
        work.mkdir(parents=True, exist_ok=True)
        calibration = train_small.calibration_file(work / "trained_calibration.txt", args.num_samples)
        texts = [line for line in calibration.read_text(encoding="utf-8").splitlines() if line.strip()]
        wins = quality.windows(model, args.windows, args.prompt, args.decode)
        return {"path": model, "name": "trained here (llama, 10 M, Python standard library)", "wins": wins,
                "texts": texts, "calibration_file": f"{len(texts)} train-split standard-library files, one text each "
                "(`train_small.calibration_file`)", "eval_file": "held-out standard-library files (heldout_tokens.npy)"}
    if which == "real":
        from optimum_shared_graph.testing import real_model

        model = real_model(log=lambda line: print(line, file=sys.stderr, flush=True))
    else:
        model = Path(which)
    wins, _count, texts = evaluation_data(AutoTokenizer.from_pretrained(model), args)
    return {"path": model, "name": args.name or model.name, "wins": wins, "texts": texts,
            "calibration_file": f"benchmarks/data/{args.texts.name}" if args.texts.parent == quality.DATA else
            args.texts.name, "eval_file": f"benchmarks/data/{args.eval.name}" if args.eval.parent == quality.DATA else
            args.eval.name}


def default_design(mode: str, texts: list[str], num_samples: int) -> str:
    """The design the export uses for `mode` when `--calibration-decode-steps` is not given (`decode_steps_for`)."""
    from optimum.intel.openvino.configuration import _quantization_config_from_dict

    from optimum_shared_graph.quantization.calibration import decode_steps_for

    steps, _why = decode_steps_for(None, _quantization_config_from_dict(mode_config(mode, texts, num_samples)))
    return next(name for name, (n, merge) in DESIGNS.items() if n == steps and (merge or not steps))


def run_model(which: str, args) -> dict:
    """One model's rows: every mode under every design, evaluated against PyTorch fp32."""
    work = args.work / Path(which).name
    data = model_data(which, work, args)
    model, wins, texts = data["path"], data["wins"], data["texts"]
    base = base_graph(model, work, args.base_task)
    config = json.loads((model / "config.json").read_text())
    results = {"model": data["name"], "model_type": config.get("model_type"), "date": time.strftime("%Y-%m-%d"),
               "machine": {"cpu": context.cpu_name()}, "windows": len(wins), "prompt": args.prompt,
               "decode": args.decode, "calibration_file": data["calibration_file"], "eval_file": data["eval_file"],
               "texts": len(texts), "rows": []}
    ref = quality.torch_logprobs(model, wins, args.prompt + args.decode)
    results["pytorch_perplexity"] = quality.reference_stats(ref, wins, args.prompt)["perplexity"]
    if args.stats:
        from optimum_shared_graph.quantization.calibration import _prepared_config, load_stateless, prompt_inputs

        m = load_stateless(base)
        prompts = prompt_inputs(m, _prepared_config(m, mode_config("int4-awq-se", texts, args.num_samples), str(model)))
        del m
        results["statistics"] = statistics(base, prompts, [d for d in args.designs if DESIGNS[d][0] is not None])
    for mode in args.modes:
        for design in args.designs:
            if DESIGNS[design][0] is None and mode not in WEIGHT_MODES:
                continue
            out = work / f"{mode}-{design}"
            info = quantize(base, out, mode, design, texts, args.num_samples, str(model))
            logits = quality.artifact_logits(out, "dynamic", EXACT, wins, args.prompt, args.decode)
            stats = quality.compare(ref, logits, wins, args.prompt)
            n = stats["n_prefill"] + stats["n_decode"]
            stats["kl"] = (stats["kl_prefill"] * stats["n_prefill"] + stats["kl_decode"] * stats["n_decode"]) / n
            results["rows"].append({"mode": mode, "design": design, **info, "stats": stats})
            print(which, mode, design, json.dumps({k: v for k, v in {**info, **stats}.items()
                                                   if not k.endswith("_windows")}), flush=True)
            if not args.keep:
                shutil.rmtree(out)
            (work / "calibration_design.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    evaluation_arguments(parser)
    parser.add_argument("--models", nargs="+", help="several models in one run, each as --model takes it, or "
                        "'trained' (benchmarks/train_small.py's full model); the page's section is written from it")
    parser.add_argument("--modes", nargs="+", default=["int4-awq-se", "int8"])
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS))
    parser.add_argument("--stats", action="store_true", help="also measure what the samples change in the statistics")
    parser.add_argument("--work", type=Path, default=HERE / "results" / "calibration_design")
    parser.add_argument("--keep", action="store_true", help="keep the quantized graphs")
    parser.add_argument("--name", help="the model's name on the page (default: its directory's name)")
    parser.add_argument("--base-task", choices=["with-past", "shared"], default="with-past",
                        help="the fp32 stateless graph: optimum-intel's with-past export, or text-generation-shared's")
    parser.add_argument("--docs", type=Path, metavar="JSON",
                        help="only write docs/quality.md's section from a run's JSON file")
    args = parser.parse_args()
    if args.docs:
        write_docs(ROOT / "docs" / "quality.md", json.loads(args.docs.read_text()))
        return
    started = time.time()
    runs = []
    run_json = args.work / "calibration_design_run.json"
    args.work.mkdir(parents=True, exist_ok=True)
    for which in args.models or [args.model]:
        runs.append(run_model(which, args))
        run = {"runs": runs, "argv": sys.argv[1:], "minutes": round((time.time() - started) / 60, 1),
               "versions": quality._versions(),
               "machine": {"cpu": context.cpu_name(), "isa": context.cpu_isa(), "nproc": os.cpu_count()}}
        run_json.write_text(json.dumps(run, indent=1, default=str) + "\n")
    for r in runs:
        for mode in args.modes:
            rows = {x["design"]: x["stats"] for x in r["rows"] if x["mode"] == mode}
            for design, st in rows.items():
                ratio = f"{st['kl'] / rows['prefill']['kl']:.3f}x prefill-only" if "prefill" in rows else ""
                print(f"{r['model'][:24]:24s} {mode:12s} {design:9s} KL {st['kl']:.4g} ({ratio}) "
                      f"ppl {100 * (st['perplexity'] / r['pytorch_perplexity'] - 1):+.2f}% top1 {st['top1']:.4f}")
    if args.models:
        write_docs(ROOT / "docs" / "quality.md", run)
        (ROOT / "docs" / "calibration-designs.json").write_text(json.dumps(run, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
