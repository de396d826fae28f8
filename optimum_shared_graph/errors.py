"""The exceptions raised by optimum-shared-graph.

Every message is one line that says what is wrong and how to fix it. The tree::

    SharedGraphError
    ├── InvalidOptionsError        bad flags or option values, caught before any export work
    ├── ModelNotSupportedError     missing path, not a causal LM, unknown model type, remote code
    ├── DecompositionError         generate() could not be split into prefill and decode calls
    │   ├── GenerateFailedError    generate() itself raised during the capture
    │   └── SeparatePrefillError   the prefill takes inputs no decode step takes: one graph cannot serve both
    ├── ExportValidationError      the exported graph does not reproduce the PyTorch model
    ├── ArtifactWriteError         the artifact cannot be written (disk full, read-only, no permission)
    ├── NotEnoughMemoryError       validation cannot fit even one part of the graph in the memory available
    ├── ManifestError              missing, corrupt, newer-schema or tampered artifact
    ├── ArtifactValidationError    validate(): the artifact does not reproduce its stored reference through a
    │                              consumer on a device, or has no reference to check
    └── RuntimeSelectionError      no runtime provider covers what an artifact requires,
                                   or a request the artifact cannot serve (prompt too long, ...)

and one warning, `FallbackWarning` (a `SharedGraphWarning`): the export used optimum-intel's own
partitioning instead of one shared graph.
"""

from __future__ import annotations


class SharedGraphError(Exception):
    """Root of every error this package raises on purpose."""


class InvalidOptionsError(SharedGraphError, ValueError):
    """An export or runtime option is invalid."""


class ModelNotSupportedError(SharedGraphError):
    """The model cannot be exported with the `text-generation-shared` task."""


class DecompositionError(SharedGraphError):
    """`generate()` could not be decomposed into one prefill call and decode calls.

    Args:
        message: the one-line reason.
        architecture: the model class name.
        expected: how many top-level `forward()` calls were expected.
        captured: how many were recorded.
    """

    def __init__(self, message: str, *, architecture: str = "", expected: int = 0, captured: int = 0):
        super().__init__(message)
        self.architecture = architecture
        self.expected = expected
        self.captured = captured


class GenerateFailedError(DecompositionError):
    """`generate()` raised while its calls were recorded: no retry on an inner model can help."""


class SeparatePrefillError(DecompositionError):
    """The captured prefill takes inputs that no decode step takes (pixel values, ...): one graph cannot serve
    both stages, and a fallback to optimum-intel's partitioning would not be the shared graph asked for."""


class ExportValidationError(SharedGraphError):
    """The exported graph does not match the PyTorch model.

    Args:
        message: the one-line reason.
        report: the validation results, as written to the manifest.
    """

    def __init__(self, message: str, *, report: dict | None = None):
        super().__init__(message)
        self.report = report or {}


class ArtifactWriteError(SharedGraphError, OSError):
    """The artifact could not be written where it was asked for: no space left, a read-only file system,
    no permission. Nothing is left behind."""


class NotEnoughMemoryError(SharedGraphError, MemoryError):
    """Validation cannot fit even the smallest part of the graph in the memory available (a cgroup limit, or
    the system's); raised before any export work."""


class ManifestError(SharedGraphError):
    """An artifact's manifest is missing, unreadable, from a newer schema, or does not match its files."""


class ArtifactValidationError(SharedGraphError):
    """`validate()`: an artifact does not reproduce its stored reference through the consumer and device it
    was run on, or it has no (intact) reference to check.

    Args:
        message: the one-line reason.
        report: the check's results (None when nothing could be run).
    """

    def __init__(self, message: str, *, report: dict | None = None):
        super().__init__(message)
        self.report = report


class RuntimeSelectionError(SharedGraphError):
    """No runtime can serve this artifact or this request."""


class SharedGraphWarning(UserWarning):
    """Root of every warning this package issues."""


class FallbackWarning(SharedGraphWarning):
    """The export used optimum-intel's own partitioning instead of one shared decoder graph."""
