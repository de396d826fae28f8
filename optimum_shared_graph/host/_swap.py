"""The one way host/ replaces an attribute of a library: for a while, then put back exactly as it was."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

_MISSING = object()


@contextlib.contextmanager
def replaced(owner: Any, name: str, value: Any) -> Iterator[Any]:
    """`owner.name` is `value` while active; yield what `owner` held under `name` itself (its `__dict__` entry,
    so a staticmethod stays one), or None when it only inherited it. On exit the entry is restored, or removed
    if `owner` had none of its own, whatever happens inside."""
    saved = vars(owner).get(name, _MISSING)
    setattr(owner, name, value)
    try:
        yield None if saved is _MISSING else saved
    finally:
        if saved is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, saved)
