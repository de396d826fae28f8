"""transformers' attention and mask function registries, and optimum-intel's Gemma 2 model patcher, as the
static trace (`pipeline/static.py`) needs them, for the duration of that trace."""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


@contextlib.contextmanager
def _registered(interface, keys: tuple[str, ...], wrap: Callable) -> Iterator[None]:
    saved = {key: interface[key] for key in keys}
    for key, inner in saved.items():
        interface.register(key, wrap(inner))
    try:
        yield
    finally:
        for key, inner in saved.items():
            interface.register(key, inner)


def mask_functions_wrapped(keys: tuple[str, ...], wrap: Callable) -> contextlib.AbstractContextManager:
    """While active, transformers' mask functions `keys` (`ALL_MASK_ATTENTION_FUNCTIONS`, process-wide) are
    `wrap(function)`; the functions are registered again on exit."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return _registered(ALL_MASK_ATTENTION_FUNCTIONS, keys, wrap)


def attention_functions_wrapped(keys: tuple[str, ...], wrap: Callable) -> contextlib.AbstractContextManager:
    """While active, transformers' attention functions `keys` (`ALL_ATTENTION_FUNCTIONS`, process-wide) are
    `wrap(function)`; the functions are registered again on exit."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return _registered(ALL_ATTENTION_FUNCTIONS, keys, wrap)


@contextlib.contextmanager
def cache_passed_through(patcher) -> Iterator[None]:
    """While active, a transformers `Cache` reaches the model's forward as it is through optimum-intel's Gemma 2
    patcher `patcher` (enter this before the patcher itself); any other patcher is left as it is.

    `Gemma2ModelPatcher` (the patcher of optimum-intel's Gemma 2, Gemma 3 text and Gemma 3n text configs) wraps
    whatever `past_key_values` its `patched_forward` gets in a new `DynamicCache`, which takes legacy `(key,
    value)` tuples. With a `Cache`, its forward here calls the model's own (`patcher.orig_forward`) with
    optimum-intel's argument overrides (`override_arguments(args, kwargs, signature, model_kwargs=)`); legacy
    tuples still take optimum-intel's path.
    """
    from optimum.exporters.openvino.model_patcher import Gemma2ModelPatcher

    if not isinstance(patcher, Gemma2ModelPatcher):
        yield
        return
    import functools
    import inspect

    from optimum.exporters.openvino.patching_utils import override_arguments
    from transformers.cache_utils import Cache

    legacy_forward, model_forward = patcher.patched_forward, patcher.orig_forward
    signature = inspect.signature(model_forward)

    @functools.wraps(model_forward)
    def patched_forward(*args, **kwargs):
        if isinstance(signature.bind_partial(*args, **kwargs).arguments.get("past_key_values"), Cache):
            args, kwargs = override_arguments(args, kwargs, signature, model_kwargs=patcher.model_kwargs)
            return model_forward(*args, **kwargs)
        return legacy_forward(*args, **kwargs)

    patcher.patched_forward = patched_forward
    try:
        yield
    finally:
        patcher.patched_forward = legacy_forward
