"""The public surface never changes by accident."""

import optimum_shared_graph


def test_all():
    assert sorted(optimum_shared_graph.__all__) == sorted([
        "TASK", "ArtifactValidationError", "ArtifactWriteError", "DecompositionError", "ExportOptions", "ExportValidationError", "InvalidOptionsError", "Manifest",
        "ManifestError", "ModelNotSupportedError", "NotEnoughMemoryError", "RuntimeSelectionError", "SharedGraphError", "export",
        "read_manifest", "register", "runtime", "supported_model_types", "validate",
    ])


def test_error_tree():
    from optimum_shared_graph import (ArtifactValidationError, ArtifactWriteError, DecompositionError, ExportValidationError, InvalidOptionsError,
                                      ManifestError, ModelNotSupportedError, NotEnoughMemoryError, RuntimeSelectionError,
                                      SharedGraphError)

    for cls in (ArtifactValidationError, ArtifactWriteError, DecompositionError, ExportValidationError, InvalidOptionsError, ManifestError,
                ModelNotSupportedError, NotEnoughMemoryError, RuntimeSelectionError):
        assert issubclass(cls, SharedGraphError)


def test_import_is_light():
    import subprocess
    import sys

    code = "import sys, optimum_shared_graph; print('torch' in sys.modules, 'openvino' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_every_raise_names_a_subclass_of_the_root():
    """An error's class says what went wrong (callers and the pipeline tell errors apart by class, never by their
    message): no raise of the bare `SharedGraphError`."""
    import ast
    from pathlib import Path

    package = Path(optimum_shared_graph.__file__).parent
    bare = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                name = node.exc.func.id if isinstance(node.exc.func, ast.Name) else getattr(node.exc.func, "attr", "")
                if name == "SharedGraphError":
                    bare.append(f"{path.relative_to(package)}:{node.lineno}")
    assert bare == []


def test_decomposition_errors_are_told_apart_by_class():
    from optimum_shared_graph.errors import DecompositionError, GenerateFailedError, SeparatePrefillError

    assert issubclass(GenerateFailedError, DecompositionError) and issubclass(SeparatePrefillError, DecompositionError)
    import inspect

    from optimum_shared_graph.pipeline import decompose

    assert '" in str(' not in inspect.getsource(decompose)  # no error recognised by its message text
