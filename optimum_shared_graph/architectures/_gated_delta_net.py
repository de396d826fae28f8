"""What the gated-delta-net hybrids (Qwen3-Next, Qwen3.5) share under transformers 5.5: the cache and the patcher.

transformers 5.5 removed the per-family hybrid caches optimum-intel's patchers subclass
(`Qwen3NextDynamicCache`, `Qwen3_5DynamicCache`: a model now keeps its convolution and recurrent
states in `LinearAttentionLayer`s of one `DynamicCache`), turned `has_previous_state` from a property
into a method taking a layer index, and stores MoE experts as 3-D tensors (`gate_up_proj`,
`down_proj`) behind a router returning `(logits, scores, indices)` instead of a list of MLPs.

`GatedDeltaNetPatcher` keeps optimum-intel's graph: its recurrent gated-delta-net forward
(`qwen3_next_gated_delta_net_forward` / `qwen3_5_gated_delta_net_forward`: `ov_causal_conv1d` and the
`RecurrentAttentionCell` module converted to an OpenVINO loop by `convert_recurrent_attention_cell`),
its vectorised MoE block for the 3-D experts (`patched_qwen3_5_moe_sparse_moe_block`), its inputs
(`cache_params.past.conv.{i}` / `.ssm.{i}` per linear-attention layer, then `.key.{i}` / `.value.{i}`
per full-attention layer). What changes is the cache the model sees: `GatedDeltaNetCache`, a plain
holder of the graph's state tensors with the handful of methods the 5.5 model calls on a cache (as
optimum-intel's own `GraniteMoeHybridModelPatcher` does under 5.5).

Two behaviours are made explicit. The model only zeroes padded positions before a linear-attention
layer when its cache reports no previous state, and a traced graph always has one (its state
inputs), so the holder keeps the 2-D attention mask and every linear-attention layer multiplies its
input by the mask's last `seq_len` columns (the zeroing transformers does at a left-padded prefill; a
no-op at decode, whose new tokens are never padding). And the rotary positions are passed to the
model as `arange(past, past + new)`, the form transformers 4.57 traced: 5.5 computes
`arange(new) + past`, which OpenVINO's SDPA-to-PagedAttention rewrite (GenAI's default backend) does
not map to its `position_ids`, so every prompt token got the same position there.
"""

from __future__ import annotations

import types
from typing import Any, Callable

from . import moe_experts
from ._states import AttentionStates, StatesForward, layers_of, use_recurrent_cell


class GatedDeltaNetCache(AttentionStates):
    """The graph's states as the model sees them while optimum-intel traces it (transformers 5.5).

    Linear-attention layers read and write `conv_states[i]` / `recurrent_states[i]` (indexed through
    `linear_attn_mapping`, as optimum-intel's patched gated-delta-net forwards expect); full-attention
    layers append to `key_cache` / `value_cache` through `update()`. `attention_mask` is the graph's 2-D
    mask over past and new tokens.
    """

    def __init__(self, layer_types: list[str], conv_states: list[Any], recurrent_states: list[Any],
                 key_cache: list[Any], value_cache: list[Any], attention_mask: Any = None):
        super().__init__(layers_of(layer_types, "full_attention"), key_cache, value_cache, attention_mask)
        self.conv_states = conv_states
        self.recurrent_states = recurrent_states
        linear = layers_of(layer_types, "linear_attention")
        self.linear_attn_mapping = {layer: n for n, layer in enumerate(linear)}

    @classmethod
    def from_graph_states(cls, layer_types: list[str], cache_params, attention_mask: Any = None) -> "GatedDeltaNetCache":
        """The cache over the graph's flat state inputs: each linear-attention layer's convolution and recurrent
        states in turn, then the full-attention layers' keys and values in turn."""
        n_linear = layer_types.count("linear_attention")
        n_full = layer_types.count("full_attention")
        states = list(cache_params)
        return cls(layer_types, conv_states=states[0:2 * n_linear:2], recurrent_states=states[1:2 * n_linear:2],
                   key_cache=states[2 * n_linear::2][:n_full], value_cache=states[2 * n_linear + 1::2][:n_full],
                   attention_mask=attention_mask)

    def graph_states(self) -> list[Any]:
        """The states as the graph outputs them, in `from_graph_states`' order."""
        linear = [state for pair in zip(self.conv_states, self.recurrent_states) for state in pair]
        return linear + self.present_key_values()


def linear_attention_forward(layer, recurrent_forward: Callable) -> Callable:
    """`layer`'s forward under transformers 5.5: padding zeroed from the graph's mask, then optimum-intel's recurrent form.

    transformers 5.5 calls `linear_attn(hidden_states=..., cache_params=..., attention_mask=...)`, with
    `attention_mask` None whenever the cache has a previous state (always, in the traced graph).
    """

    def forward(hidden_states, cache_params: GatedDeltaNetCache | None = None, attention_mask=None, **kwargs):
        mask = cache_params.attention_mask if cache_params is not None else attention_mask
        if mask is not None:
            mask = mask[:, -hidden_states.shape[1]:]
            hidden_states = hidden_states * mask[:, :, None].to(hidden_states.dtype)
        return recurrent_forward(layer, hidden_states, cache_params=cache_params, attention_mask=None)

    return forward


