"""The built-in provider of image-text-to-text artifacts: `runtime()` of an `--task image-text-to-text-shared` export.

Registered through the package's entry point (`setup.cfg`, group `optimum_shared_graph.runtimes`, name
`openvino-vlm`), like the text provider. The model is optimum-intel's `OVModelForVisualCausalLM` (so its
`generate()` takes what the checkpoint's processor makes of images and text, as
`model.generate(**processor(images=..., text=..., return_tensors="pt"))`), with what this package adds:

- Qwen3.5 and Qwen3.5-MoE generate: optimum-intel 2.2's `generate()` for them fails under transformers 5.5
  (`host/visual_generate.py`); the loaded model is of a subclass with host/'s three fixed methods as its own
  (`host/visual_generate.qwen3_5_generate_fixed_class`), so nothing of optimum-intel's class is replaced and nothing is asked of
  the user. The other families' `generate()` runs as optimum-intel has it;
- concurrent callers (the capability `concurrent`): every graph is compiled once, and each calling thread gets a
  view of the model of its own: a shallow copy whose parts (the language model, the vision and text embedding
  graphs, each family's further graphs) each have their own inference request on the shared compiled model, so
  their own KV and recurrent state, and whose generation bookkeeping (past length, beam indices, Qwen's
  `rope_deltas`) is the view's; the weights are in memory once;
- `generate()` runs transformers' loop on one PyTorch thread (`torch_threads`), as the text provider does.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionsError, RuntimeSelectionError
from ..manifest import Manifest
from ..tasks import VLM_TASK
from .openvino import _torch_threads


class VisualProvider:
    """Runs image-text-to-text artifacts with OpenVINO Runtime (`OVModelForVisualCausalLM`), on any OpenVINO device."""

    name = "openvino-vlm"
    capabilities = frozenset({"generation", VLM_TASK, "logits-all", "concurrent"})

    def load(self, path: str | Path, manifest: Manifest, *, device: str = "CPU", ov_config: dict | None = None,
             torch_threads: int | None = 1, **kwargs: Any) -> "VisualModel":
        """Load the artifact at `path` as a `generate()`-capable vision-language model.

        Args:
            path: the artifact directory.
            manifest: its checked manifest.
            device: the OpenVINO device.
            ov_config: OpenVINO compile properties of every graph (e.g. `{"INFERENCE_PRECISION_HINT": "f32"}`).
            torch_threads: PyTorch threads for the generation loop's own tensor work while `generate()`
                runs (restored after); `None` leaves PyTorch's setting as it is.
            **kwargs: passed to `OVModelForVisualCausalLM.from_pretrained`.
        """
        if VLM_TASK not in manifest.requires:
            raise RuntimeSelectionError(
                f"runtime provider {self.name!r} runs image-text-to-text artifacts, and {path} is a "
                f"{manifest.task} artifact: leave `provider` unset (or use 'openvino')")
        if torch_threads is not None and torch_threads < 1:
            raise InvalidOptionsError(f"torch_threads must be 1 or more (or None to leave PyTorch's setting), got {torch_threads}")
        from optimum.intel import OVModelForVisualCausalLM

        from ..host.visual_generate import qwen3_5_generate_fixed_class

        model = OVModelForVisualCausalLM.from_pretrained(str(path), device=device, ov_config=dict(ov_config or {}),
                                                         compile=True, **kwargs)
        fixed = qwen3_5_generate_fixed_class(type(model))
        if fixed is not type(model):
            object.__setattr__(model, "__class__", fixed)  # the same object, of the subclass with the fix
        return VisualModel(model, manifest, torch_threads)


class _Request:
    """A part's own inference request, called as optimum-intel calls the part's compiled model
    (`request(inputs, share_inputs=...)`); every other attribute (`inputs`, `outputs`, ...) is the compiled model's."""

    def __init__(self, compiled):
        self._compiled = compiled
        self._request = compiled.create_infer_request()

    def __call__(self, inputs: Any = None, share_inputs: bool = True, share_outputs: bool = False, **kwargs):
        # the compiled model's defaults; share_outputs=False: the results are copies, not this request's tensors
        return self._request.infer(inputs, share_inputs=share_inputs, share_outputs=share_outputs, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._compiled, name)


def _compiled_of(request):
    """The compiled model behind an optimum-intel part's `request` (a compiled model, an inference request, or a
    `_Request`)."""
    import openvino as ov

    if isinstance(request, _Request):
        return request._compiled
    if isinstance(request, ov.InferRequest):
        return request.get_compiled_model()
    return request


def _thread_view(model):
    """A view of the compiled `model` for one thread: a shallow copy whose parts are shallow copies with inference
    requests of their own on the same compiled models."""
    view = copy.copy(model)
    for name in model._component_names:
        part = copy.copy(getattr(model, name))
        if hasattr(part, "text_emb_request"):  # the language model (OVModelWithEmbedForCausalLM), and its embeddings
            part.request = _compiled_of(part.request).create_infer_request()
            part.text_emb_request = _Request(_compiled_of(part.text_emb_request))
            part._past_length, part.next_beam_idx = 0, None
        elif part.request is not None:
            part.request = _Request(_compiled_of(part.request))
        object.__setattr__(view, name, part)
    return view


class VisualModel:
    """A vision-language artifact loaded by `runtime()`: optimum-intel's `OVModelForVisualCausalLM` (attributes are
    the calling thread's view's: `config`, `language_model`, `vision_embeddings`, ...), whose `generate()` may be
    called from several threads at once (the module docstring)."""

    def __init__(self, model, manifest: Manifest, torch_threads: int | None):
        self.__dict__.update(_shared=model, _local=threading.local(), manifest=manifest, torch_threads=torch_threads)

    @property
    def model(self):
        """This thread's view of the loaded `OVModelForVisualCausalLM` (made on first use)."""
        view = getattr(self._local, "view", None)
        if view is None:
            view = self._local.view = _thread_view(self._shared)
        return view

    def generate(self, *args, **kwargs):
        """`OVModelForVisualCausalLM.generate()` (transformers' `generate()`), on this thread's view."""
        with _torch_threads(self.torch_threads):
            return self.model.generate(*args, **kwargs)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)
