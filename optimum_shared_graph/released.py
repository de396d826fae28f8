"""Random-init models with the widths of released checkpoints and few layers, for checks whose outcome depends
on size (GenAI's NPU pipeline partitions a model by size: a tiny model's result does not predict a real one's).

`released_width_config(model_type)` gives, per model type, the widths of that type's best-known released
checkpoint of a size an NPU laptop runs (named beside each entry): hidden size, attention heads, KV heads,
head_dim, intermediate and expert sizes, vocabulary, rotary settings, tied or untied head. The values are
those of the checkpoint's public `config.json` as written here from memory of its model card (nothing is
downloaded here: check an entry against the card before relying on one number). Only the layer count is cut,
to 6 layers (`LAYERS`), the checkpoint's per-layer pattern kept (sliding and full attention, RoPE and NoPE layers,
convolution and attention layers in the order the checkpoint has them). Not 2, as the tiny models have, nor 4:
NPUW's online partitioning keeps a repeated block only when it repeats at least `NPUW_ONLINE_KEEP_BLOCKS` times
(5 by default), and below that it partitions differently. Measured: Llama-3.2-1B's widths fail with 4 layers
("Model references undeclared parameters", both artifacts) and run with greedy parity with the checkpoint's 16;
Llama-3.1-8B's, Mistral-7B's and Phi-3-mini's widths fail with 4 layers too. Where layers of several kinds
alternate, each kind repeats less often: gemma2 and gemma3_text get more layers (said beside them); the other
patterned entries (smollm3, cohere2, gpt_oss, lfm2, lfm2_moe, qwen3_next, qwen3_5*) repeat some kind fewer than 5
times, and their NPU result is less certain to be a full-depth model's. Mixture-of-experts entries keep
each expert's width and the router's top-k but may have fewer experts (said beside them).

Every model gets `initializer_range=0.1` (decisive random logits, as the tiny models: a greedy flip is then an
error, not a rounding near-tie) and the token ids of the locally trained tokenizer (`testing.build_tokenizer`,
whose 512 ids all lie inside every vocabulary here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .testing import seq2seq_structure

_TOKENS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
LAYERS = 6


def _rope(theta: float, **extra: Any) -> dict[str, Any]:
    return {"rope_type": extra.pop("rope_type", "default"), "rope_theta": theta, **extra}


_LLAMA3_8K = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)

# model type -> (released checkpoint, its widths as config keyword arguments). num_hidden_layers is LAYERS
# unless an entry sets it (to keep the checkpoint's per-layer pattern).
RELEASED: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("meta-llama/Llama-3.2-1B-Instruct", dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters=_rope(500000.0, factor=32.0, **_LLAMA3_8K))),
    "qwen2": ("Qwen/Qwen2.5-1.5B-Instruct", dict(
        hidden_size=1536, intermediate_size=8960, num_attention_heads=12, num_key_value_heads=2,
        vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=True,
        use_sliding_window=False, rope_parameters=_rope(1000000.0))),
    "qwen3": ("Qwen/Qwen3-4B", dict(
        hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters=_rope(1000000.0))),
    # 128 experts (top 8) there; 16 here, each of the released width
    "qwen3_moe": ("Qwen/Qwen3-30B-A3B", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=16, num_experts_per_tok=8,
        norm_topk_prob=True, decoder_sparse_step=1, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        vocab_size=151936, max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=_rope(1000000.0))),
    "mistral": ("mistralai/Mistral-7B-Instruct-v0.3", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        vocab_size=32768, max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=None,
        tie_word_embeddings=False, rope_parameters=_rope(1000000.0))),
    "phi3": ("microsoft/Phi-3-mini-4k-instruct", dict(
        hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=32064, max_position_embeddings=4096, original_max_position_embeddings=4096, rms_norm_eps=1e-5,
        sliding_window=2047, tie_word_embeddings=False, rope_parameters=_rope(10000.0))),
    "gemma": ("google/gemma-2b", dict(
        hidden_size=2048, intermediate_size=16384, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
        vocab_size=256000, max_position_embeddings=8192, hidden_activation="gelu_pytorch_tanh",
        tie_word_embeddings=True, rope_parameters=_rope(10000.0))),
    # its layers alternate sliding (window 4096) and full attention: 5 periods (10 layers), so that each kind repeats
    # as often as NPUW needs (with 6 layers, 3 of each, ours failed in NPUW where it ran with 4)
    "gemma2": ("google/gemma-2-2b-it", dict(
        num_hidden_layers=10, hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        vocab_size=256000, max_position_embeddings=8192, sliding_window=4096, query_pre_attn_scalar=256,
        attn_logit_softcapping=50.0, final_logit_softcapping=30.0, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention"] * 5, rope_parameters=_rope(10000.0))),
    # 5 sliding-window (512) layers then 1 full, each kind with its own rotary base: the checkpoint's own 26 layers
    # (narrow enough to afford; fewer would repeat the full-attention layer too seldom for NPUW)
    "gemma3_text": ("google/gemma-3-1b-it", dict(
        num_hidden_layers=26, hidden_size=1152, intermediate_size=6912, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
        vocab_size=262144, max_position_embeddings=32768, sliding_window=512, query_pre_attn_scalar=256,
        tie_word_embeddings=True, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 4 + ["sliding_attention"] * 2,
        rope_parameters={"sliding_attention": _rope(10000.0), "full_attention": _rope(1000000.0)})),
    "granite": ("ibm-granite/granite-3.1-2b-instruct", dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=49155, max_position_embeddings=131072, rms_norm_eps=1e-5, embedding_multiplier=12.0,
        attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=8.0, tie_word_embeddings=True,
        rope_parameters=_rope(5000000.0))),
    "olmo2": ("allenai/OLMo-2-1124-7B", dict(
        hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=100352, max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters=_rope(500000.0))),
    # every 4th layer without RoPE (no_rope_layer_interval 4), as there
    "smollm3": ("HuggingFaceTB/SmolLM3-3B", dict(
        hidden_size=2048, intermediate_size=11008, num_attention_heads=16,
        num_key_value_heads=4, vocab_size=128256, max_position_embeddings=65536, rms_norm_eps=1e-6,
        no_rope_layer_interval=4, tie_word_embeddings=True, rope_parameters=_rope(5000000.0))),
    "phi": ("microsoft/phi-2", dict(
        hidden_size=2560, intermediate_size=10240, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=51200, max_position_embeddings=2048, hidden_act="gelu_new", tie_word_embeddings=False,
        rope_parameters=_rope(10000.0, partial_rotary_factor=0.4))),
    # 8 experts (top 2) there; 4 here, each of the released width
    "mixtral": ("mistralai/Mixtral-8x7B-Instruct-v0.1", dict(
        hidden_size=4096, intermediate_size=14336, num_local_experts=4, num_experts_per_tok=2,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32000,
        max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=None, tie_word_embeddings=False,
        rope_parameters=_rope(1000000.0))),
    # 60 experts (top 4) there; 8 here, each of the released width, and the shared expert
    "qwen2_moe": ("Qwen/Qwen1.5-MoE-A2.7B", dict(
        hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408, shared_expert_intermediate_size=5632,
        num_experts=8, num_experts_per_tok=4, norm_topk_prob=False, decoder_sparse_step=1, num_attention_heads=16,
        num_key_value_heads=16, vocab_size=151936, max_position_embeddings=8192, rms_norm_eps=1e-6,
        tie_word_embeddings=False, use_sliding_window=False, rope_parameters=_rope(1000000.0))),
    "glm4": ("THUDM/GLM-4-9B-0414", dict(
        hidden_size=4096, intermediate_size=13696, num_attention_heads=32, num_key_value_heads=2, head_dim=128,
        vocab_size=151552, max_position_embeddings=32768, rms_norm_eps=1e-5, attention_bias=True,
        tie_word_embeddings=False, rope_parameters=_rope(10000.0, partial_rotary_factor=0.5))),
    "glm": ("THUDM/glm-4-9b-chat-hf", dict(
        hidden_size=4096, intermediate_size=13696, num_attention_heads=32, num_key_value_heads=2, head_dim=128,
        vocab_size=151552, max_position_embeddings=131072, rms_norm_eps=1.5625e-7, attention_bias=True,
        tie_word_embeddings=False, rope_parameters=_rope(10000.0, partial_rotary_factor=0.5))),
    "stablelm": ("stabilityai/stablelm-2-1_6b", dict(
        hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=100352, max_position_embeddings=4096, use_qkv_bias=True, tie_word_embeddings=False,
        rope_parameters=_rope(10000.0, partial_rotary_factor=0.25))),
    "starcoder2": ("bigcode/starcoder2-3b", dict(
        hidden_size=3072, intermediate_size=12288, num_attention_heads=24, num_key_value_heads=2,
        vocab_size=49152, max_position_embeddings=16384, sliding_window=4096, use_bias=True,
        tie_word_embeddings=True, rope_parameters=_rope(999999.4420358813))),
    "olmo": ("allenai/OLMo-1B-hf", dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=16, num_key_value_heads=16,
        vocab_size=50304, max_position_embeddings=2048, tie_word_embeddings=True, rope_parameters=_rope(10000.0))),
    "gpt2": ("openai-community/gpt2", dict(n_embd=768, n_head=12, n_layer=LAYERS, n_inner=None, n_positions=1024,
                                           vocab_size=50257, tie_word_embeddings=True)),
    "gpt_neox": ("EleutherAI/pythia-1.4b", dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=16, vocab_size=50304,
        max_position_embeddings=2048, use_parallel_residual=True, tie_word_embeddings=False,
        rope_parameters=_rope(10000.0, partial_rotary_factor=0.25))),
    # global and local (window 256) attention alternate
    "gpt_neo": ("EleutherAI/gpt-neo-1.3B", dict(
        hidden_size=2048, num_layers=LAYERS, num_heads=16, intermediate_size=None, vocab_size=50257,
        max_position_embeddings=2048, attention_types=[[["global", "local"], LAYERS // 2]], window_size=256)),
    "falcon": ("tiiuae/falcon-7b", dict(
        hidden_size=4544, num_attention_heads=71, vocab_size=65024, new_decoder_architecture=False,
        multi_query=True, parallel_attn=True, alibi=False, bias=False, tie_word_embeddings=True)),
    "bloom": ("bigscience/bloom-560m", dict(hidden_size=1024, n_layer=LAYERS, n_head=16, vocab_size=250880,
                                            tie_word_embeddings=True)),
    "opt": ("facebook/opt-1.3b", dict(
        hidden_size=2048, ffn_dim=8192, num_attention_heads=32, word_embed_proj_dim=2048, vocab_size=50272,
        max_position_embeddings=2048, do_layer_norm_before=True, tie_word_embeddings=True)),
    "gptj": ("EleutherAI/gpt-j-6b", dict(n_embd=4096, n_layer=LAYERS, n_head=16, n_inner=None, rotary_dim=64,
                                         n_positions=2048, vocab_size=50400, tie_word_embeddings=False)),
    "codegen": ("Salesforce/codegen-2B-mono", dict(n_embd=2560, n_layer=LAYERS, n_head=32, n_inner=None,
                                                   rotary_dim=64, n_positions=2048, n_ctx=2048, vocab_size=51200,
                                                   tie_word_embeddings=False)),
    "gpt_bigcode": ("bigcode/starcoderbase-1b", dict(n_embd=2048, n_layer=LAYERS, n_head=16, n_inner=8192,
                                                     n_positions=8192, vocab_size=49152, multi_query=True,
                                                     tie_word_embeddings=True)),
    "biogpt": ("microsoft/biogpt", dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16,
                                        vocab_size=42384, max_position_embeddings=1024)),
    "xglm": ("facebook/xglm-564M", dict(d_model=1024, ffn_dim=4096, attention_heads=16, num_layers=LAYERS,
                                        vocab_size=256008, max_position_embeddings=2048)),
    "cohere": ("CohereForAI/aya-23-8B (command-r-v01, 35 B, is the best-known cohere checkpoint; too large here)", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=256000,
        max_position_embeddings=8192, logit_scale=0.125, use_qk_norm=False, tie_word_embeddings=True,
        rope_parameters=_rope(10000.0))),
    # 3 sliding-window (4096) layers then 1 full, as there
    "cohere2": ("CohereForAI/c4ai-command-r7b-12-2024", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, vocab_size=256000,
        max_position_embeddings=8192, sliding_window=4096, logit_scale=0.25, tie_word_embeddings=True,
        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2, rope_parameters=_rope(50000.0),
        num_hidden_layers=8)),
    # 32 experts (top 4) there; 8 here, each of the released width; sliding (128) and full attention alternate
    "gpt_oss": ("openai/gpt-oss-20b", dict(
        hidden_size=2880, intermediate_size=2880, num_local_experts=8, num_experts_per_tok=4, num_attention_heads=64,
        num_key_value_heads=8, head_dim=64, vocab_size=201088, max_position_embeddings=131072, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2), tie_word_embeddings=False,
        rope_parameters=_rope(150000.0, rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                              original_max_position_embeddings=4096, truncate=False))),
    # 16 experts (top 2) there; 4 here, each of the released width
    "phimoe": ("microsoft/Phi-3.5-MoE-instruct (its longrope scaling left out: default rotary)", dict(
        hidden_size=4096, intermediate_size=6400, num_local_experts=4, num_experts_per_tok=2, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=32064, max_position_embeddings=4096, sliding_window=None,
        tie_word_embeddings=False, rope_parameters=_rope(10000.0))),
    # 64 routed experts (top 6) there; 8 here, each of the released width; layer 0 dense as there
    "deepseek_v2": ("deepseek-ai/DeepSeek-V2-Lite", dict(
        hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=8,
        num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1,
        topk_method="greedy", norm_topk_prob=False, routed_scaling_factor=1.0, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        head_dim=64, v_head_dim=128, vocab_size=102400, max_position_embeddings=163840, tie_word_embeddings=False,
        rope_parameters=_rope(10000.0, rope_type="yarn", factor=40.0, original_max_position_embeddings=4096,
                              beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707))),
    "mamba": ("state-spaces/mamba-1.4b-hf", dict(
        hidden_size=2048, state_size=16, conv_kernel=4, expand=2, time_step_rank=128, vocab_size=50280,
        tie_word_embeddings=True)),
    "falcon_mamba": ("tiiuae/falcon-mamba-7b", dict(
        hidden_size=4096, state_size=16, conv_kernel=4, expand=2, time_step_rank=256, vocab_size=65024,
        tie_word_embeddings=False)),
    # its first six layers (conv, conv, attention, conv, conv, attention); the feed-forward auto-adjusted as there
    "lfm2": ("LiquidAI/LFM2-1.2B", dict(
        hidden_size=2048, intermediate_size=12288, block_auto_adjust_ff_dim=True, block_multiple_of=256,
        block_ffn_dim_multiplier=1.0, num_attention_heads=32, num_key_value_heads=8, vocab_size=65536,
        layer_types=["conv", "conv", "full_attention"] * 2, conv_L_cache=3, max_position_embeddings=128000,
        tie_word_embeddings=True, rope_parameters=_rope(1000000.0))),
    # its first six layers, the first two dense (conv, conv, attention as LFM2); 32 experts (top 4) there, 8 here
    "lfm2_moe": ("LiquidAI/LFM2-8B-A1B", dict(
        hidden_size=2048, intermediate_size=7168, moe_intermediate_size=1792, num_experts=8, num_experts_per_tok=4,
        num_dense_layers=2, use_expert_bias=True, norm_topk_prob=True, routed_scaling_factor=1.0,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=65536,
        layer_types=["conv", "conv", "full_attention"] * 2, conv_L_cache=3, max_position_embeddings=128000,
        tie_word_embeddings=True, rope_parameters=_rope(1000000.0))),
    # 3 gated-delta-net layers then 1 gated full-attention layer (8 layers: two periods); 512 experts (top 10) there,
    # 16 here
    "qwen3_next": ("Qwen/Qwen3-Next-80B-A3B-Instruct", dict(
        num_hidden_layers=8, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
        linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
        num_experts=16, num_experts_per_tok=10, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        decoder_sparse_step=1, norm_topk_prob=True, vocab_size=151936, max_position_embeddings=262144,
        tie_word_embeddings=False, rope_parameters=_rope(10000000.0, partial_rotary_factor=0.25))),
    # Qwen3_5TextConfig's defaults (its docstring names Qwen/Qwen3.5-27B): 3 gated-delta-net layers, 1 full
    "qwen3_5_text": ("Qwen/Qwen3.5-27B (Qwen3_5TextConfig's default widths)", dict(
        num_hidden_layers=8, hidden_size=4096, intermediate_size=12288, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        vocab_size=248320, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True})),
    # Qwen3_5MoeTextConfig's defaults; 256 experts (top 8) there, 16 here, each of the released width
    "qwen3_5_moe_text": ("Qwen/Qwen3.5-35B-A3B (Qwen3_5MoeTextConfig's default widths)", dict(
        num_hidden_layers=8, hidden_size=2048, num_attention_heads=16, num_key_value_heads=2, head_dim=256, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, num_experts=16, num_experts_per_tok=8, vocab_size=248320,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [11, 11, 10], "mrope_interleaved": True})),
    # 40 experts (top 8) there; 16 here, each of the released width
    "granitemoe": ("ibm-granite/granite-3.1-3b-a800m-instruct", dict(
        hidden_size=1536, intermediate_size=512, num_local_experts=16, num_experts_per_tok=8,
        num_attention_heads=24, num_key_value_heads=8, vocab_size=49155, max_position_embeddings=131072,
        embedding_multiplier=12.0, attention_multiplier=0.015625, residual_multiplier=0.22, logits_scaling=6.0,
        tie_word_embeddings=True, rope_parameters=_rope(10000000.0))),
    "mpt": ("mosaicml/mpt-7b", dict(d_model=4096, n_heads=32, n_layers=LAYERS, expansion_ratio=4, max_seq_len=2048,
                                    vocab_size=50432, no_bias=True, attn_config={"alibi": True})),
    "persimmon": ("adept/persimmon-8b-base", dict(
        hidden_size=4096, intermediate_size=16384, num_attention_heads=64, vocab_size=262144,
        max_position_embeddings=16384, qk_layernorm=True, tie_word_embeddings=False,
        rope_parameters=_rope(25000.0, partial_rotary_factor=0.5))),
    "bitnet": ("microsoft/bitnet-b1.58-2B-4T", dict(
        hidden_size=2560, intermediate_size=6912, num_attention_heads=20, num_key_value_heads=5, vocab_size=128256,
        max_position_embeddings=4096, tie_word_embeddings=True, rope_parameters=_rope(500000.0))),
    "arcee": ("arcee-ai/AFM-4.5B", dict(
        hidden_size=2560, intermediate_size=18432, num_attention_heads=20, num_key_value_heads=4, head_dim=128,
        vocab_size=128004, max_position_embeddings=65536, tie_word_embeddings=False,
        rope_parameters=_rope(10000.0, rope_type="yarn", factor=20.0, original_max_position_embeddings=4096))),
    "exaone4": ("LGAI-EXAONE/EXAONE-4.0-1.2B", dict(
        hidden_size=2048, intermediate_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        vocab_size=102400, max_position_embeddings=65536, sliding_window=None, layer_types=["full_attention"] * LAYERS,
        tie_word_embeddings=True,
        rope_parameters=_rope(1000000.0, factor=16.0, **{k: v for k, v in _LLAMA3_8K.items()}))),
    # moonshotai/Moonlight-16B-A3B-Instruct, the best-known deepseek_v3 checkpoint an NPU laptop could hold
    # (DeepSeek-V3 itself has 671 B parameters): multi-head latent attention without a query LoRA, 64 experts
    # (top 6) there, 8 here, 2 shared, the first layer dense, sigmoid routing with one group
    "deepseek_v3": ("moonshotai/Moonlight-16B-A3B-Instruct", dict(
        hidden_size=2048, intermediate_size=11264, moe_intermediate_size=1408, n_routed_experts=8,
        num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, n_group=1, topk_group=1,
        norm_topk_prob=True, routed_scaling_factor=2.446, num_attention_heads=16, num_key_value_heads=16,
        q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, head_dim=64, v_head_dim=128,
        vocab_size=163840, max_position_embeddings=8192, tie_word_embeddings=False, rope_parameters=_rope(50000.0))),
    # arcee-ai/Trinity-Mini: 32 layers of 2048, 3 sliding-window layers then 1 global (RoPE on the sliding ones), 32
    # heads on 4 KV heads of 128, the first 2 layers dense (MLP 6144), 128 routed experts of 1024 (top 8) there, 16
    # here, 1 shared, sigmoid routing scaled by 2.826, muP input scaling; the window is AfmoeConfig's default
    "afmoe": ("arcee-ai/Trinity-Mini (its sliding window AfmoeConfig's default)", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=1024, num_experts=16, num_experts_per_tok=8,
        num_shared_experts=1, route_scale=2.826, mup_enabled=True, num_dense_layers=2, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, vocab_size=200192, max_position_embeddings=131072,
        global_attn_every_n_layers=4, sliding_window=1024, num_hidden_layers=8,
        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 2, tie_word_embeddings=False,
        rope_parameters=_rope(10000.0))),
    # meta-llama/Llama-4-Scout-17B-16E: 48 layers of 5120, every one a MoE layer (16 experts of 8192, top 1, and a
    # shared expert of 8192), 40 heads on 8 KV heads of 128, chunked attention (8192) on 3 layers of 4 and no RoPE on
    # the 4th, the 202,048-token vocabulary; 4 experts here (the benchmarks set 16)
    "llama4_text": ("meta-llama/Llama-4-Scout-17B-16E (Llama4TextConfig's default widths)", dict(
        hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=4,
        num_experts_per_tok=1, interleave_moe_layer_step=1, num_attention_heads=40, num_key_value_heads=8,
        head_dim=128, vocab_size=202048, max_position_embeddings=131072, attention_chunk_size=8192,
        use_qk_norm=True, tie_word_embeddings=False, rope_parameters=_rope(500000.0))),
    "hunyuan_v1_dense": ("tencent/Hunyuan-1.8B-Instruct (its dynamic-NTK rotary scaling left out: default rotary)",
                         dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=4,
                              head_dim=128, vocab_size=120818, max_position_embeddings=32768, rms_norm_eps=1e-5,
                              tie_word_embeddings=True, rope_parameters=_rope(10000.0))),
    # one period of its 4 sliding (window 512) : 1 full pattern and one more sliding layer (30 layers there), the
    # last layer reusing the KV of the last sliding layer before it (the last 10 of 30 share there), the first
    # third's MLP activations sparsified (0.95) as there; AltUp over 4 inputs, LAuReL rank 64, per-layer input
    # embeddings of 256, final logit softcap 30, tied head
    "gemma3n_text": ("google/gemma-3n-E2B-it", dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        vocab_size=262400, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256,
        layer_types=["sliding_attention"] * 4 + ["full_attention", "sliding_attention"], sliding_window=512,
        num_kv_shared_layers=1, activation_sparsity_pattern=[0.95] * 2 + [0.0] * 4, laurel_rank=64,
        altup_num_inputs=4, final_logit_softcapping=30.0, max_position_embeddings=32768, tie_word_embeddings=True)),
    # Gemma4TextConfig's default widths (5 sliding-window layers of heads 256 wide, then 1 full-attention layer of
    # heads 512 wide with proportional partial rotary; per-layer input embeddings of 256): one period of its pattern
    "gemma4_text": ("Gemma4TextConfig's default widths (its docstring names google/gemma-4-e2b-it)", dict(
        hidden_size=2304, intermediate_size=9216, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
        global_head_dim=512, vocab_size=262144, vocab_size_per_layer_input=262144, hidden_size_per_layer_input=256,
        layer_types=["sliding_attention"] * 5 + ["full_attention"], sliding_window=512, num_kv_shared_layers=0,
        final_logit_softcapping=30.0, tie_word_embeddings=True)),
    # 5 Mamba-2 layers then the attention layer (4 of 40 layers attend there, without positions), 64 experts (top 6)
    # there, 16 here, a shared expert, grouped KV heads, tied head
    "granitemoehybrid": ("ibm-granite/granite-4.0-h-tiny", dict(
        hidden_size=1536, intermediate_size=512, shared_intermediate_size=1024, num_local_experts=16,
        num_experts_per_tok=6, num_attention_heads=12, num_key_value_heads=4, layer_types=["mamba"] * 5 + ["attention"],
        mamba_n_heads=48, mamba_d_head=64, mamba_expand=2, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4,
        mamba_chunk_size=256, position_embedding_type="nope", vocab_size=100352, max_position_embeddings=131072,
        tie_word_embeddings=True)),
    # 5 Mamba-2 layers then a hybrid layer (the shared transformer block with LoRA adapters of rank 128; 6 of 38
    # layers there), attention over [hidden, embeddings] with 32 heads, tied head
    "zamba2": ("Zyphra/Zamba2-1.2B", dict(
        hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32, n_mamba_heads=64,
        mamba_d_state=64, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, chunk_size=256, num_mem_blocks=1,
        use_shared_attention_adapter=True, adapter_rank=128, use_mem_rope=True,
        layers_block_type=["mamba"] * 5 + ["hybrid"], vocab_size=32000, max_position_embeddings=4096,
        tie_word_embeddings=True)),
    # the sequence-to-sequence families' decoders (their causal LMs), as many encoder layers as decoder layers;
    # the head untied (tied there: with a tied head a random-init model only echoes its prompt, see testing.py)
    # (their structure, pre- or post-norm, positions, activation, is the tiny models': testing.seq2seq_structure)
    **{t: (checkpoint, dict(seq2seq_structure(t), d_model=d, decoder_attention_heads=h, encoder_attention_heads=h,
                            decoder_ffn_dim=f, encoder_ffn_dim=f, decoder_layers=LAYERS, vocab_size=v,
                            init_std=0.1, tie_word_embeddings=False, **extra))
       for t, checkpoint, d, h, f, v, extra in (
           ("bart", "facebook/bart-large", 1024, 16, 4096, 50265, {}),
           ("mbart", "facebook/mbart-large-50", 1024, 16, 4096, 250054, {}),
           ("marian", "Helsinki-NLP/opus-mt-en-de", 512, 8, 2048, 58101, dict(decoder_vocab_size=58101)),
           ("pegasus", "google/pegasus-large", 1024, 16, 4096, 96103, {}),
           ("blenderbot", "facebook/blenderbot-400M-distill (12 decoder layers on 2 encoder layers there)", 1280, 32,
            5120, 8008, {}),
           ("blenderbot-small", "facebook/blenderbot_small-90M", 512, 16, 2048, 54944, {}),
           ("bigbird_pegasus", "google/bigbird-pegasus-large-arxiv", 1024, 16, 4096, 96103, {}),
       )},
    "gpt_neox_japanese": ("abeja/gpt-neox-japanese-2.7b", dict(
        hidden_size=2560, num_attention_heads=32, intermediate_multiple_size=4, vocab_size=32000,
        max_position_embeddings=2048, rope_parameters=_rope(10000.0, partial_rotary_factor=1.0))),
}


def released_checkpoint(model_type: str) -> str | None:
    """The released checkpoint whose widths `released_width_config(model_type)` has, or None."""
    entry = RELEASED.get(model_type)
    return entry[0] if entry else None


def released_width_config(model_type: str, **overrides: Any):
    """`AutoConfig.for_model(model_type)` with the widths of `released_checkpoint(model_type)` and few layers.

    Raises:
        KeyError: no released-width entry for `model_type`.
    """
    from transformers import AutoConfig

    if model_type not in RELEASED:
        raise KeyError(f"no released-width configuration for {model_type!r} (optimum_shared_graph/released.py)")
    kwargs: dict[str, Any] = dict(num_hidden_layers=LAYERS, initializer_range=0.1, **_TOKENS)
    kwargs.update(RELEASED[model_type][1])
    kwargs.update(overrides)
    return AutoConfig.for_model(model_type, **kwargs)


def widths(config) -> dict[str, Any]:
    """The sizes a reader compares with the checkpoint's: what the page lists per model type."""
    text = getattr(config, "text_config", None) or config
    found: dict[str, Any] = {}
    for key, names in {
        "layers": ("num_hidden_layers", "n_layer", "num_layers"),
        "hidden": ("hidden_size", "n_embd", "d_model"),
        "heads": ("num_attention_heads", "n_head", "num_heads", "attention_heads"),
        "kv_heads": ("num_key_value_heads",),
        "head_dim": ("head_dim",),
        "intermediate": ("intermediate_size", "ffn_dim", "n_inner", "decoder_ffn_dim"),
        "expert_intermediate": ("moe_intermediate_size",),
        "experts": ("num_experts", "num_local_experts", "n_routed_experts"),
        "experts_per_token": ("num_experts_per_tok",),
        "vocab": ("vocab_size",),
    }.items():
        for name in names:
            value = getattr(text, name, None)
            if isinstance(value, list) and value:  # per layer (gemma3n_text's intermediate_size)
                value = max(value)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                found[key] = value
                break
    if "head_dim" not in found and found.get("heads") and found.get("hidden"):
        found["head_dim"] = found["hidden"] // found["heads"]  # the config computes it so
    found["tied"] = bool(getattr(text, "tie_word_embeddings", False))
    return found