def patcher_class() -> type:
    """`GatedDeltaNetPatcher`, built on first use (optimum-intel and torch are imported only then)."""
    import torch
    from optimum.exporters.openvino._ov_ops import convert_recurrent_attention_cell
    from optimum.exporters.openvino.model_patcher import (
        OVDecoderModelPatcher,
        RecurrentAttentionCell,
        patched_qwen3_5_moe_sparse_moe_block,
        patched_recurrent_gated_delta_rule,
    )

    class GatedDeltaNetPatcher(StatesForward, OVDecoderModelPatcher):
        """optimum-intel's hybrid gated-delta-net patcher for transformers 5.5 (subclasses set the family's pieces).

        The patched forward takes optimum-intel's inputs (`input_ids`, `attention_mask`, the flat
        `cache_params` list: conv and recurrent state per linear-attention layer, then key and value
        per full-attention layer) and returns `logits` and the present states in the same order.
        """

        @staticmethod
        def recurrent_forward(layer, hidden_states, cache_params=None, attention_mask=None):
            """optimum-intel's recurrent gated-delta-net forward for the family."""
            raise NotImplementedError

        @staticmethod
        def sparse_moe_classes() -> tuple[type, ...]:
            """The family's MoE block classes (3-D experts, router returning logits, scores, indices)."""
            return ()

        def __init__(self, config, model, model_kwargs: dict[str, Any] | None = None):
            super().__init__(config, model, model_kwargs)
            # the decoder: the causal LM's `model`, or a multimodal model's `model.language_model`
            self._text_model = getattr(self._model.model, "language_model", self._model.model)
            self._layer_types = list(self._text_model.config.layer_types)
            self.positions = None  # the rotary positions of the call being traced, (1, seq)
            use_recurrent_cell(self, RecurrentAttentionCell, convert_recurrent_attention_cell)

        def _states_forward(self, input_ids, attention_mask=None, cache_params=None, position_ids=None,
                            inputs_embeds=None):
            """`(input_ids, attention_mask, cache_params) -> {"logits", "present_key_values"}`.

            The positions handed to the model are `arange(past, past + new)`, the form transformers
            4.57 traced (5.5 builds `arange(new) + past`, which OpenVINO's SDPA-to-PagedAttention
            rewrite does not recognise: under GenAI's default backend every token of a prompt then got
            the last token's position). A `position_ids` argument is accepted and unused, as in
            optimum-intel's own patcher (the Qwen3.5 fix drops the input its config declares): rotary
            attention only sees the difference of two positions, so a left-padded row gives the same scores.
            """
            self.positions = None
            if cache_params is None:
                return self._logits_only(input_ids, attention_mask)
            cache = GatedDeltaNetCache.from_graph_states(self._layer_types, cache_params, attention_mask)
            past = cache.get_seq_length()
            self.positions = torch.arange(past, past + input_ids.shape[1], dtype=torch.int64).unsqueeze(0)
            out = self.model_orig_forward(input_ids=input_ids, attention_mask=attention_mask,
                                          position_ids=self.positions, past_key_values=cache, use_cache=True)
            return {"logits": out.logits, "present_key_values": cache.graph_states()}

        def patch_modules(self):
            moe_classes = self.sparse_moe_classes()
            for layer, kind in zip(self._text_model.layers, self._layer_types):
                if kind == "linear_attention":
                    attn = layer.linear_attn
                    attn._orig_forward = attn.forward
                    attn.forward = linear_attention_forward(attn, self.recurrent_forward)
                    attn._orig_recurrent_gated_delta_rule = attn.recurrent_gated_delta_rule
                    attn.recurrent_gated_delta_rule = patched_recurrent_gated_delta_rule
                    attn.recurrent_attention_cell = RecurrentAttentionCell()
                # a block whose experts are loaded as stored keeps its own forward (`moe_experts` traces them)
                if moe_classes and isinstance(layer.mlp, moe_classes) \
                        and not isinstance(layer.mlp.experts, moe_experts.StoredExperts):
                    layer.mlp._orig_forward = layer.mlp.forward
                    layer.mlp.forward = types.MethodType(patched_qwen3_5_moe_sparse_moe_block, layer.mlp)

        def restore_modules(self):
            for layer in self._text_model.layers:
                for module in (getattr(layer, "linear_attn", None), layer.mlp):
                    if module is not None and hasattr(module, "_orig_forward"):
                        module.forward = module._orig_forward
                        del module._orig_forward
                attn = getattr(layer, "linear_attn", None)
                if attn is not None and hasattr(attn, "_orig_recurrent_gated_delta_rule"):
                    attn.recurrent_gated_delta_rule = attn._orig_recurrent_gated_delta_rule
                    del attn._orig_recurrent_gated_delta_rule, attn.recurrent_attention_cell

    return GatedDeltaNetPatcher
