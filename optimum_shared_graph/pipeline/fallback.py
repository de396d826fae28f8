"""Fallback: optimum-intel's own partitioning when decomposition fails.

With `--fallback auto`, a model whose `generate()` cannot be split into one prefill call and
decode calls of one decoder graph is exported the way optimum-intel exports it on its own:
`text-generation-with-past` for a causal LM, `image-text-to-text` for a vision-language model
(a vision encoder, a text-embeddings graph and one stateful language model). The user is warned
once with the reason, and the manifest records `partitioning: fallback` and the reason.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from ..errors import FallbackWarning
from ..registration import supported_model_types
from ..tasks import BASE_TASK, TASK, VLM_TASK

# Forward inputs through which a prefill writes another modality into the KV cache.
MODALITY_INPUTS = (
    "pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "image_sizes",
    "pixel_attention_mask", "image_attention_mask", "input_features", "input_values",
)


def openvino_tasks(model_type: str | None) -> set[str]:
    """The tasks optimum-intel's OpenVINO exporter supports for a model type."""
    supported_model_types()  # registers optimum-intel's exporter and our task
    from optimum.exporters.tasks import TasksManager

    exporters = TasksManager._SUPPORTED_MODEL_TYPE.get(model_type, {})
    return set(exporters.get("openvino") or {}) if isinstance(exporters, dict) else set()


def is_vision_language(config: Any) -> bool:
    """True for a model type optimum-intel exports as image-text-to-text but not as a causal LM."""
    model_type = getattr(config, "model_type", None)
    return model_type not in supported_model_types() and VLM_TASK in openvino_tasks(model_type)


def fallback_task(config: Any) -> str:
    """optimum-intel's own task for this model: with-past for a causal LM, image-text-to-text for a VLM."""
    return VLM_TASK if is_vision_language(config) else BASE_TASK


def vision_language_reason(config: Any) -> str:
    """Why a vision-language model gets no shared graph: its prefill takes image inputs decode never takes."""
    model_type = getattr(config, "model_type", None)
    architecture = (getattr(config, "architectures", None) or [model_type])[0]
    found: list[str] = []
    try:
        from transformers import AutoModelForImageTextToText

        model_class = AutoModelForImageTextToText._model_mapping[type(config)]
        parameters = inspect.signature(model_class.forward).parameters
        found = [name for name in MODALITY_INPUTS if name in parameters]
    except Exception:  # a remote-code VLM: its class is not in transformers' mapping
        pass
    inputs = ", ".join(found) if found else "image inputs"
    return (
        f"{architecture} ({model_type}) is a vision-language model: its prefill writes image features "
        f"({inputs}) into the KV cache and decode steps never take them, so one decoder graph cannot serve both "
        "stages"
    )


def warn(reason: str, task: str) -> None:
    """Warn, once, that the export falls back to optimum-intel's partitioning, and why."""
    warnings.warn(
        f"{TASK} falls back to optimum-intel's {task} partitioning: {reason}", FallbackWarning, stacklevel=3
    )
