"""Stage 4, static trace (`--shape-mode static`): the static graph that replaces optimum-intel's dynamic one.

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
import os
from pathlib import Path
from typing import Iterator

import numpy as np

from .. import host
from ..errors import ModelNotSupportedError
from ..graph.logits import slice_logits
from ..graph.precision import keep_vectors_exact
from ..graph.static import StaticShapes, make_static_stateful
from ..manifest import GRAPH_BIN, GRAPH_XML, STATIC_GRAPH_XML
from ..options import ExportOptions
from ..architectures._static_forms import static_forms
from .decompose import capture_generation, with_float32_reference

# --------------------------------------------------------------------------------------------- export


def export_static_graph(pt_model, shapes: StaticShapes, *, logits: str, stateful: bool):
    """Trace `pt_model` into a static OpenVINO graph (see the module docstring for its interface).

    Args:
        pt_model: a transformers causal LM in eval mode (float32, or 16 bits as optimum-intel loads it).
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
    query_slots: dict = {}  # the call's cache_position, for attention that needs the query slots (`architectures/_static_forms.py`)
    wrapper = _StaticDecoder(pt_model, len(kv_shapes), takes_positions, query_slots)

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

    # transformers' masks and attention, and optimum-intel's Gemma 2 patcher given a Cache, for this trace (host/)
    masks = host.mask_functions_wrapped(("sdpa", "eager"), _with_int_query_length)
    attention = host.attention_functions_wrapped(("sdpa",), _grouped_sdpa)
    forms = static_forms(pt_model, query_slots)
    with torch.no_grad(), host.cache_passed_through(patcher), patcher, masks, attention, forms, \
            _traceable_16bit(pt_model):
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


@contextlib.contextmanager
def _traceable_16bit(pt_model) -> Iterator[None]:
    """A 16-bit model traced as optimum-intel traces one: OpenVINO's `__make_16bit_traceable` keeps the 16-bit
    weights as the graph's constants and makes every activation float32 (optimum-intel's `patch_16bit_model`).
    It casts the model's small non-matmul weights (norms) to float32 for good: the trace is the model's last use."""
    from .decompose import is_16bit

    if not is_16bit(pt_model):
        yield
        return
    from openvino.frontend.pytorch.patch_model import __make_16bit_traceable, unpatch_model

    __make_16bit_traceable(pt_model)
    try:
        yield
    finally:
        unpatch_model(pt_model, "_openvino_module_extension_patch_orig_forward")


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
    cache = getattr(out, "past_key_values", None)  # state-space models return cache_params instead
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

        def __init__(self, model, num_layers: int, takes_positions: bool, query_slots: dict):
            super().__init__()
            self.model = model
            self.num_layers = num_layers
            self.takes_positions = takes_positions
            self.query_slots = query_slots

        def forward(self, input_ids, attention_mask, *rest):
            if self.takes_positions:
                position_ids, cache_position, *past = rest
            else:
                position_ids, (cache_position, *past) = None, rest
            self.query_slots["query"] = cache_position
            cache = _graph_cache(past, cache_position)
            kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            if position_ids is not None:
                kwargs["position_ids"] = position_ids
            out = self.model(**kwargs)
            logits = out["logits"] if isinstance(out, dict) else out[0]
            present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
            return (logits, *present)

    return StaticDecoder


def _StaticDecoder(model, num_layers: int, takes_positions: bool, query_slots: dict | None = None):
    return _make_wrapper_class()(model, num_layers, takes_positions, {} if query_slots is None else query_slots)


def _slice_logits_to_last_attended(model) -> None:
    """Compute logits for one slot only: the last slot of the call that the attention mask marks as real.

    The slot index is the same for the whole batch (left padding aligns the rows' ends), computed in
    the graph from `attention_mask` at `cache_position`, and gathered before the vocabulary
    projection, so the `C x hidden x vocab` multiply shrinks to `1 x hidden x vocab`.
    """
    from openvino import opset13 as ops

    C = model.input("cache_position").get_partial_shape()[0].get_length()
    mask = ops.convert(model.input("attention_mask"), "i64")
    in_window = ops.gather(mask, model.input("cache_position"), ops.constant(np.array(1, dtype=np.int64)))  # [B, C]
    rank = ops.multiply(in_window, ops.constant(np.arange(1, C + 1, dtype=np.int64).reshape(1, C)))
    last = ops.reduce_max(rank, ops.constant(np.array([0, 1], dtype=np.int64)), keep_dims=False)  # scalar, 1-based
    index = ops.maximum(ops.subtract(last, ops.constant(np.array(1, dtype=np.int64))), ops.constant(np.array(0, dtype=np.int64)))
    index = ops.reshape(index, ops.constant(np.array([1], dtype=np.int64)), special_zero=False)
    slice_logits(model, index, name="shared_graph/last_attended_slot")


