"""The task in Optimum's `TasksManager`: `text-generation-shared` for every model type optimum-intel
exports as `text-generation-with-past`, registered as soon as optimum-intel's OpenVINO exporter is imported.

`call_after_import` is what lets `optimum-cli --help` stay cheap: the task is registered when the
exporter (and with it torch) is imported for an export, not when the CLI starts.
"""

from __future__ import annotations

import importlib
import sys
import threading

from .host import task_registered
from .tasks import BASE_TASK, TASK, VLM_SHARED_TASK, VLM_TASK

_EXPORTER_MODULE = "optimum.exporters.openvino"

_lock = threading.RLock()
_tasks_registered: list[str] | None = None


class _AfterImport:
    """A meta path finder that runs `callback(module)` right after `fullname` finishes importing."""

    def __init__(self, fullname: str, callback):
        self.fullname = fullname
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_call(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call
        return spec


def call_after_import(fullname: str, callback) -> None:
    """Call `callback(module)` once `fullname` is imported (now, if it already is). Idempotent per pair."""
    module = sys.modules.get(fullname)
    spec = getattr(module, "__spec__", None)
    if module is not None and spec is not None and not getattr(spec, "_initializing", False):
        callback(module)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.fullname == fullname and finder.callback is callback:
            return
    sys.meta_path.insert(0, _AfterImport(fullname, callback))


def register_tasks_on_import() -> None:
    """Register the task once optimum-intel's OpenVINO exporter is imported (now, if it is). Cheap."""
    call_after_import(_EXPORTER_MODULE, _register_tasks_hook)


def register_tasks() -> list[str]:
    """Register the task for every model type optimum-intel exports as `text-generation-with-past`.

    The list is read from optimum-intel's own `TasksManager` at run time, so a model type that
    optimum-intel adds is covered without a change here. Returns the model types, sorted.
    """
    global _tasks_registered
    with _lock:
        if _tasks_registered is not None:
            return list(_tasks_registered)
        importlib.import_module(_EXPORTER_MODULE)
        _tasks_registered = sorted(task_registered(TASK, BASE_TASK))  # host/: TasksManager, for the process
        # image-text-to-text-shared beside optimum-intel's image-text-to-text, loaded as it loads them (the export
        # refuses, at stage 1, the types it cannot do yet)
        task_registered(VLM_SHARED_TASK, VLM_TASK, generic=VLM_TASK, loader=None)
        return list(_tasks_registered)


def supported_model_types() -> list[str]:
    """The model types `--task text-generation-shared` accepts (those optimum-intel exports with past)."""
    return register_tasks()


def _register_tasks_hook(module) -> None:
    register_tasks()
