"""`optimum-cli export openvino --task text-generation-shared`: the flags, the run, and `register()`,
which patches optimum-intel's `export openvino` command (the optimum-cli hook calls it)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from .errors import SharedGraphError
from .host import export_command_extended
from .options import FALLBACK_MODES, LOGITS_MODES, SHAPE_MODES, ExportOptions
from .registration import register_tasks_on_import
from .tasks import BASE_TASK, TASK, VLM_SHARED_TASK, VLM_TASK

# flag -> ExportOptions field. Flags default to None so we can tell which ones were given.
_FLAGS = {
    "shape_mode": "--shape-mode",
    "max_cache_len": "--max-cache-len",
    "static_batch_size": "--static-batch-size",
    "static_query_len": "--static-query-len",
    "logits": "--logits",
    "fallback": "--fallback",
    "skip_validation": "--skip-validation",
    "calibration_decode_steps": "--calibration-decode-steps",
    "validation_new_tokens": "--validation-tokens",
    "quiet": "--quiet",
}


def add_arguments(parser) -> None:
    """Add the plugin flags to `optimum-cli export openvino`."""
    group = parser.add_argument_group(
        f"{TASK} options (optimum-shared-graph)",
        f"Only with --task {TASK}: one decoder graph for prompt prefill and decode.",
    )
    group.add_argument("--shape-mode", choices=SHAPE_MODES, default=None,
                       help="dynamic (default): optimum-intel's dynamic interface; static: every shape fixed.")
    group.add_argument("--max-cache-len", type=int, default=None, metavar="N",
                       help="Static only: KV cache capacity (default: the model's max positions, capped at 2048).")
    group.add_argument("--static-batch-size", type=int, default=None, metavar="N",
                       help="Static only: fixed batch size (default 1).")
    group.add_argument("--static-query-len", type=int, default=None, metavar="C",
                       help="Static only: query tokens per call (default 1; C > 1 prefills C tokens per call).")
    group.add_argument("--logits", choices=LOGITS_MODES, default=None,
                       help="last (default): logits for the last position only; all: every position (assisted decoding).")
    group.add_argument("--fallback", choices=FALLBACK_MODES, default=None,
                       help="auto (default): use optimum-intel's partitioning when decomposition fails; never: fail.")
    group.add_argument("--skip-validation", action="store_true", default=None,
                       help="Do not check the exported graph against the PyTorch model.")
    group.add_argument("--validation-tokens", type=int, default=None, metavar="N", dest="validation_new_tokens",
                       help="Greedy tokens validated (a prefill and N-1 decode calls; at least 4). Default: 4 to 16, "
                            "so the capture reads about 4 GB of weights (16 under 0.25 GB, 4 from 1 GB); 4 when the "
                            "checkpoint does not fit in memory (each call rereads it from disk).")
    group.add_argument("--calibration-decode-steps", type=int, default=None, metavar="N",
                       help="Data-aware quantization: decode calls calibrated after each text's prefill, with the "
                            "real KV cache (0: prefill only). Default: 16 for GPTQ alone, 0 for every other data-aware "
                            "quantization (--quant-mode, AWQ, scale estimation, mixed precision: measured no better "
                            "with decode calls), 4 for static graphs and vision-language models. --dataset may also "
                            "be a local text file, one sample per line.")
    group.add_argument("--quiet", action="store_true", default=None,
                       help="No progress display (shown on stderr only when it is a terminal); the summary line "
                            "is still printed.")


def options_from_args(args) -> ExportOptions:
    """Build the export options from parsed `optimum-cli` arguments."""
    given = {field: getattr(args, field) for field in _FLAGS if getattr(args, field, None) is not None}
    return ExportOptions(
        **given,
        stateful=not args.disable_stateful,
        weight_format=args.weight_format,
        trust_remote_code=args.trust_remote_code,
        convert_tokenizer=not args.disable_convert_tokenizer,
    )


def run(command, original_run) -> None:
    """Run `optimum-cli export openvino`: our pipeline for our task, optimum-intel's otherwise."""
    args = command.args
    if args.task == VLM_SHARED_TASK:
        return _run_vlm(command, original_run)
    if args.task != TASK:
        given = [flag for field, flag in _FLAGS.items() if getattr(args, field, None) is not None]
        if given:
            _fail(f"{', '.join(given)} only applies with --task {TASK}")
        return original_run(command)

    from .pipeline import export as pipeline

    def raw_export(model_path: str, output: Path, task: str = BASE_TASK) -> None:
        # optimum-intel's own command does the export and quantization, so every one of its flags
        # keeps its meaning; it sees the with-past task so the graph is stateful and the
        # quantization reload uses the cache (or image-text-to-text, for a VLM's fallback).
        # a local --dataset text file reaches optimum-intel as its list of lines
        from .quantization.calibration import resolve_dataset

        saved = (args.model, args.output, args.task, args.dataset)
        args.model, args.output, args.task = model_path, output, task
        args.dataset = resolve_dataset(args.dataset)
        try:
            original_run(command)
        finally:
            args.model, args.output, args.task, args.dataset = saved

    def quantization_config():
        # optimum-intel's command builds the config from its flags and is stopped before it exports
        from .quantization.both_stages import quantization_config_of

        return quantization_config_of(lambda: raw_export(args.model, Path(args.output)))

    try:
        options = options_from_args(args)
        quant = {"weight_format": args.weight_format, "quant_mode": args.quant_mode, "dataset": args.dataset}
        with _interrupts_fail_in_one_line(args.output):
            manifest = pipeline.run_export(args.model, args.output, options, raw_export=raw_export,
                                           quantization=quant, quantization_config=quantization_config)
    except SharedGraphError as err:
        if os.environ.get("OPTIMUM_SHARED_GRAPH_DEBUG"):
            raise
        _fail(str(err))
    print(manifest.summary(), file=sys.stderr)


