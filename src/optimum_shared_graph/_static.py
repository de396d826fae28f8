"""Static-shape export (SPEC section 5) and the session that drives a static graph.

The static graph is traced from the PyTorch model with transformers' static-cache semantics: each
layer's KV cache is a fixed `[batch, kv_heads, capacity, head_dim]` buffer and a call writes its C
query tokens in place (`index_copy`) at `cache_position`. Tracing goes through optimum-intel's own
per-architecture `ModelPatcher`, and the stateful variant through optimum-intel's `make_stateful`.

Graph interface (every shape static)::

    input_ids       [B, C]     int64   C query slots
    attention_mask  [B, cap]   int64   1 where a cache slot holds a real token
    position_ids    [B, C]     int64   (when the model takes them)
    cache_position  [C]        int64   the cache slots the C queries are written to: w .. w+C-1
    beam_idx        [B]        int32   (stateful) cache reorder, as in optimum-intel's graphs
    logits          [B, 1, V]  (logits=last: the last attended slot of the call) or [B, C, V]

How a runtime feeds it (`StaticSession`): the n new tokens of a call are written to the next n
slots, C at a time. A window of C slots starting at `w = min(first new slot, cap - C)` is fed: slots
before the new tokens (only near the end of the capacity) are re-fed with their own tokens, slots
after them are masked (attention_mask 0) and overwritten by later calls. So decode feeds one real
token plus C - 1 masked slots, and the capacity is used to the last slot.
"""

from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ._errors import InvalidOptionsError, ModelNotSupportedError, RuntimeSelectionError
from ._options import DEFAULT_MAX_CACHE_CAP, ExportOptions

_MAX_POSITION_ATTRS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


