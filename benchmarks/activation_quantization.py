"""What `--quant-mode int8` loses on a trained model, and which of NNCF's settings win it back.

For one trained model, optimum-intel's stateless fp32 export is made once (as `calibration_design.py` does); then for
every variant of the full-quantization config the same graph is quantized in-process through optimum-intel's own
entry point (`calibration._apply_calibrated`, as an export does, on the export's default calibration set for
`--quant-mode int8` unless the variant names another), made stateful, and evaluated against PyTorch fp32 on held-out
text (benchmarks/quality.py's evaluation, f32 properties) on this CPU: the int8 arithmetic is the CPU's, so run it
again under `ONEDNN_MAX_CPU_ISA=AVX2` for a CPU without VNNI (the JSON records which, `machine.isa`).

A variant is a set of changes to `--quant-mode int8`'s config (`VARIANTS`): SmoothQuant's alpha, NNCF ignored scopes
(one group of operations left in float at a time, or every group but one), the activation range estimator,
per-channel activation quantizers, the quantizers' scheme, NNCF's overflow fix, the calibration set. A variant
other than `shipped` starts from optimum-intel's config as it is (no overflow fix unless it sets one). `--outliers`
also measures, on the fp32 graph and the calibration samples, each weighted MatMul's input: its largest value over
every token against its 99.9th percentile, which channels hold it and at which position.

Usage:
    nice -n 5 python benchmarks/activation_quantization.py --model real --outliers --variants default no-sq ...
    python benchmarks/activation_quantization.py --list
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import calibration_design  # noqa: E402
import context  # noqa: E402
import quality  # noqa: E402

EXACT = calibration_design.EXACT

# NNCF ignored-scope patterns of each group of operations in a llama/gemma-like decoder graph (OpenVINO friendly
# names from optimum-intel's conversion)
GROUPS = {
    "lm_head": {"patterns": [".*lm_head.*"]},
    "qkv": {"patterns": [r".*self_attn\.(q|k|v)_proj.*"]},
    "qk": {"patterns": [r".*self_attn\.(q|k)_proj.*"]},
    "v": {"patterns": [r".*self_attn\.v_proj.*"]},
    "o_proj": {"patterns": [r".*self_attn\.o_proj.*"]},
    "gate_up": {"patterns": [r".*mlp\.(gate|up)_proj.*"]},
    "down_proj": {"patterns": [r".*mlp\.down_proj.*"]},
    "sdpa": {"types": ["ScaledDotProductAttention"]},
    "first_last_layer": {"patterns": [r".*layers\.0\..*", r".*layers\.{last}\..*"]},
}

SPLITS = ("qk", "v")  # parts of "qkv", to be left in float on their own (never "only" quantized)


def ignore(*groups: str) -> dict:
    scope: dict = {"validate": False}
    for g in groups:
        for key, values in GROUPS[g].items():
            scope.setdefault(key, []).extend(values)
    return scope


def only(group: str) -> dict:
    return ignore(*[g for g in GROUPS if g not in (group, "first_last_layer", *SPLITS)])


# name: (what it changes, config changes). Keys: "config" (optimum-intel OVQuantizationConfig fields), "estimator"
# (an NNCF RangeEstimatorParametersSet name, "nncf-default" for NNCF's own), "activations" (NNCF QuantizationParameters
# fields for activations), "sq" (SmoothQuant alpha for MatMuls; -1 off), "design" (calibration_design.DESIGNS).
VARIANTS = {
    "former-default": ("--quant-mode int8 before outliers were measured (MINMAX ranges, NNCF's SmoothQuant alpha "
                       "0.95, no overflow fix, 16 decode calls)", {"design": "merged16"}),
    "shipped": ("--quant-mode int8 as exported now: the MLPs' down projections in float "
                "(calibration.mlp_output_matmuls), SmoothQuant alpha 0.5, NNCF's overflow fix, the export's default "
                "calibration", {"package": True}),
    "nncf-default-ranges": ("NNCF's default range estimator (MEAN_MINMAX)", {"estimator": "nncf-default"}),
    "prefill-only": ("prefill calls only", {"design": "prefill"}),
    "both-stages": ("prefill and 16 decode calls per text, merged to prompt-length samples", {"design": "merged16"}),
    "no-sq": ("SmoothQuant off", {"sq": -1}),
    "sq-0.5": ("SmoothQuant alpha 0.5", {"sq": 0.5}),
    "sq-0.8": ("SmoothQuant alpha 0.8", {"sq": 0.8}),
    "sym": ("symmetric activations (--sym: NNCF's performance preset)", {"config": {"sym": True}}),
    "per-channel": ("per-channel activation quantizers", {"activations": {"per_channel": True}}),
    "overflow-fix": ("NNCF's overflow fix on every layer (7-bit weights)", {"config": {"overflow_fix": "enable"}}),
    "overflow-fix-first-layer": ("NNCF's overflow fix on the first layer only (8-bit weights elsewhere)",
                                 {"config": {"overflow_fix": "first_layer_only"}}),
    "mse-ranges": ("NNCF's MEAN_QUANTILE range estimator", {"estimator": "MEAN_QUANTILE"}),
    **{f"ignore-{g}": (f"{g} left in float", {"config": {"ignored_scope": ignore(g)}}) for g in GROUPS},
    **{f"only-{g}": (f"only {g} quantized", {"config": {"ignored_scope": only(g)}}) for g in GROUPS
       if g != "first_last_layer" and g not in SPLITS},
}


def combined(name: str, outliers: list[dict] | None = None) -> tuple[str, dict]:
    """The variant `name`: one of `VARIANTS`, `ignore-outliers-R` (the weighted MatMuls whose input's largest |x| is
    more than R times its 99.9th percentile left in float, from `--outliers`), or several joined by `+` (their
    changes together, ignored scopes merged)."""
    whats, merged = [], {}
    for part in name.split("+"):
        if part.startswith("ignore-outliers-"):
            if not outliers:
                raise SystemExit(f"{part} needs --outliers (in this run or an earlier one's JSON)")
            ratio = float(part.rsplit("-", 1)[1])
            names = [r["input_of"] for r in outliers if r["ratio"] > ratio]
            what, variant = f"{len(names)} MatMuls whose input's max exceeds {ratio:g}x its 99.9th percentile left in " \
                            "float", {"config": {"ignored_scope": {"names": names, "validate": False}}}
        else:
            what, variant = VARIANTS[part]
        whats.append(what)
        for key, value in variant.items():
            if key == "config":
                config = {**merged.get("config", {})}
                for k, v in value.items():
                    if k == "ignored_scope" and "ignored_scope" in config:
                        scope = {**config["ignored_scope"]}
                        for kk, vv in v.items():
                            scope[kk] = scope[kk] + vv if isinstance(vv, list) and kk in scope else vv
                        config[k] = scope
                    else:
                        config[k] = v
                merged["config"] = config
            else:
                merged[key] = value
    return "; ".join(whats), merged


def resolve(variant: dict, layers: int) -> dict:
    """The variant with `{last}` in its ignored-scope patterns replaced by the model's last layer index."""
    scope = (variant.get("config") or {}).get("ignored_scope")
    if not scope:
        return variant
    scope = {k: ([p.replace("{last}", str(layers - 1)) for p in v] if k == "patterns" else v) for k, v in scope.items()}
    return {**variant, "config": {**variant["config"], "ignored_scope": scope}}


