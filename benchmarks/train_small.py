"""Train a small llama-shaped causal LM and its tokenizer on the Python standard library's own sources.

Every machine with Python has the text (`sysconfig.get_paths()["stdlib"]`, its `*.py` files), so a
trained model, with a trained model's peaked next-token distributions, can be built offline. The files
are split into train and held-out BY FILE: sorted relative paths, a file is held out when the first
byte of the sha256 of its relative path is below 26 (about 10%). A byte-level BPE tokenizer
(`tokenizers`) is trained on train files, then the model on windows of tokenized train files, in a
fixed order from a fixed seed, on 2 torch threads with AdamW and a cosine schedule.

The output is a normal Hugging Face model directory (config.json, model.safetensors,
generation_config.json, tokenizer files that `AutoTokenizer` loads with bos/eos/pad set), plus
`train_stamp.json` (what it was built from and the held-out perplexity) and the token ids of the
held-out split (`heldout_tokens.npy`) for evaluation. A directory whose stamp matches (size,
configuration, corpus digest, seed, steps) is reused as it is.

Usage:
    python benchmarks/train_small.py                     # the full model (about 12 min on 2 cores shared with other jobs)
    python benchmarks/train_small.py --size ci           # the tests' model (under a minute)
    python benchmarks/train_small.py --speed             # tokens/s of each size, nothing saved
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import context  # noqa: E402

# 2 torch threads on a machine shared with other jobs: OpenMP's spinning threads wait for a busy core;
# passive waiting measured 3x the training throughput there (set before torch is imported to apply).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
DEFAULT_ROOT = HERE / "results" / "trained"

SPECIAL = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
HELD_OUT_BYTE = 26  # a file is held out when sha256(relative path)[0] < 26: about 10% of the files

# The two sizes. `steps` were sized from throughput measured with `--speed` on the project's 2-core
# machine while other jobs shared it: the full model at ~780 tokens/s (about 11 minutes of training),
# the CI one at a few thousand tokens/s (about a minute).
SIZES = {
    "full": dict(
        model=dict(hidden_size=384, intermediate_size=1024, num_hidden_layers=5, num_attention_heads=6,
                   num_key_value_heads=2, vocab_size=6144, max_position_embeddings=1024, rope_theta=10000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu", initializer_range=0.02),
        context=256, batch=8, steps=240, lr=2e-3, warmup=15, weight_decay=0.1,
        tokenizer_bytes=4_000_000, heldout_windows=64,
    ),
    "ci": dict(
        model=dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=1024, max_position_embeddings=512, rope_theta=10000.0,
                   rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu", initializer_range=0.02),
        context=128, batch=8, steps=150, lr=4e-3, warmup=10, weight_decay=0.1,
        tokenizer_bytes=1_000_000, heldout_windows=32,
    ),
}
SEED = 0


# ------------------------------------------------------------------------------------------------ corpus
def stdlib_files() -> tuple[Path, list[str]]:
    """The standard library's *.py files, as sorted relative paths (installed packages excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rel = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if "site-packages" in parts or "dist-packages" in parts or not path.is_file():
            continue
        rel.append(path.relative_to(root).as_posix())
    return root, sorted(rel)


def is_held_out(rel: str) -> bool:
    return hashlib.sha256(rel.encode()).digest()[0] < HELD_OUT_BYTE


