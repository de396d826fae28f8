"""Fixes for model types optimum-intel's own export configs cannot convert under the installed transformers.

optimum-intel converts each model type through an export config registered in its `TasksManager`, and
the config's model patcher rewrites the PyTorch model for tracing (cache classes, recurrent cells, MoE
blocks). A patcher written against one transformers release breaks on a newer one: a cache class
renamed, an attribute removed, a forward() signature changed. Each module of this package repairs one
architecture family for the transformers versions it names, the way optimum-intel itself does it: a
subclass of optimum-intel's export config whose patcher works under those versions.

A fix module defines:

- `MODEL_TYPES`: the transformers model types it repairs;
- `TRANSFORMERS`: the transformers versions it is written for (a version specifier), outside which
  optimum-intel's own config is used unchanged;
- `SUMMARY`: one line, what it changes (recorded in the manifest);
- `export_config(base)`: a subclass of optimum-intel's export config class `base` (or `base` itself, for a
  module whose change is to the converted graph alone);
- optionally `edit_graph(ov_model)`: an edit of the converted graph, applied before optimum-intel saves it
  (`edit_graph(model_type, ov_model)`, from the export's `before_save`), returning how many places it changed.

A module that also repairs the `image-text-to-text` export of the whole vision-language model (for
`--task image-text-to-text-shared`, `pipeline/vlm.py`) defines `VLM_MODEL_TYPES`, `VLM_SUMMARY` and
`vlm_export_config(base)`; one that repairs only that export has an empty `MODEL_TYPES` (and no `export_config`).
`vlm_fix_applied(model_type)` swaps it in for one such export. What that task's validation needs to know of each
vision-language family, fixed or not (its validation image and prompt, its language model's inputs, how its vision
graphs run), is `_vlm_families.py`, with the types the task exports (`supported_vlm_types()`).

`fix_applied(model_type)` points optimum-intel's `TasksManager` entry for the model type at the fixed
config for the duration of one `text-generation-shared` export, and puts the original back afterwards,
so optimum-intel's own tasks in the same process are untouched (the swap is host/'s
`export_configs_replaced`, with every other patch of optimum-intel; the fixed configs are this package's). Every export is validated against
PyTorch, so a fix that does not reproduce the model is refused like any other graph.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass
from typing import Iterator

from ..host import export_configs_replaced, openvino_entries
from ..tasks import VLM_TASK


def fix_modules() -> list[str]:
    """The fix modules of this package (one per architecture family), by name."""
    import pkgutil

    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


# optimum-intel's tasks a fix replaces the config of (the stateful export and its stateless form).
_TASKS = ("text-generation-with-past", "text-generation")


@dataclass(frozen=True)
class Fix:
    """One architecture fix: what the manifest records when it was applied."""

    module: str
    model_type: str
    summary: str
    transformers: str

    def record(self) -> dict[str, str]:
        return {"fix": self.module, "model_type": self.model_type, "summary": self.summary,
                "transformers": self.transformers}


def _load(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def fix_module(model_type: str, transformers_version: str | None = None):
    """The fix module for `model_type` under `transformers_version` (default: the installed one), or None."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if transformers_version is None:
        import transformers

        transformers_version = transformers.__version__
    version = Version(Version(transformers_version).base_version)
    for name in fix_modules():
        module = _load(name)
        if model_type in module.MODEL_TYPES and version in SpecifierSet(module.TRANSFORMERS):
            return module
    return None


def edit_graph(model_type: str, ov_model) -> int:
    """The converted graph of `model_type` edited in place by its fix module's `edit_graph` (under the installed
    transformers), if it has one; how many places it changed (0: no such edit)."""
    module = fix_module(model_type)
    edit = getattr(module, "edit_graph", None)
    return edit(ov_model) if edit is not None else 0


