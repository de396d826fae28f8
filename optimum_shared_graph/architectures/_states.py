"""What the hybrid fixes share: the holder of a graph's states the 5.5 model sees as its cache, the
patcher skeleton whose forward takes and returns those states, and the recurrent cell a patcher
converts to an OpenVINO loop.

transformers 5.5 removed the per-family hybrid caches optimum-intel's patchers subclass. Each hybrid fix
hands the model a plain holder of the graph's state tensors instead, with the handful of methods the
5.5 model calls on a cache (as optimum-intel's own `GraniteMoeHybridModelPatcher` does under 5.5).
`AttentionStates` is the part every holder shares: the attention layers' keys and values; each family
adds its own states (convolution, SSM, linear-attention) in a subclass.
"""

from __future__ import annotations

from typing import Any


def layers_of(layer_types: list[str], kind: str) -> list[int]:
    """The indices of the layers of `kind` in `layer_types`."""
    return [i for i, layer_kind in enumerate(layer_types) if layer_kind == kind]


class AttentionStates:
    """The attention layers' keys and values as the 5.5 model reaches them through its cache.

    `update()` appends one attention layer's new keys and values (by model layer index, through
    `attention_index`) to `key_cache` / `value_cache` ([batch, heads, seq, dim]); `get_seq_length()` and
    `get_mask_sizes()` size the causal mask; `attention_mask` is the graph's 2-D mask, for the layers
    that zero padding themselves.
    """

    is_compileable = False
    is_sliding = (False,)  # the mask builder takes layer 0's sizes: every attention layer is global

    def __init__(self, attention_layers: list[int], key_cache: list[Any], value_cache: list[Any],
                 attention_mask: Any = None):
        self.key_cache = key_cache
        self.value_cache = value_cache
        self.attention_mask = attention_mask
        self.attention_index = {layer: n for n, layer in enumerate(attention_layers)}

    def update(self, key_states, value_states, layer_idx: int, cache_kwargs: dict | None = None):
        """Append one attention layer's new keys and values; return the whole keys and values."""
        n = self.attention_index[layer_idx]
        self.key_cache[n] = _cat_sequence(self.key_cache[n], key_states)
        self.value_cache[n] = _cat_sequence(self.value_cache[n], value_states)
        return self.key_cache[n], self.value_cache[n]

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        """The number of past tokens (the first attention layer's cached length)."""
        return self.key_cache[0].shape[-2] if self.key_cache else 0

    def get_mask_sizes(self, query_length, layer_idx: int = 0) -> tuple[int, int]:
        """`(kv_length, kv_offset)` for the causal mask: the past and the new tokens, from position 0."""
        if hasattr(query_length, "shape") and len(query_length.shape) > 0:  # a 1-D cache_position (older calls)
            query_length = query_length.shape[0]
        return self.get_seq_length() + query_length, 0

    def has_previous_state(self, layer_idx: int | None = None) -> bool:
        """Always: the graph's state inputs are the previous state (zeros before the first token)."""
        return True

    def present_key_values(self) -> list[Any]:
        """The keys and values after the call, interleaved per attention layer (the graph's output order)."""
        return [tensor for pair in zip(self.key_cache, self.value_cache) for tensor in pair]


def _cat_sequence(past, new):
    """`past` and `new` concatenated along the sequence axis (dim 2 of `[batch, heads, seq, dim]`)."""
    import torch

    return new if past is None else torch.cat([past, new], dim=2)


class StatesForward:
    """The skeleton of a hybrid patcher: a forward over the graph's states stands in for the model's.

    Mixed in before optimum-intel's patcher class (`class P(StatesForward, ModelPatcher)`). A subclass
    defines `_states_forward(input_ids, attention_mask, cache_params, ...)`, which the exporter traces
    (it orders the traced inputs by `orig_forward`'s signature, so this forward stands in for it, as in
    optimum-intel's hybrid patchers), and `patch_modules()` / `restore_modules()` for the layers it
    replaces while the model is traced.
    """

    def __init__(self, config, model, model_kwargs: dict[str, Any] | None = None):
        super().__init__(config, model, model_kwargs)
        self.model_orig_forward = self.orig_forward
        self.patched_forward = self.orig_forward = self._states_forward

    def _logits_only(self, input_ids, attention_mask) -> dict[str, Any]:
        """The call without states (`cache_params=None`: the model run without its cache)."""
        return {"logits": self.model_orig_forward(input_ids=input_ids, attention_mask=attention_mask,
                                                  use_cache=False).logits}

    def patch_modules(self) -> None:
        """Replace the layers the graph needs in its own form (on entering the patcher)."""

    def restore_modules(self) -> None:
        """Undo `patch_modules()` (on leaving the patcher)."""

    def __enter__(self):
        super().__enter__()
        setattr(self._model, self.orig_forward_name, self.patched_forward)
        self.patch_modules()
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        super().__exit__(exc_type, exc_value, traceback)
        setattr(self._model, self.orig_forward_name, self.model_orig_forward)
        self.restore_modules()


def use_recurrent_cell(patcher, cell: type, converter) -> None:
    """Have OpenVINO convert each `cell` module (optimum-intel's recurrent cells) with `converter`, as a loop."""
    from openvino.frontend.pytorch import ConversionExtension, ModuleExtension

    op = f"{cell.__name__}Op"
    patcher.module_extensions = {cell: ModuleExtension(cell, op)}
    patcher.conversion_extensions = [ConversionExtension(op, converter)]