def read(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


def corpus() -> dict:
    """Train and held-out files and the digest of the whole corpus (paths and contents)."""
    root, files = stdlib_files()
    digest = hashlib.sha256()
    for rel in files:
        digest.update(rel.encode() + b"\0")
        digest.update(hashlib.sha256((root / rel).read_bytes()).digest())
    train = [f for f in files if not is_held_out(f)]
    held = [f for f in files if is_held_out(f)]
    # a fixed, content-independent order that mixes directories: by the hash of the path
    train.sort(key=lambda f: hashlib.sha256(f.encode()).hexdigest())
    held.sort(key=lambda f: hashlib.sha256(f.encode()).hexdigest())
    return {"root": root, "train": train, "held_out": held, "digest": digest.hexdigest()}


def calibration_file(path: Path, count: int, min_chars: int = 240) -> Path:
    """`count` calibration texts from train-split files: consecutive non-empty lines joined by a space."""
    c = corpus()
    texts: list[str] = []
    for rel in reversed(c["train"]):  # from the end of the train order (the model trains on its beginning)
        buf = ""
        for line in read(c["root"], rel).splitlines():
            if not line.strip():
                continue
            buf = f"{buf} {line.rstrip()}" if buf else line.rstrip()
            if len(buf) >= min_chars:
                texts.append(buf)
                buf = ""
                break  # one text per file: many files
        if len(texts) >= count:
            break
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------- tokenizer
def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def encode_files(tok, root: Path, files: list[str], max_tokens: int | None) -> np.ndarray:
    """Files tokenized and joined, each followed by EOS, up to `max_tokens` tokens."""
    parts, total = [], 0
    for rel in files:
        ids = tok.encode(read(root, rel)).ids + [EOS_ID]
        parts.append(np.asarray(ids, dtype=np.int32))
        total += len(ids)
        if max_tokens is not None and total >= max_tokens:
            break
    return np.concatenate(parts)


# ------------------------------------------------------------------------------------------------ model
def build_config(spec: dict):
    from transformers import LlamaConfig

    return LlamaConfig(**spec["model"], bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)


def heldout_windows(tokens: np.ndarray, count: int, length: int) -> np.ndarray:
    """`count` non-overlapping windows of `length` tokens, evenly spread over the held-out stream."""
    usable = len(tokens) // length
    if usable < count:
        raise SystemExit(f"held-out split has {usable} windows of {length} tokens, need {count}")
    starts = np.linspace(0, usable - 1, count).astype(np.int64) * length
    return np.stack([tokens[s:s + length] for s in starts]).astype(np.int64)


def perplexity(model, windows: np.ndarray, batch: int = 8) -> float:
    import torch

    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(windows), batch):
            ids = torch.from_numpy(windows[i:i + batch])
            logits = model(input_ids=ids).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                     reduction="sum")
            nll += float(loss)
            n += ids[:, 1:].numel()
    return math.exp(nll / n)


def stamp_of(size: str, spec: dict, digest: str) -> dict:
    import tokenizers
    import torch
    import transformers

    return {"size": size, "spec": spec, "corpus_sha256": digest, "seed": SEED, "steps": spec["steps"],
            "held_out_rule": f"sha256(relative path)[0] < {HELD_OUT_BYTE}", "torch_threads": 2,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "tokenizers": tokenizers.__version__}}


def ensure(size: str = "full", out: Path | None = None, *, quiet: bool = False) -> Path:
    """The trained model directory for `size`, trained now unless a matching one is cached."""
    spec = SIZES[size]
    out = Path(out) if out is not None else DEFAULT_ROOT / size
    c = corpus()
    stamp = stamp_of(size, spec, c["digest"])
    stamp_file = out / "train_stamp.json"
    if stamp_file.is_file():
        old = json.loads(stamp_file.read_text())
        if old.get("stamp") == stamp and (out / "model.safetensors").is_file():
            if not quiet:
                print(f"reusing {out} (stamp matches)", file=sys.stderr)
            return out
    train(size, out, c, stamp, quiet=quiet)
    return out


