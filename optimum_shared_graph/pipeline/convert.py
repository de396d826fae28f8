"""Stage 3, convert: optimum-intel's own export into a staging directory beside the output.

optimum-intel converts the model (the CLI runs its own command, so every flag keeps its meaning);
the staging directory lives in the output's parent, on the same disk, so the finished artifact is moved
into place by renames. A failure of that disk is one `ArtifactWriteError` line.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from .. import host, progress
from ..errors import ArtifactWriteError, SharedGraphError
from ..graph.precision import keep_vectors_exact


# Below this many free bytes after a failed write, the disk is taken to be what failed it.
_NEARLY_FULL = 64 * 2**20


@contextlib.contextmanager
def disk_errors_reported(where: Path):
    """Turn a failure of the disk holding `where` into one `ArtifactWriteError` line.

    OpenVINO's writer fails with `RuntimeError("basic_ios::clear: iostream error")`, Python's with
    `OSError`; any other error, and any error while the disk is fine, goes through unchanged.
    """
    try:
        yield
    except (OSError, RuntimeError) as err:
        problem = None if isinstance(err, SharedGraphError) else disk_problem(where, err)
        if problem is None:
            raise
        raise write_error(where, err, problem) from err


def _free_bytes(where: Path) -> int | None:
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def disk_problem(where: Path, err: BaseException) -> str | None:
    """"full" or "denied" when `err` (from any library) comes from the disk holding `where`, else None.

    Checked before the staging directory is removed: a write that filled the disk leaves it nearly full.
    """
    code = getattr(err, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "full"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "denied"
    free = _free_bytes(where)
    return "full" if free is not None and free < _NEARLY_FULL else None


def write_error(where: Path, err: BaseException, problem: str | None) -> ArtifactWriteError:
    """One line for an artifact that cannot be written into `where` (`problem` from `_disk_problem`)."""
    if problem == "full":
        return ArtifactWriteError(
            f"no space left on the disk holding {where} ({(_free_bytes(where) or 0) / 2**20:,.0f} MB free) while "
            "writing the artifact: free some space or choose an output directory on another disk (nothing was written)"
        )
    reason = getattr(err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[0]
    return ArtifactWriteError(
        f"cannot write the artifact into {where}: {reason}; choose an output directory you can write to "
        "(nothing was written)"
    )


def no_dynamic_graph(static):
    """A static export needs optimum-intel's configs, tokenizer and rt_info, not its dynamic graph.

    Unless it calibrates: `quantize_static_graph` loads optimum-intel's (stateless) export as an
    `OVModelForCausalLM` for its quantization entry point, which needs the dynamic graph.
    """
    if static is None or static.calibrating:
        return contextlib.nullcontext()
    return host.dynamic_graph_skipped()




@contextlib.contextmanager
def staging(output: Path):
    """A staging directory beside `output` (same disk), removed afterwards whatever happens.

    It is named `.OUT.<random>.partial` and holds an exclusive lock while the export lives. Staging
    directories of `OUT` whose lock is free belong to exports that died (killed, out of memory) and
    are removed first; a live export's is never touched.
    """
    import fcntl
    import tempfile

    starting = lock = None
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_staging(output)
        # locked before it takes the name other exports' clean-up looks for
        starting = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".starting", dir=output.parent))
        lock = open(starting / ".lock", "w")
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        directory = starting.with_suffix(".partial")
        os.rename(starting, directory)
    except OSError as err:
        if lock is not None:
            lock.close()
        if starting is not None:
            shutil.rmtree(starting, ignore_errors=True)  # no litter when the lock or the rename failed
        raise write_error(output.parent, err, disk_problem(output.parent, err)) from err
    try:
        with disk_errors_reported(output.parent):
            yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        lock.close()


def remove_dead_staging(output: Path) -> list[Path]:
    """Remove the staging directories of exports into `output` that are no longer running; return them."""
    import fcntl

    removed = []
    for candidate in output.parent.glob(f".{output.name}.*.partial"):
        if not candidate.is_dir():
            continue
        try:
            with open(candidate / ".lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while the export that made it lives
                shutil.rmtree(candidate, ignore_errors=True)
                removed.append(candidate)
        except OSError:
            continue
    return removed


class ConvertAgain(Exception):
    """Stops optimum-intel's export: the capture beside it found that the model gets optimum-intel's own
    partitioning (`reason`), so it is converted again as a fallback."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class InnerModelExport(Exception):
    """Stops optimum-intel's export of a wrapper: the inner causal LM saved in `directory` is exported instead."""

    def __init__(self, directory: Path):
        super().__init__(str(directory))
        self.directory = directory


