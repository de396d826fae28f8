"""A sliding window counted along the attention mask: the form GenAI's NPU pipeline (NPUW) runs right (gpt_neo).

A 4-D mask [batch, 1, queries, keys] (the causal and the padding mask, additive with optimum-intel's float16 minimum
for a masked key, or boolean) gets the keys `window` or more positions before a query masked, where a key's position
is the number of keys the last query may attend up to it (`cumsum` of the mask's last row) and a query's the
position of its own slot (the queries are the last slots). Where every slot holds a token (PyTorch's cache,
OpenVINO's dynamic graph) the count is the slot index, so this is the slot-index window transformers and
optimum-intel write; in a left-padded row the pads precede every token, so two tokens are as many positions apart as
slots: the same mask again. NPUW runs the graph on a static cache whose slots are not the tokens' positions (the
past, then empty slots, then the new token in the last slot; its prefill left-padded to its prompt length): the
count skips the empty slots and the pads, so the window is the tokens' own.

The comparison is written `k - q < 1 - window`, not `q - k >= window`: NPUW's attention-mask detector
(`DetectAttentionMask`, its TriuSliding matcher) takes `Select(GreaterEqual(Subtract, window))` for a sliding window
of its own and then asserts ("conflicting attention mask detection for the same SDPA node") against the causal mask
it also finds feeding the same attention.

Not for a model whose window OpenVINO's PagedAttention rewrite (GenAI's default backend) reads from transformers'
own mask: that rewrite recognises transformers' chain only (`Greater(kv, Add(q, offset))` in its `BitwiseAnd`s), and
with this form it drops the window (measured on a tiny Starcoder2 with a window of 4: every prompt's greedy tokens
differ through the default backend, where optimum-intel's artifact and this one through `ATTENTION_BACKEND=SDPA` have
parity). For such a model `graph/sliding_window.py` counts the positions inside transformers' chain instead
(Starcoder2). GPT-Neo's window the rewrite drops in optimum-intel's artifact as well.
"""

from __future__ import annotations

# optimum-intel writes a masked key as float16's minimum, whatever the mask's dtype (OVDecoderModelPatcher's masks)
MASKED = -65504.0


def counted_window(mask, window: int):
    """`mask` (4-D, additive or boolean) with every key `window` or more positions before its query masked."""
    import torch

    if mask.dtype == torch.bool:
        visible = mask
    else:
        visible = mask > MASKED / 2
    keys = visible[:, :, -1:, :].to(torch.int32)  # [batch, 1, 1, keys]: what the last query sees
    positions = keys.cumsum(-1)  # a key's position (+1), counted along the mask
    query_positions = positions[..., -mask.shape[-2]:].transpose(-1, -2)  # [batch, 1, queries, 1]
    too_far = (positions - query_positions) < 1 - window
    if mask.dtype == torch.bool:
        return mask & ~too_far
    return torch.where(too_far, torch.full([], MASKED, dtype=mask.dtype), mask)
