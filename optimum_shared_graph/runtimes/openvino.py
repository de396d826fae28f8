"""The built-in OpenVINO runtime provider: artifacts as models with transformers' `generate()` API.

Registered through the package's entry point (`setup.cfg`), like any other provider. The model
is optimum-intel's `OVModelForCausalLM` (so greedy, sampling, beam search, streamers and
`pipeline("text-generation")` behave as they do there) with what this package's artifacts add:

- static artifacts run through `StaticSession`: C slots per call, a fixed-capacity cache, and a
  prompt plus `max_new_tokens` over the capacity refused before any inference;
- assisted decoding: the cache handed to transformers can `crop()`, which trims the KV state (or the KV
  inputs, or the static cache's fill) after rejected candidates. As the main model an artifact needs
  `logits=all` (every candidate is verified in one call), and `logits=last` is refused with one clear line;
  as the draft (`assistant_model=`) any artifact works, since a draft only reads the last position;
- `generate()` runs transformers' loop on one PyTorch thread (`torch_threads`): its tensor work per
  token is a few small operations, and PyTorch's worker threads otherwise compete for the cores with
  OpenVINO's, which run the graph;
- concurrent callers: the model is compiled once, and each calling thread gets its own inference
  request (so its own KV state) and its own generation bookkeeping, so `generate()` may be called from
  several threads at once on one loaded model, the weights in memory once (the capability `concurrent`).
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidOptionsError, RuntimeSelectionError
from ..manifest import GRAPH_XML, Manifest
from .session import _PAST_PREFIXES
from .static_session import StaticSession


class OpenVINOProvider:
    """Runs artifacts with OpenVINO Runtime, on any OpenVINO device."""

    name = "openvino"
    capabilities = frozenset({"generation", "static", "stateless", "logits-all", "concurrent"})

    def load(self, path: str | Path, manifest: Manifest, *, device: str = "CPU", ov_config: dict | None = None,
             torch_threads: int | None = 1, **kwargs: Any):
        """Load the artifact at `path` as a `generate()`-capable model.

        Args:
            path: the artifact directory.
            manifest: its checked manifest.
            device: the OpenVINO device.
            ov_config: OpenVINO compile properties (e.g. `{"INFERENCE_PRECISION_HINT": "f32"}`).
            torch_threads: PyTorch threads for the generation loop's own tensor work while `generate()`
                runs (restored after); `None` leaves PyTorch's setting as it is.
            **kwargs: passed to optimum-intel's model constructor.
        """
        if torch_threads is not None and torch_threads < 1:
            raise InvalidOptionsError(f"torch_threads must be 1 or more (or None to leave PyTorch's setting), got {torch_threads}")
        import openvino as ov
        from transformers import AutoConfig, GenerationConfig

        path = Path(path)
        config = AutoConfig.from_pretrained(path)
        try:
            generation_config = GenerationConfig.from_pretrained(path)
        except OSError:
            generation_config = GenerationConfig.from_model_config(config)
        if getattr(generation_config, "cache_implementation", None) is not None:
            generation_config.cache_implementation = None
        graph = (manifest.graph or {}).get("files", [GRAPH_XML])[0]
        model = ov.Core().read_model(path / graph)
        cls = _model_class(config, manifest)
        return cls(
            model=model, config=config, device=device, ov_config=ov_config or {}, model_save_dir=path,
            generation_config=generation_config, manifest=manifest, torch_threads=torch_threads, **kwargs,
        )


def _model_class(config, manifest: Manifest):
    """optimum-intel's class for this model type (as `OVModelForCausalLM.from_pretrained` picks it), with our mixin."""
    from optimum.intel.openvino import modeling_decoder as md

    base = md.OVModelForCausalLM
    if manifest.shape_mode != "static":
        special = {"gpt_bigcode": "OVGPTBigCodeForCausalLM", "phi3": "OVPhi3ForCausalLM"}
        base = getattr(md, special.get(config.model_type, ""), base)
    return type(f"SharedGraph{base.__name__}", (_SharedGraphMixin, base), {"__module__": __name__})


class _CroppableCache(list):
    """The `past_key_values` handed to transformers: optimum-intel's value with what assisted generation asks
    of a cache. As the main model's cache it is cropped after the candidates are verified; as the draft's, it
    comes back into the draft's next `generate()` call, which reads its length (`get_seq_length()`) and asks
    whether it can be compiled (`is_compileable`: no, OpenVINO runs the graph), after the draft's rejected
    proposals were cropped from it."""

    is_compileable = False

    def __init__(self, items, model):
        super().__init__(items)
        self._model = model

    def crop(self, length: int) -> None:
        self._model._crop_cache(self, int(length))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return int(self._model._get_past_length(self))


