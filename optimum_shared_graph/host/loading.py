"""transformers' model loading: the weights a model class's load does not report as unexpected."""

from __future__ import annotations

import contextlib
from typing import Iterator

from ._swap import replaced


@contextlib.contextmanager
def unexpected_keys_ignored(model_class: type, patterns: list[str]) -> Iterator[None]:
    """While active, transformers' load of `model_class` does not list checkpoint weights matching `patterns`
    (regular expressions) as unexpected: they are added to the class's `_keys_to_ignore_on_load_unexpected`,
    which is back as it was on exit (the class's own value, or the inherited one)."""
    current = list(getattr(model_class, "_keys_to_ignore_on_load_unexpected", None) or [])
    with replaced(model_class, "_keys_to_ignore_on_load_unexpected", current + list(patterns)):
        yield
