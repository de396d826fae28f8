"""Exporting past optimum-intel's transformers version caps, with validation as the guard.

Many of optimum-intel's per-architecture export configs carry a `MAX_TRANSFORMERS_VERSION`: the
newest transformers its patchers were tested with. A newer transformers often still traces the
same graph. This task validates every export against PyTorch, so for our task
only, and only when validation runs, the cap of that one export config class is lifted for the
duration of the export; a graph that does not reproduce PyTorch is still refused.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

from .. import host
from ..errors import ModelNotSupportedError


def export_config_class(model_type: str, task: str):
    """optimum-intel's OpenVINO export config class for `model_type` and `task`, or None."""
    from optimum.exporters.tasks import TasksManager

    try:
        constructor = TasksManager.get_exporter_config_constructor(
            exporter="openvino", model_type=model_type, task=task, library_name="transformers"
        )
    except (KeyError, ValueError):
        return None
    return getattr(constructor, "func", constructor)


def exceeded_cap(model_type: str, task: str) -> tuple[type, str, str] | None:
    """`(config class, cap, installed)` when the installed transformers is newer than the class's cap."""
    from packaging.version import Version
    import transformers

    cls = export_config_class(model_type, task)
    cap = getattr(cls, "MAX_TRANSFORMERS_VERSION", None) if cls is not None else None
    if cap is None:
        return None
    cap = cap.base_version if isinstance(cap, Version) else str(cap)
    installed = transformers.__version__
    if Version(Version(installed).base_version) <= Version(cap):
        return None
    return cls, cap, installed


@dataclass(frozen=True)
class LiftedCap:
    """A transformers cap lifted for one export: what the manifest and a validation failure say."""

    model_type: str
    config_class: str
    cap: str
    installed: str

    @property
    def note(self) -> str:
        return (f"optimum-intel's {self.config_class} caps transformers at {self.cap}; exported under "
                f"{self.installed} because the export validated against PyTorch")

    @property
    def refusal(self) -> str:
        return (f"{self.model_type} is past optimum-intel's transformers cap ({self.cap}, installed {self.installed}) "
                f"and does not validate: install transformers<={self.cap} to export it")


@contextlib.contextmanager
def lifted_cap(
    model_type: str, task: str, *, validating: bool, fallback_reason: str | None = None
) -> Iterator[LiftedCap | None]:
    """Lift the export config's transformers cap for this export; yield what was lifted (or None).

    Args:
        model_type: the model type being exported.
        task: optimum-intel's task used for the raw export.
        validating: the shared graph will be validated. Without it (--skip-validation, or a fallback
            export that has no captured calls) the cap stays and a capped type is refused.
        fallback_reason: why the export is a fallback, for the refusal message.

    Raises:
        ModelNotSupportedError: the installed transformers exceeds the cap and validation is skipped.
    """
    found = exceeded_cap(model_type, task)
    if found is None:
        yield None
        return
    cls, cap, installed = found
    if not validating:
        raise ModelNotSupportedError(
            f"optimum-intel supports exporting {model_type} only up to transformers {cap} (installed: {installed}); "
            "text-generation-shared exports it past that cap only when the one shared graph is validated against PyTorch "
            f"(not with --skip-validation, nor for a fallback export); install transformers<={cap} to export it"
            + (f" (this export fell back because {fallback_reason})" if fallback_reason else "")
        )
    with host.transformers_cap_lifted(cls):
        yield LiftedCap(model_type, cls.__name__, cap, installed)
