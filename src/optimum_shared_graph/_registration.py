"""Registration with Optimum: the task in optimum's `TasksManager`, the flags in `optimum-cli`.

`register()` is what the `optimum-cli` hook (`optimum/commands/register/register_shared_graph.py`)
calls. It stays cheap: it patches the `export openvino` command (already imported by
optimum-intel's own hook) and registers the task in `TasksManager` as soon as optimum-intel's
OpenVINO exporter is imported, so `optimum-cli --help` does not pay for importing torch.
"""

from __future__ import annotations

import importlib
import threading

from _optimum_shared_graph_hooks import call_after_import, install_static_guard

TASK = "text-generation-shared"
BASE_TASK = "text-generation-with-past"
_EXPORTER_MODULE = "optimum.exporters.openvino"

_lock = threading.RLock()
_cli_patched = False
_tasks_registered: list[str] | None = None


def register() -> None:
    """Make `--task text-generation-shared` and its flags available in Optimum. Idempotent.

    Example:
        >>> import optimum_shared_graph
        >>> optimum_shared_graph.register()
        >>> optimum_shared_graph.register()  # a second call changes nothing
    """
    with _lock:
        _patch_cli()
        call_after_import(_EXPORTER_MODULE, _register_tasks_hook)
        install_static_guard()


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
        from optimum.exporters.tasks import TasksManager

        TasksManager._TRANSFORMERS_TASKS_TO_MODEL_LOADERS.setdefault(TASK, "AutoModelForCausalLM")
        mappings = getattr(TasksManager, "_TRANSFORMERS_TASKS_TO_MODEL_MAPPINGS", None)
        if isinstance(mappings, dict) and "text-generation" in mappings:
            mappings.setdefault(TASK, mappings["text-generation"])
        model_types = []
        for model_type, exporters in TasksManager._SUPPORTED_MODEL_TYPE.items():
            tasks = exporters.get("openvino") if isinstance(exporters, dict) else None
            if tasks and BASE_TASK in tasks:
                tasks.setdefault(TASK, tasks[BASE_TASK])
                model_types.append(model_type)
        try:
            from optimum.intel.openvino import utils as ov_utils

            ov_utils._HEAD_TO_AUTOMODELS.setdefault(TASK, ov_utils._HEAD_TO_AUTOMODELS["text-generation"])
        except (ImportError, KeyError, AttributeError):
            pass
        _tasks_registered = sorted(model_types)
        return list(_tasks_registered)


def supported_model_types() -> list[str]:
    """The model types `--task text-generation-shared` accepts (those optimum-intel exports with past)."""
    return register_tasks()


def _patch_cli() -> None:
    global _cli_patched
    if _cli_patched:
        return
    try:
        from optimum.commands.export import openvino as cli_module
    except ImportError:  # optimum-intel not installed: nothing to patch
        return
    command = cli_module.OVExportCommand
    if getattr(command, "_shared_graph_original", None) is None:
        original_parse = command.parse_args
        original_run = command.run

        def parse_args(parser):
            original_parse(parser)
            from . import _cli

            _cli.add_arguments(parser)

        def run(self):
            from . import _cli

            return _cli.run(self, original_run)

        command._shared_graph_original = (original_parse, original_run)
        command.parse_args = staticmethod(parse_args)
        command.run = run
    _cli_patched = True


def _register_tasks_hook(module) -> None:
    register_tasks()
