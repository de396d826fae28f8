"""Stage 1, plan: every check that needs no weights, and every fact the later stages read, decided once.

`make_plan()` runs before optimum-intel loads anything, for both tasks: the output directory, the model's config,
the weight format (`manifest.weight_format_of`, the one rule), whether the export calibrates (a data-aware
quantization), whether validation fits in the memory available and how many calls the capture records
(`memory.py`), and the graph that is the shared one. For `text-generation-shared` also a multimodal checkpoint's
language model (`multimodal.py`), the static shapes and their quantization (`static_shapes.py`,
`quantization/static.py`), whether the capture runs beside optimum-intel's conversion (`capture_beside.py`) and the
digests beside the validation, and a vision-language model's fallback reason; for `image-text-to-text-shared` the
vision-language family (`architectures/_vlm_families.py`: the validation's image, prompt and vision parts), the
processor's image token and the calibration set of a data-aware quantization (`quantization/visual.py`). The `Plan`
it returns is frozen: later stages read it and never change it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import InvalidOptionsError, ModelNotSupportedError
from ..manifest import GRAPH_XML, LANGUAGE_XML, STATIC_GRAPH_XML, weight_format_of
from ..options import ExportOptions
from ..quantization.calibration import is_data_aware
from ..quantization.static import check_static_quantization, plan_static_quantization
from ..registration import register_tasks
from ..tasks import TASK, VLM_SHARED_TASK
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
    weight_format: str | None = None  # the graph's weight format (`manifest.weight_format_of`), None: not asked
    calibrating: bool = False  # a data-aware quantization: optimum-intel's graph is calibrated as it is
    fallback_reason: str | None = None  # known at plan time: a vision-language model has no causal LM to decompose
    capture_beside: bool = False  # the capture in a process of its own, beside optimum-intel's conversion
    digests_beside: bool = False  # the graph's digests in a thread, beside the validation
    task: str = TASK  # the artifact's task (`text-generation-shared`, `image-text-to-text-shared`)
    shared_graph: str = GRAPH_XML  # the file of the one shared graph (a vision-language model's: its language model)
    family: Any = None  # image-text-to-text-shared: the `architectures._vlm_families.Family` (the validation's parts)
    calibration_set: Any = None  # image-text-to-text-shared, data-aware: its images (`quantization.visual`)
    dataset_unused: bool = False  # image-text-to-text-shared: a --dataset a data-free quantization does not read


def make_plan(model: str, output_dir, opts: ExportOptions, *, task: str = TASK, quantization: dict | None = None,
              quantization_config: Callable[[], Any] | None = None) -> Plan:
    """Stage 1 of `task`'s export: every check that needs no weights, before optimum-intel loads the model (see the
    module)."""
    if task == VLM_SHARED_TASK and opts.is_static:
        raise InvalidOptionsError(f"--task {VLM_SHARED_TASK} has no static shape mode yet: use --shape-mode dynamic")
    output = Path(output_dir).absolute()
    load.check_output(output)
    config = load.load_config(model, opts)  # a path that is not a model is refused before optimum-intel is imported
    register_tasks()
    weight_format = weight_format_of(quantization, opts.weight_format)  # both tasks: the one rule, decided once
    if task == VLM_SHARED_TASK:
        return _vision_language_plan(model, output, config, opts, weight_format, quantization, quantization_config)
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
            from ..quantization.calibration import both_stage_steps

            check_static_quantization(static, both_stage_steps(opts.calibration_decode_steps), cli_config)
        static_plan = plan_static_quantization(
            static, opts, calibrating=opts.quantization_config is not None or is_data_aware(cli_config))
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
                capture_beside=beside, digests_beside=overlap.digests and not calibrating,
                shared_graph=STATIC_GRAPH_XML if opts.is_static else GRAPH_XML)


# the greedy tokens an image-text-to-text-shared export validates when the options leave it open
VLM_NEW_TOKENS = 8


def _vision_language_plan(model: str, output: Path, config, opts: ExportOptions, weight_format: str | None,
                          quantization: dict | None, quantization_config) -> Plan:
    """Stage 1 of `--task image-text-to-text-shared`, after the checks both tasks share: a type it exports (its
    family), the processor's image token, the calibration set, whether validation fits (the language model's
    smallest part: `memory.check_fits`), and how many greedy tokens the capture records."""
    from ..architectures import supported_vlm_types
    from ..architectures._vlm_families import family_of, not_exported_reason
    from .vlm_reference import check_image_token

    model_type = getattr(config, "model_type", None)
    if model_type not in supported_vlm_types():
        raise ModelNotSupportedError(
            f"{model_type} is not a model type --task {VLM_SHARED_TASK} exports: {not_exported_reason(model_type)} "
            f"(it exports {', '.join(supported_vlm_types())}); for a text-only export of its language model use "
            "--task text-generation-shared")
    check_image_token(model, config, opts.trust_remote_code)  # the processor's image token is the model's
    dataset = _vlm_calibration(model, opts, quantization, quantization_config)
    if not opts.skip_validation:  # even the language model's smallest part cannot fit: stop before any work
        memory.check_fits(config, weight_format, memory.available_memory())
    opts = dataclasses.replace(opts, validation_new_tokens=opts.validation_new_tokens or VLM_NEW_TOKENS)
    return Plan(model=model, output=output, config=config, opts=opts, weight_format=weight_format,
                calibrating=dataset is not None, task=VLM_SHARED_TASK, shared_graph=LANGUAGE_XML,
                family=family_of(model_type), calibration_set=dataset,
                dataset_unused=dataset is None and (quantization or {}).get("dataset") is not None)


def _vlm_calibration(model: str, opts: ExportOptions, quantization: dict[str, Any] | None,
                     quantization_config: Callable[[], Any] | None):
    """The calibration set of an image-text-to-text-shared export's data-aware quantization
    (`quantization.visual.VisualDataset`), or None when the flags ask for none; checked before any work.

    Raises:
        InvalidOptionsError: a `--dataset` that is neither a readable JSON-lines file nor one of optimum-intel's
            vision-language sets (or one of those without the `datasets` package that reads it), or a checkpoint
            without the processor the images go through.
    """
    import importlib.util

    from ..quantization import visual

    quantization = quantization or {}
    # any --dataset is checked first: one that is not of images and instructions has no meaning here (optimum-intel
    # would take a text set's name and fail in its calibration, and a file's path is no name it knows)
    dataset = visual.resolve_dataset(quantization["dataset"]) if quantization.get("dataset") is not None else None
    if opts.quantization_config is not None:
        data_aware = is_data_aware(opts.quantization_config)
    else:
        data_aware = (quantization.get("dataset") is not None and quantization_config is not None
                      and is_data_aware(quantization_config()))
    if not data_aware:
        return None
    if dataset is None:  # the API's config with a list of texts as its dataset: no images
        raise InvalidOptionsError("data-aware quantization of a vision-language model calibrates on images: give "
                                  "the config's dataset as a JSON-lines file of images and instructions")
    if dataset.name is not None and importlib.util.find_spec("datasets") is None:
        raise InvalidOptionsError(
            f"--dataset {dataset.name} is read from the hub by the datasets package, which is not installed: "
            "pip install datasets, or pass a local JSON-lines file of images and instructions")
    from ..proof.vlm import load_processor

    _processor, why = load_processor(model, opts.trust_remote_code)
    if why is not None:
        raise InvalidOptionsError(
            f"data-aware quantization feeds the calibration images through the checkpoint's processor, and {why}: "
            "export from the checkpoint directory with its processor files (preprocessor_config.json, the tokenizer "
            "and its chat template)")
    return dataset


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
