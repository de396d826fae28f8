"""Optimum's `TasksManager`: the task registered for the process, a model type's OpenVINO export configs
replaced for one export, and its model loader wrapped for one export."""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

from ._swap import replaced


def task_registered(task: str, like: str, *, generic: str = "text-generation",
                    loader: str | None = "AutoModelForCausalLM") -> list[str]:
    """Register `task` for the rest of the process for every model type optimum-intel exports as `like`, with
    `like`'s export config; return those model types (in `TasksManager`'s order). Its model loader is `loader`
    (None: `generic`'s) and its model class mappings are `generic`'s, in Optimum and in optimum-intel's
    `_HEAD_TO_AUTOMODELS`. Entries already there are kept (`setdefault`), so a second call changes nothing."""
    from optimum.exporters.tasks import TasksManager

    loaders = TasksManager._TRANSFORMERS_TASKS_TO_MODEL_LOADERS
    loader = loader if loader is not None else loaders.get(generic)
    if loader is not None:
        loaders.setdefault(task, loader)
    mappings = getattr(TasksManager, "_TRANSFORMERS_TASKS_TO_MODEL_MAPPINGS", None)
    if isinstance(mappings, dict) and generic in mappings:
        mappings.setdefault(task, mappings[generic])
    model_types = []
    for model_type, exporters in TasksManager._SUPPORTED_MODEL_TYPE.items():
        tasks = exporters.get("openvino") if isinstance(exporters, dict) else None
        if tasks and like in tasks:
            tasks.setdefault(task, tasks[like])
            model_types.append(model_type)
    try:
        from optimum.intel.openvino import utils as ov_utils

        ov_utils._HEAD_TO_AUTOMODELS.setdefault(task, ov_utils._HEAD_TO_AUTOMODELS[generic])
    except (ImportError, KeyError, AttributeError):
        pass
    return model_types


def openvino_entries(model_type: str) -> dict:
    """optimum-intel's `TasksManager` entries (task -> config constructor) for `model_type`'s OpenVINO export:
    the table itself, so a change to it changes what optimum-intel exports with."""
    from optimum.exporters.tasks import TasksManager
    import optimum.exporters.openvino.model_configs  # noqa: F401  (registers optimum-intel's configs)

    name = model_type.replace("_", "-")
    table = TasksManager._SUPPORTED_MODEL_TYPE
    found = table.get(name) or table.get(model_type) or {}
    return found.get("openvino", {})


@contextlib.contextmanager
def export_configs_replaced(model_type: str, tasks: tuple[str, ...], make: Callable[[type], type]) -> Iterator[dict]:
    """While active, `TasksManager` builds `model_type`'s OpenVINO export config for `tasks` from `make(base)`
    instead of optimum-intel's class `base` (one subclass per base class, the constructor's bound arguments
    kept); yield the original entries replaced (empty: the model type has none of `tasks`). They are put back
    on exit, whatever happens inside."""
    entries = openvino_entries(model_type)
    originals = {task: entries[task] for task in tasks if task in entries}
    if not originals:
        yield {}
        return
    made: dict[type, type] = {}
    for task, constructor in originals.items():
        base = getattr(constructor, "func", constructor)
        if base not in made:
            made[base] = make(base)
        cls = made[base]
        entries[task] = (functools.partial(cls, *constructor.args, **constructor.keywords)
                         if isinstance(constructor, functools.partial) else cls)
    try:
        yield dict(originals)
    finally:
        entries.update(originals)


@contextlib.contextmanager
def model_loads_wrapped(load_error: Callable[[BaseException], BaseException], load_kwargs: dict | None = None,
                        on_load: Callable[[tuple, dict], None] | None = None):
    """While active, optimum-intel's model load (`TasksManager.get_model_from_task`, a staticmethod) passes
    `load_kwargs` on to `from_pretrained`, and any failure of it is raised as `load_error(err)`. `on_load(args,
    kwargs)` is told each load's arguments (`load_kwargs` included) before it runs."""
    from optimum.exporters.tasks import TasksManager

    original = TasksManager.__dict__["get_model_from_task"]

    def get_model_from_task(*args, **kwargs):
        kwargs = {**kwargs, **(load_kwargs or {})}
        if on_load is not None:
            on_load(args, kwargs)
        try:
            return original.__func__(*args, **kwargs)
        except Exception as err:
            raise load_error(err) from err

    with replaced(TasksManager, "get_model_from_task", staticmethod(get_model_from_task)):
        yield
