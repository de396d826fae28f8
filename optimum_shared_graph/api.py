"""`export()`: the Python API of the export, the same pipeline as the CLI with optimum-intel's
`main_export` / `_main_quantize` in place of its command."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from .manifest import Manifest
from .options import ExportOptions
from .pipeline import export as pipeline
from .quantization.calibration import resolve_config_dataset
from .errors import InvalidOptionsError
from .tasks import BASE_TASK, TASK, VLM_SHARED_TASK

# the options `task="image-text-to-text-shared"` takes: the CLI's flags for it (`cli._VLM_FLAGS`) and the ones
# optimum-intel's own flags set (`cli.options_from_args`); the others are refused as the CLI refuses their flags
VLM_OPTIONS = ("logits", "skip_validation", "validation_new_tokens", "calibration_decode_steps", "quiet", "stateful",
               "weight_format", "quantization_config", "trust_remote_code", "convert_tokenizer")


def export(model_or_path: Any, output_dir: str | os.PathLike, *, task: str = TASK, **options: Any) -> Manifest:
    """Export a causal LM as one OpenVINO decoder graph for prefill and decode, or (`task=
    "image-text-to-text-shared"`) a vision-language model in optimum-intel's layout with its language model as
    that graph.

    Args:
        model_or_path: a hub model id, a local model directory, or a loaded transformers model
            (saved to a temporary directory first; a loaded vision-language model has no processor beside it,
            so its artifact stores no reference for `validate()`).
        output_dir: where the artifact goes. Written only once validation has passed.
        task: `"text-generation-shared"` (the default) or `"image-text-to-text-shared"`
            (Qwen3.5, Qwen3.5-MoE: [Multimodal checkpoints](multimodal.md)), as `optimum-cli --task`.
        **options: the fields of `ExportOptions` (`logits="all"`, `weight_format="int8"`, ...). With
            `task="image-text-to-text-shared"` only `logits`, `skip_validation`, `validation_new_tokens`,
            `calibration_decode_steps`, `quiet`, `stateful`, `weight_format`, `quantization_config` (weight
            compression; a `dataset` of images and instructions, [Multimodal checkpoints](multimodal.md)),
            `trust_remote_code` and `convert_tokenizer` apply.

    Returns:
        The `Manifest` written to `output_dir/shared_graph.json`.

    Raises:
        InvalidOptionsError: an unknown task, or an option that does not apply to the task (one line).

    Example:
        >>> import optimum_shared_graph as osg
        >>> manifest = osg.export("./tiny-llama", "./tiny-llama-ov")  # doctest: +SKIP
        >>> manifest.partitioning, manifest.logits  # doctest: +SKIP
        ('shared', 'last')
        >>> osg.export("./tiny-qwen3.5", "./tiny-qwen3.5-ov", task="image-text-to-text-shared").task  # doctest: +SKIP
        'image-text-to-text-shared'
    """
    if task not in (TASK, VLM_SHARED_TASK):
        raise InvalidOptionsError(f"task must be {TASK!r} or {VLM_SHARED_TASK!r}, got {task!r}")
    opts = ExportOptions.from_dict(options)
    if task == VLM_SHARED_TASK:
        given = [name for name in options if name not in VLM_OPTIONS]
        if given:
            raise InvalidOptionsError(f"{', '.join(given)} does not apply with task {VLM_SHARED_TASK!r}")
        return _export_vlm(model_or_path, output_dir, opts)
    quantization = _api_quantization(opts)
    if hasattr(model_or_path, "save_pretrained"):
        with tempfile.TemporaryDirectory(prefix="osg-model-") as tmp:
            model_or_path.save_pretrained(tmp)
            return pipeline.run_export(tmp, output_dir, opts, raw_export=_api_raw_export(opts), quantization=quantization)
    return pipeline.run_export(str(model_or_path), output_dir, opts, raw_export=_api_raw_export(opts), quantization=quantization)


def _export_vlm(model_or_path: Any, output_dir, opts: ExportOptions) -> Manifest:
    """`task="image-text-to-text-shared"`: `pipeline/vlm.run_vlm_export` with optimum-intel's `main_export`."""
    import dataclasses

    from .pipeline import vlm

    config, raw_opts = opts.quantization_config, opts
    if isinstance(config, dict) and config.get("dataset") is not None:
        # a local file of images and instructions (read now: a bad one is refused before any work) reaches
        # optimum-intel's config as its instructions, a list it accepts; the calibration reads the file
        # (quantization/visual.py), the manifest records its name
        from .quantization.visual import resolve_dataset

        dataset = resolve_dataset(config["dataset"])
        if dataset.items is not None:
            raw_opts = dataclasses.replace(opts, quantization_config={**config, "dataset": dataset.texts})
    quantization = {**_api_quantization(raw_opts), **({"dataset": config["dataset"]} if raw_opts is not opts else {})}
    raw_export = _api_raw_export(raw_opts)
    if hasattr(model_or_path, "save_pretrained"):
        with tempfile.TemporaryDirectory(prefix="osg-model-") as tmp:
            model_or_path.save_pretrained(tmp)
            return vlm.run_vlm_export(tmp, output_dir, opts, raw_export=raw_export, quantization=quantization)
    return vlm.run_vlm_export(str(model_or_path), output_dir, opts, raw_export=raw_export, quantization=quantization)


