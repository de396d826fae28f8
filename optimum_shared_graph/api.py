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
from .tasks import BASE_TASK


def export(model_or_path: Any, output_dir: str | os.PathLike, **options: Any) -> Manifest:
    """Export a causal LM as one OpenVINO decoder graph for prefill and decode.

    Args:
        model_or_path: a hub model id, a local model directory, or a loaded transformers causal LM
            (saved to a temporary directory first).
        output_dir: where the artifact goes. Written only once validation has passed.
        **options: the fields of `ExportOptions` (`logits="all"`, `weight_format="int8"`, ...).

    Returns:
        The `Manifest` written to `output_dir/shared_graph.json`.

    Example:
        >>> import optimum_shared_graph as osg
        >>> manifest = osg.export("./tiny-llama", "./tiny-llama-ov")  # doctest: +SKIP
        >>> manifest.partitioning, manifest.logits  # doctest: +SKIP
        ('shared', 'last')
    """
    opts = ExportOptions.from_dict(options)
    quantization = _api_quantization(opts)
    if hasattr(model_or_path, "save_pretrained"):
        with tempfile.TemporaryDirectory(prefix="osg-model-") as tmp:
            model_or_path.save_pretrained(tmp)
            return pipeline.run_export(tmp, output_dir, opts, raw_export=_api_raw_export(opts), quantization=quantization)
    return pipeline.run_export(str(model_or_path), output_dir, opts, raw_export=_api_raw_export(opts), quantization=quantization)


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
