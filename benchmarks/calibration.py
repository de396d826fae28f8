"""Calibration on both stages against calibration on prefill only: the error of the quantized graph.

One run builds a realistic-size random-init model (Qwen2-0.5B's public configuration by default,
weights random, nothing downloaded), a local text file and a tokenizer trained on it, then for each
quantization mode exports the model twice through `optimum-cli export openvino --task
text-generation-shared`, once with `--calibration-decode-steps 0` (prefill calls only: one sample
per text, empty cache, which is what optimum-intel gathers today) and once calibrated on both stages
(`--calibration-decode-steps N`). Same flags, same texts, same graph: only the calibration set differs.

Each quantized graph is compared with the fp32 PyTorch model on held-out lines of the text file:
the prefill call's next-token distribution, and the next-token distribution of every decode step,
teacher-forced with the fp32 model's greedy tokens so both read the same inputs. Reported per stage:
mean KL(fp32 || quantized) in nats, and top-1 agreement.

Usage:
    nice -n 5 python benchmarks/calibration.py --model smollm-135m --texts 32 --held-out 12 --eval-steps 8 \
        --modes int8 int4-awq --range-estimators nncf-default MINMAX   # the docs/quantization.md figures
    python benchmarks/calibration.py --model toy --texts 24 --held-out 8   # a smoke run in a minute
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import context  # noqa: E402

HERE = Path(__file__).resolve().parent

# Qwen/Qwen2-0.5B config.json (public): the fields that shape the compute.
QWEN2_0_5B = dict(
    model_type="qwen2", hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
    max_window_layers=24, initializer_range=0.02,
)
TOY = dict(QWEN2_0_5B, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, vocab_size=4096, max_window_layers=2, initializer_range=0.1)
# HuggingFaceTB/SmolLM-135M config.json (public): a llama of realistic depth that a 2-core machine runs.
SMOLLM_135M = dict(
    model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=2048, rope_theta=10000.0,
    rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu", initializer_range=0.02,
)
MODELS = {"qwen2-0.5b": QWEN2_0_5B, "smollm-135m": SMOLLM_135M, "toy": TOY}

# Runs optimum-cli in-process with the calibration's activation range estimator set (argv[1]).
_CLI = (
    "import sys; import optimum_shared_graph.quantization.calibration as c; e = sys.argv.pop(1); "
    "c.ACTIVATION_RANGE_ESTIMATOR = None if e == 'nncf-default' else e; sys.argv[0] = 'optimum-cli'; "
    "from optimum.commands.optimum_cli import main; sys.exit(main())"
)

MODES = {
    "int8": ["--quant-mode", "int8"],
    "int4-awq": ["--weight-format", "int4", "--awq", "--group-size", "64", "--ratio", "1.0"],
}


def stdlib_text_lines(count: int, words_per_line: int = 40) -> list[str]:
    """English lines from the docstrings of the Python standard library: deterministic, offline."""
    import importlib

    names = ["argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email", "functools", "heapq",
             "http.client", "inspect", "itertools", "json", "logging", "os", "pathlib", "pickle", "random", "re",
             "shutil", "socket", "sqlite3", "statistics", "string", "subprocess", "tarfile", "tempfile",
             "textwrap", "threading", "typing", "unittest", "urllib.parse", "uuid", "zipfile"]
    words: list[str] = []
    for name in names:
        module = importlib.import_module(name)
        for obj in [module] + [v for _, v in sorted(vars(module).items()) if inspect.isclass(v) or inspect.isfunction(v)]:
            doc = inspect.getdoc(obj) or ""
            words += re.sub(r"\s+", " ", doc).split(" ")
    words = [w for w in words if w]
    lines = [" ".join(words[i:i + words_per_line]) for i in range(0, len(words) - words_per_line, words_per_line)]
    if len(lines) < count:
        raise SystemExit(f"only {len(lines)} lines of text available, asked for {count}")
    rng = np.random.default_rng(0)
    return [lines[i] for i in sorted(rng.choice(len(lines), size=count, replace=False))]


def build_model(name: str, root: Path, lines: list[str]) -> Path:
    """Save a random-init model of the named configuration and a BPE tokenizer trained on `lines`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast

    path = root / name
    if (path / "config.json").is_file():
        return path
    fields = dict(MODELS[name])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(4096, config.vocab_size), special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(lines, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>").save_pretrained(path)
    return path


def export(model: Path, out: Path, texts: Path, flags: list[str], decode_steps: int, estimator: str) -> float:
    if (out / "shared_graph.json").is_file():
        return float("nan")
    start = time.perf_counter()
    cmd = [sys.executable, "-c", _CLI, estimator, "export", "openvino", "-m", str(model), "--task", "text-generation-shared",
           "--dataset", str(texts), *flags, "--calibration-decode-steps", str(decode_steps), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def reference(model: Path, prompts: list[np.ndarray], steps: int) -> list[dict]:
    """The fp32 PyTorch model's greedy tokens and next-token log-probabilities at each call."""
    import torch
    from transformers import AutoModelForCausalLM

    pt = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            gen = pt.generate(torch.from_numpy(ids), attention_mask=torch.ones(ids.shape, dtype=torch.long),
                              max_new_tokens=steps + 1, min_new_tokens=steps + 1, do_sample=False,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=0)
            logp = [torch.log_softmax(step[0].float(), -1).numpy() for step in gen.logits]
            out.append({"tokens": gen.sequences[0, ids.shape[1]:].numpy(), "logp": logp})
    del pt
    return out


def errors(artifact: Path, prompts: list[np.ndarray], refs: list[dict]) -> dict[str, dict[str, float]]:
    """Mean KL(fp32 || quantized) and top-1 agreement, on the prefill call and on the decode steps."""
    import openvino as ov

    sys.path.insert(0, str(HERE.parent))
    from optimum_shared_graph.runtimes.session import EXACT_CONFIG, GraphSession

    session = GraphSession(ov.Core().compile_model(str(artifact / "openvino_model.xml"), "CPU", EXACT_CONFIG))
    stats = {"prefill": ([], []), "decode": ([], [])}
    for ids, ref in zip(prompts, refs):
        session.reset()
        feeds = [ids] + [np.array([[t]]) for t in ref["tokens"][:-1]]
        for call, (feed, p_log) in enumerate(zip(feeds, ref["logp"])):
            logits = session.step(feed)[0, -1].astype(np.float64)
            q_log = logits - logits.max()
            q_log -= np.log(np.exp(q_log).sum())
            kl = float(np.sum(np.exp(p_log) * (p_log - q_log)))
            stage = "prefill" if call == 0 else "decode"
            stats[stage][0].append(kl)
            stats[stage][1].append(int(np.argmax(logits)) == int(np.argmax(p_log)))
    return {stage: {"kl": float(np.mean(kl)), "top1": float(np.mean(top1)), "n": len(kl)}
            for stage, (kl, top1) in stats.items()}


def activation_ranges(artifact: Path) -> dict[str, tuple[float, float]]:
    """Each activation FakeQuantize's input range (low, high), by node name (widest over channels)."""
    import openvino as ov

    ranges = {}
    for node in ov.Core().read_model(artifact / "openvino_model.xml").get_ordered_ops():
        if node.get_type_name() != "FakeQuantize":
            continue
        if node.input_value(0).get_node().get_type_name() == "Constant":
            continue  # a weight
        low, high = (node.input_value(i).get_node().get_data() for i in (1, 2))
        ranges[node.get_friendly_name()] = (float(np.min(low)), float(np.max(high)))
    return ranges


def compare_ranges(pre: Path, both: Path) -> dict[str, float]:
    """How the both-stage calibration's activation ranges compare with the prefill-only ones."""
    a, b = activation_ranges(pre), activation_ranges(both)
    common = sorted(set(a) & set(b))
    ratio = np.array([(b[n][1] - b[n][0]) / max(a[n][1] - a[n][0], 1e-12) for n in common])
    return {"quantizers": len(common), "median_width_ratio": float(np.median(ratio)),
            "narrower": float(np.mean(ratio < 0.999)), "wider": float(np.mean(ratio > 1.001)),
            "min_width_ratio": float(ratio.min()), "max_width_ratio": float(ratio.max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen2-0.5b")
    parser.add_argument("--texts", type=int, default=128, help="calibration lines (optimum-intel's default num_samples)")
    parser.add_argument("--held-out", type=int, default=48, help="evaluation lines, never calibrated on")
    parser.add_argument("--decode-steps", type=int, default=4, help="decode calls calibrated after each prefill")
    parser.add_argument("--eval-steps", type=int, default=16, help="decode steps measured after each prefill")
    parser.add_argument("--prompt-tokens", type=int, default=48, help="held-out prompts are cut to this length")
    parser.add_argument("--modes", nargs="+", choices=sorted(MODES), default=sorted(MODES))
    parser.add_argument("--range-estimators", nargs="+", default=["nncf-default", "MINMAX"],
                        help="NNCF activation range estimators for int8, each run in both arms: 'nncf-default' "
                             "(NNCF's own choice: MEAN_MINMAX for per-tensor activations, what optimum-intel "
                             "uses) or a RangeEstimatorParametersSet name such as MINMAX (this package's default)")
    parser.add_argument("--compare-ranges", nargs=2, type=Path, metavar=("PREFILL_ONLY", "BOTH"),
                        help="only compare the activation ranges of two int8 artifacts, then exit")
    parser.add_argument("--work", type=Path, default=HERE / "results" / "calibration")
    args = parser.parse_args()
    if args.compare_ranges:
        print(json.dumps(compare_ranges(*args.compare_ranges), indent=2))
        return

    args.work.mkdir(parents=True, exist_ok=True)
    lines = stdlib_text_lines(args.texts + args.held_out)
    calibration, held_out = lines[:args.texts], lines[args.texts:]
    texts = args.work / "calibration.txt"
    texts.write_text("\n".join(calibration) + "\n", encoding="utf-8")
    model = build_model(args.model, args.work, lines)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(line, return_tensors="np")["input_ids"][:, :args.prompt_tokens].astype(np.int64) for line in held_out]
    refs = reference(model, prompts, args.eval_steps)

    results = {"model": args.model, "config": MODELS[args.model], "texts": args.texts, "held_out": args.held_out,
               "decode_steps": args.decode_steps, "eval_steps": args.eval_steps, "prompt_tokens": args.prompt_tokens,
               "machine": {"cpu": context.cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
               "versions": _versions(), "modes": {}}
    runs = [(mode, estimator) for mode in args.modes
            for estimator in (args.range_estimators if mode == "int8" else ["MINMAX"])]
    for mode, estimator in runs:
        key = f"{mode} ({estimator})" if mode == "int8" else mode
        results["modes"][key] = {}
        for arm, steps in (("prefill-only", 0), ("both-stages", args.decode_steps)):
            out = args.work / f"{args.model}-{mode}-{estimator}-{arm}"
            seconds = export(model, out, texts, MODES[mode], steps, estimator)
            manifest = json.loads((out / "shared_graph.json").read_text())
            row = errors(out, prompts, refs)
            row["calibration_samples"] = manifest["quantization"]["calibration_samples"]
            row["export_seconds"] = seconds
            if mode == "int8" and arm == "both-stages":
                row["activation_ranges_vs_prefill_only"] = compare_ranges(
                    args.work / f"{args.model}-{mode}-{estimator}-prefill-only", out)
            results["modes"][key][arm] = row
            print(key, arm, json.dumps(row), flush=True)
        both, pre = results["modes"][key]["both-stages"], results["modes"][key]["prefill-only"]
        results["modes"][key]["ratio"] = {s: both[s]["kl"] / pre[s]["kl"] for s in ("prefill", "decode")}
        (args.work / f"{args.model}.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.work / f"{args.model}.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))


def table(results: dict) -> str:
    rows = ["| mode | calibration | samples (prefill + decode) | prefill KL | prefill top-1 | decode KL | decode top-1 |",
            "|---|---|---|---|---|---|---|"]
    for mode, arms in results["modes"].items():
        for arm in ("prefill-only", "both-stages"):
            r = arms[arm]
            s = r["calibration_samples"]
            rows.append(f"| {mode} | {arm} | {s['prefill']} + {s['decode']} | {r['prefill']['kl']:.4g} | "
                        f"{r['prefill']['top1']:.1%} | {r['decode']['kl']:.4g} | {r['decode']['top1']:.1%} |")
        ratio = arms["ratio"]
        rows.append(f"| {mode} | both / prefill-only KL | | {ratio['prefill']:.3f}x | | {ratio['decode']:.3f}x | |")
    return "\n".join(rows)


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {n: metadata.version(n) for n in ("openvino", "nncf", "optimum-intel", "transformers", "torch")}


if __name__ == "__main__":
    main()
