"""Qwen3.5 text decoders under transformers 5.5: optimum-intel's Qwen3_5ModelPatcher graph with a 5.5 cache holder.

What broke: transformers 5.5 removed `Qwen3_5DynamicCache`, which optimum-intel's `Qwen3_5ModelPatcher`
(and `Qwen3_5MoeModelPatcher`, its subclass) imports and subclasses first thing, so the export stops
at that import; the model now keeps its states in one `DynamicCache` and calls
`has_previous_state(layer_idx)` as a method. `Qwen3_5TextOpenVINOConfig` also caps transformers at
5.2.99.

The fix (`_gated_delta_net.GatedDeltaNetPatcher`) keeps optimum-intel's graph: the same inputs
(`input_ids`, `attention_mask`, `cache_params.past.conv.{i}` / `.ssm.{i}` per linear-attention layer,
`.key.{i}` / `.value.{i}` per full-attention layer, all states of the one stateful graph), its recurrent gated-delta-net forward
(`qwen3_5_gated_delta_net_forward` with `ov_causal_conv1d` and the `RecurrentAttentionCell` loop), and
for the MoE variant its vectorised `patched_qwen3_5_moe_sparse_moe_block`, which still fits the 5.5
block. The model sees the graph's states through a plain holder, and left padding is zeroed before
every linear-attention layer from the graph's attention mask, as transformers does at prefill.

The rotary positions are `arange(past, past + new)` and the rotary embedding is traced as plain RoPE
on them: for a text-only decoder the three interleaved M-RoPE axes carry the same positions, so the
interleaving changes nothing, and traced as transformers writes it (positions repeated on 4 axes,
sliced, interleaved by slice assignment) OpenVINO's SDPA-to-PagedAttention rewrite cannot map the
angles to its `position_ids`: under GenAI's default backend every prompt token got the last token's
position.

One input is dropped: optimum-intel's config declares `position_ids`, which its text patcher accepts
and never uses, so the graph had an input nothing reads. OpenVINO GenAI's NPU pipeline cannot give
such an input a static shape ("to_shape was called on a dynamic shape"); OVModelForCausalLM and
GenAI's CPU pipeline feed `position_ids` only to a graph that has it.
"""

from __future__ import annotations

from . import moe_experts

MODEL_TYPES = ("qwen3_5_text", "qwen3_5_moe_text")
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's Qwen3_5ModelPatcher graph with a state holder for transformers 5.5's cache "
           "(Qwen3_5DynamicCache was removed), left padding zeroed before the linear-attention layers, "
           "and the text-only M-RoPE traced as plain RoPE on arange(past, past + L) positions, the form "
           "GenAI's PagedAttention rewrite recognises")


def _text_rotary(rotary, x, positions):
    """Qwen3.5's interleaved M-RoPE for a text-only decoder, as plain RoPE on the text `positions` (batch, seq).

    A text decoder's temporal, height and width positions are all its text positions, so interleaving
    their frequencies (`apply_interleaved_mrope`) returns the frequencies unchanged. Traced the way
    transformers does it (positions repeated on 4 axes, sliced, interleaved by slice assignment),
    OpenVINO's PagedAttention rewrite cannot follow the rotary angles back to the positions.
    """
    import torch

    inv_freq = rotary.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
    freqs = (inv_freq @ positions[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rotary.attention_scaling).to(x.dtype), (emb.sin() * rotary.attention_scaling).to(x.dtype)


def _patcher_class() -> type:
    from optimum.exporters.openvino.model_patcher import qwen3_5_gated_delta_net_forward

    from ._gated_delta_net import patcher_class

    class Qwen3_5Patcher(patcher_class()):
        """The gated-delta-net patcher with Qwen3.5's recurrent forward, text rotary and (MoE variant) MoE block."""

        recurrent_forward = staticmethod(qwen3_5_gated_delta_net_forward)

        @staticmethod
        def sparse_moe_classes() -> tuple[type, ...]:
            from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeSparseMoeBlock

            return (Qwen3_5MoeSparseMoeBlock,)

        def patch_modules(self):
            super().patch_modules()
            rotary = self._text_model.rotary_emb

            def text_rotary_forward(x, position_ids):
                """The rotary angles of the positions the patched forward built (else the model's text axis)."""
                positions = self.positions
                if positions is None:
                    positions = position_ids[0] if position_ids.ndim == 3 else position_ids
                return _text_rotary(rotary, x, positions)

            rotary._orig_forward = rotary.forward
            rotary.forward = text_rotary_forward

        def restore_modules(self):
            super().restore_modules()
            rotary = self._text_model.rotary_emb
            rotary.forward = rotary._orig_forward
            del rotary._orig_forward

    return Qwen3_5Patcher


def export_config(base: type) -> type:
    """optimum-intel's Qwen3.5 text config (dense or MoE) without its 5.2.99 cap and its unused `position_ids`
    input, patching the model for 5.5."""

    def inputs(self) -> dict:
        declared = dict(base.inputs.fget(self))
        declared.pop("position_ids", None)  # never read by the graph (see the module docstring)
        return declared

    return moe_experts.export_config(type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with a patcher for transformers 5.5 (see {__name__}).",
        "MAX_TRANSFORMERS_VERSION": None,
        "_MODEL_PATCHER": _patcher_class(),
        "inputs": property(inputs),
    }))  # the MoE variant's experts traced as loaded (`moe_experts`); nothing changes for the dense one


