"""Fallback (SPEC section 6): optimum-intel's own partitioning when decomposition fails.

With `--fallback auto`, a model whose `generate()` cannot be split into one prefill call and
decode calls of one decoder graph is exported the way optimum-intel exports it on its own:
`text-generation-with-past` for a causal LM, `image-text-to-text` for a vision-language model
(a vision encoder, a text-embeddings graph and one stateful language model). The user is warned
once with the reason, and the manifest records `partitioning: fallback` and the reason.
"""

from __future__ import annotations

import inspect
import shutil
import warnings
from pathlib import Path
from typing import Any

from ._errors import SharedGraphError
from ._manifest import GRAPH_XML, RT_INFO_KEY, Manifest, describe_ports, hash_graph_files
from ._registration import BASE_TASK, TASK, supported_model_types

VLM_TASK = "image-text-to-text"

# Forward inputs through which a prefill writes another modality into the KV cache.
MODALITY_INPUTS = (
    "pixel_values", "pixel_values_videos", "image_grid_thw", "video_grid_thw", "image_sizes",
    "pixel_attention_mask", "image_attention_mask", "input_features", "input_values",
)


class FallbackWarning(UserWarning):
    """The export used optimum-intel's own partitioning instead of one shared decoder graph."""


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


def _model_graphs(directory: Path) -> list[str]:
    return sorted(
        p.name for p in directory.glob("openvino_*.xml")
        if p.name not in ("openvino_tokenizer.xml", "openvino_detokenizer.xml")
    )


def finish_fallback(raw: Path, final: Path, config: Any, reason: str, opts: Any, model: str,
                    quantization: dict[str, Any] | None) -> Manifest:
    """Turn optimum-intel's own export in `raw` into the artifact in `final`, with its manifest.

    Every graph optimum-intel wrote (one for with-past; the language model, text embeddings and
    vision graphs for image-text-to-text) gets the manifest facts in its rt_info and its sha256 in
    the manifest.

    Args:
        raw: optimum-intel's export directory.
        final: the artifact directory to create.
        config: the model's transformers config.
        reason: why decomposition failed.
        opts: the `ExportOptions`.
        model: the model id or directory, as given.
        quantization: what the manifest records of the quantization flags.

    Returns:
        The manifest, already written into `final`.
    """
    import openvino as ov

    task = fallback_task(config)
    graphs = _model_graphs(raw)
    decoder = GRAPH_XML if GRAPH_XML in graphs else next((g for g in graphs if "language_model" in g), None)
    if decoder is None:
        raise SharedGraphError(
            f"optimum-intel's {task} export of {config.model_type} wrote no decoder graph "
            f"({', '.join(graphs) or 'no graphs'}): export it with --task {task} directly"
        )
    core = ov.Core()
    decoder_model = core.read_model(raw / decoder)
    stateful = not any(p.get_any_name().startswith("past_key_values") for p in decoder_model.inputs)
    requires = ["generation", "logits-all"] + ([] if stateful else ["stateless"]) + ([task] if task == VLM_TASK else [])
    quantization = quantization or {}
    manifest = Manifest(
        task=TASK,
        partitioning="fallback",
        fallback_reason=reason,
        shape_mode="dynamic",
        logits="all",
        stateful=stateful,
        requires=requires,
        model={"source": str(model), "model_type": config.model_type,
               "architecture": (getattr(config, "architectures", None) or [None])[0]},
        graph={
            "task": task,
            "files": graphs,
            "decoder": decoder,
            "inputs": describe_ports(decoder_model.inputs),
            "outputs": describe_ports(decoder_model.outputs),
            "states": len(decoder_model.get_sinks()),
        },
        quantization={
            "weight_format": quantization.get("weight_format") or opts.weight_format or "fp32",
            "quant_mode": quantization.get("quant_mode"),
            "dataset": quantization.get("dataset"),
            "calibration_samples": {"prefill": 0, "decode": 0},
        },
        validation={
            "status": "skipped",
            "reason": "fallback: optimum-intel's own partitioning, with no captured generate() calls to check it against",
        },
    )
    del decoder_model
    final.mkdir()
    graph_files = set(graphs) | {g[: -len(".xml")] + ".bin" for g in graphs}
    for item in raw.iterdir():
        if item.name not in graph_files:
            shutil.move(str(item), final / item.name)
    rt_info = manifest.rt_info()
    for name in graphs:
        graph = core.read_model(raw / name)
        for key, value in rt_info.items():
            graph.set_rt_info(value, [RT_INFO_KEY, key])
        ov.save_model(graph, final / name, compress_to_fp16=False)
        del graph
    names = [n for g in graphs for n in (g, g[: -len(".xml")] + ".bin") if (final / n).is_file()]
    manifest.files = hash_graph_files(final, sorted(names))
    manifest.write(final)
    return manifest