def trace_static_graph(pt_model, raw: Path, shapes: StaticShapes, opts: ExportOptions, *, capture, plan,
                       weight_format: str | None = None):
    """Trace the static graph of the model optimum-intel loaded into `raw`, the directory optimum-intel is
    writing (it moves it into place with its own files); return the capture to validate on.

    Runs on the one loaded model, right after optimum-intel converted it (or, without calibration, wrote
    only its configs and a placeholder graph carrying the rt_info it writes into every IR, see
    `host.dynamic_graph_skipped`). That rt_info is copied onto the static graph, which is written as
    `openvino_static_model.xml` (not optimum-intel's `openvino_model.xml`), so runtimes that cannot run a
    static graph (OVModelForCausalLM, OpenVINO GenAI) do not pick it up. With a data-aware quantization
    the graph is traced stateless (every calibration call carries its KV buffers); `finish_static_graph`
    quantizes it once optimum-intel's flags have given the config. When the captured prompt and its greedy
    tokens do not fit the capacity, `generate()` is captured again, on a prompt that fits.
    """
    import openvino as ov

    target = capture.exported if capture is not None and capture.exported is not None else pt_model
    fitting = _capture_that_fits(pt_model, capture, shapes, opts)
    ov_model = export_static_graph(target, shapes, logits=opts.logits,
                                   stateful=opts.stateful and not (plan is not None and plan.calibrating))
    reference = ov.Core().read_model(raw / GRAPH_XML)
    for key in ("optimum", "runtime_options"):
        if reference.has_rt_info(key):
            for name, value in reference.get_rt_info()[key].items():
                ov_model.set_rt_info(value.astype(str), [key, name])
    del reference
    if weight_format == "fp16":
        keep_vectors_exact(ov_model)
    ov.save_model(ov_model, raw / STATIC_GRAPH_XML, compress_to_fp16=(weight_format == "fp16"))
    return fitting


def _capture_that_fits(pt_model, capture, shapes: StaticShapes, opts: ExportOptions):
    if capture is None or capture.prompt_ids.shape[1] + capture.tokens.shape[1] <= shapes.cache_len:
        return capture
    import torch

    new_tokens = min(opts.validation_new_tokens, shapes.cache_len - 1)
    if new_tokens < 4:
        return None  # a prefill and 3 decode steps do not fit: validation is reported as skipped
    keep = max(1, shapes.cache_len - new_tokens)
    ids = torch.from_numpy(capture.prompt_ids[:, -keep:].copy())
    mask = torch.from_numpy(capture.prompt_mask[:, -keep:].copy())
    kwargs = {}
    if capture.exported is not None:
        kwargs = {"target": capture.exported, "module": capture.module}
    return with_float32_reference(pt_model, lambda: capture_generation(pt_model, ids, mask, new_tokens, **kwargs))


def finish_static_graph(raw: Path, plan, opts: ExportOptions, *, exported_type: str = "the model") -> None:
    """After optimum-intel's export: the static graph quantized as its flags asked (`quantization/static.py`),
    optimum-intel's dynamic graph dropped. The quantized graph is saved as NNCF left it, beside the unquantized
    one, then renamed over it.

    Raises:
        InvalidOptionsError: NNCF refused the group size (it does not divide some matmul's input width): the
            dynamic export's one line (`convert.group_size_refusal`).
    """
    import openvino as ov

    from ..quantization.static import quantized_static_graph
    from .convert import group_size_refusal

    xml = raw / STATIC_GRAPH_XML
    try:
        ov_model = quantized_static_graph(xml, raw, plan, stateful=opts.stateful)
    except Exception as err:  # NNCF's InvalidGroupSizeError: the static graph is quantized here, not in optimum-intel
        refusal = group_size_refusal(err, exported_type)
        if refusal is None:
            raise
        raise refusal from err
    (raw / GRAPH_XML).unlink(missing_ok=True)
    (raw / GRAPH_BIN).unlink(missing_ok=True)
    if ov_model is not None:
        staged = raw / f".quantized-{STATIC_GRAPH_XML}"
        ov.save_model(ov_model, staged, compress_to_fp16=False)
        del ov_model
        os.replace(staged, xml)
        os.replace(staged.with_suffix(".bin"), xml.with_suffix(".bin"))