def fixed_model_types() -> set[str]:
    """Every model type a fix module repairs (whatever the installed transformers)."""
    return {t for name in fix_modules() for t in _load(name).MODEL_TYPES}


# optimum-intel's TasksManager entries (task -> constructor) for a model type's OpenVINO export (host/)
_entries = openvino_entries


@contextlib.contextmanager
def fix_applied(model_type: str, scratch=None) -> Iterator[Fix | None]:
    """While active, optimum-intel exports `model_type` with its fix; yield the `Fix` (None: no fix applies).

    The fixed config class replaces optimum-intel's in its `TasksManager` for the text-generation
    tasks only, and the original entries are restored on exit, whatever happens inside. A fix module's
    `while_exporting(model_type, scratch)`, where it has one, is active too (the model's load included): `scratch`
    is a directory of the export's own for files the fix needs while it converts.
    """
    module = fix_module(model_type)
    if module is None:
        yield None
        return
    with _swapped_in(module, model_type, _TASKS, module.export_config, scratch) as swapped:
        yield (Fix(f"{__name__}.{module.__name__.rsplit('.', 1)[-1]}", model_type, module.SUMMARY, module.TRANSFORMERS)
               if swapped else None)


@contextlib.contextmanager
def _swapped_in(module, model_type: str, tasks, export_config, scratch) -> Iterator[bool]:
    """While active, `export_config` stands in for optimum-intel's config of `model_type` for `tasks` (host/'s
    `export_configs_replaced`), and the fix `module`'s `while_exporting(model_type, scratch)`, where it has one, is
    active; yields whether optimum-intel had an entry to replace (nothing else is active when it had none)."""
    with export_configs_replaced(model_type, tasks, export_config) as originals:
        if not originals:
            yield False
            return
        during = getattr(module, "while_exporting", None)
        with during(model_type, scratch) if during is not None else contextlib.nullcontext():
            yield True


def vlm_fix_module(model_type: str, transformers_version: str | None = None):
    """The fix module whose `vlm_export_config` repairs `model_type`'s image-text-to-text export under
    `transformers_version` (default: the installed one), or None."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if transformers_version is None:
        import transformers

        transformers_version = transformers.__version__
    version = Version(Version(transformers_version).base_version)
    for name in fix_modules():
        module = _load(name)
        if model_type in getattr(module, "VLM_MODEL_TYPES", ()) and version in SpecifierSet(module.TRANSFORMERS):
            return module
    return None


@contextlib.contextmanager
def vlm_fix_applied(model_type: str, scratch=None) -> Iterator[Fix | None]:
    """While active, optimum-intel's `image-text-to-text` export of `model_type` uses the fixed config; yields the
    manifest's record of the fix (None: none applies). The swap is host/'s `export_configs_replaced`, which puts
    the original entry back on exit; the fix module's `while_exporting(model_type, scratch)`, where it has one, is
    active too, as in `fix_applied`."""
    module = vlm_fix_module(model_type)
    if module is None:
        yield None
        return
    with _swapped_in(module, model_type, (VLM_TASK,), module.vlm_export_config, scratch) as swapped:
        yield Fix(module.__name__, model_type, module.VLM_SUMMARY, module.TRANSFORMERS) if swapped else None


def supported_vlm_types() -> list[str]:
    """The model types `--task image-text-to-text-shared` exports (`_vlm_families.FAMILIES`)."""
    from ._vlm_families import FAMILIES

    return sorted(FAMILIES)


def experts_graph(model_type: str | None) -> bool:
    """Whether `model_type`'s graph holds mixture-of-experts blocks in the form `graph/experts.py` finds (its
    experts stacked per projection, summed over the experts axis), so validation cuts it inside its layers and
    inside every MatMul's rows: the stored-experts families (`moe_experts.FAMILIES`) and GraniteMoE's."""
    from . import granitemoe, moe_experts

    return model_type in moe_experts.FAMILIES or model_type in granitemoe.MODEL_TYPES
