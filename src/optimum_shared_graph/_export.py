"""The `text-generation-shared` export pipeline (SPEC section 4)."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from ._calibration import (
    CalibrationReport, both_stage_quantization, check_static_quantization, is_data_aware, resolve_config_dataset,
)
from ._decompose import DEFAULT_PROMPT, Capture, check_one_graph_serves_both, decompose, save_exported_model
from . import _fallback
from ._errors import (
    ArtifactWriteError, DecompositionError, ExportValidationError, ModelNotSupportedError, SharedGraphError,
)
from ._manifest import (
    GRAPH_BIN, GRAPH_XML, MANIFEST_NAME, RT_INFO_KEY, Manifest, describe_ports, hash_graph_files,
)
from ._options import ExportOptions
from . import _progress
from ._registration import BASE_TASK, TASK, register, supported_model_types
from ._version_cap import lifted_cap

logger = logging.getLogger("optimum_shared_graph")

RawExport = Callable[[str, Path], None]


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
            return run_export(tmp, output_dir, opts, raw_export=_api_raw_export(opts), quantization=quantization)
    return run_export(str(model_or_path), output_dir, opts, raw_export=_api_raw_export(opts), quantization=quantization)


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


def _api_raw_export(opts: ExportOptions) -> RawExport:
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


def run_export(
    model: str,
    output_dir: str | os.PathLike,
    opts: ExportOptions,
    *,
    raw_export: RawExport,
    quantization: dict[str, Any] | None = None,
    quantization_config: Callable[[], Any] | None = None,
) -> Manifest:
    """The pipeline shared by the CLI and the API: check, decompose, export, transform, validate, move.

    Args:
        model: a hub id or a local directory.
        output_dir: the final artifact directory.
        opts: the export options.
        raw_export: runs optimum-intel's `text-generation-with-past` export of a model path into a
            directory (the CLI passes optimum-intel's own command so all its flags apply).
        quantization: what the manifest records of the quantization flags.
        quantization_config: returns the quantization config the CLI's flags give (without exporting),
            so a static export checks it before any export work.
    """
    stages = ["loading", "decomposing generate()", "converting (optimum-intel)"]
    stages += (["static graph"] if opts.is_static else []) + ([] if opts.skip_validation else ["validating"])
    with _progress.export_progress(stages + ["writing"], quiet=opts.quiet):
        return _run_export(model, output_dir, opts, raw_export=raw_export, quantization=quantization,
                           quantization_config=quantization_config)


def _run_export(model: str, output_dir: str | os.PathLike, opts: ExportOptions, *, raw_export: RawExport,
                quantization: dict[str, Any] | None, quantization_config: Callable[[], Any] | None = None) -> Manifest:
    _progress.stage("loading")
    register()
    output = Path(output_dir).absolute()
    _check_output(output)
    config = _load_config(model, opts)
    static, calibrating = None, False
    if opts.is_static:  # checked against the model's config before any export work
        from ._static import resolve_static_shapes

        static = resolve_static_shapes(config, opts)  # refuses an API quantization_config that is not data-aware
        cli_config = quantization_config() if quantization_config is not None else None
        if cli_config is not None:  # the CLI's quantization flags, as optimum-intel reads them
            check_static_quantization(static, opts.calibration_decode_steps, cli_config)
        calibrating = opts.quantization_config is not None or is_data_aware(cli_config)
    pt_model = _load_model(model, config, opts)
    _progress.stage("decomposing generate()")
    capture, reason = _decompose(pt_model, model, opts, config)
    export_task = BASE_TASK if reason is None else _fallback.fallback_task(config)
    if reason is not None and opts.fallback == "never":
        raise DecompositionError(
            f"{reason}; to export it anyway, use --fallback auto (or --task {export_task}) for optimum-intel's own partitioning "
            "(--fallback never: nothing was written)"
        )
    if reason is not None and opts.is_static:  # before any warning or export work
        raise DecompositionError(
            f"{reason}; --shape-mode static needs the one shared graph, so it has no fallback: use --shape-mode dynamic"
        )
    if reason is not None:
        _fallback.warn(reason, export_task)

    _progress.stage("converting (optimum-intel)")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".partial", dir=output.parent))
    except OSError as err:
        raise _write_error(output.parent, err, _disk_problem(output.parent, err)) from err
    try:
        with _disk_errors_reported(output.parent):  # staging is a directory in output.parent, on its disk
            raw = staging / "raw"
            calibration = CalibrationReport()  # filled when data-aware quantization calibrates
            final = staging / "final"
            source = model
            if capture is not None and capture.module is not None:  # the inner causal LM generate() drives
                source = str(save_exported_model(capture, model, staging / "inner", trust_remote_code=opts.trust_remote_code))
            if static is None:  # validation needs only the captured calls: free the fp32 copy before optimum-intel loads its own
                pt_model = None
                _release_pytorch(capture)
            try:
                if export_task == BASE_TASK:
                    cap_type = capture.exported.config.model_type if source != model else config.model_type
                    # past optimum-intel's transformers cap only when validation will guard the graph
                    # (a fallback is not validated: no captured calls to check it against)
                    with lifted_cap(cap_type, BASE_TASK, validating=not opts.skip_validation and reason is None,
                                    fallback_reason=reason) as lifted:
                        with both_stage_quantization(opts.calibration_decode_steps, calibration), _no_dynamic_graph(static, calibrating):
                            raw_export(source, raw)
                    if lifted is not None and capture is not None:
                        capture.notes.append(lifted.note)
                else:  # optimum-intel's own partitioning for a vision-language model
                    raw_export(source, raw, task=export_task)
            except SharedGraphError:
                raise
            except (Exception, SystemExit) as err:  # optimum-intel reports with ValueError, RuntimeError, ...
                problem = _disk_problem(output.parent, err)
                if problem is not None:  # a full disk, not the model: say so
                    raise _write_error(output.parent, err, problem) from err
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                exported_type = capture.exported.config.model_type if source != model else config.model_type
                raise ModelNotSupportedError(
                    f"optimum-intel could not export {exported_type} as {export_task}: {first}"
                ) from err
            if static is not None:  # --shape-mode static: the static graph replaces optimum-intel's dynamic one
                from ._static import write_static_graph

                _progress.stage("static graph")
                capture = write_static_graph(pt_model, raw, static, opts, capture=capture, reason=reason,
                                             weight_format=(quantization or {}).get("weight_format") or opts.weight_format)
            try:
                manifest = _finish(raw, final, config, capture, reason, opts, model, quantization, calibration)
            except ExportValidationError as err:
                if export_task == BASE_TASK and lifted is not None:
                    raise ExportValidationError(f"{err}; {lifted.refusal}", report=err.report) from err
                raise
            _move_into_place(final, output)
        manifest.path = output / MANIFEST_NAME
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# Below this many free bytes after a failed write, the disk is taken to be what failed it.
_NEARLY_FULL = 64 * 2**20


@contextlib.contextmanager
def _disk_errors_reported(where: Path):
    """Turn a failure of the disk holding `where` into one `ArtifactWriteError` line.

    OpenVINO's writer fails with `RuntimeError("basic_ios::clear: iostream error")`, Python's with
    `OSError`; any other error, and any error while the disk is fine, goes through unchanged.
    """
    try:
        yield
    except (OSError, RuntimeError) as err:
        problem = None if isinstance(err, SharedGraphError) else _disk_problem(where, err)
        if problem is None:
            raise
        raise _write_error(where, err, problem) from err


def _free_bytes(where: Path) -> int | None:
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


def _disk_problem(where: Path, err: BaseException) -> str | None:
    """"full" or "denied" when `err` (from any library) comes from the disk holding `where`, else None.

    Checked before the staging directory is removed: a write that filled the disk leaves it nearly full.
    """
    code = getattr(err, "errno", None)
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "full"
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "denied"
    free = _free_bytes(where)
    return "full" if free is not None and free < _NEARLY_FULL else None


def _write_error(where: Path, err: BaseException, problem: str | None) -> ArtifactWriteError:
    """One line for an artifact that cannot be written into `where` (`problem` from `_disk_problem`)."""
    if problem == "full":
        return ArtifactWriteError(
            f"no space left on the disk holding {where} ({(_free_bytes(where) or 0) / 2**20:,.0f} MB free) while "
            "writing the artifact: free some space or choose an output directory on another disk (nothing was written)"
        )
    reason = getattr(err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[0]
    return ArtifactWriteError(
        f"cannot write the artifact into {where}: {reason}; choose an output directory you can write to "
        "(nothing was written)"
    )


def _no_dynamic_graph(static, calibrating: bool):
    """A static export needs optimum-intel's configs, tokenizer and rt_info, not its dynamic graph.

    Unless it calibrates: `quantize_static_graph` loads optimum-intel's (stateless) export as an
    `OVModelForCausalLM` for its quantization entry point, which needs the dynamic graph.
    """
    if static is None or calibrating:
        return contextlib.nullcontext()
    from ._static import without_dynamic_graph

    return without_dynamic_graph()


def _check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise SharedGraphError(f"output {output} exists and is not a directory: choose a directory path")
    if output.is_dir() and any(output.iterdir()) and not (output / MANIFEST_NAME).is_file():
        raise SharedGraphError(
            f"output directory {output} is not empty and holds no {MANIFEST_NAME}: choose a new or empty directory"
        )


def _load_config(model: str, opts: ExportOptions):
    from transformers import AutoConfig

    # "org/name" is a hub id; anything that looks like a file system path must exist.
    looks_local = model.startswith(("/", ".", "~")) or model.count("/") > 1 or "\\" in model
    if (looks_local or os.path.exists(model)) and not os.path.isdir(model):
        raise ModelNotSupportedError(f"model path {model} does not exist: pass a model directory or a hub model id")
    try:
        config = AutoConfig.from_pretrained(model, trust_remote_code=opts.trust_remote_code)
    except ValueError as err:
        text = str(err)
        if "trust_remote_code" in text:
            raise ModelNotSupportedError(
                f"{model} needs custom code from its repository: pass --trust-remote-code if you trust it"
            ) from err
        raise ModelNotSupportedError(f"cannot read the configuration of {model}: {text.splitlines()[0]}") from err
    except (OSError, KeyError) as err:
        raise ModelNotSupportedError(
            f"cannot load {model}: {str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__}; "
            "pass a model directory with a config.json or a hub model id"
        ) from err
    model_type = getattr(config, "model_type", None)
    supported = supported_model_types()
    if model_type not in supported:
        if _fallback.is_vision_language(config) or (opts.trust_remote_code and getattr(config, "auto_map", None)):
            return config  # decomposition decides: a VLM falls back, a remote-code wrapper may delegate
        from optimum.exporters.tasks import TasksManager

        tasks = TasksManager._SUPPORTED_MODEL_TYPE.get(model_type, {}).get("openvino")
        if tasks:
            raise ModelNotSupportedError(
                f"{model} is a {model_type} model, not a causal language model: the OpenVINO exporter supports it for "
                f"{', '.join(sorted(tasks))}, not for {TASK}"
            )
        raise ModelNotSupportedError(
            f"model type {model_type!r} is not known to optimum-intel's OpenVINO exporter, so {TASK} cannot export it; "
            "see `optimum_shared_graph.supported_model_types()`"
        )
    return config


def _load_model(model: str, config, opts: ExportOptions):
    import torch
    from transformers import AutoModelForCausalLM

    if _fallback.is_vision_language(config):
        return None  # no causal LM to load: _decompose() gives the reason and the fallback takes over
    try:
        pt_model = AutoModelForCausalLM.from_pretrained(
            model, config=config, torch_dtype=torch.float32, trust_remote_code=opts.trust_remote_code
        )
    except ValueError as err:
        raise ModelNotSupportedError(
            f"{model} ({config.model_type}) is not a causal language model transformers can load: "
            f"{str(err).splitlines()[0]}"
        ) from err
    except Exception as err:  # a corrupt or truncated weights file (safetensors, torch), a missing shard, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ModelNotSupportedError(
            f"cannot load the weights of {model}: {type(err).__name__}: {first}; check that its weight files are "
            "complete (re-download or re-save the model)"
        ) from err
    return pt_model.eval()


def _sample_inputs(model: str, pt_model, opts: ExportOptions):
    import torch

    text = opts.validation_prompt or DEFAULT_PROMPT
    vocab = pt_model.config.get_text_config().vocab_size
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=opts.trust_remote_code)
        ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :48]
    except Exception:  # no tokenizer shipped
        ids = None
    # transformers may build an empty tokenizer for a directory without tokenizer files; a prompt
    # that is empty or out of the vocabulary cannot validate anything: use a fixed pseudo-random one.
    if ids is None or ids.shape[1] < 2 or int(ids.max()) >= vocab:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, vocab, (1, 24), generator=generator)
    return ids, torch.ones_like(ids)


def _decompose(pt_model, model: str, opts: ExportOptions, config=None) -> tuple[Capture | None, str | None]:
    """Capture prefill and decode calls; return (capture, None) or (None, fallback reason).

    The calls are recorded on the top-level `forward()`, or on the inner causal LM that a wrapper's
    `generate()` really drives (then `capture.module` names it and that model is exported). A
    vision-language model (`pt_model` None) is not captured: its prefill takes image inputs that
    decode steps never take, which is the reason returned.
    """
    if pt_model is None:
        return None, _fallback.vision_language_reason(config)
    ids, mask = _sample_inputs(model, pt_model, opts)

    def exportable(inner) -> str | None:
        model_type = getattr(inner.config, "model_type", None)
        if model_type in supported_model_types():
            return None
        return f"is a {model_type} model, which optimum-intel does not export as {BASE_TASK}"

    try:
        capture = decompose(pt_model, ids, mask, opts.validation_new_tokens, exportable=exportable)
        check_one_graph_serves_both(capture)
    except DecompositionError as err:
        if "needs a separate prefill graph" in str(err):
            raise
        return None, str(err)
    return capture, None


class _Released:
    """Stands in for a released PyTorch model: its class name and config, none of its weights."""

    def __init__(self, model):
        self.config = model.config
        self.architecture = type(model).__name__


def _release_pytorch(capture) -> None:
    """Drop the capture's reference to the PyTorch model and collect it (the caller drops its own first).

    A dynamic export validates against the captured calls (inputs and the logits PyTorch returned), so
    the fp32 copy loaded for the decomposition is not needed while optimum-intel converts the model from
    its own load: releasing it keeps the two loads from adding up (a model passed in by the caller stays
    the caller's).
    """
    import gc

    if capture is not None and capture.exported is not None:
        capture.exported = _Released(capture.exported)
    gc.collect()


def _exported_module(capture) -> dict:
    """What the manifest records when the shared graph is a wrapper's inner causal LM."""
    if capture is None or capture.module is None:
        return {}
    inner = capture.exported
    return {"exported_module": capture.module, "exported_model_type": inner.config.model_type,
            "exported_architecture": getattr(inner, "architecture", type(inner).__name__)}


def _finish(raw: Path, final: Path, config, capture, reason, opts, model, quantization, calibration=None) -> Manifest:
    import openvino as ov

    if reason is not None:
        _progress.stage("writing")
        return _fallback.finish_fallback(raw, final, config, reason, opts, model, quantization)
    graphs = sorted(p.name for p in raw.glob("openvino_*model*.xml") if "tokenizer" not in p.name)
    if graphs != [GRAPH_XML]:
        raise SharedGraphError(
            f"optimum-intel wrote {len(graphs)} graphs ({', '.join(graphs)}) for {config.model_type}, not one "
            "decoder graph: use --fallback auto for this model"
        )
    core = ov.Core()
    ov_model = core.read_model(raw / GRAPH_XML)
    weight_format = (quantization or {}).get("weight_format") or opts.weight_format
    quant_mode = (quantization or {}).get("quant_mode")
    if opts.logits == "last" and not opts.is_static:  # static graphs slice their own logits
        from ._transforms import slice_logits_to_last_position

        slice_logits_to_last_position(ov_model)
    stateful = not any(p.get_any_name().startswith("past_key_values") for p in ov_model.inputs)
    requires = ["generation"] + (["stateless"] if not stateful else []) + (["logits-all"] if opts.logits == "all" else [])
    requires += ["static"] if opts.is_static else []
    manifest = Manifest(
        task=TASK,
        partitioning="shared",
        shape_mode=opts.shape_mode,
        logits=opts.logits,
        stateful=stateful,
        requires=requires,
        static=_static_shapes_of(ov_model) if opts.is_static else None,
        model={"source": str(model), "model_type": config.model_type,
               "architecture": (getattr(config, "architectures", None) or [None])[0], **_exported_module(capture),
               **({"notes": list(capture.notes)} if capture is not None and capture.notes else {})},
        graph={
            "files": graphs,
            "inputs": describe_ports(ov_model.inputs),
            "outputs": describe_ports(ov_model.outputs),
            "states": len(ov_model.get_sinks()),
        },
        quantization={
            "weight_format": weight_format or "fp32",
            "quant_mode": quant_mode,
            "dataset": (quantization or {}).get("dataset"),
            "calibration_samples": calibration.counts() if calibration else {"prefill": 0, "decode": 0},
            **({"calibration_decode_steps": calibration.decode_steps, "calibration_graph": calibration.graph}
               if calibration and calibration.graph else {}),
        },
    )
    if opts.skip_validation:
        manifest.validation = {"status": "skipped", "reason": "--skip-validation"}
    else:
        from ._session import GraphSession
        from ._static import StaticSession
        from ._validation import validate_graph

        _progress.stage("validating")
        exported_type = capture.exported.config.model_type if capture.module is not None else config.model_type
        session = StaticSession if opts.is_static else functools.partial(GraphSession, model_type=exported_type)
        manifest.validation = validate_graph(
            ov_model, capture, weight_format if not quant_mode else "int8", session_class=session
        )
    _progress.stage("writing")
    for key, value in manifest.rt_info().items():
        ov_model.set_rt_info(value, [RT_INFO_KEY, key])
    final.mkdir()
    for item in raw.iterdir():
        if item.name not in (GRAPH_XML, GRAPH_BIN):
            shutil.move(str(item), final / item.name)
    ov.save_model(ov_model, final / GRAPH_XML, compress_to_fp16=False)
    del ov_model
    manifest.files = hash_graph_files(final, [GRAPH_BIN, GRAPH_XML])
    manifest.write(final)
    return manifest


def _static_shapes_of(ov_model) -> dict[str, int]:
    from ._static import shapes_of

    return shapes_of(ov_model).to_dict()


def _move_into_place(final: Path, output: Path) -> None:
    """Put `final` at `output` by renames on the same filesystem; an old artifact there is replaced."""
    if output.is_dir():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.rename(output, old)
        try:
            os.rename(final, output)
        except OSError:
            os.rename(old, output)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(final, output)