def train(size: str, out: Path, c: dict, stamp: dict, *, quiet: bool = False) -> dict:
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    spec = SIZES[size]
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    start = time.perf_counter()

    # tokenizer: on the first `tokenizer_bytes` of train files (corpus order)
    texts, size_b = [], 0
    for rel in c["train"]:
        texts.append(read(c["root"], rel))
        size_b += len(texts[-1])
        if size_b >= spec["tokenizer_bytes"]:
            break
    tok = train_tokenizer(texts, spec["model"]["vocab_size"])
    ctx, batch, steps = spec["context"], spec["batch"], spec["steps"]
    need = ctx * batch * steps
    train_ids = encode_files(tok, c["root"], c["train"], need + ctx)
    held_ids = encode_files(tok, c["root"], c["held_out"], None)
    windows = heldout_windows(held_ids, spec["heldout_windows"], ctx)
    log(f"tokenizer: {tok.get_vocab_size()} tokens, {len(texts)} files; train stream {len(train_ids):,} tokens, "
        f"held-out {len(held_ids):,} tokens ({len(c['held_out'])} files); {time.perf_counter() - start:.0f} s")

    config = build_config(spec)
    model = LlamaForCausalLM(config).float()
    params = sum(p.numel() for p in model.parameters())
    log(f"model: {params / 1e6:.2f} M parameters")

    # the order of training windows: a permutation of non-overlapping windows, from the seed
    n_windows = (len(train_ids) - 1) // ctx
    order = np.random.default_rng(SEED).permutation(n_windows)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": spec["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=spec["lr"], betas=(0.9, 0.95), eps=1e-8)

    def lr_at(step: int) -> float:
        if step < spec["warmup"]:
            return spec["lr"] * (step + 1) / spec["warmup"]
        progress = (step - spec["warmup"]) / max(1, steps - spec["warmup"])
        return spec["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    model.train()
    train_start = time.perf_counter()
    for step in range(steps):
        idx = order[(np.arange(batch) + step * batch) % n_windows]
        ids = torch.from_numpy(np.stack([train_ids[i * ctx:(i + 1) * ctx] for i in idx]).astype(np.int64))
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            elapsed = time.perf_counter() - train_start
            log(f"step {step}/{steps} loss {loss.item():.3f} lr {lr_at(step):.2e} "
                f"{(step + 1) * batch * ctx / elapsed:,.0f} tokens/s")
    train_seconds = time.perf_counter() - train_start
    model.eval()
    ppl = perplexity(model, windows)
    log(f"held-out perplexity {ppl:.2f} (uniform over the vocabulary: {config.vocab_size})")

    # save: a normal HF model directory
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(tmp)
    hf_tok = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                     model_max_length=config.max_position_embeddings)
    hf_tok.save_pretrained(tmp)
    np.save(tmp / "heldout_tokens.npy", held_ids.astype(np.int32))
    result = {
        "stamp": stamp, "parameters": params, "train_seconds": round(train_seconds, 1),
        "total_seconds": round(time.perf_counter() - start, 1), "train_tokens": steps * batch * ctx,
        "tokens_per_second": round(steps * batch * ctx / train_seconds),
        "heldout_perplexity": ppl, "uniform_perplexity": config.vocab_size,
        "heldout_windows": int(len(windows)), "context": ctx,
        "train_files": len(c["train"]), "heldout_files": len(c["held_out"]),
        "machine": {"cpu": context.cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
    }
    (tmp / "train_stamp.json").write_text(json.dumps(result, indent=2) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return result


def speed(size: str, steps: int = 6) -> float:
    """Training tokens/s of a random-init model of `size` (after one warm-up step)."""
    import torch
    from transformers import LlamaForCausalLM

    spec = SIZES[size]
    torch.set_num_threads(2)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(build_config(spec)).float().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(3, spec["model"]["vocab_size"], (spec["batch"], spec["context"]))
    for i in range(steps + 1):
        if i == 1:
            t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    tps = steps * spec["batch"] * spec["context"] / (time.perf_counter() - t0)
    params = sum(p.numel() for p in model.parameters())
    print(f"{size}: {params / 1e6:.2f} M parameters, {tps:,.0f} tokens/s, {spec['steps']} steps of "
          f"{spec['batch']}x{spec['context']} -> about {spec['steps'] * spec['batch'] * spec['context'] / tps / 60:.1f} min")
    return tps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--out", type=Path, help=f"output directory (default {DEFAULT_ROOT}/SIZE, git-ignored)")
    parser.add_argument("--speed", action="store_true", help="measure training tokens/s only")
    args = parser.parse_args()
    if args.speed:
        speed(args.size)
        return
    out = ensure(args.size, args.out)
    info = json.loads((out / "train_stamp.json").read_text())
    print(json.dumps({k: info[k] for k in ("parameters", "train_seconds", "tokens_per_second", "heldout_perplexity",
                                           "uniform_perplexity", "train_files", "heldout_files")}, indent=2))
    print(f"{out}: held-out perplexity {info['heldout_perplexity']:.2f} against {info['uniform_perplexity']} "
          f"for a uniform distribution over the vocabulary")


if __name__ == "__main__":
    main()