def quantize(base: Path, out: Path, variant: dict, texts: list[str], num_samples: int, model_id: str) -> dict:
    """The stateless graph at `base` quantized with `--quant-mode int8` as `variant` changes it, into `out`, stateful."""
    import dataclasses

    import nncf
    from nncf.quantization.advanced_parameters import QuantizationParameters
    from nncf.quantization.range_estimator import RangeEstimatorParametersSet

    from optimum_shared_graph.quantization import calibration
    from optimum_shared_graph.quantization.calibration import (
        _apply_calibrated, _prepared_config, load_stateless, make_stateful, prompt_inputs,
    )

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(base, out)
    model = load_stateless(out)
    cfg = {**calibration_design.mode_config("int8", texts, num_samples), **variant.get("config", {})}
    advanced = nncf.AdvancedQuantizationParameters()
    if "sq" in variant:
        advanced.smooth_quant_alphas.matmul = variant["sq"]
    if "activations" in variant:
        advanced.activations_quantization_params = QuantizationParameters(**variant["activations"])
    estimator = variant.get("estimator")
    if estimator and estimator != "nncf-default":
        advanced = dataclasses.replace(
            advanced, activations_range_estimator_params=getattr(RangeEstimatorParametersSet, estimator))
    cfg["advanced_parameters"] = advanced
    config = _prepared_config(model, cfg, model_id)
    prompts = prompt_inputs(model, config)
    design = variant.get("design") or calibration_design.default_design("int8", texts, num_samples)
    samples = calibration_design.samples_of(model, prompts, design)
    info = {"design": design, "samples": len(samples), "prefill_calls": samples.prefill_count,
            "decode_calls": samples.decode_count}
    if variant.get("package"):  # what quantize_both_stages does for --quant-mode int8
        ignored = calibration.mlp_output_matmuls(model.model)
        config = calibration.with_int8_activation_defaults(config.clone(), ignored)
        info["float_matmuls"] = ignored
    saved = calibration.ACTIVATION_RANGE_ESTIMATOR, calibration.OVERFLOW_FIX
    if estimator == "nncf-default":
        calibration.ACTIVATION_RANGE_ESTIMATOR = None
    if not variant.get("package"):  # optimum-intel's overflow fix ("disable") unless the variant sets one
        calibration.OVERFLOW_FIX = "disable"
    start = time.perf_counter()
    try:
        info["overflow_fix"] = _apply_calibrated(model, config, samples, model_name_or_path=model_id,
                                                 trust_remote_code=False, save_directory=out, immediate_save=True)
    finally:
        calibration.ACTIVATION_RANGE_ESTIMATOR, calibration.OVERFLOW_FIX = saved
    info["quantize_seconds"] = time.perf_counter() - start
    model_config = model.config
    del model, samples
    make_stateful(out / "openvino_model.xml", model_config)
    info["quantizers"] = quantizers(out / "openvino_model.xml", base)
    return info


