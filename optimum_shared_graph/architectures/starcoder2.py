"""Starcoder2: the sliding-window mask counted along the attention mask, so GenAI's NPU pipeline can run it.

What broke: transformers' `create_sliding_window_causal_mask` writes the window in cache slots (a key is kept while
`k > q - window`, `k` and `q` slot indices). GenAI's NPU pipeline (NPUW) runs the graph on a static cache whose slots
are not the tokens' positions and rewrites a mask of that form for it (`SlidingWindowMask`); on Starcoder2's graph
the rewrite fails, "Argument shapes are inconsistent" at the `BitwiseAnd` it adds (the past length it slices the
padding mask with is bound to the prompt's length), for optimum-intel's artifact and this package's alike, tiny
and at starcoder2-3b's widths (docs/npu-real-width.md).

What the fix does: the model's mask is the causal and padding mask (`create_causal_mask`, as for a model without a
window) with the window counted along it (`_counted_window.counted_window`): the same mask where every slot holds a
token and for left-padded rows, and the tokens' own window in NPUW's static cache, where the rewrite, finding no
slot-index window, leaves it as it is. One mask for every layer, as before. Validated against PyTorch at export like
every export.
"""

from __future__ import annotations

MODEL_TYPES = ("starcoder2",)
TRANSFORMERS = ">=5.5"  # written and tested under 5.5 (masking_utils' create_causal_mask, the model's mask_function)
SUMMARY = ("optimum-intel's Starcoder2 export with the sliding window counted along the attention mask (the same "
           "mask), so GenAI's NPU pipeline, whose static cache slots are not the tokens' positions, runs it")


def _counted_window_mask(config, inputs_embeds, attention_mask, cache_position=None, *, past_key_values,
                         position_ids=None, **kwargs):
    """`create_sliding_window_causal_mask`'s mask, its window counted along the mask instead of the slots."""
    from transformers import masking_utils

    from ._counted_window import counted_window

    mask = masking_utils.create_causal_mask(config, inputs_embeds, attention_mask, cache_position,
                                            past_key_values=past_key_values, position_ids=position_ids, **kwargs)
    if mask is None or not hasattr(mask, "dim") or mask.dim() != 4:  # nothing to count along: transformers' own
        return masking_utils.create_sliding_window_causal_mask(
            config, inputs_embeds, attention_mask, cache_position, past_key_values=past_key_values,
            position_ids=position_ids, **kwargs)
    return counted_window(mask, config.sliding_window)


def export_config(base: type) -> type:
    """optimum-intel's Starcoder2 export config `base`, the model's sliding-window mask counted along the mask."""
    patcher_base = base._MODEL_PATCHER

    class CountedWindowPatcher(patcher_base):
        """optimum-intel's Starcoder2 patcher, and the model's sliding-window mask counted along the mask."""

        def __enter__(self):
            from transformers.models.starcoder2 import modeling_starcoder2

            super().__enter__()
            self._window_before = modeling_starcoder2.create_sliding_window_causal_mask
            modeling_starcoder2.create_sliding_window_causal_mask = _counted_window_mask
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            from transformers.models.starcoder2 import modeling_starcoder2

            modeling_starcoder2.create_sliding_window_causal_mask = self._window_before
            super().__exit__(exc_type, exc_value, traceback)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with the sliding-window mask counted along the attention mask.",
        "_MODEL_PATCHER": CountedWindowPatcher,
    })