def build_released_width_model(model_type: str, out_dir: str | Path, *, seed: int = 0, **overrides: Any):
    """Build and save a random-init `model_type` of released width (fp16 weights, as the checkpoints ship), with
    the locally trained tokenizer and a generation config beside it. Returns the config (the model is freed)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from .pipeline.memory import available_memory
    from .testing import build_tokenizer, draw_zero_initialised

    config = released_width_config(model_type, **overrides)
    torch.manual_seed(seed)
    with torch.device("meta"):
        shape = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    if sum(p.numel() * 2 for p in shape.parameters()) > available_memory().available // 2:
        _save_streamed(shape, out_dir)  # a checkpoint larger than what this machine holds twice
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16).eval()
        draw_zero_initialised(model, model_type)
        model.generation_config = GenerationConfig(**_TOKENS)
        model.save_pretrained(str(out_dir))
        del model
    build_tokenizer(out_dir)
    return config


_SHARD_BYTES = 2 << 30


def _save_streamed(model, out_dir: str | Path) -> None:
    """Save the random-init `model` (built on the meta device) one module's own tensors at a time, initialised by
    transformers' `_init_weights` and written into shards of at most 2 GiB with their index, as `save_pretrained`
    writes a sharded checkpoint: what a checkpoint larger than memory needs. Where transformers converts a model
    type's tensors as it loads (experts fused into one tensor), each module's are converted back as `save_pretrained`
    converts them (`revert_weight_conversion`), so the files hold the tensors as the published checkpoints do."""
    import json

    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig
    from transformers.core_model_loading import revert_weight_conversion

    from .testing import is_drawn

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tied = {"lm_head.weight"} if model.config.get_text_config().tie_word_embeddings else set()
    shards, shard, size, total = [], {}, 0, 0

    def flush():
        nonlocal shard, size
        if shard:
            name = f"part-{len(shards):05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            shards.append((name, list(shard)))
        shard, size = {}, 0

    with torch.no_grad():
        for path, module in model.named_modules():
            if next(module.parameters(recurse=False), None) is None:
                continue
            module.to_empty(device="cpu", recurse=False)
            # as `post_init` initialises, the module first, then each module holding it (a mixture-of-experts block
            # draws its router's weight): the others' tensors are on the meta device, where initialising is a no-op
            parts = path.split(".") if path else []
            for depth in range(len(parts), -1, -1):
                model._init_weights(model.get_submodule(".".join(parts[:depth])))
            for name, param in module.named_parameters(recurse=False):  # as `draw_zero_initialised` draws them
                if is_drawn(model.config.model_type, f"{path}.{name}"):
                    param.normal_(mean=0.0, std=model.config.initializer_range)
            own = {f"{path}.{name}" if path else name: param.detach().to(torch.float16)
                   for name, param in module.named_parameters(recurse=False)}
            for key, tensor in revert_weight_conversion(model, own).items():
                if key in tied:
                    continue
                tensor = tensor.contiguous()
                if size and size + tensor.numel() * 2 > _SHARD_BYTES:
                    flush()
                shard[key], size, total = tensor, size + tensor.numel() * 2, total + tensor.numel() * 2
            if size > _SHARD_BYTES:
                flush()
            module.to_empty(device="meta", recurse=False)
        flush()
    weight_map = {}
    for i, (name, keys) in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        (out / name).rename(out / final)
        weight_map.update({k: final for k in keys})
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    model.config.save_pretrained(str(out))
    GenerationConfig(**_TOKENS).save_pretrained(str(out))


# ------------------------------------------------------------------------------------ vision-language checkpoints
# Vision-language model type -> its released checkpoint at about 4 B parameters, the widths of its text model
# (`text`, config keyword arguments) and its vision tower (`vision`), the top-level keys of its config (`extra`), its
# processor's image sizes (`processor`, keys of `testing.VLM_PROCESSORS`' entry) and the period of its layer kinds
# (`period`: the kinds of one repeat of its `layer_types`, the global kind last). As `RELEASED`, written from the
# checkpoints' public configurations, nothing downloaded; `build_released_multimodal` builds them random-init with
# any number of text layers. The image token ids are the tiny tokenizer's (`testing.VLM_PROCESSORS`), inside every
# vocabulary here.
RELEASED_MULTIMODAL: dict[str, dict[str, Any]] = {
    # google/gemma-3-4b-it: 34 layers of 2560 (8 heads, 4 KV heads of 256, MLP 10240), 5 sliding-window (1024)
    # layers then 1 global, rotary 10000 on the sliding ones and 1e6 scaled linearly by 8 on the global ones, the
    # 262,208-token vocabulary, head tied; a SigLIP tower of 27 layers of 1152 (16 heads, MLP 4304, patches of 14 on
    # 896 x 896 images, no head), pooled to 256 image tokens
    "gemma3": dict(
        checkpoint="google/gemma-3-4b-it", layers=34,
        source="the checkpoint's public config.json as written here from memory of its model card", period=("sliding_attention",) * 5 + ("full_attention",),
        text=dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8, num_key_value_heads=4,
                  head_dim=256, vocab_size=262208, max_position_embeddings=131072, rms_norm_eps=1e-6,
                  query_pre_attn_scalar=256, sliding_window=1024, hidden_activation="gelu_pytorch_tanh",
                  tie_word_embeddings=True,
                  rope_parameters={"sliding_attention": _rope(10000.0),
                                   "full_attention": _rope(1000000.0, rope_type="linear", factor=8.0)}),
        vision=dict(model_type="siglip_vision_model", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                    num_attention_heads=16, image_size=896, patch_size=14, vision_use_head=False, layer_norm_eps=1e-6),
        extra=dict(mm_tokens_per_image=256, tie_word_embeddings=True),
        processor=dict(image_processor=dict(size={"height": 896, "width": 896}, image_mean=[0.5, 0.5, 0.5],
                                            image_std=[0.5, 0.5, 0.5], resample=2, do_pan_and_scan=None),
                       image_seq_length=256)),
    # Qwen/Qwen3.5-4B: 32 layers of 2560, 3 gated-delta-net layers then 1 full-attention layer (16 heads, 4 KV heads
    # of 256, a quarter of each head rotated, base 1e7, interleaved M-RoPE sections 11 : 11 : 10), MLP 9216, the
    # 248,320-token vocabulary, head tied: the widths of a public training recipe's Megatron arguments for the
    # checkpoint (no copy of its config.json could be had here). Not established: the gated-delta-net widths and the
    # vision tower, which are transformers' `Qwen3_5TextConfig` / `Qwen3_5VisionConfig` defaults (16 key and 32 value
    # heads of 128, kernel 4; 27 blocks of 1152, 16 heads, MLP 4304, patches of 16, 2 x 2 merge, 2 frames per
    # temporal patch), the tower's output the text width. The processor: the published Qwen3.5 image processor's
    # pixel bounds (shortest edge 65,536 pixels, longest 16,777,216), patches of 16, 2 x 2 merge.
    "qwen3_5": dict(
        checkpoint="Qwen/Qwen3.5-4B", layers=32,
        source=("nothing installed on this machine has them (transformers' Qwen3_5TextConfig defaults, 4096 x 32 "
                "layers with MLP 12288, are what its docstring calls Qwen3.5-9B's); the text widths are those of a "
                "public training recipe's Megatron arguments for Qwen/Qwen3.5-4B (found with the search tool's stored "
                "copies of public repositories), which give 4.65 B parameters at full depth with the tower here; the "
                "gated-delta-net widths and the vision tower are transformers' defaults, not the 4B's as published"), period=("linear_attention",) * 3 + ("full_attention",),
        text=dict(hidden_size=2560, intermediate_size=9216, num_attention_heads=16, num_key_value_heads=4,
                  head_dim=256, vocab_size=248320, max_position_embeddings=262144, rms_norm_eps=1e-6,
                  linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                  linear_num_key_heads=16, linear_num_value_heads=32, tie_word_embeddings=True,
                  rope_parameters=_rope(10000000.0, partial_rotary_factor=0.25, mrope_section=[11, 11, 10],
                                        mrope_interleaved=True)),
        vision=dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                    spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=2304,
                    hidden_act="gelu_pytorch_tanh", out_hidden_size=2560),
        extra=dict(tie_word_embeddings=True),
        processor=dict(image_processor=dict(patch_size=16, merge_size=2, temporal_patch_size=2,
                                            image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                                            size={"shortest_edge": 65536, "longest_edge": 16777216}))),
}


def released_layer_types(period: tuple[str, ...], layers: int) -> list[str]:
    """The released checkpoint's first `layers` layer kinds (its `period` repeated), the last one made the period's
    global kind where none of them is, so that a model cut to a few layers still has one layer of each kind."""
    kinds = [period[i % len(period)] for i in range(layers)]
    if period[-1] not in kinds:
        kinds[-1] = period[-1]
    return kinds


def released_multimodal_config(model_type: str, *, layers: int | None = None, vision_layers: int | None = None,
                               **text_overrides: Any):
    """The configuration of `RELEASED_MULTIMODAL[model_type]` with `layers` text layers (None: the release's) and
    `vision_layers` vision blocks (None: the release's), the published `initializer_range` 0.02.

    Raises:
        KeyError: no released-width entry for `model_type`.
    """
    from transformers import AutoConfig

    from .testing import VLM_PROCESSORS

    if model_type not in RELEASED_MULTIMODAL:
        raise KeyError(f"no released-width vision-language configuration for {model_type!r} "
                       "(optimum_shared_graph/released.py)")
    entry = RELEASED_MULTIMODAL[model_type]
    layers = entry["layers"] if layers is None else layers
    text = dict(entry["text"], num_hidden_layers=layers, layer_types=released_layer_types(entry["period"], layers),
                initializer_range=0.02, **_TOKENS)
    text.update(text_overrides)
    vision = dict(entry["vision"], initializer_range=0.02)
    if vision_layers is not None:
        vision["depth" if "depth" in vision else "num_hidden_layers"] = vision_layers
    config = AutoConfig.for_model(model_type, text_config=text, vision_config=vision, initializer_range=0.02,
                                  **entry["extra"])
    for key, token_id in VLM_PROCESSORS[model_type]["ids"].items():  # the tokenizer's image token ids
        setattr(config, key, token_id)
    return config


def build_released_multimodal(model_type: str, out_dir: str | Path, *, layers: int | None = None,
                              vision_layers: int | None = None, seed: int = 0, **text_overrides: Any):
    """Build and save a random-init vision-language checkpoint of `RELEASED_MULTIMODAL[model_type]`'s widths with
    `layers` text layers (fp16 weights, as the checkpoints ship), laid out as published, with its processor (image
    processor at the release's image sizes, the tiny tokenizer with the image tokens, the chat template). Returns
    the config (the model is freed)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from .testing import build_vlm_processor, save_multimodal

    config = released_multimodal_config(model_type, layers=layers, vision_layers=vision_layers, **text_overrides)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float16).eval()
    save_multimodal(model, out_dir)
    del model
    build_vlm_processor(model_type, out_dir, **RELEASED_MULTIMODAL[model_type]["processor"])
    return config
