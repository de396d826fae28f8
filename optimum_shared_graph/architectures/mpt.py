"""MPT: the ALiBi bias counted along the attention mask, so it stays right where the keys' slots are not their positions.

What broke: optimum-intel's MPT patcher (`_mpt_sdpa_attention_forward`) adds to each key the bias `slope * (j - (K - 1))`,
`j` the key's slot and `K` the number of slots (the columns of the ALiBi table it slices). The graph is right where
the slots are the tokens in order (OVModelForCausalLM, GenAI's SDPA backend), but GenAI's NPU pipeline runs it on a
static cache whose slots are not the keys' positions (the past, then empty slots, then the new token in the last
slot): every past key then gets the wrong distance and the decode differs from PyTorch's from its second token
(measured on a tiny MPT and at mpt-7b's widths); the graph has no `position_ids` input either, which NPUW's decoding
needs (`graph/npuw_forms.py`). GenAI's PagedAttention backend (its default) differs from PyTorch the same way.

What the fix does: the same bias with positions counted along the mask: a key's position is the number of keys the
last query may attend up to it (`cumsum` of the last row of the causal mask), and its bias is `slope * (p_j - p_last)`.
Where every slot holds a token (PyTorch's cache, OpenVINO's dynamic graph) `p_j - p_last` is `j - (K - 1)`, the
same integers times the same slopes, so the same numbers; a left-padded key is masked either way. The graph then
counts positions along the mask as bloom's does, and gets the `position_ids` input NPUW needs
(`graph/npuw_forms.declare_position_ids`). Validated against PyTorch at export like every export.
"""

from __future__ import annotations

import types

MODEL_TYPES = ("mpt",)
TRANSFORMERS = ">=5.5"  # written and tested under 5.5 (the cache API optimum-intel's patched attention calls)
SUMMARY = ("optimum-intel's MPT export with the ALiBi bias counted along the attention mask (the same numbers), so "
           "GenAI's NPU pipeline, whose cache slots are not the keys' positions, decodes it right")


def _slopes(attn):
    """The per-head ALiBi slopes [1, heads, 1, 1] of the model (transformers' own table, two columns of it)."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    table = build_mpt_alibi_tensor(attn.n_heads, 2)  # MptModel builds its table with the default alibi_bias_max
    return (-table[:, :, 0]).view(1, attn.n_heads, 1, 1)  # column 0 holds -slope, column 1 zero


def _attention_forward(self, hidden_states, position_bias, past_key_value=None, attention_mask=None,
                       cache_position=None):
    """optimum-intel's `_mpt_sdpa_attention_forward` with the ALiBi bias taken from the mask's running count."""
    import torch

    batch_size, seq_length = hidden_states.shape[:2]
    mixed_qkv = self.Wqkv(hidden_states)
    query_states, key_states, value_states = mixed_qkv.chunk(3, dim=2)
    query_states = query_states.reshape(batch_size, seq_length, self.n_heads, self.head_dim).transpose(1, 2)
    key_states = key_states.reshape(batch_size, seq_length, self.n_heads, self.head_dim).transpose(1, 2)
    value_states = value_states.reshape(batch_size, seq_length, self.n_heads, self.head_dim).transpose(1, 2)
    if past_key_value is not None:
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx,
                                                         {"cache_position": cache_position})

    attention_mask_sdpa = torch.ones(
        (query_states.shape[0], query_states.shape[1], query_states.shape[2], key_states.shape[2]),
        dtype=query_states.dtype)
    if position_bias is not None:
        keys = (~attention_mask[:, :, -1:, :]).to(query_states.dtype)  # [batch, 1, 1, keys]: what the last query sees
        distance = keys.cumsum(-1) - keys.sum(-1, keepdim=True)  # p_j - p_last
        attention_mask_sdpa = attention_mask_sdpa + self._alibi_slopes.to(query_states.dtype) * distance
    attention_mask_sdpa = attention_mask_sdpa.masked_fill(attention_mask, torch.finfo(query_states.dtype).min)
    context_states = torch.nn.functional.scaled_dot_product_attention(
        query_states, key_states, value_states, attn_mask=attention_mask_sdpa, dropout_p=self.attn_dropout_p,
        scale=self.softmax_scale)
    context_states = context_states.permute(0, 2, 1, 3).contiguous().view(batch_size, seq_length, -1)
    return self.out_proj(context_states), None


def export_config(base: type) -> type:
    """optimum-intel's MPT export config `base`, its patcher's attention with the bias counted along the mask."""
    patcher_base = base._MODEL_PATCHER

    class MaskAlibiPatcher(patcher_base):
        """optimum-intel's MPT patcher, then each block's attention with the ALiBi bias counted along the mask."""

        def __enter__(self):
            super().__enter__()
            self._alibi_undo = []
            for block in self._model.transformer.blocks:
                attn = block.attn
                attn._alibi_slopes = _slopes(attn)
                self._alibi_undo.append((attn, attn.__dict__.get("forward")))
                attn.forward = types.MethodType(_attention_forward, attn)
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            for attn, before in reversed(self._alibi_undo):
                attn.__dict__.pop("_alibi_slopes", None)
                if before is None:
                    attn.__dict__.pop("forward", None)
                else:
                    attn.forward = before
            super().__exit__(exc_type, exc_value, traceback)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with the ALiBi bias counted along the attention mask.",
        "_MODEL_PATCHER": MaskAlibiPatcher,
    })
