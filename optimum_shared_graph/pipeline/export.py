"""The `text-generation-shared` export, stage by stage: read this file first.

`run_export()` is shared by the CLI and the Python API. It runs, in order:

1. load (`load.py`): check the output directory and the model's config, before any work; for a multimodal
   checkpoint (`multimodal.py`), its language model is what the next stages export, with its own config;
   whether the validation fits in the memory available (`memory.py`: it chooses how many calls are captured);
2. decompose (`decompose.py`): record the prefill and decode calls `generate()` makes, and check that
   one graph can serve both (or find the reason it cannot: then the fallback, `fallback.py`);
3. convert (`convert.py`): optimum-intel's own export into a staging directory, with the both-stage
   calibration hooks of `quantization/` when a data-aware quantization is asked for;
4. static trace (`static.py`, `--shape-mode static` only): the static graph replaces optimum-intel's;
5. validate (`validate.py`): the graph against the captured calls;
6. write (`write.py`): the manifest, the rt_info, the file hashes; the artifact moved into place, its
   `config.json` completed with what OpenVINO consumers read and the model's config lacks (`consumer_config.py`).

The model is loaded once, by optimum-intel's export in stage 3, in the dtype optimum-intel picks: it
hands the model over (`convert.one_model_load`) and stages 2 and 4 run on it before and after its
conversion. optimum-intel frees it once converted, so the graph is compiled for validation with no
PyTorch weights in memory. A failure at any stage leaves the output directory as it was.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable

from .. import progress
from ..errors import DecompositionError, ExportValidationError
from ..manifest import MANIFEST_NAME, Manifest
from ..options import ExportOptions
from ..quantization.both_stages import both_stage_quantization
from ..quantization.calibration import CalibrationReport, is_data_aware
from ..quantization.static import check_static_quantization, plan_static_quantization
from ..registration import register_tasks, supported_model_types
from ..tasks import BASE_TASK
from . import consumer_config, convert, fallback, load, memory, multimodal, write
from .decompose import decompose_model, release_pytorch, save_exported_model

# optimum-intel's export of a model path into a directory (the CLI passes optimum-intel's own command,
# so all its flags apply; the API calls `main_export`); `task` is with-past unless a fallback says otherwise.
RawExport = Callable[..., None]


def run_export(
    model: str,
    output_dir: str | os.PathLike,
    opts: ExportOptions,
    *,
    raw_export: RawExport,
    quantization: dict[str, Any] | None = None,
    quantization_config: Callable[[], Any] | None = None,
) -> Manifest:
    """Export `model` into `output_dir` as one decoder graph; return the manifest written there.

    Args:
        model: a hub id or a local directory.
        output_dir: the final artifact directory.
        opts: the export options.
        raw_export: runs optimum-intel's export of a model path into a directory.
        quantization: what the manifest records of the quantization flags.
        quantization_config: returns the quantization config the CLI's flags give (without exporting),
            so a static export checks it before any export work.
    """
    stages = ["loading", "decomposing generate()", "converting (optimum-intel)"]
    stages += (["static graph"] if opts.is_static else []) + ([] if opts.skip_validation else ["validating"])
    with progress.export_progress(stages + ["writing"], quiet=opts.quiet):
        # 1. load: every check that needs no weights comes before optimum-intel loads the model
        progress.stage("loading")
        register_tasks()
        output = Path(output_dir).absolute()
        load.check_output(output)
        config = load.load_config(model, opts)
        # a multimodal checkpoint (Qwen3.5): its language model is what gets exported, with its own config
        language = multimodal.plan(config)
        if language is not None:
            multimodal.check_weights(model, language)
            config = language.config
        static, static_plan = None, None
        if opts.is_static:
            from .static_shapes import resolve_static_shapes

            static = resolve_static_shapes(config, opts)
            cli_config = quantization_config() if quantization_config is not None else None
            if cli_config is not None:  # the CLI's quantization flags, as optimum-intel reads them
                check_static_quantization(static, opts.calibration_decode_steps, cli_config)
            static_plan = plan_static_quantization(
                static, opts, calibrating=opts.quantization_config is not None or is_data_aware(cli_config))
        weight_format = (quantization or {}).get("weight_format") or opts.weight_format
        opts = memory.plan_validation(model, config, opts, weight_format)  # fits? how many calls? before any work
        export = _Export(model, config, opts, static, static_plan, weight_format)
        if static_plan is not None:
            export.calibrating = static_plan.calibrating
        elif opts.quantization_config is not None:
            export.calibrating = is_data_aware(opts.quantization_config)
        elif quantization_config is not None and (quantization or {}).get("dataset") is not None:
            export.calibrating = is_data_aware(quantization_config())  # data-aware needs a dataset
        if fallback.is_vision_language(config):  # no causal LM to decompose: optimum-intel's own partitioning
            export.fallback(fallback.vision_language_reason(config))

        with convert.staging(output) as staging:
            raw, calibration = staging / "raw", CalibrationReport()
            export.staging = staging

            # 2. decompose, 3. convert and 4. static trace, on the one model optimum-intel loads
            def hooks():
                stack = contextlib.ExitStack()
                stack.enter_context(convert.one_model_load(export.on_model, load_error=export.load_error,
                                                           before_save=export.before_save,
                                                           load_kwargs=language.load_kwargs if language else None))
                stack.enter_context(multimodal.left_out_unreported(language))
                stack.enter_context(both_stage_quantization(opts.calibration_decode_steps, calibration, static=static_plan))
                return stack

            source, exported_type = model, config.model_type
            if language is not None:  # transformers loads the language model alone from the checkpoint's files
                source = str(multimodal.text_view(model, language, staging / "text"))
            if export.reason is None and config.model_type not in supported_model_types():
                # a remote-code wrapper of a type optimum-intel does not export: loaded here, once, to find the
                # inner causal LM its generate() drives, which is saved and exported instead (the wrapper freed)
                source, exported_type = export.decompose_wrapper(load.load_model(model, config, opts))
            task = BASE_TASK if export.reason is None else fallback.fallback_task(config)
            validating = not opts.skip_validation and export.reason is None
            try:
                lifted, fix = convert.convert(raw_export, source, raw, task=task, exported_type=exported_type,
                                              validating=validating, fallback_reason=export.reason, hooks=hooks(),
                                              static=static_plan)
            except convert.InnerModelExport as inner:  # generate() drives an inner causal LM: export that one
                export.inner = True
                lifted, fix = convert.convert(raw_export, str(inner.directory), raw, task=BASE_TASK,
                                              exported_type=export.capture.exported.config.model_type,
                                              validating=validating, fallback_reason=None, hooks=hooks(),
                                              static=static_plan)
            if lifted is not None and export.capture is not None:
                export.capture.notes.append(lifted.note)
            convert.return_freed_memory()  # the PyTorch model is gone: give its pages back before compiling
            if static is not None:
                from .static import finish_static_graph

                finish_static_graph(raw, static_plan, opts)

            # what OpenVINO consumers' loaders read from config.json and the model's config lacks
            extra = {"config_added": added} if (added := consumer_config.complete(raw)) else {}
            if language is not None:
                extra.update(language.manifest_facts())

            # 5. validate and 6. write
            try:
                manifest = write.finish(raw, staging / "final", config, export.capture, export.reason, opts, model,
                                        quantization, calibration, fix=fix,
                                        model_extra=extra)
            except ExportValidationError as err:
                if lifted is not None:
                    raise ExportValidationError(f"{err}; {lifted.refusal}", report=err.report) from err
                raise
            write.move_into_place(staging / "final", output)
        manifest.path = output / MANIFEST_NAME
        return manifest


class _Export:
    """What stages 2 and 4 learn from the model optimum-intel loads: the capture, or the fallback reason."""

    def __init__(self, model: str, config, opts: ExportOptions, static, static_plan, weight_format):
        self.model, self.config, self.opts = model, config, opts
        self.static, self.static_plan, self.weight_format = static, static_plan, weight_format
        self.capture, self.reason, self.inner, self.staging = None, None, False, None
        self.calibrating = False  # a data-aware quantization (known from the options before the export)

    def load_error(self, err: BaseException):
        return load.load_error(self.model, self.config, err)

    def fallback(self, reason: str) -> None:
        task = fallback.fallback_task(self.config)
        _check_fallback_allowed(reason, task, self.opts)
        fallback.warn(reason, task)
        self.reason = reason

    def before_save(self, ov_model) -> None:
        """The graph edits applied to the graph optimum-intel is about to save, so it writes the final graph
        (stage 6 then adds only the manifest to its XML): past lengths read from the key states (for GenAI's
        NPU pipeline, `graph/kv_shapes.py`) and the logits slice. Not for a fallback, a static export (its
        own graph), or a data-aware quantization (which calibrates on optimum-intel's graph as it is)."""
        from ..graph.kv_shapes import read_lengths_from_keys
        from ..graph.logits import slice_logits

        if self.opts.is_static or self.reason is not None or self.calibrating:
            return
        read_lengths_from_keys(ov_model)
        if self.opts.logits == "last" and "logits" in {name for port in ov_model.outputs for name in port.get_names()}:
            slice_logits(ov_model)

    def decompose_wrapper(self, pt_model) -> tuple[str, str]:
        """Stage 2 on a model this export loaded itself (optimum-intel cannot load its type); return the
        source and model type optimum-intel exports: the inner causal LM (saved, then the wrapper freed), or
        the model itself when decomposition found no inner one (then optimum-intel says why it cannot)."""
        import gc

        progress.stage("decomposing generate()")
        self.capture, reason = decompose_model(pt_model, self.model, self.opts, self.config)
        if reason is not None:
            self.fallback(reason)
            return self.model, self.config.model_type
        if self.capture.module is None:
            return self.model, self.config.model_type
        exported_type = self.capture.exported.config.model_type
        directory = save_exported_model(self.capture, self.model, self.staging / "inner",
                                        trust_remote_code=self.opts.trust_remote_code)
        self.inner = True  # optimum-intel's load of the inner model is converted as it is
        release_pytorch(self.capture)
        del pt_model
        gc.collect()
        return str(directory), exported_type

    def on_model(self, pt_model, convert_model, written_to: Path):
        """Stage 2 on the model optimum-intel loaded, then its conversion (3), then the static trace (4)."""
        if self.reason is not None or self.inner:  # a fallback or the inner model's own export: convert as it is
            return convert_model()
        pt_model.eval()
        progress.stage("decomposing generate()")
        self.capture, reason = decompose_model(pt_model, self.model, self.opts, self.config)
        if reason is not None:
            self.fallback(reason)
            return convert_model()
        if self.capture.module is not None:  # generate() drives an inner causal LM: export that model instead
            directory = save_exported_model(self.capture, self.model, self.staging / "inner",
                                            trust_remote_code=self.opts.trust_remote_code)
            release_pytorch(self.capture)
            raise convert.InnerModelExport(directory)
        progress.stage("converting (optimum-intel)")
        if self.static is None:
            release_pytorch(self.capture)  # the capture keeps nothing of the model optimum-intel frees after
            return convert_model()
        result = convert_model()
        from .static import trace_static_graph

        progress.stage("static graph")
        self.capture = trace_static_graph(pt_model, written_to, self.static, self.opts, capture=self.capture,
                                          plan=self.static_plan, weight_format=self.weight_format)
        release_pytorch(self.capture)
        return result


def _check_fallback_allowed(reason: str, export_task: str, opts: ExportOptions) -> None:
    if opts.fallback == "never":
        raise DecompositionError(
            f"{reason}; to export it anyway, use --fallback auto (or --task {export_task}) for optimum-intel's own "
            "partitioning (--fallback never: nothing was written)"
        )
    if opts.is_static:
        raise DecompositionError(
            f"{reason}; --shape-mode static needs the one shared graph, so it has no fallback: use --shape-mode dynamic"
        )

