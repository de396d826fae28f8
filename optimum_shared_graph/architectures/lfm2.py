"""LFM2 and LFM2-MoE under transformers 5.5: optimum-intel's LFM2 graph with a cache holder for the 5.5 model.

What broke: transformers 5.5 removed `Lfm2HybridConvCache` (LFM2 keeps its convolution states in a
`DynamicCache` of `LinearAttentionLayer`s), so optimum-intel's `Lfm2ModelPatcher`, whose cache wrapper
subclasses it, fails on import. Its export config also caps transformers at 5.4.0. Its short-convolution
patch (`lfm2_short_conv_forward_patched`) reads the padding mask from a positional argument whose
meaning changed between releases, and the 5.5 model passes that mask only when the call has more
than one token, which tracing fixes once for the dummy input.

What the fix does, in the way optimum-intel's GraniteMoeHybridModelPatcher does it under 5.5:

- the graph's states are passed to the model as one small holder (`Lfm2States`) in `past_key_values`:
  it serves the attention layers' `update` (the keys and values concatenated after the past ones, as
  optimum-intel's wrapper did) and the mask builder (`get_seq_length`, `get_mask_sizes`), and keeps the
  convolution layers' states and the graph's attention mask;
- each short convolution (`Lfm2ShortConv`) runs optimum-intel's `ov_causal_conv1d` (the cached window
  before the new tokens, one code path for the prompt and for each new token) on its input zeroed
  where the mask's last `seq_len` columns are 0, as transformers' `apply_mask_to_padding_states`;
- the rotary positions are passed as `arange(past, past + seq_len)`, the form transformers 4.x
  traced and OpenVINO GenAI's PagedAttention rewrite recognises (the 5.5 model's own
  `arange(seq_len) + past`, the same values, is not rewritten there, and GenAI's default backend then
  drifts from PyTorch after a few tokens).

LFM2-MoE (`lfm2_moe`) is LFM2 with routed experts in the feed-forward of the layers after the first
`num_dense_layers`. optimum-intel's `Lfm2MoeModelPatcher` subclasses `Lfm2ModelPatcher` (so it breaks
the same way, and its config has the same 5.4.0 cap) and adds one thing, kept here: each
`Lfm2MoeExperts` runs optimum-intel's `lfm2_moe_experts_forward` (every expert on every token as batched
matmuls, weighted by the dense routing weights) instead of transformers' default "grouped_mm" experts,
which do not convert (`aten::histc` has no OpenVINO rule). Its short convolution (`Lfm2MoeShortConv`) is
LFM2's and is patched the same way.

The graph interface is optimum-intel's LFM2 interface (the same for LFM2-MoE): `input_ids`, `attention_mask` (the whole
context's), and `cache_params.past.conv.{i}` [batch, hidden, L_cache] for each convolution layer,
then `cache_params.past.key.{i}` / `cache_params.past.value.{i}` for each attention layer, all states
of the one stateful graph.
"""

from __future__ import annotations

import types
from typing import Any

from . import moe_experts
from ._states import AttentionStates, StatesForward, layers_of

MODEL_TYPES = ("lfm2", "lfm2_moe")
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's LFM2 graph with a cache holder for transformers 5.5's model (Lfm2HybridConvCache was "
           "removed) and the short convolutions as ov_causal_conv1d on the masked input; LFM2-MoE's experts on "
           "optimum-intel's lfm2_moe_experts_forward (grouped_mm does not convert)")


class Lfm2States(AttentionStates):
    """The graph's states as the 5.5 model reaches them through `past_key_values`.

    Convolution layers read and replace `conv_states[conv_index[layer]]`; attention layers call
    `update`, which appends the new keys and values to `key_cache` / `value_cache`.
    """

    def __init__(self, layer_types: list[str], conv_states: list[Any], key_cache: list[Any], value_cache: list[Any],
                 attention_mask: Any):
        super().__init__(layers_of(layer_types, "full_attention"), key_cache, value_cache, attention_mask)
        self.conv_states = conv_states
        self.conv_index = {layer: n for n, layer in enumerate(layers_of(layer_types, "conv"))}


def lfm2_short_conv_forward(self, hidden_states, past_key_values: Lfm2States | None = None, attention_mask=None):
    """`Lfm2ShortConv.forward` (and `Lfm2MoeShortConv.forward`) of transformers 5.5 in one traceable path for the
    prompt and each new token."""
    import torch
    from optimum.exporters.openvino.model_patcher import ov_causal_conv1d

    seq_len = hidden_states.shape[1]
    if past_key_values is not None:
        attention_mask = past_key_values.attention_mask
    if attention_mask is not None:  # padding tokens do not enter the convolution window
        hidden_states = hidden_states * attention_mask[:, -seq_len:, None].to(hidden_states.dtype)

    B, C, x = self.in_proj(hidden_states).transpose(-1, -2).chunk(3, dim=-2)
    Bx = B * x
    if past_key_values is not None:
        n = past_key_values.conv_index[self.layer_idx]
        conv_state = past_key_values.conv_states[n]
    else:
        conv_state = torch.zeros(Bx.shape[0], Bx.shape[1], self.L_cache, dtype=Bx.dtype)
    conv_out, new_conv_state = ov_causal_conv1d(conv_state, Bx, self.conv.weight, self.conv.bias)
    if past_key_values is not None:
        past_key_values.conv_states[n] = new_conv_state
    return self.out_proj((C * conv_out).transpose(-1, -2).contiguous())


