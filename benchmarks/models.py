"""Realistic random-init models built from public configurations, written out here (nothing is downloaded).

The shapes are those of the public checkpoints; the weights are random (`initializer_range` of the
config), saved in the checkpoint's own dtype (fp16/bf16 -> saved as fp16 here) so loading and
exporting do the same work as with a real checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Qwen/Qwen2-0.5B config.json (public), fields that shape the compute.
QWEN2_0_5B: dict[str, Any] = dict(
    model_type="qwen2",
    architectures=["Qwen2ForCausalLM"],
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    sliding_window=None,
    use_sliding_window=False,
    max_window_layers=24,
    attention_dropout=0.0,
    initializer_range=0.02,
)

# TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json (public): the Llama-2 architecture at 1.1B.
TINYLLAMA_1_1B: dict[str, Any] = dict(
    model_type="llama",
    architectures=["LlamaForCausalLM"],
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=2048,
    rope_theta=10000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    hidden_act="silu",
    initializer_range=0.02,
)

# Qwen/Qwen3-4B config.json (public): the size users export, for the export-only `--suite large` (8 GB in fp16).
QWEN3_4B: dict[str, Any] = dict(
    model_type="qwen3",
    architectures=["Qwen3ForCausalLM"],
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=151936,
    max_position_embeddings=40960,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_bias=False,
    attention_dropout=0.0,
    initializer_range=0.02,
)

# For `--quick`: the Qwen2 architecture at toy size, so a smoke test runs in seconds.
QWEN2_TOY: dict[str, Any] = dict(
    QWEN2_0_5B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, vocab_size=4096, max_position_embeddings=4096, max_window_layers=2,
    initializer_range=0.1,
)

MODELS: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": QWEN2_0_5B,
    "tinyllama-1.1b": TINYLLAMA_1_1B,
    "qwen2-toy": QWEN2_TOY,
    "qwen3-4b": QWEN3_4B,
}

# Token ids the locally trained tokenizer uses; the model configs point at them so generation
# config, tokenizer and model agree. Prompts are random ids, so the tokenizer is only there because
# the artifact layout (and OpenVINO GenAI) expect one.
BOS, EOS, PAD = 1, 2, 0


def describe(name: str) -> dict[str, Any]:
    """The shape facts reported in the docs for one model."""
    cfg = MODELS[name]
    return {k: cfg[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                "num_key_value_heads", "intermediate_size", "vocab_size",
                                "max_position_embeddings", "tie_word_embeddings")}


def build(name: str, out_dir: Path, *, dtype: str = "float16", seed: int = 0) -> Path:
    """Build and save `name` with random weights in `dtype` (once; reused when already there).

    Returns:
        The model directory (config, safetensors weights, generation config, tokenizer).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from optimum_shared_graph.testing import build_tokenizer

    out_dir = Path(out_dir)
    stamp = out_dir / "benchmark_model.json"
    wanted = {"name": name, "config": MODELS[name], "dtype": dtype, "seed": seed}
    if stamp.is_file() and json.loads(stamp.read_text()) == wanted:
        return out_dir
    cfg = dict(MODELS[name])
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD, **cfg)
    torch.manual_seed(seed)
    torch_dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype).eval()
    model.generation_config = GenerationConfig(bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD)
    model.save_pretrained(str(out_dir))
    build_tokenizer(out_dir)
    stamp.write_text(json.dumps(wanted, indent=1))
    del model
    return out_dir


def parameter_count(name: str) -> int:
    """Parameters of `name`, computed from its shapes (tied embeddings counted once)."""
    c = MODELS[name]
    h, i, v, n = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_hidden_layers"]
    head = c.get("head_dim") or h // c["num_attention_heads"]
    q, kv = c["num_attention_heads"] * head, c["num_key_value_heads"] * head
    attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if c["model_type"] == "qwen2" else 0)
    attn += 2 * head if c["model_type"] == "qwen3" else 0  # q and k norms
    layer = attn + 3 * h * i + 2 * h
    emb = v * h * (1 if c["tie_word_embeddings"] else 2)
    return n * layer + emb + h


def main(argv: list[str] | None = None) -> int:
    """`python benchmarks/models.py NAME OUT_DIR [--dtype float16]`: build in a process of its own, so the
    benchmark's parent process never holds torch (a child's peak-RSS figure starts from its parent's size)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("name", choices=list(MODELS))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--dtype", default="float16")
    args = parser.parse_args(argv)
    build(args.name, args.out_dir, dtype=args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
