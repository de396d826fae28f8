"""Registration with Optimum: the task in TasksManager and the flags in optimum-cli."""

from __future__ import annotations

import subprocess
import sys

from conftest import run_cli


def test_task_registered_for_every_with_past_model_type():
    import optimum.exporters.openvino  # noqa: F401
    from optimum.exporters.tasks import TasksManager

    import optimum_shared_graph

    types = optimum_shared_graph.supported_model_types()
    expected = sorted(
        mt for mt, exporters in TasksManager._SUPPORTED_MODEL_TYPE.items()
        if "text-generation-with-past" in exporters.get("openvino", {})
    )
    assert types == expected and len(types) > 50
    for mt in ("llama", "gpt2", "qwen2"):
        tasks = TasksManager.get_supported_tasks_for_model_type(mt, exporter="openvino", library_name="transformers")
        assert "text-generation-shared" in tasks


def test_register_is_idempotent():
    import optimum_shared_graph
    from optimum.commands.export.openvino import OVExportCommand

    optimum_shared_graph.register()
    run = OVExportCommand.run
    optimum_shared_graph.register()
    assert OVExportCommand.run is run
    assert optimum_shared_graph.supported_model_types() == optimum_shared_graph.supported_model_types()


def test_registered_when_the_exporter_is_imported_later():
    code = (
        "import sys, optimum_shared_graph as o; o.register(); "
        "assert 'optimum.exporters.openvino' not in sys.modules; "
        "from optimum.exporters.tasks import TasksManager; import optimum.exporters.openvino; "
        "print('text-generation-shared' in TasksManager._SUPPORTED_MODEL_TYPE['llama']['openvino'])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


def test_help_lists_the_plugin_flags():
    proc = run_cli("export", "openvino", "--help", check=True)
    for flag in ("--shape-mode", "--max-cache-len", "--static-batch-size", "--static-query-len", "--logits",
                 "--fallback", "--skip-validation", "--weight-format", "--disable-stateful"):
        assert flag in proc.stdout


def test_hook_file_is_in_the_namespace_without_init():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("optimum.commands.register")
    dirs = [Path(p) for p in spec.submodule_search_locations]
    assert any((d / "register_shared_graph.py").is_file() for d in dirs)
    assert not any((d / "__init__.py").exists() for d in dirs)