def weights_int8(base: Path, out: Path) -> None:
    """`--weight-format int8` (data-free, optimum-intel's config) applied to the graph at `base`, into `out`, stateful."""
    from optimum_shared_graph.quantization.calibration import load_stateless, make_stateful

    shutil.copytree(base, out)
    model = load_stateless(out)
    model._apply_quantization({"bits": 8}, compile_only=False, compile_model=False, model_name_or_path=str(out),
                              trust_remote_code=False, save_directory=out, immediate_save=True)
    model_config = model.config
    del model
    make_stateful(out / "openvino_model.xml", model_config)


def quantizers(xml: Path, base: Path) -> dict:
    """How many activation FakeQuantizes the graph holds, and how many MatMuls (those with a constant weight in the
    fp32 graph at `base`, and all) and ScaledDotProductAttentions read at least one quantized activation."""
    import openvino as ov

    core = ov.Core()
    weighted = set()
    for op in core.read_model(base / "openvino_model.xml").get_ordered_ops():
        if op.get_type_name() == "MatMul":
            src = op.input_value(1).get_node()
            while src.get_type_name() == "Convert":
                src = src.input_value(0).get_node()
            if src.get_type_name() == "Constant":
                weighted.add(op.get_friendly_name())
    model = core.read_model(xml)

    def quantized_activation(value) -> bool:
        node = value.get_node()
        while node.get_type_name() in ("Convert", "Reshape", "Transpose"):
            node = node.input_value(0).get_node()
        if node.get_type_name() != "FakeQuantize":
            return False
        src = node.input_value(0).get_node()
        while src.get_type_name() == "Convert":
            src = src.input_value(0).get_node()
        return src.get_type_name() != "Constant"

    ops = model.get_ordered_ops()
    out = {"activation_fake_quantizes": sum(op.get_type_name() == "FakeQuantize" and quantized_activation(op.output(0))
                                            for op in ops)}
    matmuls = [op for op in ops if op.get_type_name() == "MatMul"]
    out["weighted_matmuls"] = len([op for op in matmuls if op.get_friendly_name() in weighted])
    out["weighted_matmuls_int8_activations"] = len([op for op in matmuls if op.get_friendly_name() in weighted
                                                    and quantized_activation(op.input_value(0))])
    sdpa = [op for op in ops if op.get_type_name() == "ScaledDotProductAttention"]
    out["sdpa"] = len(sdpa)
    out["sdpa_int8_inputs"] = len([op for op in sdpa if any(quantized_activation(v) for v in op.input_values()[:3])])
    return out


