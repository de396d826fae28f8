"""Progress of the export on stderr, with tqdm: shown on a terminal, silent with `quiet` or off one.

`export_progress()` wraps one export: a coarse bar of its stages (`stage()` moves it on) and the
switch for the step bars that `bar()` returns to the long loops (generate() capture, validation,
calibration). Outside an export, or when progress is off, `bar()` returns tqdm's disabled bar,
which takes the same calls and shows nothing.

`step()` marks where each finer step of the export starts (the model load, the capture, optimum-intel's conversion
and save, each validation part's compile and run, the hashing, ...); `recording_steps()` collects the marks for a
benchmark (`benchmarks/export_stages.py`). Outside a recording a mark costs nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from typing import Any, Iterable, Iterator

from .tasks import TASK

_STAGE_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]"


class _Export:
    def __init__(self, shown: bool, stages: list[str]):
        from tqdm import tqdm

        self.shown = shown
        self.stages = stages
        self.bar = tqdm(total=len(stages), desc=TASK, unit="stage", file=sys.stderr, leave=False,
                        dynamic_ncols=True, bar_format=_STAGE_FORMAT, disable=not shown)

    def stage(self, name: str) -> None:
        done = self.stages.index(name) if name in self.stages else self.bar.n
        self.bar.update(max(0, done - self.bar.n))
        self.bar.set_postfix_str(name)


_current: contextvars.ContextVar[_Export | None] = contextvars.ContextVar("optimum_shared_graph_progress", default=None)


def on_terminal() -> bool:
    """Whether stderr is a terminal (a stream without `isatty`, or a closed one, is not)."""
    try:
        return bool(sys.stderr is not None and sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def export_progress(stages: list[str], *, quiet: bool = False) -> Iterator[None]:
    """Show the progress of one export: on stderr, only if it is a terminal and `quiet` is off.

    With `quiet`, transformers', huggingface_hub's and NNCF's own progress bars (weights loading,
    downloads, calibration statistics) are off as well for the export's duration, then restored.
    """
    export = _Export(not quiet and on_terminal(), stages)
    token = _current.set(export)
    try:
        with _libraries_quiet(quiet):
            yield
    finally:
        _current.reset(token)
        export.bar.close()


def stage(name: str) -> None:
    """Enter stage `name` of the current export (a no-op outside one)."""
    export = _current.get()
    if export is not None:
        export.stage(name)


_steps: contextvars.ContextVar[list | None] = contextvars.ContextVar("optimum_shared_graph_steps", default=None)


def step(name: str) -> None:
    """Mark that step `name` of the export starts now (the previous one ends), for `recording_steps()`."""
    marks = _steps.get()
    if marks is not None:
        marks.append((time.perf_counter(), name))


@contextlib.contextmanager
def recording_steps() -> Iterator[list[tuple[float, str]]]:
    """Collect the `step()` marks made while active: a list of `(time.perf_counter(), name)`, in order."""
    marks: list[tuple[float, str]] = []
    token = _steps.set(marks)
    try:
        yield marks
    finally:
        _steps.reset(token)


def bar(desc: str, total: int | None = None, *, iterable: Iterable[Any] | None = None, unit: str = "step"):
    """A tqdm bar for a long loop of the current export, disabled unless that export shows progress."""
    from tqdm import tqdm

    export = _current.get()
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True,
                disable=export is None or not export.shown)


@contextlib.contextmanager
def _libraries_quiet(quiet: bool) -> Iterator[None]:
    if not quiet:
        yield
        return
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as hf_logging

    was_enabled, hub_was_disabled = hf_logging.is_progress_bar_enabled(), hub_utils.are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # huggingface_hub's too
    console = _rich_console()  # NNCF's bars (statistics collection, SmoothQuant, AWQ) draw on rich's console
    console_was_quiet = console.quiet if console is not None else None
    if console is not None:
        console.quiet = True
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
        (hub_utils.disable_progress_bars if hub_was_disabled else hub_utils.enable_progress_bars)()
        if console is not None:
            console.quiet = console_was_quiet


def _rich_console():
    """rich's global console, which NNCF's progress bars write to (None without rich)."""
    try:
        import rich
    except ImportError:
        return None
    return rich.get_console()
