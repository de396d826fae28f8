"""Llama 4's text model (meta-llama/Llama-4-*, `llama4_text`) under transformers 5.5.

What broke: optimum-intel's `Llama4TextOpenVINOConfig` (capped at transformers 4.57.6) exports with
`Llama4TextModelPatcher`, whose attention forward (`llama4_attn_forward`) scales the queries of the layers without
RoPE (`attn_temperature_tuning`: every 4th layer of Llama-4-Scout, a global-attention layer) by a temperature
computed from `cache_position`, which transformers 5.5 no longer passes to the attention. The trace stops there
("'NoneType' object has no attribute 'float'"), so no released Llama 4 exported; a model whose layers all use RoPE
(the tiny coverage model) did.

What the fix does: each attention runs optimum-intel's forward with the positions transformers 5.5's own attention
computes in their place (the past length of the layer's cache plus the query's offsets), and the version cap is
lifted. The experts load as the checkpoint stores them, memory-mapped, and are traced stacked (`moe_experts`,
composed with this config).
"""

from __future__ import annotations

import types
from typing import Self

from . import moe_experts

MODEL_TYPES = ("llama4_text",)
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's Llama 4 text export config with its attention given the positions transformers 5.5 no "
           "longer passes (the temperature of the layers without RoPE), and the experts loaded as the checkpoint "
           "stores them, traced stacked (moe_experts)")


def export_config(base: type) -> type:
    """optimum-intel's `Llama4TextOpenVINOConfig` `base`, uncapped, its attention given positions, the experts traced
    as the checkpoint stores them (`moe_experts`)."""
    return moe_experts.export_config(_positions_config(base))


# the experts load as the checkpoint stores them, memory-mapped (`moe_experts`)
while_exporting = moe_experts.while_exporting


def attention_forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None,
                      cache_position=None, **kwargs):
    """optimum-intel's `llama4_attn_forward` with `cache_position` computed as transformers 5.5's
    `Llama4TextAttention.forward` computes the positions it scales by: the past length plus the query's offsets."""
    import torch
    from optimum.exporters.openvino.model_patcher import llama4_attn_forward

    if cache_position is None:
        past = past_key_values.get_seq_length(self.layer_idx) if past_key_values is not None else 0
        cache_position = torch.arange(hidden_states.shape[1], device=hidden_states.device) + past
    return llama4_attn_forward(self, hidden_states, position_embeddings, attention_mask,
                               past_key_values=past_key_values, cache_position=cache_position, **kwargs)


def _positions_config(base: type) -> type:
    class Llama4PositionsPatcher(base._MODEL_PATCHER):
        """optimum-intel's Llama 4 text patcher, its attention forward given positions (above); its own exit puts
        each attention's forward back."""

        def __enter__(self) -> Self:
            super().__enter__()
            for layer in self._model.model.layers:
                layer.self_attn.forward = types.MethodType(attention_forward, layer.self_attn)
            return self

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} for the Llama 4 classes of transformers 5.5 (optimum_shared_graph.architectures.llama4).",
        "_MODEL_PATCHER": Llama4PositionsPatcher,
        "MAX_TRANSFORMERS_VERSION": None,
    })
