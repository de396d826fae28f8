"""optimum-shared-graph: one OpenVINO decoder graph for prompt prefill and token-by-token decode.

Installing the package adds `--task text-generation-shared` to `optimum-cli export openvino`.
"""

from ._errors import (
    ArtifactWriteError,
    DecompositionError,
    ExportValidationError,
    InvalidOptionsError,
    ManifestError,
    ModelNotSupportedError,
    RuntimeSelectionError,
    SharedGraphError,
)
from ._export import export
from ._manifest import Manifest, read_manifest
from ._options import ExportOptions
from ._registration import TASK, register, supported_model_types
from ._runtime import runtime

__version__ = "0.1.0"

__all__ = [
    "TASK",
    "ArtifactWriteError",
    "DecompositionError",
    "ExportOptions",
    "ExportValidationError",
    "InvalidOptionsError",
    "Manifest",
    "ManifestError",
    "ModelNotSupportedError",
    "RuntimeSelectionError",
    "SharedGraphError",
    "export",
    "read_manifest",
    "register",
    "runtime",
    "supported_model_types",
]
