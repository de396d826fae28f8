"""The `text-generation-shared` export, stage by stage: read this file first.

`run_export()` is shared by the CLI and the Python API. It runs, in order:

1. plan (`plan.py`): every check that needs no weights and every fact the later stages read, decided once in a
   frozen `Plan` (the output directory, the config, a multimodal checkpoint's language model, static shapes, the
   weight format, calibrating or not, the validation's size, a vision-language model's fallback);
2. capture and 3. convert, in `hand_over_to_optimum_intel()`: optimum-intel's own export into a staging directory
   (`convert.py`), which loads the model once and calls back into this package: the capture of the prefill and
   decode calls `generate()` makes, checking one graph can serve both (`decompose.py`, or the fallback,
   `fallback.py`), before its conversion, or in a process of its own while it converts (`capture_beside.py`,
   where the plan says); the both-stage calibration hooks of `quantization/`; the graph edits before it saves;
4. static graph (`static.py`, `--shape-mode static` only): traced on the same model right after its conversion
   (inside the hand-over), then quantized as the flags ask, replacing optimum-intel's graph;
5. validate (`validate.py`): the graph against the captured calls;
6. write (`write.py`): the manifest, the rt_info, the file hashes (the `.bin`'s computed beside stage 5 where
   the plan says); the artifact moved into place, its
   `config.json` completed with what OpenVINO consumers read and the model's config lacks (`consumer_config.py`).

optimum-intel frees the model once converted, so the graph is compiled for validation with no PyTorch weights
in memory. A failure at any stage leaves the output directory as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from .. import progress
from ..errors import DecompositionError, ExportValidationError
from ..manifest import MANIFEST_NAME, Manifest
from ..options import ExportOptions
from ..quantization.both_stages import both_stage_quantization
from ..quantization.calibration import CalibrationReport
from ..registration import supported_model_types
from ..tasks import BASE_TASK
from . import consumer_config, convert, fallback, load, multimodal, validate, write
from .plan import Plan, make_plan
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
        # 1. plan: every check that needs no weights, every fact the later stages read
        progress.stage("loading")
        progress.step("plan")
        plan = make_plan(model, output_dir, opts, quantization=quantization, quantization_config=quantization_config)
        export = _Export(plan)
        if plan.fallback_reason is not None:  # no causal LM to decompose: optimum-intel's own partitioning
            export.fallback(plan.fallback_reason)
        with convert.staging(plan.output) as staging:
            export.staging, raw, calibration = staging, staging / "raw", CalibrationReport()
            # 2. capture and 3. convert (and 4's trace), in the hand-over to optimum-intel's export
            lifted, fix = hand_over_to_optimum_intel(plan, export, raw_export, raw, calibration)
            progress.step("model freed")
            convert.return_freed_memory()  # the PyTorch model is gone: give its pages back before compiling
            if plan.static is not None:  # 4. the static graph quantized as asked, optimum-intel's graph dropped
                from .static import finish_static_graph

                finish_static_graph(raw, plan.static_plan, plan.opts, exported_type=plan.config.model_type)
            extra = _model_facts(plan, raw, fix)
            # the graph's weights hashed in a thread while the validation runs, where the plan says
            digests = write.digests_beside(raw) if plan.digests_beside and export.reason is None else None
            # 5. validate (a fallback is optimum-intel's own partitioning: recorded, not validated here)
            checked = None if export.reason is not None else _validate(plan, export, raw, quantization, calibration,
                                                                        extra, lifted)
            # 6. write
            progress.stage("writing")
            manifest = _write(plan, export, raw, staging / "final", checked, quantization, extra, digests)
            progress.step("move into place")
            write.move_into_place(staging / "final", plan.output)
            progress.step("staging removed")
        manifest.path = plan.output / MANIFEST_NAME
        return manifest


def hand_over_to_optimum_intel(plan: Plan, export: "_Export", raw_export: RawExport, raw: Path, calibration):
    """Stages 2 to 4 on the one model optimum-intel loads: its export runs into `raw` with this package's hooks
    (`convert.one_model_load`: the capture before its conversion, the static trace after, the graph edits before
    it saves; the both-stage calibration; a multimodal checkpoint's left-out weights unreported). Returns the
    lifted transformers cap (or None) and the architecture fix it ran with (or None).

    The one place optimum-intel's export calls back into the package: it loads the model, so the stages that need
    the model run inside its conversion. A wrapper whose `generate()` drives an inner causal LM has that inner
    model saved and exported instead (a second export, `convert.InnerModelExport`)."""
    language, opts = plan.language, plan.opts

    def hooks():
        stack = contextlib.ExitStack()
        stack.enter_context(convert.one_model_load(export.on_model, load_error=export.load_error,
                                                   before_save=export.before_save,
                                                   load_kwargs=language.load_kwargs if language else None,
                                                   on_load=export.on_load if plan.capture_beside else None))
        stack.enter_context(multimodal.left_out_unreported(language))
        stack.enter_context(both_stage_quantization(opts.calibration_decode_steps, calibration, static=plan.static_plan))
        return stack

    source, exported_type = plan.model, plan.config.model_type
    if language is not None:  # transformers loads the language model alone from the checkpoint's files
        source = str(multimodal.text_view(plan.model, language, export.staging / "text"))
    if export.reason is None and plan.config.model_type not in supported_model_types():
        # a remote-code wrapper of a type optimum-intel does not export: loaded here, once, to find the
        # inner causal LM its generate() drives, which is saved and exported instead (the wrapper freed)
        source, exported_type = export.decompose_wrapper(load.load_model(plan.model, plan.config, opts))
    export.exported_type = exported_type  # whose architecture fix edits the converted graph (`before_save`)
    task = BASE_TASK if export.reason is None else fallback.fallback_task(plan.config)
    validating = not opts.skip_validation and export.reason is None
    progress.step("load (optimum-intel)")
    try:
        lifted, fix = convert.convert(raw_export, source, raw, task=task, exported_type=exported_type,
                                      validating=validating, fallback_reason=export.reason, hooks=hooks(),
                                      static=plan.static_plan)
    except convert.InnerModelExport as inner:  # generate() drives an inner causal LM: export that one
        export.inner = True
        export.exported_type = export.capture.exported.config.model_type
        shutil.rmtree(raw, ignore_errors=True)  # what a conversion beside the capture wrote
        lifted, fix = convert.convert(raw_export, str(inner.directory), raw, task=BASE_TASK,
                                      exported_type=export.exported_type,
                                      validating=validating, fallback_reason=None, hooks=hooks(),
                                      static=plan.static_plan)
    except convert.ConvertAgain as again:  # the capture beside the conversion found a fallback: convert as one
        export.fallback(again.reason)
        shutil.rmtree(raw, ignore_errors=True)
        lifted, fix = convert.convert(raw_export, source, raw, task=task, exported_type=exported_type,
                                      validating=False, fallback_reason=export.reason, hooks=hooks(),
                                      static=plan.static_plan)
    finally:
        export.close_beside()
    if lifted is not None and export.capture is not None:
        export.capture.notes.append(lifted.note)
    return lifted, fix


def _model_facts(plan: Plan, raw: Path, fix) -> dict:
    """What the manifest's `model` adds: the architecture fix, the `config.json` keys completed for OpenVINO
    consumers' loaders (`consumer_config.py`), a multimodal checkpoint's language model."""
    extra = {"fixes": [fix.record()]} if fix is not None else {}
    if added := consumer_config.complete(raw):
        extra["config_added"] = added
    if plan.language is not None:
        extra.update(plan.language.manifest_facts())
    return extra


def _validate(plan: Plan, export: "_Export", raw: Path, quantization, calibration, extra: dict, lifted):
    """Stage 5 on the shared graph (`validate.validate_export`); return `(graph_xml, graph, manifest, reference)`.
    A validation failure of an export whose transformers cap was lifted says so."""
    progress.step("graph read, manifest built")
    graph_xml, ov_model, unchanged, manifest = write.prepare(
        raw, plan.shared_graph, plan.config, export.capture, plan.opts, plan.model, quantization, calibration, model_extra=extra)
    try:
        manifest.validation, reference = validate.validate_export(ov_model, export.capture, plan.config, plan.opts,
                                                                  manifest)
    except ExportValidationError as err:
        if lifted is not None:
            raise ExportValidationError(f"{err}; {lifted.refusal}", report=err.report) from err
        raise
    return graph_xml, None if unchanged else ov_model, manifest, reference


def _write(plan: Plan, export: "_Export", raw: Path, final: Path, checked, quantization, extra: dict,
           digests=None) -> Manifest:
    """Stage 6: the artifact written into `final` (`write.py`): the validated graph with its manifest, or a
    fallback's graphs as optimum-intel wrote them."""
    if checked is None:
        return write.finish_fallback(raw, final, plan.config, export.reason, plan.opts, plan.model, quantization,
                                     model_extra=extra)
    graph_xml, graph, manifest, reference = checked
    write.write_artifact(raw, final, {graph_xml: graph}, manifest, reference=reference, digests=digests)
    return manifest


class _Export:
    """What stages 2 and 4 learn from the model optimum-intel loads: the capture, or the fallback reason; the
    callbacks read the plan's facts from `plan`."""

    def __init__(self, plan: Plan):
        self.plan = plan  # read, never changed
        self.capture, self.reason, self.inner, self.staging = None, None, False, None
        self.beside = None  # the capture's own process (`capture_beside.CaptureBeside`), while it runs
        self.exported_type = plan.config.model_type  # the model type optimum-intel converts (set by hand_over)

    def on_load(self, args: tuple, kwargs: dict) -> None:
        """optimum-intel starts loading the model: start the capture beside its conversion, on a load of its own
        with the same arguments (not for the inner model's export, whose capture is done)."""
        from .capture_beside import CaptureBeside

        if self.beside is None and self.reason is None and not self.inner:
            self.beside = CaptureBeside.start(args, kwargs, model=self.plan.model, opts=self.plan.opts,
                                              config=self.plan.config, staging=self.staging)

    def close_beside(self) -> None:
        if self.beside is not None:
            self.beside.close()
            self.beside = None

    def load_error(self, err: BaseException):
        return load.load_error(self.plan.model, self.plan.config, err)

    def fallback(self, reason: str) -> None:
        task = fallback.fallback_task(self.plan.config)
        _check_fallback_allowed(reason, task, self.plan.opts)
        fallback.warn(reason, task)
        self.reason = reason

    def before_save(self, ov_model) -> None:
        """The graph edits applied to the graph optimum-intel is about to save, so it writes the final graph
        (stage 6 then adds only the manifest to its XML): past lengths read from the key states and the forms
        of a tied head's reads GenAI's NPU pipeline partitions (`graph/kv_shapes.py`, `graph/npuw_forms.py`),
        an architecture fix's own edit (`architectures.edit_graph`), and the logits slice. Not for a fallback,
        a static export (its own graph), or a data-aware quantization (which calibrates on optimum-intel's graph
        as it is)."""
        from ..architectures import edit_graph
        from ..graph.kv_shapes import read_lengths_from_keys
        from ..graph.logits import slice_logits
        from ..graph.npuw_forms import npuw_forms

        if self.plan.opts.is_static or self.reason is not None or self.plan.calibrating:
            return
        read_lengths_from_keys(ov_model)
        npuw_forms(ov_model)
        edit_graph(self.exported_type, ov_model)
        if self.plan.opts.logits == "last" and "logits" in {name for port in ov_model.outputs for name in port.get_names()}:
            slice_logits(ov_model)

    def decompose_wrapper(self, pt_model) -> tuple[str, str]:
        """Stage 2 on a model this export loaded itself (optimum-intel cannot load its type); return the
        source and model type optimum-intel exports: the inner causal LM (saved, then the wrapper freed), or
        the model itself when decomposition found no inner one (then optimum-intel says why it cannot)."""
        import gc

        progress.stage("decomposing generate()")
        self.capture, reason = decompose_model(pt_model, self.plan.model, self.plan.opts, self.plan.config)
        if reason is not None:
            self.fallback(reason)
            return self.plan.model, self.plan.config.model_type
        if self.capture.module is None:
            return self.plan.model, self.plan.config.model_type
        exported_type = self.capture.exported.config.model_type
        directory = save_exported_model(self.capture, self.plan.model, self.staging / "inner",
                                        trust_remote_code=self.plan.opts.trust_remote_code)
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
        if self.beside is not None:
            return self._convert_beside_capture(pt_model, convert_model)
        progress.stage("decomposing generate()")
        reason, inner = self._capture_here(pt_model)
        if reason is not None:
            self.fallback(reason)
            return convert_model()
        if inner is not None:  # generate() drives an inner causal LM: export that model instead
            release_pytorch(self.capture)
            raise convert.InnerModelExport(inner)
        progress.stage("converting (optimum-intel)")
        progress.step("conversion (optimum-intel)")
        if self.plan.static is None:
            release_pytorch(self.capture)  # the capture keeps nothing of the model optimum-intel frees after
            result = convert_model()
            progress.step("tokenizer and configs (optimum-intel)")
            return result
        result = convert_model()
        from .static import trace_static_graph

        progress.stage("static graph")
        progress.step("static graph")
        self.capture = trace_static_graph(pt_model, written_to, self.plan.static, self.plan.opts, capture=self.capture,
                                          plan=self.plan.static_plan, weight_format=self.plan.weight_format)
        release_pytorch(self.capture)
        return result

    def _capture_here(self, pt_model) -> tuple[str | None, Path | None]:
        """Stage 2 in this process, on the model optimum-intel loaded: `self.capture`, and the fallback reason (None
        where the model decomposes) and, where generate() drives an inner causal LM, the directory that model was
        saved to for its own export (else None)."""
        progress.step("capture")
        self.capture, reason = decompose_model(pt_model, self.plan.model, self.plan.opts, self.plan.config)
        if reason is not None or self.capture.module is None:
            return reason, None
        return reason, Path(save_exported_model(self.capture, self.plan.model, self.staging / "inner",
                                                trust_remote_code=self.plan.opts.trust_remote_code))

    def _convert_beside_capture(self, pt_model, convert_model):
        """Stage 3 while the capture (2) runs in its own process: optimum-intel's conversion, then the capture's
        answer. A fallback or an inner model it finds converts again (`ConvertAgain`, `InnerModelExport`); where the
        child failed, the capture runs here, on the model optimum-intel loaded."""
        progress.stage("converting (optimum-intel)")
        progress.step("conversion (optimum-intel), the capture beside it")
        result = convert_model()
        progress.step("capture beside: waited for")
        beside, self.beside = self.beside, None
        try:
            answer = beside.result()
        finally:
            beside.close()
        if answer is None:  # the child failed: the capture here, as without it
            reason, inner = self._capture_here(pt_model)
        else:
            self.capture, reason, inner = answer
        if reason is not None:
            raise convert.ConvertAgain(reason)
        release_pytorch(self.capture)
        if inner is not None:
            raise convert.InnerModelExport(Path(inner))
        progress.step("tokenizer and configs (optimum-intel)")
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