def outliers(base: Path, prompts, steps: int = 16) -> list[dict]:
    """For every weighted MatMul's input on the calibration samples (prefill and decode calls): the largest |x| over
    every token, its 99.9th percentile, how many channels exceed 20x the percentile, and at which token positions of
    the prefill calls the largest values sit."""
    import openvino as ov

    from optimum_shared_graph.quantization.both_stages import BothStageSamples

    core = ov.Core()
    probe = core.read_model(base / "openvino_model.xml")
    taps = calibration_design.weight_inputs(probe)
    probe.add_outputs([o for _, o in taps])
    compiled = core.compile_model(probe, "CPU", EXACT)
    outputs = list(compiled.outputs)[-len(taps):]
    request = compiled.create_infer_request()
    samples = BothStageSamples(core.read_model(base / "openvino_model.xml"), prompts, steps)
    absmax = [None] * len(taps)
    at_first = [0] * len(taps)  # prefill calls whose largest |x| is at the first position
    hist = [[] for _ in taps]
    decode_max = [0.0] * len(taps)
    for i in range(samples.texts):
        request.infer(samples.feed((i, 0)))
        for m, o in enumerate(outputs):
            a = np.abs(request.get_tensor(o).data[0])  # [tokens, channels]
            ch = a.max(0)
            absmax[m] = ch if absmax[m] is None else np.maximum(absmax[m], ch)
            at_first[m] += int(np.unravel_index(a.argmax(), a.shape)[0] == 0)
            hist[m].append(a[1:].ravel()[::7])
        for k in range(1, steps + 1):
            request.infer(samples.feed((i, k)))
            for m, o in enumerate(outputs):
                decode_max[m] = max(decode_max[m], float(np.abs(request.get_tensor(o).data).max()))
    rows = []
    for m, ((name, _), _) in enumerate(taps):
        p999 = float(np.quantile(np.concatenate(hist[m]), 0.999))
        top = np.argsort(-absmax[m])[:3]
        rows.append({"input_of": _consumer(probe, taps[m][1]), "tensor": name[0], "absmax": float(absmax[m].max()),
                     "p99.9_after_first": p999, "ratio": float(absmax[m].max() / max(p999, 1e-12)),
                     "decode_absmax": decode_max[m], "top_channels": [int(c) for c in top],
                     "outlier_channels_20x": int((absmax[m] > 20 * p999).sum()),
                     "max_at_first_position": at_first[m] / samples.texts})
    return rows


def _consumer(model, output) -> str:
    names = [t.get_node().get_friendly_name() for t in output.get_target_inputs()
             if t.get_node().get_type_name() == "MatMul"]
    return names[0] if names else ""


