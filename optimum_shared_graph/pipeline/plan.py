"""Stage 1, plan: every check that needs no weights, and every fact the later stages read, decided once.

`make_plan()` runs before optimum-intel loads anything: the output directory, the model's config (for a
multimodal checkpoint, its language model's: `multimodal.py`), the static shapes and their quantization
(`static_shapes.py`, `quantization/static.py`), the weight format, whether the export calibrates (a data-aware
quantization), whether validation fits in the memory available and how many calls the capture records
(`memory.py`), whether the capture runs beside optimum-intel's conversion (`capture_beside.py`) and the digests
beside the validation, and a vision-language model's fallback reason. The `Plan` it returns is frozen: later stages read it
and never change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..options import ExportOptions
from ..quantization.calibration import is_data_aware
from ..quantization.static import check_static_quantization, plan_static_quantization
from ..registration import register_tasks
from . import fallback, load, memory, multimodal


@dataclass(frozen=True)
class Plan:
    """What the export decided before any work."""

    model: str  # the hub id or directory asked for
    output: Path  # the final artifact directory (absolute)
    config: Any  # the config of the model exported (a multimodal checkpoint's language model's)
    opts: ExportOptions  # the options, with the validation's token count planned (`memory.plan_validation`)
    language: Any = None  # a multimodal checkpoint's language model (`multimodal.plan`), else None
    static: Any = None  # `graph.static.StaticShapes` for --shape-mode static, else None
    static_plan: Any = None  # a static export's quantization (`quantization.static.plan_static_quantization`)
    weight_format: str | None = None  # the weight format asked for (the CLI's flag, else the options')
    calibrating: bool = False  # a data-aware quantization: optimum-intel's graph is calibrated as it is
    fallback_reason: str | None = None  # known at plan time: a vision-language model has no causal LM to decompose
    capture_beside: bool = False  # the capture in a process of its own, beside optimum-intel's conversion
    digests_beside: bool = False  # the graph's digests in a thread, beside the validation


def make_plan(model: str, output_dir, opts: ExportOptions, *, quantization: dict | None = None,
              quantization_config: Callable[[], Any] | None = None) -> Plan:
    """Stage 1: every check that needs no weights, before optimum-intel loads the model (see the module)."""
    register_tasks()
    output = Path(output_dir).absolute()
    load.check_output(output)
    config = load.load_config(model, opts)
    language = multimodal.plan(config)
    if language is not None:  # transformers loads the language model alone from the checkpoint's files
        multimodal.check_weights(model, language)
        config = language.config
    static, static_plan, cli_config = None, None, None
    if opts.is_static:
        from .static_shapes import resolve_static_shapes

        static = resolve_static_shapes(config, opts)
        cli_config = quantization_config() if quantization_config is not None else None
        if cli_config is not None:  # the CLI's quantization flags, as optimum-intel reads them
            from ..quantization.calibration import DEFAULT_DECODE_STEPS

            steps = DEFAULT_DECODE_STEPS if opts.calibration_decode_steps is None else opts.calibration_decode_steps
            check_static_quantization(static, steps, cli_config)
        static_plan = plan_static_quantization(
            static, opts, calibrating=opts.quantization_config is not None or is_data_aware(cli_config))
    weight_format = (quantization or {}).get("weight_format") or opts.weight_format
    available = memory.available_memory()  # read once: what validation and the side-by-side runs are planned on
    opts = memory.plan_validation(model, config, opts, weight_format, available)  # fits? how many calls? before any work
    reason = fallback.vision_language_reason(config) if fallback.is_vision_language(config) else None
    calibrating = _calibrating(opts, static_plan, quantization, quantization_config)
    # side by side where memory and cores allow; the static trace and the calibration need the capture on
    # optimum-intel's own model, in this process, and a calibrated graph is saved again (nothing to digest early)
    overlap = memory.overlap(model, available)
    beside = overlap.capture and static is None and not calibrating and language is None and reason is None
    return Plan(model=model, output=output, config=config, opts=opts, language=language, static=static,
                static_plan=static_plan, weight_format=weight_format, calibrating=calibrating, fallback_reason=reason,
                capture_beside=beside, digests_beside=overlap.digests and not calibrating)


def _calibrating(opts: ExportOptions, static_plan, quantization: dict | None, quantization_config) -> bool:
    """Whether the export calibrates: a static export's plan says; else the API's quantization config; else the
    CLI's flags, data-aware only with a dataset."""
    if static_plan is not None:
        return static_plan.calibrating
    if opts.quantization_config is not None:
        return is_data_aware(opts.quantization_config)
    if quantization_config is not None and (quantization or {}).get("dataset") is not None:
        return is_data_aware(quantization_config())
    return False
