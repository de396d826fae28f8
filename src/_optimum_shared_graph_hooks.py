"""Start-up hooks of optimum-shared-graph, kept outside the package so they cost nothing at start-up.

`optimum_shared_graph.pth` (installed beside this file) imports this module when Python starts and
calls `install_static_guard()`: once optimum-intel's decoder models are imported, anywhere,
`OVModelForCausalLM.from_pretrained()` refuses a static text-generation-shared artifact with a clear
error that points to `optimum_shared_graph.runtime()` instead of failing inside OpenVINO with a shape
mismatch. Nothing else is imported until optimum-intel is.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
from pathlib import Path

_DECODER_MODULE = "optimum.intel.openvino.modeling_decoder"


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `callback(module)` right after the module `fullname` finishes importing."""

    def __init__(self, fullname: str, callback):
        self.fullname = fullname
        self.callback = callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        callback = self.callback

        def exec_then_call(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_call
        return spec


def call_after_import(fullname: str, callback) -> None:
    """Call `callback(module)` once `fullname` is imported (now, if it already is). Idempotent per pair."""
    module = sys.modules.get(fullname)
    if module is not None and getattr(module, "__spec__", None) is not None and not _is_initializing(module):
        callback(module)
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.fullname == fullname and finder.callback is callback:
            return
    sys.meta_path.insert(0, _AfterImport(fullname, callback))


def _is_initializing(module) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def static_artifact_message(path) -> str | None:
    """The refusal for a static artifact at `path`, or None when `path` is not one."""
    manifest = Path(str(path)) / "shared_graph.json"
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("shape_mode") != "static":
        return None
    return (
        f"{path} is a static text-generation-shared artifact (fixed query length and KV capacity), which "
        f"OVModelForCausalLM cannot run: load it with optimum_shared_graph.runtime({str(path)!r})"
    )


def _guard_decoder_models(module) -> None:
    cls = module.OVModelForCausalLM
    if getattr(cls, "_shared_graph_guarded", False):
        return
    original = cls.from_pretrained.__func__

    def from_pretrained(klass, model_id, *args, **kwargs):
        message = static_artifact_message(Path(str(model_id)) / kwargs.get("subfolder", ""))
        if message is not None:
            from optimum_shared_graph._errors import RuntimeSelectionError

            raise RuntimeSelectionError(message)
        return original(klass, model_id, *args, **kwargs)

    from_pretrained.__doc__ = original.__doc__
    from_pretrained.__wrapped__ = original
    cls.from_pretrained = classmethod(from_pretrained)
    cls._shared_graph_guarded = True


def install_static_guard() -> None:
    """Guard `OVModelForCausalLM.from_pretrained` against static artifacts. Idempotent."""
    call_after_import(_DECODER_MODULE, _guard_decoder_models)