def position_kl(ref: np.ndarray, logits: np.ndarray) -> list[float]:
    """Mean KL(PyTorch || artifact) per position over the windows."""
    q = quality.log_softmax(logits)
    kl = np.sum(np.exp(ref) * (ref - q), -1)
    return [float(x) for x in np.nanmean(kl, 0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    calibration_design.evaluation_arguments(parser)
    parser.add_argument("--variants", nargs="+", default=["former-default", "shipped"])
    parser.add_argument("--outliers", action="store_true", help="measure the weighted MatMuls' inputs on the fp32 graph")
    parser.add_argument("--weights-int8", action="store_true", help="also evaluate data-free int8 weights (no "
                        "activation quantization, the CPU plugin's dynamic quantization off) as a reference row")
    parser.add_argument("--work", type=Path, default=HERE / "results" / "activation_quantization")
    parser.add_argument("--name", help="the model's name (default: its directory's name)")
    parser.add_argument("--base-task", choices=["with-past", "shared"], default="with-past")
    parser.add_argument("--list", action="store_true", help="print the variants and exit")
    parser.add_argument("--keep", action="store_true", help="keep each variant's artifact in the work directory")
    args = parser.parse_args()
    if args.list:
        for name, (what, _) in VARIANTS.items():
            print(f"{name:24s} {what}")
        return

    work = args.work / (args.name or Path(args.model).name)
    data = calibration_design.model_data(args.model, work, args)
    model, wins, texts = Path(data["path"]), data["wins"], data["texts"]
    base = calibration_design.base_graph(model, work, args.base_task)
    config = json.loads((model / "config.json").read_text())
    layers = config.get("num_hidden_layers") or config.get("text_config", {}).get("num_hidden_layers")
    out_json = work / "activation_quantization.json"
    results = json.loads(out_json.read_text()) if out_json.is_file() else {"rows": {}}
    results.update({"model": data["name"], "model_type": config.get("model_type"),
                    "machine": {"cpu": context.cpu_name(), "isa": context.cpu_isa()}, "windows": len(wins),
                    "prompt": args.prompt, "decode": args.decode, "texts": len(texts),
                    "calibration_file": data["calibration_file"], "eval_file": data["eval_file"]})
    ref = quality.torch_logprobs(model, wins, args.prompt + args.decode)
    results["pytorch_perplexity"] = quality.reference_stats(ref, wins, args.prompt)["perplexity"]
    if args.outliers:
        from optimum_shared_graph.quantization.calibration import _prepared_config, load_stateless, prompt_inputs

        m = load_stateless(base)
        prompts = prompt_inputs(m, _prepared_config(m, calibration_design.mode_config("int8", texts, args.num_samples),
                                                    str(model)))
        del m
        results["outliers"] = outliers(base, prompts)
        out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
        for row in sorted(results["outliers"], key=lambda r: -r["ratio"])[:12]:
            print(json.dumps(row), flush=True)

    def evaluate(artifact: Path, config: dict) -> dict:
        logits = quality.artifact_logits(artifact, "dynamic", config, wins, args.prompt, args.decode)
        stats = quality.compare(ref, logits, wins, args.prompt)
        stats["kl_by_position"] = position_kl(ref, logits)
        n = stats["n_prefill"] + stats["n_decode"]
        stats["kl"] = (stats["kl_prefill"] * stats["n_prefill"] + stats["kl_decode"] * stats["n_decode"]) / n
        stats["vs_pytorch"] = stats["perplexity"] / results["pytorch_perplexity"] - 1
        return stats

    if args.weights_int8:
        out = work / "int8-weights"
        if not (out / "openvino_model.xml").is_file():
            weights_int8(base, out)
        results["rows"]["int8-weights"] = {"what": "int8 weights (data-free), activations not quantized",
                                           "stats": evaluate(out, {**EXACT, "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})}
        out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    for vname in args.variants:
        what, variant = combined(vname, results.get("outliers"))
        out = work / vname
        try:
            info = quantize(base, out, resolve(variant, layers), texts, args.num_samples, str(model))
        except Exception as err:  # a setting NNCF refuses (per-channel activations on the CPU) is a result too
            results["rows"][vname] = {"what": what, "refused": f"{type(err).__name__}: {' '.join(str(err).split())}"}
            out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
            print(f"{vname:24s} refused: {results['rows'][vname]['refused']}", flush=True)
            shutil.rmtree(out, ignore_errors=True)
            continue
        stats = evaluate(out, EXACT)
        results["rows"][vname] = {"what": what, **info, "stats": stats, "date": time.strftime("%Y-%m-%d")}
        if not args.keep:
            shutil.rmtree(out)
        out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")
        print(f"{vname:24s} ppl {100 * stats['vs_pytorch']:+.2f}% KL {stats['kl']:.4g} (prefill {stats['kl_prefill']:.4g}"
              f", decode {stats['kl_decode']:.4g}, first position {stats['kl_by_position'][0]:.3g}) top1 "
              f"{stats['top1']:.4f} {json.dumps(info['quantizers'])} {info['quantize_seconds']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