def _module_classes(suffix: str) -> tuple[type, ...]:
    """transformers' `Lfm2<suffix>` and `Lfm2Moe<suffix>` classes that exist (`ShortConv`, `Experts`)."""
    from transformers.models.lfm2 import modeling_lfm2
    from transformers.models.lfm2_moe import modeling_lfm2_moe

    found = [getattr(modeling_lfm2, f"Lfm2{suffix}", None), getattr(modeling_lfm2_moe, f"Lfm2Moe{suffix}", None)]
    return tuple(cls for cls in found if cls is not None)


def _patcher_class() -> type:
    from optimum.exporters.openvino.model_patcher import OVDecoderModelPatcher

    class Lfm2StatesPatcher(StatesForward, OVDecoderModelPatcher):
        """Patches an LFM2 (or LFM2-MoE) causal LM for tracing: states in and out as one list, traceable short
        convolutions, LFM2-MoE's experts as optimum-intel's `lfm2_moe_experts_forward`."""

        def __init__(self, config, model, model_kwargs: dict[str, Any] | None = None):
            super().__init__(config, model, model_kwargs)
            self.layer_types = list(self.real_config._config.layer_types)

        def _states_forward(self, input_ids, attention_mask=None, cache_params=None):
            """`(input_ids, attention_mask, [conv..., key, value, ...]) -> {logits, present_key_values}`."""
            import torch

            if cache_params is None:
                return self._logits_only(input_ids, attention_mask)
            convs = self.layer_types.count("conv")
            attentions = self.layer_types.count("full_attention")
            states = Lfm2States(self.layer_types, list(cache_params[:convs]),
                                [cache_params[convs + 2 * n] for n in range(attentions)],
                                [cache_params[convs + 2 * n + 1] for n in range(attentions)], attention_mask)
            past = states.get_seq_length()
            position_ids = torch.arange(past, past + input_ids.shape[1]).unsqueeze(0)
            result = self.model_orig_forward(input_ids=input_ids, attention_mask=attention_mask,
                                             position_ids=position_ids, past_key_values=states, use_cache=True)
            present = list(states.conv_states) + states.present_key_values()
            return {"logits": result.logits, "present_key_values": present}

        def _short_convs(self) -> list:
            """The model's short-convolution modules (`Lfm2ShortConv` or `Lfm2MoeShortConv`)."""
            kinds = _module_classes("ShortConv")
            return [layer.conv for layer in self._model.model.layers if isinstance(getattr(layer, "conv", None), kinds)]

        def _experts(self) -> list:
            """LFM2-MoE's `Lfm2MoeExperts` modules (none in LFM2)."""
            kinds = _module_classes("Experts")
            return [layer.feed_forward.experts for layer in self._model.model.layers
                    if isinstance(getattr(layer.feed_forward, "experts", None), kinds)
                    and not isinstance(layer.feed_forward.experts, moe_experts.StoredExperts)]

        def patch_modules(self):
            from optimum.exporters.openvino.model_patcher import lfm2_moe_experts_forward

            for conv in self._short_convs():
                conv.forward = types.MethodType(lfm2_short_conv_forward, conv)
            for experts in self._experts():  # as optimum-intel's Lfm2MoeModelPatcher
                experts.forward = types.MethodType(lfm2_moe_experts_forward, experts)

        def restore_modules(self):
            for module in self._short_convs() + self._experts():  # back to the class's forward
                del module.forward

    return Lfm2StatesPatcher


def export_config(base: type) -> type:
    """optimum-intel's `LFM2OpenVINOConfig` / `LFM2MoeOpenVINOConfig` without the 5.4.0 cap, patching the model for
    transformers 5.5; LFM2-MoE's experts traced as the checkpoint stores them (`moe_experts`)."""
    return moe_experts.export_config(_config(base))  # its patcher changes nothing in LFM2, which has no experts


# the MoE variant's experts load as the checkpoint stores them, memory-mapped (`moe_experts`; nothing for the dense one)
while_exporting = moe_experts.while_exporting


def _config(base: type) -> type:
    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} for transformers 5.5 (see {__name__}).",
        "__module__": __name__,
        "MAX_TRANSFORMERS_VERSION": None,
        "_MODEL_PATCHER": _patcher_class(),
    })
