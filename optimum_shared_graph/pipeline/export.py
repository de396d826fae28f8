"""The `text-generation-shared` export, stage by stage: read this file first.

`run_export()` is shared by the CLI and the Python API. It runs, in order:

1. load (`load.py`): check the output directory, read the config, load the PyTorch model;
2. decompose (`decompose.py`): record the prefill and decode calls `generate()` makes, and check that
   one graph can serve both (or find the reason it cannot: then the fallback, `fallback.py`);
3. convert (`convert.py`): optimum-intel's own export into a staging directory, with the both-stage
   calibration hooks of `quantization/` when a data-aware quantization is asked for;
4. static trace (`static.py`, `--shape-mode static` only): the static graph replaces optimum-intel's;
5. validate (`validate.py`): the graph against the captured calls;
6. write (`write.py`): the manifest, the rt_info, the file hashes; the artifact moved into place.

A failure at any stage leaves the output directory as it was.
"""

from __future__ import annotations

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
from ..registration import register_tasks
from ..tasks import BASE_TASK
from . import convert, fallback, load, write
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
        # 1. load: every check that needs no model comes before the model is loaded
        progress.stage("loading")
        register_tasks()
        output = Path(output_dir).absolute()
        load.check_output(output)
        config = load.load_config(model, opts)
        static, static_plan = None, None
        if opts.is_static:
            from .static import resolve_static_shapes

            static = resolve_static_shapes(config, opts)
            cli_config = quantization_config() if quantization_config is not None else None
            if cli_config is not None:  # the CLI's quantization flags, as optimum-intel reads them
                check_static_quantization(static, opts.calibration_decode_steps, cli_config)
            static_plan = plan_static_quantization(
                static, opts, calibrating=opts.quantization_config is not None or is_data_aware(cli_config))
        pt_model = load.load_model(model, config, opts)

        # 2. decompose
        progress.stage("decomposing generate()")
        capture, reason = decompose_model(pt_model, model, opts, config)
        export_task = BASE_TASK if reason is None else fallback.fallback_task(config)
        if reason is not None:
            _check_fallback_allowed(reason, export_task, opts)
            fallback.warn(reason, export_task)

        # 3. convert
        progress.stage("converting (optimum-intel)")
        with convert.staging(output) as staging:
            source = model
            if capture is not None and capture.module is not None:  # the inner causal LM generate() drives
                source = str(save_exported_model(capture, model, staging / "inner", trust_remote_code=opts.trust_remote_code))
            if static is None:  # validation needs only the captured calls: free the PyTorch model first
                pt_model = None
                release_pytorch(capture)
            calibration = CalibrationReport()
            raw = staging / "raw"
            lifted = convert.convert(
                raw_export, source, raw, task=export_task, model=model, config=config, capture=capture, reason=reason,
                opts=opts, hooks=both_stage_quantization(opts.calibration_decode_steps, calibration, static=static_plan),
                static=static_plan,
            )

            # 4. static trace
            if static is not None:
                from .static import write_static_graph

                progress.stage("static graph")
                capture = write_static_graph(
                    pt_model, raw, static, opts, capture=capture, plan=static_plan,
                    weight_format=(quantization or {}).get("weight_format") or opts.weight_format,
                )
                pt_model = None

            # 5. validate and 6. write
            try:
                manifest = write.finish(raw, staging / "final", config, capture, reason, opts, model, quantization,
                                        calibration)
            except ExportValidationError as err:
                if lifted is not None:
                    raise ExportValidationError(f"{err}; {lifted.refusal}", report=err.report) from err
                raise
            write.move_into_place(staging / "final", output)
        manifest.path = output / MANIFEST_NAME
        return manifest


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
