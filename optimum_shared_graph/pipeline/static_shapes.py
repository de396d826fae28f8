"""Stage 1's check of the static options (`--shape-mode static`): the static shapes resolved against the model's
config before any export work (the KV capacity's default, the query length within it)."""

from __future__ import annotations

from ..errors import InvalidOptionsError
from ..graph.static import StaticShapes
from ..options import DEFAULT_MAX_CACHE_CAP, ExportOptions

_MAX_POSITION_ATTRS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def max_positions(config) -> int | None:
    """The model's maximum number of positions, from whichever attribute its config uses."""
    text_config = getattr(config, "text_config", None) or config
    for attr in _MAX_POSITION_ATTRS:
        value = getattr(text_config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def resolve_static_shapes(config, opts: ExportOptions) -> StaticShapes:
    """Check the static options against the model's config and fill in the default capacity.

    Raises:
        InvalidOptionsError: capacity above the model's max positions, or C above the capacity.
    """
    limit = max_positions(config)
    capacity = opts.max_cache_len
    if capacity is None:
        capacity = min(limit, DEFAULT_MAX_CACHE_CAP) if limit else DEFAULT_MAX_CACHE_CAP
    elif limit is not None and capacity > limit:
        raise InvalidOptionsError(
            f"--max-cache-len {capacity} exceeds the model's maximum of {limit} positions: "
            f"use --max-cache-len {limit} or less"
        )
    if opts.static_query_len > capacity:
        raise InvalidOptionsError(
            f"--static-query-len ({opts.static_query_len}) cannot exceed the KV capacity ({capacity}): "
            "lower the query length or raise --max-cache-len"
        )
    return StaticShapes(batch_size=opts.static_batch_size, query_len=opts.static_query_len, cache_len=capacity)