class _PerThread:
    """An attribute of the model with one value per calling thread.

    optimum-intel keeps a generation's state on the model object: the inference request (which holds
    the KV state of a stateful graph), the past length, the beam indices. Held per thread, concurrent
    `generate()` calls from different threads each have their own, on the one compiled model.
    """

    def __init__(self, default=None):
        self.default = default

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return getattr(obj._per_thread, self.name, self.default)

    def __set__(self, obj, value):
        setattr(obj._per_thread, self.name, value)


class _SharedGraphMixin:
    """What a `text-generation-shared` artifact adds to optimum-intel's `OVModelForCausalLM`."""

    _past_length = _PerThread(0)
    next_beam_idx = _PerThread(None)
    _first_iter_beam_search = _PerThread(False)
    _second_iter_beam_search = _PerThread(False)
    _static_session = _PerThread(None)

    def __init__(self, *args, manifest: Manifest, torch_threads: int | None = 1, **kwargs):
        self._per_thread = threading.local()
        self._compiled = None
        self._compile_lock = threading.Lock()
        self.manifest = manifest
        self.torch_threads = torch_threads
        self.is_static = manifest.shape_mode == "static"
        super().__init__(*args, **kwargs)

    # ------------------------------------------------- one compiled model, one request per thread

    @property
    def request(self):
        """This thread's inference request on the shared compiled model (created on first use)."""
        request = getattr(self._per_thread, "request", None)
        if request is None and self._compiled is not None:
            request = self._per_thread.request = self._compiled.create_infer_request()
        return request

    @request.setter
    def request(self, value):
        # optimum-intel assigns the compiled model, then its request; None drops both (recompile).
        import openvino as ov

        if value is None:
            self._compiled = None
            self._per_thread = threading.local()
        elif isinstance(value, ov.CompiledModel):
            self._compiled = value
            self._per_thread = threading.local()
        else:
            self._per_thread.request = value

    # ---------------------------------------------------------------- optimum-intel hooks, static-aware

    def _reshape(self, model, *args, **kwargs):
        if getattr(self, "is_static", False):
            return model  # every shape is fixed by design
        return super()._reshape(model, *args, **kwargs)

    def update_pkv_precision(self, force_fp32: bool = False):
        if getattr(self, "is_static", False):
            return  # the static session keeps the KV buffers in the graph's own precision
        return super().update_pkv_precision(force_fp32)

    def compile(self):
        with self._compile_lock:  # two first callers at once compile once
            if self._compiled is None:
                # optimum-intel's OVModel.compile(), keeping the compiled model rather than one request
                self._compiled = self._compile_model(self.model, self._device, {**self.ov_config}, self.model_save_dir)
        request = self.request
        if self.is_static and (self._static_session is None or self._static_session.request is not request):
            generation_config = getattr(self, "generation_config", None)
            pad = generation_config.pad_token_id if generation_config is not None else None
            if isinstance(pad, list):
                pad = pad[0]
            self._static_session = StaticSession(self._compiled, pad_token_id=pad or 0, request=request)

    @property
    def static_session(self):
        """The `StaticSession` of a static artifact (compiling on first use)."""
        self.compile()
        return self._static_session

    # ------------------------------------------------------------------------------------- generate

    def generate(self, inputs=None, generation_config=None, *args, assistant_model=None, **kwargs):
        config, _ = self._prepare_generation_config(generation_config, **kwargs)
        assisted = assistant_model is not None or getattr(config, "prompt_lookup_num_tokens", None)
        if assisted or getattr(config, "is_assistant", False):  # the main model, or the draft (transformers' flag)
            uncroppable = self._uncroppable_states()
            if uncroppable:
                raise RuntimeSelectionError(
                    f"this {self.config.model_type} artifact can be neither the main model nor the draft of assisted "
                    f"generation: its {len(uncroppable)} convolution or SSM states ({uncroppable[0]}, ...) have no "
                    f"sequence axis to cut back to the accepted tokens; generate without assistant_model"
                )
        if assisted and self.manifest.logits != "all":
            raise RuntimeSelectionError(
                "assisted decoding needs the logits of every candidate position, and this artifact has logits=last: "
                "export it with --logits all (a logits=last artifact can be the draft, assistant_model=)"
            )
        if assistant_model is self and (self.stateful or self.is_static):
            raise RuntimeSelectionError(
                "a model from runtime() cannot be its own draft: the draft's calls would overwrite the KV cache its "
                "inference request holds; load the artifact again with runtime() and pass that as assistant_model"
            )
        if self.is_static:
            ids = inputs if inputs is not None else kwargs.get("input_ids")
            if ids is not None:
                rows = ids.shape[0] * max(1, config.num_beams or 1) * max(1, config.num_return_sequences or 1)
                length = ids.shape[1]
                new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - length
                self.static_session.check_fits(rows, length + max(0, new))
        with _torch_threads(self.torch_threads):
            return super().generate(inputs, generation_config, *args, assistant_model=assistant_model, **kwargs)

    def forward(self, input_ids, attention_mask=None, past_key_values=None, position_ids=None, **kwargs):
        if self.is_static:
            return self._static_forward(input_ids, attention_mask, past_key_values)
        out = super().forward(input_ids, attention_mask=attention_mask, past_key_values=past_key_values,
                              position_ids=position_ids, **kwargs)
        if out.past_key_values is not None:
            # croppable whatever the logits: a logits=last artifact can be a draft (it only needs the last position)
            out.past_key_values = _CroppableCache(out.past_key_values, self)
        return out

    def _static_forward(self, input_ids, attention_mask, past_key_values):
        import torch
        from transformers.modeling_outputs import CausalLMOutputWithPast

        session = self.static_session
        if past_key_values is None:
            session.reset()
        n = input_ids.shape[1]
        mask = None if attention_mask is None else attention_mask[:, -n:].cpu().numpy()
        logits = session.step(input_ids.cpu().numpy(), mask)
        self._first_iter_beam_search = False  # static graphs run the full beam batch from the first call
        self._past_length = session.filled
        return CausalLMOutputWithPast(logits=torch.from_numpy(logits), past_key_values=_CroppableCache([()], self))

    def _get_past_length(self, past_key_values=None):
        if self.is_static:
            return 0 if past_key_values is None else self.static_session.filled
        return super()._get_past_length(past_key_values)

    def _reorder_cache(self, past_key_values, beam_idx):
        if self.is_static:
            self.static_session.reorder(np.asarray(beam_idx))
            return past_key_values
        return super()._reorder_cache(past_key_values, beam_idx)

    # ------------------------------------------------------------------- cache trimming (assisted)

    def _uncroppable_states(self) -> list[str]:
        """The graph's cache entries (states, or a stateless graph's cache inputs) without a sequence axis:
        recurrent convolution and SSM states, which hold no per-token positions to drop, unlike keys and values.
        Read from the graph once (a draft's generate() asks at every round)."""
        if self.__dict__.get("_uncroppable") is None:
            self._uncroppable = self._find_uncroppable_states()
        return self._uncroppable

    def _find_uncroppable_states(self) -> list[str]:
        if self.is_static:
            return []  # a static graph holds a KV cache only
        if self.stateful:
            axes = _state_sequence_axes(self.model)
            names = [op.get_variable_id() for op in self.model.get_ops() if op.get_type_name() == "ReadValue"]
            return [name for name in names if name not in axes]
        return [port.get_any_name() for port in self.model.inputs
                if port.get_any_name().startswith(_PAST_PREFIXES) and not _sequence_axes(port.get_partial_shape())]

    def _crop_cache(self, cache, length: int) -> None:
        """Keep the first `length` positions of the cache (assisted generation drops rejected candidates)."""
        if self.is_static:
            self.static_session.crop(length)
            self._past_length = self.static_session.filled
            return
        import openvino as ov

        if self.stateful:
            axes = _state_sequence_axes(self.model)
            for state in self.request.query_state():
                data = state.state.data
                axis = axes[state.name]  # every state has one: generate() refuses a graph with other states
                if data.shape[axis] > length:
                    state.state = ov.Tensor(np.ascontiguousarray(np.take(data, np.arange(length), axis=axis)))
            self._past_length = min(self._past_length, length)
        else:
            for i, layer in enumerate(cache):
                cache[i] = tuple(np.ascontiguousarray(t[..., :length, :]) for t in layer)


class _TorchThreads:
    """PyTorch's intra-op thread count held at a value while any `generate()` call runs.

    The count is process-wide, so concurrent calls share one setting: the first call in sets it, the
    last one out restores what it was. (Calls asking for different counts at once get the first's.)
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._active = 0
        self._before: int | None = None

    @contextlib.contextmanager
    def __call__(self, count: int | None):
        if count is None:
            yield
            return
        import torch

        with self._lock:
            if self._active == 0:
                self._before = torch.get_num_threads()
                if self._before != count:
                    torch.set_num_threads(count)
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0 and torch.get_num_threads() != self._before:
                    torch.set_num_threads(self._before)


_torch_threads = _TorchThreads()


def _state_sequence_axes(model) -> dict[str, int]:
    """The sequence axis of each KV state: its dynamic axis other than the batch axis 0."""
    axes = {}
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            dynamic = _sequence_axes(op.get_output_partial_shape(0))
            if dynamic:
                axes[op.get_variable_id()] = dynamic[-1]
    return axes


def _sequence_axes(shape) -> list[int]:
    """The dynamic axes of a cache entry's shape other than the batch axis 0."""
    return [i for i in range(shape.rank.get_length()) if shape[i].is_dynamic and i != 0]
