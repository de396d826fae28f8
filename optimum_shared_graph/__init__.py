"""optimum-shared-graph: one OpenVINO decoder graph for prompt prefill and token-by-token decode.

Installing the package adds `--task text-generation-shared` to `optimum-cli export openvino`.

The public names below are imported on first use, so `import optimum_shared_graph` (and the
optimum-cli hook) loads nothing heavy. Where things live (docs/design.md has the full map):

- `api` (`export`) and `cli` (the optimum-cli flags, `register`): the public face;
- `pipeline`: the export, stage by stage (`pipeline/export.py` runs them in order);
- `quantization`: calibration on both stages, and on a static graph's own calls;
- `runtimes`: `runtime()`, its provider registry, the OpenVINO provider and the sessions;
- `proof`: the reference stored in an artifact, the rules that judge against it, `validate()`;
- `graph`: transforms of OpenVINO graphs;
- leaves: `errors`, `options`, `manifest` (and `verified`, its cache of verified files), `tasks`, `registration`, `progress`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

_EXPORTS = {
    "TASK": "tasks",
    "ArtifactValidationError": "errors",
    "ArtifactWriteError": "errors",
    "DecompositionError": "errors",
    "ExportValidationError": "errors",
    "InvalidOptionsError": "errors",
    "ManifestError": "errors",
    "ModelNotSupportedError": "errors",
    "NotEnoughMemoryError": "errors",
    "RuntimeSelectionError": "errors",
    "SharedGraphError": "errors",
    "ExportOptions": "options",
    "Manifest": "manifest",
    "read_manifest": "manifest",
    "export": "api",
    "register": "cli",
    "runtime": "runtimes.registry",
    "supported_model_types": "registration",
    "validate": "proof.check",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names come from __getattr__
    from .api import export
    from .cli import register
    from .errors import (
        ArtifactValidationError, ArtifactWriteError, DecompositionError, ExportValidationError, InvalidOptionsError, ManifestError,
        ModelNotSupportedError, NotEnoughMemoryError, RuntimeSelectionError, SharedGraphError,
    )
    from .manifest import Manifest, read_manifest
    from .options import ExportOptions
    from .registration import supported_model_types
    from .runtimes.registry import runtime
    from .proof.check import validate
    from .tasks import TASK


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'optimum_shared_graph' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