@contextlib.contextmanager
def one_model_load(on_model, *, load_error, before_save=None, load_kwargs=None, on_load=None):
    """While active, the model optimum-intel's export loads goes to `on_model(model, convert, output)` first.

    `output` is the directory optimum-intel writes into (with a quantization flag, its command exports into a
    temporary directory and moves it into place afterwards); `convert()` runs optimum-intel's conversion of that model (its `export_from_model`, with every flag's
    meaning); `on_model` returns what it returns, after the decomposition (and, for a static export,
    the static trace) ran on the same model. So one PyTorch model serves the capture, the conversion and
    the validation reference, in the dtype optimum-intel picks. A failure of optimum-intel's loader is
    `load_error(err)`. `before_save(ov_model)` transforms each graph optimum-intel is about to save (the logits
    slice), so it writes the final graph once. `load_kwargs` go to the loader's `from_pretrained` (a multimodal
    checkpoint's weight renaming, `multimodal.py`); `on_load(args, kwargs)` is told the load's arguments before it
runs (the capture beside the conversion, `capture_beside.py`). The patches of optimum-intel are host/'s
    (`models_handed_over`, `graphs_before_save`, `model_loads_wrapped`).
    """

    def save_hook(model, ov_config):
        progress.step("graph edits")
        if before_save is not None:
            before_save(model)
        if getattr(ov_config, "dtype", None) == "fp16":  # what makes optimum-intel save with compress_to_fp16
            keep_vectors_exact(model)
        progress.step("save (optimum-intel)")

    with host.models_handed_over(on_model), host.graphs_before_save(save_hook), \
            host.model_loads_wrapped(load_error, load_kwargs, on_load):
        yield


def convert(raw_export, source: str, raw: Path, *, task: str, exported_type: str, validating: bool,
            fallback_reason: str | None, hooks, static):
    """Run optimum-intel's export of `source` into `raw`; return `(lifted cap or None, applied fix or None)`.

    An architecture fix of `architectures/` replaces optimum-intel's export config for the duration of
    the export where one applies to `exported_type` under the installed transformers. `hooks` (the model
    hand-over and the both-stage calibration) are active during the export; a static export without
    calibration skips optimum-intel's dynamic graph, which the static one replaces. Any
    failure of optimum-intel's is one `ModelNotSupportedError` line (a full disk: `ArtifactWriteError`).
    `InnerModelExport` and `ConvertAgain` go through: the caller exports the inner model, or converts again.
    """
    from ..architectures import fix_applied
    from ..errors import ModelNotSupportedError
    from ..tasks import BASE_TASK
    from .version_cap import lifted_cap

    lifted = fix = None
    try:
        # a large weight compressed a slice at a time, its values file-backed (NNCF's own way holds twice its
        # float32 size), the files in the staging directory
        with host.weights_compressed_in_slices(raw.parent):
            if task == BASE_TASK:
                # past optimum-intel's transformers cap only when validation will guard the graph
                # (a fallback is not validated: no captured calls to check it against)
                with fix_applied(exported_type, scratch=raw.parent) as fix, lifted_cap(
                        exported_type, BASE_TASK, validating=validating, fallback_reason=fallback_reason) as lifted:
                    with hooks, no_dynamic_graph(static):
                        raw_export(source, raw)
            else:  # optimum-intel's own partitioning for a vision-language model
                with hooks:
                    raw_export(source, raw, task=task)
    except (SharedGraphError, InnerModelExport, ConvertAgain):
        raise
    except (Exception, SystemExit) as err:  # optimum-intel reports with ValueError, RuntimeError, ...
        problem = disk_problem(raw.parent.parent, err)
        if problem is not None:  # a full disk, not the model: say so
            raise write_error(raw.parent.parent, err, problem) from err
        from ..tasks import TASK

        refusal = group_size_refusal(err, exported_type)
        if refusal is not None:  # a flag the user can change, not the model: say which and how
            raise refusal from err
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        with_fix = f", with {fix.module}" if fix is not None else ""
        raise ModelNotSupportedError(
            f"optimum-intel could not export {exported_type} for {TASK} (its {task} export{with_fix}): {first}") from err
    return lifted, fix


def group_size_refusal(err: BaseException, exported_type: str):
    """The one-line `InvalidOptionsError` for NNCF's refusal of a group size (`group_size_problem`), else None.
    Raised by the dynamic export (optimum-intel's `_main_quantize`) and the static one (`finish_static_graph`)."""
    from ..errors import InvalidOptionsError
    from ..tasks import TASK

    problem = group_size_problem(err)
    if problem is None:
        return None
    return InvalidOptionsError(f"{TASK} cannot quantize {exported_type}: {problem} (nothing was written)")


def group_size_problem(err: BaseException) -> str | None:
    """What to say when NNCF refused a group size that does not divide some matmuls' input width (its
    `InvalidGroupSizeError`, anywhere in `err`'s chain), else None."""
    import math
    import re

    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if type(err).__name__ == "InvalidGroupSizeError":
            break
        err = err.__cause__ or err.__context__
    else:
        return None
    text = str(err)
    asked = re.search(r"group size value (\d+)", text)
    widths = sorted({int(w) for w in re.findall(r"channel size: (\d+)", text)})
    if asked is None or not widths:
        return None
    group = int(asked.group(1))
    common = math.gcd(*widths)
    divides = next((g for g in (group // 2 ** k for k in range(1, 8)) if g >= 8 and common % g == 0), None)
    instead = f", or a group size that divides {'them' if len(widths) > 1 else 'it'} (--group-size {divides})" if divides else ""
    nodes = len(re.findall(r"channel size: \d+", text))
    width = f"input width{'s' if len(widths) > 1 else ''} {', '.join(map(str, widths))}"
    return (f"group size {group} does not divide the {width} of {nodes} of its matmuls; pass "
            f"--group-size-fallback adjust (NNCF then picks a group size that divides each such width){instead}")


def return_freed_memory() -> None:
    """Collect garbage and hand the allocator's free pages back to the system (glibc's `malloc_trim`), so
    the memory the freed PyTorch model held is not counted again when the graph is compiled."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
