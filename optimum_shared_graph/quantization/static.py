"""Quantization of a static graph, calibrated on the calls a static runtime makes.

The static export traces its graph stateless and calls `quantize_static_graph`: `StaticCalibrationSamples`
drives the compiled graph with `StaticSession`, so every sample is a call a static runtime really makes
(C prompt tokens per prefill call, one real token plus C - 1 masked slots per decode call, the
fixed-capacity KV buffers as inputs). The plan (`StaticQuantization`) is made by `plan_static_quantization`
before any export work and filled by the `_main_quantize` hook of `both_stages.both_stage_quantization`.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ..errors import InvalidOptionsError, ModelNotSupportedError
from ..graph.static import make_static_stateful
from ..progress import bar
from ..runtimes.static_session import StaticSession, layer_order
from .calibration import (
    COMPILE_CONFIG, both_stage_steps,
    _as_numpy,
    CalibrationReport, _apply_calibrated, _prepared_config, is_data_aware, load_stateless, resolve_config_dataset,
    prompt_inputs, resolve_dataset,
)

@dataclass
class StaticQuantization:
    """A static export's quantization plan, calibrated on the static graph itself.

    Made by `plan_static_quantization` before any export work and passed to the export's stages: the
    `_main_quantize` hook of `both_stages.both_stage_quantization` fills in the config optimum-intel built
    from its flags (and the arguments it was called with) instead of quantizing the dynamic graph, and
    the static trace then runs `quantize_static_graph` (data-aware) or compresses the static graph's
    weights with optimum-intel's `_weight_only_quantization` and that config (data-free).
    """

    shapes: Any  # graph.static.StaticShapes
    decode_steps: int
    calibrating: bool = False  # a data-aware config is expected (known from the options before the export)
    config: Any = None  # a data-aware config: calibrated on the static graph's calls
    weight_config: Any = None  # a data-free weight-compression config: applied to the static graph as is
    report: CalibrationReport | None = None
    model_name_or_path: str | None = None
    trust_remote_code: bool = False
    cache_dir: str | None = None
    model_kwargs: dict | None = None


def plan_static_quantization(shapes, opts, *, calibrating: bool) -> StaticQuantization:
    """Check a static export's quantization options; return its plan.

    The Python API's `quantization_config` is checked here; the CLI's quantization flags are only known
    to optimum-intel's command, and `run_export` checks the config it builds (`quantization_config_of`)
    before this.
    """
    config = opts.quantization_config
    steps = both_stage_steps(opts.calibration_decode_steps)
    if config is not None:
        check_static_quantization(shapes, steps, config)
        if not is_data_aware(config):
            raise InvalidOptionsError(
                "a quantization_config without calibration data is not applied to static graphs: pass "
                "weight_format='int8' or 'int4' for data-free weight compression, or add a dataset with a "
                "data-aware mode (full quantization, AWQ, scale estimation, GPTQ)"
            )
    return StaticQuantization(shapes=shapes, decode_steps=steps, calibrating=calibrating)


def check_static_quantization(shapes, decode_steps: int, quantization_config: Any) -> None:
    """Refuse quantization options a static export cannot honour, with what to change.

    Raises:
        InvalidOptionsError: the decode steps leave no room for a prompt in the capacity; a data-aware
            algorithm (AWQ, scale estimation, GPTQ, LoRA correction) without a dataset, which needs the
            static graph's own calibration calls; a local dataset file that is empty or unreadable.
    """
    from optimum.intel.openvino.configuration import OVWeightQuantizationConfig, _quantization_config_from_dict

    config = quantization_config
    if isinstance(config, dict):
        config = _quantization_config_from_dict(resolve_config_dataset(config))
    if is_data_aware(config):
        _check_room(decode_steps, shapes.cache_len)
        resolve_dataset(getattr(config, "dataset", None))  # an empty or unreadable text file fails here
        return
    if isinstance(config, OVWeightQuantizationConfig) and config.dataset is None:
        from optimum.intel.openvino.configuration import OVQuantizationMethod

        flags = [flag for flag, on in (("--awq", config.quant_method == OVQuantizationMethod.AWQ),
                                       ("--scale-estimation", config.scale_estimation), ("--gptq", config.gptq),
                                       ("--lora-correction", config.lora_correction)) if on]
        if flags:
            raise InvalidOptionsError(
                f"{', '.join(flags)} without --dataset is not available with --shape-mode static (static weights are "
                f"either compressed data-free or calibrated on the static graph's own calls): add --dataset "
                f"(a name or a local text file) or drop {', '.join(flags)}"
            )


def _check_room(decode_steps: int, capacity: int) -> None:
    """Refuse decode steps that leave no slot of a static KV capacity for a calibration prompt."""
    if decode_steps >= capacity:
        raise InvalidOptionsError(
            f"--calibration-decode-steps {decode_steps} leaves no room for a calibration prompt in the static KV "
            f"capacity of {capacity}: use --calibration-decode-steps {capacity - 1} or less, or raise --max-cache-len"
        )


class _RecordingRequest:
    """An infer request that keeps, for every call, the small inputs and the KV slots the call wrote.

    A stateless static graph returns its KV buffers with only the call's C slots (`cache_position`)
    changed, so the buffers fed to any call are rebuilt exactly from the slots the calls before it
    wrote: per text, about one buffer's worth of memory instead of one full buffer per call.
    """

    def __init__(self, request, past_names: list[str]):
        self.request = request
        self.past_names = past_names
        self.calls: list[dict[str, Any]] = []

    def infer(self, feed):
        self.request.infer(feed)
        w, C = int(feed["cache_position"][0]), len(feed["cache_position"])
        small = {name: np.array(value, copy=True) for name, value in feed.items() if not name.startswith("past_key_values")}
        small["attention_mask"] = small["attention_mask"][:, : w + C].astype(np.int8)  # later slots are all 0
        written = {name: self.request.get_tensor(name.replace("past_key_values", "present", 1)).data[:, :, w: w + C].copy()
                   for name in self.past_names}
        self.calls.append({"feed": small, "written": written, "window": (w, C)})

    def get_tensor(self, name):
        return self.request.get_tensor(name)

    def reset_state(self):
        self.request.reset_state()


class StaticCalibrationSamples:
    """Calibration samples of one stateless static graph: the calls `StaticSession` makes for each text.

    For each text, the compiled fp32 graph is driven by `StaticSession` itself, as the runtime and
    export-time validation drive it: the prompt in calls of C tokens (a last, shorter chunk followed
    by masked slots), then `decode_steps` greedy decode calls of one real token plus C - 1 masked
    slots (never stopping at EOS), the KV buffers of capacity `cache_len` fed as inputs. A prompt
    longer than the capacity minus `decode_steps` keeps its first tokens. Each call is one NNCF
    sample, fed exactly as it was made: its KV buffers are rebuilt from the slots earlier calls wrote.

    Args:
        ov_model: the stateless static `openvino.Model` (`past_key_values.*` inputs, `present.*` outputs).
        prompts: `{"input_ids": [1, L], "attention_mask": [1, L]}` items (numpy or torch).
        decode_steps: decode calls after each text's prefill calls.
        pad_token_id: the token fed in masked slots (the runtime's: the generation config's pad token, else 0).
    """

    def __init__(self, ov_model, prompts, decode_steps: int, pad_token_id: int = 0):
        import openvino as ov

        if decode_steps < 0:
            raise InvalidOptionsError(f"calibration decode steps must be 0 or more, got {decode_steps}")
        self.decode_steps = decode_steps
        self._past_names = sorted((p.get_any_name() for p in ov_model.inputs
                                   if p.get_any_name().startswith("past_key_values")), key=layer_order)
        if not self._past_names:
            raise ModelNotSupportedError("static calibration needs the stateless static graph (past_key_values inputs)")
        self._past_specs = {p.get_any_name(): (tuple(p.get_shape()), p.get_element_type().to_dtype())
                            for p in ov_model.inputs if p.get_any_name() in self._past_names}
        compiled = ov.Core().compile_model(ov_model, "CPU", COMPILE_CONFIG)
        recorder = _RecordingRequest(compiled.create_infer_request(), self._past_names)
        session = StaticSession(compiled, pad_token_id, request=recorder)
        self.capacity, self.query_len = session.capacity, session.query_len
        _check_room(decode_steps, self.capacity)
        keep = self.capacity - decode_steps
        self.truncated = 0
        self._texts: list[list[dict[str, Any]]] = []
        self._keys: list[tuple[int, int]] = []
        self.prefill_count = self.decode_count = 0
        desc = f"calibration (static): prefill + {decode_steps} decode calls per text"
        for prompt in bar(desc, iterable=prompts, unit="text"):
            ids = _as_numpy(prompt["input_ids"])
            mask = _as_numpy(prompt.get("attention_mask"))
            mask = np.ones_like(ids) if mask is None else mask
            if ids.shape[0] != 1:
                raise InvalidOptionsError(f"calibration prompts must have batch 1, got {ids.shape[0]}")
            if ids.shape[1] == 0:
                continue
            if ids.shape[1] > keep:
                ids, mask = ids[:, :keep], mask[:, :keep]
                self.truncated += 1
            recorder.calls = []
            session.reset()
            token = int(np.argmax(session.step(ids, mask)[0, -1]))
            prefill_calls = len(recorder.calls)
            for _ in range(decode_steps):
                token = int(np.argmax(session.step(np.array([[token]], dtype=np.int64))[0, -1]))
            index = len(self._texts)
            self._texts.append(recorder.calls)
            self._keys += [(index, call) for call in range(len(recorder.calls))]
            self.prefill_count += prefill_calls
            self.decode_count += len(recorder.calls) - prefill_calls
        del session, recorder, compiled
        if not self._texts:
            raise InvalidOptionsError("the calibration dataset gave no non-empty text: pass texts with at least one token")

    @property
    def texts(self) -> int:
        return len(self._texts)

    def __len__(self) -> int:
        """Samples NNCF sees: one per call."""
        return len(self._keys)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(self._keys)

    def nncf_dataset(self):
        """An `nncf.Dataset` whose items become graph feeds only when NNCF asks for them."""
        import nncf

        return nncf.Dataset(self, self.feed)

    def feed(self, key: tuple[int, int]) -> dict[str, np.ndarray]:
        """The graph inputs of call `key` = `(text, call)`, KV buffers included, as `StaticSession` fed them."""
        index, call = key
        calls = self._texts[index]
        record = calls[call]
        feed = {name: value for name, value in record["feed"].items() if name != "attention_mask"}
        recorded = record["feed"]["attention_mask"]
        mask = np.zeros((recorded.shape[0], self.capacity), dtype=np.int64)
        mask[:, : recorded.shape[1]] = recorded
        feed["attention_mask"] = mask
        for name in self._past_names:
            shape, dtype = self._past_specs[name]
            buffer = np.zeros(shape, dtype=dtype)
            for earlier in calls[:call]:  # in call order: a later write of a slot wins, as in the graph
                w, C = earlier["window"]
                buffer[:, :, w: w + C] = earlier["written"][name]
            feed[name] = buffer
        return feed


def quantize_static_graph(ov_model, raw: Path, pending: StaticQuantization):
    """Quantize a stateless static graph with NNCF, calibrated on the calls a static runtime makes.

    optimum-intel's own entry point does the quantization: the stateless dynamic graph it exported
    to `raw` is loaded as an `OVModelForCausalLM` (for its tokenizer and dataset handling, config
    preprocessing and default ignored scopes), the static graph replaces it (`replace_ov_model`),
    and `_apply_quantization(..., calibration_dataset=...)` maps the config to NNCF as it does for
    any model. The caller makes the result stateful if asked.

    Args:
        ov_model: the stateless static `openvino.Model` (fp32).
        raw: optimum-intel's export directory (stateless: the `main_export` hook asked for it);
            `openvino_config.json` there records the quantization, as optimum-intel writes it.
        pending: the export's `StaticQuantization`, with the config the `_main_quantize` hook kept.

    Returns:
        The quantized stateless `openvino.Model`.
    """
    model = load_stateless(raw, trust_remote_code=pending.trust_remote_code, cache_dir=pending.cache_dir,
                           model_kwargs=pending.model_kwargs)
    config = _prepared_config(model, pending.config, pending.model_name_or_path)
    prompts = prompt_inputs(model, config, pending.trust_remote_code)
    generation_config = getattr(model, "generation_config", None)
    pad = generation_config.pad_token_id if generation_config is not None else None  # as the runtime chooses it
    samples = StaticCalibrationSamples(ov_model, prompts, pending.decode_steps, pad_token_id=pad or 0)
    report = pending.report if pending.report is not None else CalibrationReport()
    report.record(samples, pending.decode_steps)
    model.replace_ov_model(model.model, ov_model)  # the dynamic graph is released here
    report.overflow_fix = _apply_calibrated(model, config, samples, model_name_or_path=pending.model_name_or_path,
                                            trust_remote_code=pending.trust_remote_code)
    quantized = model.model
    model._openvino_config.save_pretrained(raw)
    del model, samples
    gc.collect()
    return quantized


def quantized_static_graph(xml: Path, raw: Path, plan, *, stateful: bool):
    """The static graph at `xml` quantized as optimum-intel's flags asked, in memory (None: nothing to quantize).

    A data-aware config (which the `_main_quantize` hook of `both_stage_quantization` kept for this export
    instead of quantizing optimum-intel's dynamic graph) is calibrated on the calls a static runtime makes,
    on the stateless static graph, then the graph is made stateful if asked (`quantize_static_graph`). A
    data-free one compresses the static graph's weights as optimum-intel would (`_compress_weights`).
    """
    import openvino as ov

    if plan is not None and plan.config is not None:
        ov_model = quantize_static_graph(ov.Core().read_model(xml), raw, plan)
        if stateful:
            make_static_stateful(ov_model)
        return ov_model
    if plan is not None and plan.weight_config is not None:
        return _compress_weights(ov.Core().read_model(xml), plan.weight_config)
    return None


def _compress_weights(ov_model, config):
    """Data-free weight compression of the static graph (`--weight-format` without calibration).

    `config` is the weight-compression config optimum-intel built from the flags (`--weight-format`,
    `--group-size`, `--ratio`, `--sym`, `--all-layers`, ... or the Python API's `weight_format`), applied
    by optimum-intel's own `_weight_only_quantization`, as its dynamic export would apply it.
    """
    from optimum.intel.openvino.quantization import _weight_only_quantization

    return _weight_only_quantization(ov_model, config, verify_not_optimized=False)