# the flags `--task image-text-to-text-shared` takes (the others fix what it does not do yet: a static graph, ...)
_VLM_FLAGS = ("logits", "skip_validation", "validation_new_tokens", "calibration_decode_steps", "quiet")


def _run_vlm(command, original_run) -> None:
    """`--task image-text-to-text-shared`: optimum-intel's own `image-text-to-text` export (all its flags) with the
    language model as the shared graph, validated (`pipeline/vlm.py`)."""
    args = command.args
    given = [flag for field, flag in _FLAGS.items() if field not in _VLM_FLAGS and getattr(args, field, None) is not None]
    if given:
        _fail(f"{', '.join(given)} does not apply with --task {VLM_SHARED_TASK}")

    from .pipeline import vlm

    def raw_export(model_path: str, output: Path, task: str) -> None:
        # a local --dataset file of images and instructions reaches optimum-intel's config as its instructions (a
        # list it accepts); the calibration itself reads the file (quantization/visual.py)
        saved = (args.model, args.output, args.task, args.dataset)
        args.model, args.output, args.task = model_path, output, task
        if isinstance(args.dataset, str) and os.path.isfile(args.dataset):
            from .quantization.visual import read_dataset_file

            args.dataset = [item.text for item in read_dataset_file(args.dataset)]
        try:
            original_run(command)
        finally:
            args.model, args.output, args.task, args.dataset = saved

    def quantization_config():
        # optimum-intel's command builds the config from its flags and is stopped before it exports
        from .quantization.both_stages import quantization_config_of

        return quantization_config_of(lambda: raw_export(args.model, Path(args.output), VLM_TASK))

    try:
        options = options_from_args(args)
        quant = {"weight_format": args.weight_format, "quant_mode": args.quant_mode, "dataset": args.dataset}
        with _interrupts_fail_in_one_line(args.output):
            manifest = vlm.run_vlm_export(args.model, args.output, options, raw_export=raw_export,
                                          quantization=quant, quantization_config=quantization_config)
    except SharedGraphError as err:
        if os.environ.get("OPTIMUM_SHARED_GRAPH_DEBUG"):
            raise
        _fail(str(err))
    print(manifest.summary(), file=sys.stderr)


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C (SIGINT) raises `KeyboardInterrupt`: what handles one (the
    staging directory's removal, the lock's release) handles both, and no `except Exception` stops it."""


@contextlib.contextmanager
def _interrupts_fail_in_one_line(output):
    """An export stopped by SIGINT (Ctrl-C) or SIGTERM (`kill`) unwinds as an exception, so the staging directory
    beside `output` is removed and `output` is left as it was, then ends with one line and exit status 128 + the
    signal's number (130, 143), no traceback. SIGKILL cannot be caught: its staging directory is removed by the
    next export into the same place (`convert.remove_dead_staging`).

    The signal is remembered as well as raised: one that arrives inside `torch.jit.trace` reaches us re-raised by
    optimum-intel as another error ("Couldn't get TorchScript module by tracing"), still an interruption."""
    received: list[signal.Signals] = []

    def interrupted(signum, frame):
        received.append(signal.Signals(signum))
        raise _Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    main = threading.current_thread() is threading.main_thread()
    before = {s: signal.signal(s, interrupted) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    except BaseException as err:
        if not (received or isinstance(err, KeyboardInterrupt)) or os.environ.get("OPTIMUM_SHARED_GRAPH_DEBUG"):
            raise
        signum = received[0] if received else signal.SIGTERM if isinstance(err, _Terminated) else signal.SIGINT
        print(f"error: interrupted by {signum.name}: the export stopped and wrote nothing ({output} is as it was); "
              "run the command again to export", file=sys.stderr)
        raise SystemExit(128 + signum) from None
    finally:
        for s, handler in before.items():
            signal.signal(s, signal.SIG_DFL if handler is None else handler)


_lock = threading.Lock()


def register() -> None:
    """Make `--task text-generation-shared` and its flags available in Optimum. Idempotent.

    Patches optimum-intel's `export openvino` command (already imported by optimum-intel's own
    optimum-cli hook) and registers the task in `TasksManager` as soon as optimum-intel's OpenVINO
    exporter is imported, so `optimum-cli --help` does not pay for importing torch.

    Example:
        >>> import optimum_shared_graph
        >>> optimum_shared_graph.register()
        >>> optimum_shared_graph.register()  # a second call changes nothing
    """
    with _lock:
        export_command_extended(add_arguments, run)  # host/: optimum-intel's command, for the process
        register_tasks_on_import()
