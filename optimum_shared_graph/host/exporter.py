"""optimum-intel's OpenVINO exporter (`optimum.exporters.openvino`): its entry points and conversion steps,
each wrapped for one export, and an export config's transformers cap lifted for one export.

optimum-intel reaches every one of them by name at call time (`main_export` imports `export_from_model` in its
body, `OVExportCommand.run` imports `main_export` and `_main_quantize` in its body, `export` and `export_pytorch`
call `export_pytorch` and `_save_model` as module globals), so a replaced module attribute is what it calls;
`tests/test_host.py` checks that this still holds.
"""

from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any, Callable, Iterator

from ._swap import replaced


@contextlib.contextmanager
def models_handed_over(on_model: Callable) -> Iterator[None]:
    """While active, optimum-intel's `export_from_model(model, output, ...)` calls `on_model(model, convert,
    output)` instead and returns what it returns: `convert()` runs optimum-intel's conversion of that model with
    the call's arguments, `output` is the directory it writes into."""
    import optimum.exporters.openvino.convert as ov_convert

    original = ov_convert.export_from_model

    def export_from_model(model, *args, **kwargs):
        output = Path(kwargs["output"] if "output" in kwargs else args[0])  # where optimum-intel writes now
        return on_model(model, lambda: original(model, *args, **kwargs), output)

    with replaced(ov_convert, "export_from_model", export_from_model):
        yield


@contextlib.contextmanager
def graphs_before_save(before_save: Callable[[Any, Any], None]) -> Iterator[None]:
    """While active, `before_save(ov_model, ov_config)` runs on each graph optimum-intel's `_save_model(model,
    path, ov_config, ...)` is about to save (it may edit the graph in place), then optimum-intel saves it."""
    import optimum.exporters.openvino.convert as ov_convert

    original = ov_convert._save_model

    def save_model(model, *args, **kwargs):
        before_save(model, kwargs.get("ov_config", args[1] if len(args) > 1 else None))
        return original(model, *args, **kwargs)

    with replaced(ov_convert, "_save_model", save_model):
        yield


@contextlib.contextmanager
def dynamic_graph_skipped() -> Iterator[None]:
    """While active, optimum-intel's export writes everything but its dynamic decoder graph.

    `export_pytorch` neither traces nor converts: it saves, through optimum-intel's own `_save_model` (looked up
    when called, so `graphs_before_save` sees it), a one-input placeholder graph carrying the rt_info optimum-intel
    writes into every IR (its version, the export config's runtime options), and returns the config's inputs and
    outputs as the conversion would. optimum-intel still loads the model, checks its transformers version limits,
    saves the configs and converts the tokenizer.
    """
    import openvino as ov
    import optimum.exporters.openvino.convert as ov_convert

    original = ov_convert.export_pytorch
    signature = inspect.signature(original)

    def export_pytorch(*args, **kwargs):
        arguments = signature.bind(*args, **kwargs).arguments
        config = arguments["config"]
        ids = ov.opset13.parameter([-1, -1], ov.Type.i64, name="input_ids")
        placeholder = ov.Model([ov.opset13.result(ids)], [ids], "static-export-placeholder")
        ov_convert._save_model(placeholder, arguments["output"], ov_config=None,
                               library_name=arguments.get("library_name") or "transformers", config=config)
        return list(config.inputs), list(config.outputs), False

    with replaced(ov_convert, "export_pytorch", export_pytorch):
        yield


@contextlib.contextmanager
def main_export_wrapped(around: Callable[[inspect.BoundArguments, Callable[[], Any]], Any]) -> Iterator[None]:
    """While active, each call of optimum-intel's `main_export` is `around(bound, proceed)`: `bound` its
    arguments bound to `main_export`'s signature (no defaults applied; `around` may change them), `proceed()`
    runs optimum-intel's `main_export` with them."""
    import optimum.exporters.openvino.__main__ as ov_main

    original = ov_main.main_export
    signature = inspect.signature(original)

    def main_export(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        return around(bound, lambda: original(*bound.args, **bound.kwargs))

    with replaced(ov_main, "main_export", main_export):
        yield


@contextlib.contextmanager
def main_quantize_wrapped(around: Callable[[inspect.BoundArguments, Callable[[], Any]], Any]) -> Iterator[None]:
    """While active, each call of optimum-intel's `_main_quantize` is `around(bound, proceed)`: `bound` its
    arguments with the defaults applied, `proceed()` runs optimum-intel's `_main_quantize` with them."""
    import optimum.exporters.openvino.__main__ as ov_main

    original = ov_main._main_quantize
    signature = inspect.signature(original)

    def _main_quantize(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return around(bound, lambda: original(*bound.args, **bound.kwargs))

    with replaced(ov_main, "_main_quantize", _main_quantize):
        yield


@contextlib.contextmanager
def transformers_cap_lifted(config_class: type) -> Iterator[None]:
    """While active, optimum-intel's export config class `config_class` has no `MAX_TRANSFORMERS_VERSION` (its
    export checks the cap with `getattr(config, "MAX_TRANSFORMERS_VERSION", None)`); the class's own value, or
    the inherited one, is back on exit."""
    with replaced(config_class, "MAX_TRANSFORMERS_VERSION", None):
        yield
