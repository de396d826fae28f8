"""GPT-Neo: the local-attention window counted along the attention mask, so GenAI's NPU pipeline can run it.

What broke: optimum-intel's GPT-Neo patcher (`_gpt_neo_attn_sdpa`) masks a local-attention layer with a slice of
the layer's `bias` buffer, `bias[:, :, K - Q : K, :K]` (`K` keys, `Q` queries; the buffer is [positions, positions],
2048 at gpt-neo-1.3B's widths): the window is counted in cache slots. GenAI's NPU pipeline (NPUW) runs the graph on a
static cache whose slots are not the tokens' positions (the past, then empty slots, then the new token in the last
slot), and its static prefill slices that buffer empty: "Argument shapes are inconsistent" at a layer's `Select`
([1, 1, 0, 2048] where the mask it meets is [1, 1, 64, 64]; the global layers' causal rows are sliced the same way),
for optimum-intel's artifact and this package's alike (docs/npu-real-width.md).

What the fix does: the same window with positions counted along the mask. A key's position is the number of keys the
last query may attend up to it (`cumsum` of the last row of the 4-D mask the layer receives, which already holds
the causal and the padding mask), a query's the position of its own slot, and a key more than `window_size - 1`
positions back is masked. Where every slot holds a token (PyTorch's cache, OpenVINO's dynamic graph) the count is
the slot index, so the same mask; in a left-padded row the pads precede every token, so the distance between two
tokens is the distance between their slots: the same mask again. In NPUW's static cache the count skips the empty
slots and the pads of its prefill, so the window is the tokens' own. A global layer is masked by the 4-D mask alone,
which already holds the causal mask the buffer's rows repeat. Validated against PyTorch at export like every export.
"""

from __future__ import annotations

import types

MODEL_TYPES = ("gpt_neo",)
TRANSFORMERS = ">=5.5"  # written and tested under 5.5 (the 4-D mask optimum-intel's patched attention receives)
SUMMARY = ("optimum-intel's GPT-Neo export with the local-attention window counted along the attention mask (the same "
           "mask), so GenAI's NPU pipeline, whose static cache slots are not the tokens' positions, runs it")


def _local_sdpa(self, query, key, value, attention_mask=None, head_mask=None):
    """optimum-intel's `_gpt_neo_attn_sdpa` without the `bias` buffer's rows: a global layer masked by the 4-D
    `attention_mask` alone (it already holds the causal mask the rows repeat), a local one by it with the window
    counted along it; a call without a 4-D mask goes to optimum-intel's own."""
    import torch

    from ._counted_window import counted_window

    if attention_mask is None or attention_mask.dim() != 4:
        return self._osg_sdpa(query, key, value, attention_mask, head_mask)
    mask = attention_mask  # a global layer: the causal and padding mask alone, as the buffer's rows only repeat it
    if self.attention_type == "local":
        shared = self._osg_window  # [mask, its windowed form]: the local layers of one forward share one
        if shared[0] is not attention_mask:
            shared[:] = [attention_mask, counted_window(attention_mask, self.config.window_size)]
        mask = shared[1]
    if mask.dtype != torch.bool:
        mask = mask.to(value.dtype)
    dropout_p = float(self.config.attention_dropout) if self.training else 0.0
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p,
                                                           is_causal=False, scale=1.0)
    return out, None


def export_config(base: type) -> type:
    """optimum-intel's GPT-Neo export config `base`, its patcher's local layers with the window counted along the mask."""
    patcher_base = base._MODEL_PATCHER

    class MaskWindowPatcher(patcher_base):
        """optimum-intel's GPT-Neo patcher, then each local layer's window counted along the mask."""

        def __enter__(self):
            super().__enter__()
            self._window_undo = []
            shared = [None, None]
            for layer in self._model.transformer.h:
                attn = layer.attn.attention
                if "_attn" not in attn.__dict__:  # optimum-intel's patcher did not patch it (torch < 2.1)
                    continue
                self._window_undo.append(attn)
                attn._osg_sdpa = attn._attn
                attn._osg_window = shared
                attn._attn = types.MethodType(_local_sdpa, attn)
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            for attn in reversed(self._window_undo):
                attn._attn = attn.__dict__.pop("_osg_sdpa")
                attn.__dict__.pop("_osg_window", None)
            super().__exit__(exc_type, exc_value, traceback)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with the local-attention window counted along the attention mask.",
        "_MODEL_PATCHER": MaskWindowPatcher,
    })
