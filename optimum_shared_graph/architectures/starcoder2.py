"""Starcoder2: the sliding window compares positions counted along the attention mask, in transformers' own form.

What broke: GenAI's NPU pipeline (NPUW) ran neither optimum-intel's artifact nor this package's ("RuntimeError:
Argument shapes are inconsistent." at compile, tiny with 6 layers and at starcoder2-3b's widths). NPUW rewrites
transformers' sliding-window mask for its static cache (`SlidingWindowMask`), and the padding column its rewrite ANDs
in (`attention_mask[past:past + new]`) fails to compile under its default folding (it compiles with `NPUW_FOLD=NO`
or `NPUW_ONLINE_PIPELINE=NONE`; the rewrite's other steps, written into the graph beforehand, compile with folding).
A window counted along the mask in a form of its own (`_counted_window.py`) ran through NPUW, but GenAI's default
CPU backend (OpenVINO's PagedAttention rewrite) recognises only transformers' chain and dropped it.

What the fix does: optimum-intel's own export config (the same PyTorch graph and mask), then, before the graph is
saved, `graph/sliding_window.counted_window`: the window's `Greater(key, query - window)` compares positions
counted along `attention_mask` instead of slot indices, in transformers' chain of `BitwiseAnd`s with its window
constant. Where slots are positions (PyTorch, OpenVINO's dynamic graph, a left-padded batch) it is the same mask;
in NPUW's static cache the window is the tokens' own, and NPUW's rewrite no longer matches; OpenVINO's
PagedAttention rewrite still finds the chain and takes the window from it. Validated against PyTorch at export like
every export.
"""

from __future__ import annotations

MODEL_TYPES = ("starcoder2",)
TRANSFORMERS = ">=5.5"  # written and tested under 5.5 (the mask transformers' create_sliding_window_causal_mask traces)
SUMMARY = ("optimum-intel's Starcoder2 export with the sliding window comparing positions counted along the attention "
           "mask (the same mask) in transformers' own form, so GenAI's NPU pipeline runs it and its PagedAttention "
           "backend keeps the window")


def export_config(base: type) -> type:
    """optimum-intel's own config, unchanged (a subclass, so the swap and the manifest see the fix): the change is
    to the converted graph (`edit_graph`)."""
    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__}; the converted graph's sliding window edited by architectures/starcoder2.py."})


def edit_graph(ov_model) -> int:
    """The graph edit before save (`graph/sliding_window.counted_window`); how many window comparisons it changed."""
    from ..graph.sliding_window import counted_window

    return counted_window(ov_model)
