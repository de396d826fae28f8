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