@dataclass(frozen=True)
class StaticShapes:
    """The fixed shapes of a static graph (what the manifest's `static` records)."""

    batch_size: int
    query_len: int
    cache_len: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def max_positions(config) -> int | None:
    """The model's maximum number of positions, from whichever attribute its config uses."""
    text_config = getattr(config, "text_config", None) or config
    for attr in _MAX_POSITION_ATTRS:
        value = getattr(text_config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def resolve_static_shapes(config, opts: ExportOptions) -> StaticShapes:
    """Check the static options against the model's config and fill in the default capacity.

    Raises:
        InvalidOptionsError: capacity above the model's max positions, or C above the capacity.
    """
    limit = max_positions(config)
    capacity = opts.max_cache_len
    if capacity is None:
        capacity = min(limit, DEFAULT_MAX_CACHE_CAP) if limit else DEFAULT_MAX_CACHE_CAP
    elif limit is not None and capacity > limit:
        raise InvalidOptionsError(
            f"--max-cache-len {capacity} exceeds the model's maximum of {limit} positions: "
            f"use --max-cache-len {limit} or less"
        )
    if opts.static_query_len > capacity:
        raise InvalidOptionsError(
            f"--static-query-len ({opts.static_query_len}) cannot exceed the KV capacity ({capacity}): "
            "lower the query length or raise --max-cache-len"
        )
    shapes = StaticShapes(batch_size=opts.static_batch_size, query_len=opts.static_query_len, cache_len=capacity)
    from ._calibration import expect_static_quantization

    expect_static_quantization(shapes, opts)  # the quantization combinations, checked here too
    return shapes


# --------------------------------------------------------------------------------------------- export


def export_static_graph(pt_model, shapes: StaticShapes, *, logits: str, stateful: bool):
    """Trace `pt_model` into a static OpenVINO graph (see the module docstring for its interface).

    Args:
        pt_model: a transformers causal LM (fp32, eval mode).
        shapes: batch, query length and KV capacity.
        logits: `"last"` (logits of the last attended slot only) or `"all"` (every slot).
        stateful: hide the KV buffers as internal state (optimum-intel's `make_stateful`).

    Returns:
        The `openvino.Model`, with `ov.Model.is_dynamic()` False.
    """
    import inspect

    import openvino as ov
    import torch
    from openvino.frontend.pytorch.ts_decoder import TorchScriptPythonDecoder
    from optimum.exporters import openvino as _registers_openvino_configs  # noqa: F401
    from optimum.exporters.tasks import TasksManager
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    B, C, cap = shapes.batch_size, shapes.query_len, shapes.cache_len
    kv_shapes = _kv_shapes(pt_model, B, cap)
    takes_positions = "position_ids" in inspect.signature(pt_model.forward).parameters

    try:
        constructor = TasksManager.get_exporter_config_constructor(
            exporter="openvino", model=pt_model, task="text-generation-with-past", library_name="transformers"
        )
    except (KeyError, ValueError) as err:
        raise ModelNotSupportedError(
            f"optimum-intel has no OpenVINO export config for {pt_model.config.model_type}: {str(err).splitlines()[0]}"
        ) from err
    export_config = constructor(pt_model.config, int_dtype="int64", float_dtype="fp32")
    patcher = export_config.patch_model_for_export(pt_model, model_kwargs=None)
    wrapper = _StaticDecoder(pt_model, len(kv_shapes), takes_positions)

    example = {
        "input_ids": torch.ones((B, C), dtype=torch.int64),
        "attention_mask": torch.ones((B, cap), dtype=torch.int64),
    }
    if takes_positions:
        example["position_ids"] = torch.arange(C, dtype=torch.int64).expand(B, C).contiguous()
    example["cache_position"] = torch.arange(C, dtype=torch.int64)
    names = list(example)
    past = []
    for i, (k_shape, v_shape) in enumerate(kv_shapes):
        past += [torch.zeros(k_shape), torch.zeros(v_shape)]
        names += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
    args = tuple(example.values()) + tuple(past)

    masks = _wrapped_in(ALL_MASK_ATTENTION_FUNCTIONS, ("sdpa", "eager"), _with_int_query_length)
    attention = _wrapped_in(ALL_ATTENTION_FUNCTIONS, ("sdpa",), _grouped_sdpa)
    with torch.no_grad(), patcher, masks, attention:
        decoder = TorchScriptPythonDecoder(wrapper, example_input=args, trace_kwargs={"check_trace": False})
        ov_model = ov.convert_model(decoder, example_input=args, input=[(tuple(a.shape), _ov_type(a)) for a in args])
    for port, name in zip(ov_model.inputs, names):
        port.get_tensor().set_names({name})
    out_names = ["logits"] + [f"present.{i}.{kv}" for i in range(len(kv_shapes)) for kv in ("key", "value")]
    for port, name in zip(ov_model.outputs, out_names):
        port.get_tensor().set_names({name})
    ov_model.validate_nodes_and_infer_types()

    if logits == "last":
        _slice_logits_to_last_attended(ov_model)
    if stateful:
        make_static_stateful(ov_model)
    if ov_model.is_dynamic():
        dynamic = [p.get_any_name() for p in list(ov_model.inputs) + list(ov_model.outputs) if p.get_partial_shape().is_dynamic]
        raise ModelNotSupportedError(
            f"the static graph of {pt_model.config.model_type} still has dynamic shapes ({', '.join(dynamic) or 'internal'}): "
            "use --shape-mode dynamic for this model"
        )
    return ov_model


def make_static_stateful(ov_model) -> None:
    """Hide a stateless static graph's KV buffers as internal state, in place, with optimum-intel's
    `fuse_cache_reorder` (adds `beam_idx`) and `make_stateful`: what `export_static_graph(stateful=True)`
    does, also applied after quantizing the stateless graph."""
    from optimum.exporters.openvino.stateful import fuse_cache_reorder, make_stateful

    kv_in = [p.get_any_name() for p in ov_model.inputs if p.get_any_name().startswith("past_key_values")]
    kv_out = [p.get_any_name() for p in ov_model.outputs if p.get_any_name().startswith("present")]
    # cache_position has no batch axis: keep it out of the list whose axis 0 make_stateful sets to B.
    not_kv = [p for p in ov_model.inputs if p.get_any_name() not in kv_in and p.get_any_name() != "cache_position"]
    batch = ov_model.input("input_ids").get_partial_shape()[0].get_length()
    fuse_cache_reorder(ov_model, not_kv, kv_in, 0)
    make_stateful(ov_model, not_kv, kv_in, kv_out, 0, batch)


@contextlib.contextmanager
def _wrapped_in(interface, keys: tuple[str, ...], wrap) -> Iterator[None]:
    """Inside the static trace: the functions `keys` of a transformers interface (its mask or attention
    functions) replaced by `wrap(function)`, and restored after."""
    saved = {key: interface[key] for key in keys}
    for key, inner in saved.items():
        interface.register(key, wrap(inner))
    try:
        yield
    finally:
        for key, inner in saved.items():
            interface.register(key, inner)


def _grouped_sdpa(inner):
    """transformers' SDPA attention for the static trace: grouped-query attention without repeating the
    KV buffers per query head.

    transformers' SDPA attention repeats each KV head for its group of query heads (`repeat_kv`)
    before attending. Over a fixed-capacity cache that copies `capacity x heads` keys and values per
    layer and call, and the CPU plugin adds a transpose of the repeated keys (it decomposes attention
    with static shapes): together more than a third of a decode step of a Qwen2-0.5B-shaped model at
    capacity 2,048. Folding each group's query heads into the query axis instead
    (`[B, kv_heads, group x C, D]` against `[B, kv_heads, capacity, D]`) gives the same numbers with
    no copy. Any call this does not cover (no groups, no mask, a per-head mask) keeps transformers' own path.
    """

    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        import torch

        groups = getattr(module, "num_key_value_groups", 1)
        batch, heads, q_len, dim = query.shape
        if (groups <= 1 or attention_mask is None or attention_mask.ndim != 4 or attention_mask.shape[1] != 1
                or key.shape[1] * groups != heads or dropout or kwargs.get("output_attentions")):
            return inner(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         is_causal=is_causal, **kwargs)
        kv_heads = key.shape[1]
        grouped = query.reshape(batch, kv_heads, groups * q_len, dim)  # head kv*groups + j -> rows j*q_len ..
        mask = attention_mask.repeat(1, 1, groups, 1)  # the same rows for each head of a group
        out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
        out = out.reshape(batch, heads, q_len, value.shape[-1]).transpose(1, 2).contiguous()
        return out, None

    return attention


def _with_int_query_length(inner):
    """A transformers mask function for the static trace: the query length as a constant.

    optimum-intel's patched mask functions derive query positions as `arange(offset, offset + q_length)`,
    whose length OpenVINO cannot infer when the offset is a graph value (the static cache's write
    position). With `q_length` a Python int, transformers builds `arange(C) + offset`: static.
    """

    def mask(**kwargs):
        import torch

        if "q_length" in kwargs and not isinstance(kwargs["q_length"], int):
            kwargs["q_length"] = int(kwargs["q_length"])
        out = inner(**kwargs)
        if isinstance(out, torch.Tensor) and out.dtype == torch.bool:
            # A query with nothing to attend to (a left-pad slot) would give NaN, and NaN keys and values
            # in its slot poison later calls even behind the mask: let such rows attend to every slot, as
            # transformers' own `allow_torch_fix` does. Their outputs are never used.
            out = out | torch.all(~out, dim=-1, keepdim=True)
        return out

    return mask


def _ov_type(tensor):
    import openvino as ov

    return ov.Type.i64 if tensor.dtype == np.int64 or str(tensor.dtype) == "torch.int64" else ov.Type.f32


def _kv_shapes(pt_model, batch: int, capacity: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Per-layer KV buffer shapes `[B, kv_heads, capacity, head_dim]`, read from one real forward."""
    import torch

    with torch.no_grad():
        out = pt_model(input_ids=torch.ones((1, 1), dtype=torch.int64), use_cache=True)
    cache = out.past_key_values
    layers = getattr(cache, "layers", None)
    if not layers or any(getattr(layer, "keys", None) is None or layer.keys.ndim != 4 for layer in layers):
        raise ModelNotSupportedError(
            f"{type(pt_model).__name__} does not use a per-layer [batch, heads, seq, dim] KV cache, so it has no "
            "static-cache form: use --shape-mode dynamic for this model"
        )
    shapes = []
    for layer in layers:
        k, v = layer.keys.shape, layer.values.shape
        shapes.append(((batch, k[1], capacity, k[3]), (batch, v[1], capacity, v[3])))
    return shapes


def _graph_cache(past, cache_position):
    """A transformers `Cache` whose static layers are the graph's KV inputs, written at `cache_position`."""
    from transformers.cache_utils import Cache, StaticLayer

    class GraphStaticLayer(StaticLayer):
        """transformers' `StaticLayer` over given buffers, updated out of place so the traced graph
        returns the written buffers instead of mutating its inputs."""

        def __init__(self, keys, values, write_at):
            super().__init__(max_cache_len=keys.shape[2])
            self.keys, self.values = keys, values
            self.dtype, self.device = keys.dtype, keys.device
            self.max_batch_size, self.num_heads = keys.shape[:2]
            self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
            self.cumulative_length = write_at
            self.is_initialized = True

        def update(self, key_states, value_states, *args, **kwargs):
            positions = self.cumulative_length + _arange_like(key_states, -2)
            self.keys = self.keys.index_copy(2, positions, key_states.to(self.keys.dtype))
            self.values = self.values.index_copy(2, positions, value_states.to(self.values.dtype))
            return self.keys, self.values

    write_at = cache_position[0]  # a 0-d tensor, as transformers traces a cache offset
    layers = [GraphStaticLayer(past[i], past[i + 1], write_at) for i in range(0, len(past), 2)]
    return Cache(layers=layers)


def _arange_like(tensor, dim: int):
    import torch

    return torch.arange(tensor.shape[dim], dtype=torch.int64, device=tensor.device)


def _make_wrapper_class():
    import torch

    class StaticDecoder(torch.nn.Module):
        """`forward(input_ids, attention_mask, [position_ids], cache_position, *past) -> (logits, *present)`."""

        def __init__(self, model, num_layers: int, takes_positions: bool):
            super().__init__()
            self.model = model
            self.num_layers = num_layers
            self.takes_positions = takes_positions

        def forward(self, input_ids, attention_mask, *rest):
            if self.takes_positions:
                position_ids, cache_position, *past = rest
            else:
                position_ids, (cache_position, *past) = None, rest
            cache = _graph_cache(past, cache_position)
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            if position_ids is not None:
                kwargs["position_ids"] = position_ids
            out = self.model(**kwargs)
            logits = out["logits"] if isinstance(out, dict) else out[0]
            present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
            return (logits, *present)

    return StaticDecoder


def _StaticDecoder(model, num_layers: int, takes_positions: bool):
    return _make_wrapper_class()(model, num_layers, takes_positions)


def _slice_logits_to_last_attended(model) -> None:
    """Compute logits for one slot only: the last slot of the call that the attention mask marks as real.

    The slot index is the same for the whole batch (left padding aligns the rows' ends), computed in
    the graph from `attention_mask` at `cache_position`, and gathered before the vocabulary
    projection, so the `C x hidden x vocab` multiply shrinks to `1 x hidden x vocab`.
    """
    from openvino import opset13 as ops

    from ._transforms import find_logits_projection

    matmul, idx = find_logits_projection(model)
    port = matmul.input(idx)
    source = port.get_source_output()
    shape = source.get_partial_shape()
    if shape.rank.is_dynamic or shape.rank.get_length() != 3:
        raise ModelNotSupportedError(
            f"the vocabulary projection input has shape {shape}, expected [batch, C, hidden]; export with --logits all"
        )
    C = model.input("cache_position").get_partial_shape()[0].get_length()
    mask = ops.convert(model.input("attention_mask"), "i64")
    in_window = ops.gather(mask, model.input("cache_position"), ops.constant(np.array(1, dtype=np.int64)))  # [B, C]
    rank = ops.multiply(in_window, ops.constant(np.arange(1, C + 1, dtype=np.int64).reshape(1, C)))
    last = ops.reduce_max(rank, ops.constant(np.array([0, 1], dtype=np.int64)), keep_dims=False)  # scalar, 1-based
    index = ops.maximum(ops.subtract(last, ops.constant(np.array(1, dtype=np.int64))), ops.constant(np.array(0, dtype=np.int64)))
    index = ops.reshape(index, ops.constant(np.array([1], dtype=np.int64)), special_zero=False)
    sliced = ops.gather(source, index, ops.constant(np.array(1, dtype=np.int64)))
    sliced.set_friendly_name("shared_graph/last_attended_slot")
    port.replace_source_output(sliced.output(0))
    model.validate_nodes_and_infer_types()


def shapes_of(ov_model) -> StaticShapes:
    """Read batch, query length and capacity back from a static graph's inputs."""
    ids = ov_model.input("input_ids").get_partial_shape()
    mask = ov_model.input("attention_mask").get_partial_shape()
    return StaticShapes(batch_size=ids[0].get_length(), query_len=ids[1].get_length(), cache_len=mask[1].get_length())


@contextlib.contextmanager
def without_dynamic_graph() -> Iterator[None]:
    """While active, optimum-intel's export writes everything but its dynamic decoder graph.

    A static export replaces that graph with its own (`write_static_graph`), so tracing and
    converting it would be wasted work (about a third of a static export's time). optimum-intel still
    loads the model, checks its transformers version limits, saves the configs, converts the
    tokenizer, and saves, through its own `_save_model`, a one-input placeholder graph carrying the
    rt_info it writes into every IR (its version, the export config's runtime options), which
    `write_static_graph` copies onto the static graph before replacing the placeholder.
    """
    import inspect

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

    ov_convert.export_pytorch = export_pytorch
    try:
        yield
    finally:
        ov_convert.export_pytorch = original


def write_static_graph(
    pt_model, raw: Path, shapes: StaticShapes, opts: ExportOptions, *, capture=None, reason=None,
    weight_format: str | None = None,
):
    """Replace the graph optimum-intel wrote in `raw` with the static graph; return the capture to validate on.

    optimum-intel's own export still writes everything else (config, generation config, tokenizer
    files) and its rt_info is kept; only `openvino_model.xml/.bin` are replaced. Data-free weight
    formats are applied with NNCF's data-free weight compression. A data-aware quantization config
    (which the `_main_quantize` hook of `both_stage_quantization` kept for this export instead of
    quantizing optimum-intel's dynamic graph) is calibrated on the calls a static runtime makes, on
    the stateless static graph, then the graph is made stateful if asked (`_calibration.
    quantize_static_graph`). When the captured prompt and its greedy tokens do not fit the capacity,
    `generate()` is captured again on a prompt that fits.

    Raises:
        DecompositionError: the decomposition failed (`reason`): a static graph needs the shared one.
    """
    import openvino as ov

    from ._errors import DecompositionError
    from ._manifest import GRAPH_BIN, GRAPH_XML

    if reason is not None:
        raise DecompositionError(
            f"{reason}; --shape-mode static needs the one shared graph, so it has no fallback: use --shape-mode dynamic"
        )
    from ._calibration import pending_static_quantization, quantize_static_graph

    target = capture.exported if capture is not None and capture.exported is not None else pt_model
    pending = pending_static_quantization()
    calibrate = pending is not None and pending.config is not None
    core = ov.Core()
    reference = core.read_model(raw / GRAPH_XML)
    ov_model = export_static_graph(target, shapes, logits=opts.logits, stateful=opts.stateful and not calibrate)
    for key in ("optimum", "runtime_options"):
        if reference.has_rt_info(key):
            for name, value in reference.get_rt_info()[key].items():
                ov_model.set_rt_info(value.astype(str), [key, name])
    del reference
    fmt = weight_format or "fp32"
    if calibrate:  # traced stateless: every calibration call carries its KV buffers as inputs
        ov_model = quantize_static_graph(ov_model, raw, pending)
        if opts.stateful:
            make_static_stateful(ov_model)
        fmt = "fp32"  # the quantized graph is saved as NNCF left it
    elif pending is not None and pending.weight_config is not None:
        ov_model = _compress_weights(ov_model, pending.weight_config)
    (raw / GRAPH_XML).unlink()
    (raw / GRAPH_BIN).unlink(missing_ok=True)
    ov.save_model(ov_model, raw / GRAPH_XML, compress_to_fp16=(fmt == "fp16"))
    return _capture_that_fits(pt_model, capture, shapes, opts)


def _capture_that_fits(pt_model, capture, shapes: StaticShapes, opts: ExportOptions):
    if capture is None or capture.prompt_ids.shape[1] + capture.tokens.shape[1] <= shapes.cache_len:
        return capture
    import torch

    from ._decompose import capture_generation

    new_tokens = min(opts.validation_new_tokens, shapes.cache_len - 1)
    if new_tokens < 4:
        return None  # a prefill and 3 decode steps do not fit: validation is reported as skipped
    keep = max(1, shapes.cache_len - new_tokens)
    ids = torch.from_numpy(capture.prompt_ids[:, -keep:].copy())
    mask = torch.from_numpy(capture.prompt_mask[:, -keep:].copy())
    kwargs = {}
    if capture.exported is not None:
        kwargs = {"target": capture.exported, "module": capture.module}
    return capture_generation(pt_model, ids, mask, new_tokens, **kwargs)


def _compress_weights(ov_model, config):
    """Data-free weight compression of the static graph (`--weight-format` without calibration).

    `config` is the weight-compression config optimum-intel built from the flags (`--weight-format`,
    `--group-size`, `--ratio`, `--sym`, `--all-layers`, ... or the Python API's `weight_format`), applied
    by optimum-intel's own `_weight_only_quantization`, as its dynamic export would apply it.
    """
    from optimum.intel.openvino.quantization import _weight_only_quantization

    return _weight_only_quantization(ov_model, config, verify_not_optimized=False)


# -------------------------------------------------------------------------------------------- session


def _layer_order(name: str):
    _, layer, kind = name.split(".", 2)
    return int(layer), kind


class StaticSession:
    """Feeds a compiled static graph: C slots per call, a fixed-capacity cache, one sequence batch.

    It has the `reset()` / `step()` interface of `GraphSession`, so export-time validation makes the
    very calls the runtime makes.

    Args:
        compiled: the `openvino.CompiledModel` of a static graph.
        pad_token_id: the token fed in masked slots.
        request: an infer request of `compiled` to use (a new one if None).
    """

    def __init__(self, compiled, pad_token_id: int = 0, *, request=None):
        self.compiled = compiled
        self.request = request if request is not None else compiled.create_infer_request()
        self.inputs = {name: p for p in compiled.inputs for name in p.get_names()}
        self.past_names = sorted((n for n in self.inputs if n.startswith("past_key_values.")), key=_layer_order)
        self.present_names = [n.replace("past_key_values", "present", 1) for n in self.past_names]
        self.stateful = not self.past_names
        ids_shape = self.inputs["input_ids"].get_shape()
        self.batch_size, self.query_len = int(ids_shape[0]), int(ids_shape[1])
        self.capacity = int(self.inputs["attention_mask"].get_shape()[1])
        self.logits_all = int(compiled.output("logits").get_shape()[1]) == self.query_len and self.query_len > 1
        self.pad_token_id = int(pad_token_id)
        self.reset()

    @property
    def cache_length(self) -> int:
        """Slots written so far (the sequence length, padding included)."""
        return self.filled

    def reset(self) -> None:
        """Forget the cache: the next call starts a new sequence."""
        if self.stateful:
            self.request.reset_state()
        B, cap = self.batch_size, self.capacity
        self.tokens = np.full((B, cap), self.pad_token_id, dtype=np.int64)
        self.mask = np.zeros((B, cap), dtype=np.int64)
        self.filled = 0
        self._rows = B
        self._beam_idx: np.ndarray | None = None
        self._past = {
            name: np.zeros(tuple(self.inputs[name].get_shape()), dtype=self.inputs[name].get_element_type().to_dtype())
            for name in self.past_names
        }

    def check_fits(self, batch: int, total_tokens: int) -> None:
        """Refuse, before any inference, a request the static shapes cannot hold."""
        if batch > self.batch_size:
            raise RuntimeSelectionError(
                f"batch of {batch} sequences does not fit this static artifact (batch size {self.batch_size}): "
                f"generate at most {self.batch_size} at once, or re-export with --static-batch-size {batch}"
            )
        if total_tokens > self.capacity:
            raise RuntimeSelectionError(
                f"prompt plus new tokens ({total_tokens}) exceed this static artifact's KV capacity of {self.capacity}: "
                f"shorten the prompt or max_new_tokens, or re-export with --max-cache-len {total_tokens} or more"
            )

    def crop(self, length: int) -> None:
        """Keep only the first `length` slots (assisted decoding drops rejected candidates)."""
        length = max(0, min(int(length), self.filled))
        self.tokens[:, length:] = self.pad_token_id
        self.mask[:, length:] = 0
        self.filled = length

    def reorder(self, beam_idx) -> None:
        """Reorder the batch rows (beam search), applied to the cache at the next call."""
        beam_idx = np.asarray(beam_idx, dtype=np.int64)
        full = np.arange(self.batch_size, dtype=np.int64)
        full[: beam_idx.shape[0]] = beam_idx
        self.tokens, self.mask = self.tokens[full], self.mask[full]
        if self.stateful:
            self._beam_idx = full if self._beam_idx is None else self._beam_idx[full]
        else:
            self._past = {k: np.ascontiguousarray(v[full]) for k, v in self._past.items()}

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """Write `n` new tokens to the cache, C per call, and return their logits.

        Args:
            input_ids: `[batch, n]` new token ids (batch at most the static batch size).
            attention_mask: `[batch, n]` mask of the new tokens (ones if None).

        Returns:
            `[batch, 1, vocab]` (logits of the last new token) for `logits=last` graphs,
            `[batch, n, vocab]` for `logits=all` graphs.
        """
        input_ids = np.asarray(input_ids, dtype=np.int64)
        rows, n = input_ids.shape
        mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        self.check_fits(rows, self.filled + n)
        if self.filled == 0:
            self._rows = rows
        elif rows != self._rows:
            raise RuntimeSelectionError(f"batch changed from {self._rows} to {rows} rows mid-sequence: call reset() first")
        if rows < self.batch_size:  # unused rows repeat row 0 (real content: no fully masked row)
            extra = self.batch_size - rows
            input_ids = np.concatenate([input_ids, np.repeat(input_ids[:1], extra, axis=0)])
            mask = np.concatenate([mask, np.repeat(mask[:1], extra, axis=0)])
        start, end = self.filled, self.filled + n
        C, cap = self.query_len, self.capacity
        outputs = []
        s = start
        while s < end:
            e = min(s + C, end)
            w = min(s, cap - C)
            # Slots from e on are never written yet (or were cleared by crop): pad tokens, mask 0.
            self.tokens[:, s:e] = input_ids[:, s - start : e - start]
            self.mask[:, s:e] = mask[:, s - start : e - start]
            positions = np.cumsum(self.mask[:, : w + C], axis=1) - 1
            positions = np.where(self.mask[:, : w + C] == 0, 1, positions)[:, w:]
            positions[:, e - w :] = positions[:, e - w - 1 : e - w] + 1  # masked slots: any valid position
            feed = {"input_ids": np.ascontiguousarray(self.tokens[:, w : w + C]), "attention_mask": self.mask,
                    "cache_position": np.arange(w, w + C, dtype=np.int64)}
            if "position_ids" in self.inputs:
                feed["position_ids"] = np.ascontiguousarray(positions)
            if "beam_idx" in self.inputs:
                beam = self._beam_idx if self._beam_idx is not None else np.arange(self.batch_size)
                feed["beam_idx"] = beam.astype(np.int32)
                self._beam_idx = None
            if not self.stateful:
                feed.update(self._past)
            self.request.infer(feed)
            logits = self.request.get_tensor("logits").data
            if not self.stateful:
                self._past = {
                    past: self.request.get_tensor(present).data.copy()
                    for past, present in zip(self.past_names, self.present_names)
                }
            if self.logits_all:
                outputs.append(logits[:, s - w : e - w].copy())
            else:
                outputs = [logits.copy()]
            s = e
        self.filled = end
        out = np.concatenate(outputs, axis=1) if len(outputs) > 1 else outputs[0]
        return out[:rows]