# the MoE variant's experts load as the checkpoint stores them, memory-mapped (`moe_experts`; nothing for the dense one)
while_exporting = moe_experts.while_exporting


# The whole multimodal model (`--task image-text-to-text-shared`): optimum-intel's Qwen3.5 image-text-to-text
# config, whose language model part is the graph above fed `inputs_embeds` with the M-RoPE positions.
VLM_MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
VLM_SUMMARY = ("optimum-intel's Qwen3_5OpenVINOConfig without its 5.2.99 cap, its language model traced with the "
               "Qwen3.5 patcher's state holder for transformers 5.5 (Qwen3_5DynamicCache was removed), fed "
               "inputs_embeds and the (4, batch, seq) M-RoPE positions, the interleaved M-RoPE traced as a "
               "per-frequency axis selection instead of slice assignment; the vision merger traced on a 4 x 4 "
               "merged-patch grid per frame instead of 420 x 420 (the same graph, its sequence axes dynamic)")


def _mrope_selection(rotary):
    """(3, F) one-hot: which position axis (temporal, height, width) each rotary frequency takes, as
    `apply_interleaved_mrope` interleaves them: frequency j of axis d for j in `slice(d, 3 * section[d], 3)` of
    the F frequencies, Python's slicing as transformers applies it (so a section wider than the frequencies is
    clipped to them, as PyTorch computes it: transformers' default [11, 11, 10] under a smaller rotary dimension)."""
    import torch

    frequencies = rotary.inv_freq.shape[0]
    axis = [0] * frequencies
    for dim in (1, 2):
        for j in range(frequencies)[slice(dim, int(rotary.mrope_section[dim]) * 3, 3)]:
            axis[j] = dim
    return torch.nn.functional.one_hot(torch.tensor(axis, dtype=torch.long), 3).T.float()


def _mrope(rotary, selection, x, position_ids):
    """Qwen3.5's interleaved M-RoPE of `position_ids` (3, batch, seq): the frequencies of each axis multiplied by
    their one-hot selection and summed over the axes (exactly transformers' values: one product is kept, the
    others are zeros), with no slice assignment in the traced graph."""
    import torch

    if position_ids.ndim == 2:
        position_ids = position_ids[None].expand(3, -1, -1)
    freqs = position_ids[..., None].float() * rotary.inv_freq.float()  # (3, batch, seq, F)
    freqs = (freqs * selection[:, None, None, :]).sum(0)
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * rotary.attention_scaling).to(x.dtype), (emb.sin() * rotary.attention_scaling).to(x.dtype)


def _vlm_patcher_class() -> type:
    from ._gated_delta_net import GatedDeltaNetCache

    base = _patcher_class()

    class Qwen3_5LanguagePatcher(moe_experts.patcher(base)):  # the MoE variant's stored experts stacked too
        """The language model part of the multimodal model: `(inputs_embeds, attention_mask, cache_params,
        position_ids) -> logits, states`, `position_ids` (4, batch, seq): text positions, then temporal,
        height and width (optimum-intel's interface for this part, which OVModelForVisualCausalLM and
        GenAI's VLMPipeline feed)."""

        def _states_forward(self, inputs_embeds, attention_mask=None, cache_params=None, position_ids=None):
            import torch  # noqa: F401

            cache = GatedDeltaNetCache.from_graph_states(self._layer_types, cache_params, attention_mask)
            out = self._text_model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                                   position_ids=position_ids, past_key_values=cache, use_cache=True)
            logits = self._model.lm_head(out.last_hidden_state)
            return {"logits": logits, "present_key_values": cache.graph_states()}

        def patch_modules(self):
            super(base, self).patch_modules()  # the gated-delta-net layers and MoE blocks, not the text rotary
            rotary = self._text_model.rotary_emb
            selection = _mrope_selection(rotary)
            rotary._orig_forward = rotary.forward
            rotary.forward = lambda x, position_ids: _mrope(rotary, selection, x, position_ids)

        def restore_modules(self):
            super(base, self).restore_modules()
            rotary = self._text_model.rotary_emb
            rotary.forward = rotary._orig_forward
            del rotary._orig_forward

    return Qwen3_5LanguagePatcher


def vlm_export_config(base: type) -> type:
    """optimum-intel's Qwen3.5 image-text-to-text config (dense or MoE) without its 5.2.99 cap, its language
    model part traced with `Qwen3_5LanguagePatcher`; the vision parts as optimum-intel exports them, but the
    vision merger traced on a smaller dummy image.

    Why the smaller image: `_qwen_vision` (+4.6 GB of anonymous memory at Qwen3.5-4B's vision width otherwise).
    """
    from optimum.exporters.openvino.model_configs import QwenVLConfigBehavior

    from ._qwen_vision import small_merger_dummy

    language_patcher = _vlm_patcher_class()

    def with_behavior(self, behavior):
        part = base.with_behavior(self, behavior)
        if behavior in (QwenVLConfigBehavior.LANGUAGE, QwenVLConfigBehavior.LANGUAGE.value):
            part.patcher_cls = language_patcher
            part.MAX_TRANSFORMERS_VERSION = None
        return part

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with a language model patcher for transformers 5.5 and the vision merger "
                   f"traced on a smaller dummy image (see {__name__}).",
        "MAX_TRANSFORMERS_VERSION": None,
        "with_behavior": with_behavior,
        **small_merger_dummy(base),
    })