def _api_quantization(opts: ExportOptions) -> dict[str, Any]:
    """What the manifest records of the API's quantization: the same fields the CLI flags give."""
    if opts.quantization_config is None:
        return {"weight_format": opts.weight_format, "quant_mode": None, "dataset": None}
    from optimum.intel.openvino.configuration import OVConfig, OVWeightQuantizationConfig

    original = opts.quantization_config
    # a local text file as `dataset` is read first (optimum-intel only knows dataset names); the
    # manifest records the file name, not its lines
    config = OVConfig(quantization_config=resolve_config_dataset(original)).quantization_config
    dataset = original.get("dataset") if isinstance(original, dict) else getattr(config, "dataset", None)
    if isinstance(config, OVWeightQuantizationConfig):
        return {"weight_format": config.dtype or f"int{config.bits}", "quant_mode": None, "dataset": dataset}
    return {"weight_format": opts.weight_format, "quant_mode": getattr(config, "dtype", None) or "int8",
            "dataset": dataset}


def _api_raw_export(opts: ExportOptions) -> pipeline.RawExport:
    """optimum-intel's export (and quantization) for the Python API."""

    def raw_export(model_path: str, output: Path, task: str = BASE_TASK) -> None:
        from optimum.exporters.openvino.__main__ import _main_quantize, main_export
        from optimum.intel.openvino.configuration import _DEFAULT_4BIT_WQ_CONFIG, OVConfig

        quantization_config = resolve_config_dataset(opts.quantization_config)  # a local text file: its lines
        if quantization_config is None and opts.weight_format not in (None, "fp16", "fp32"):
            if opts.weight_format == "int4":
                quantization_config = dict(_DEFAULT_4BIT_WQ_CONFIG)
            else:
                quantization_config = {"bits": 8 if opts.weight_format == "int8" else 4, "dtype": opts.weight_format}
        if quantization_config is not None:
            ov_config = OVConfig(quantization_config=quantization_config)
        elif opts.weight_format in ("fp16", "fp32"):
            ov_config = OVConfig(dtype=opts.weight_format)
        else:
            ov_config = None
        main_export(
            model_name_or_path=model_path, output=output, task=task, ov_config=ov_config,
            stateful=opts.stateful, convert_tokenizer=opts.convert_tokenizer,
            trust_remote_code=opts.trust_remote_code, library_name="transformers",
        )
        if quantization_config is not None:
            _main_quantize(
                model_name_or_path=model_path, task=task, library_name="transformers",
                quantization_config=ov_config.quantization_config, output=output, cache_dir=None,
                trust_remote_code=opts.trust_remote_code,
            )

    return raw_export
