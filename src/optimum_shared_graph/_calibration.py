"""Quantization calibrated on both stages of generation (SPEC section 7).

optimum-intel calibrates a causal LM on prefill calls only: one sample per text, with an empty KV
cache. The shared graph also runs decode calls, whose single-token activations attend to a
populated cache. Here the calibration set holds both, for one graph and one set of scales:

1. optimum-intel exports the graph *stateless* (past KV as explicit inputs), so every calibration
   sample carries the cache it runs against and every NNCF algorithm (min-max, SmoothQuant, AWQ,
   scale estimation, GPTQ's layer-wise replay) sees a self-contained sample;
2. for each dataset text, generation runs on that exported fp32 graph: the prefill call, then
   `decode_steps` greedy decode calls with the real KV state. Each call is one sample;
3. the samples go to NNCF through optimum-intel's own entry point (`OVModelForCausalLM
   ._apply_quantization(..., calibration_dataset=...)`), with every optimum-intel flag's config;
4. the quantized graph is made stateful with optimum-intel's own `patch_stateful`, exactly the
   transform its stateful export applies after conversion (unless `--disable-stateful`).

The texts come from optimum-intel's own dataset handling (dataset names, `seq_len`, `num_samples`,
a list of strings), or from a local text file, one sample per line.

The hooks are installed around optimum-intel's `main_export` / `_main_quantize` for the duration of
the raw export only (`both_stage_quantization`), so the CLI, which runs optimum-intel's own command,
and the Python API go through the same code.

Static artifacts (`--shape-mode static`) are calibrated on their own graph instead: the
`_main_quantize` hook keeps the config optimum-intel built (`StaticQuantization`, registered for the
current export by `resolve_static_shapes`), and the static path traces its graph stateless and calls
`quantize_static_graph`: `StaticCalibrationSamples` drives the compiled graph with `StaticSession`,
so every sample is a call a static runtime really makes (C prompt tokens per prefill call, one real
token plus C - 1 masked slots per decode call, the fixed-capacity KV buffers as inputs).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from ._errors import InvalidOptionsError, SharedGraphError
from ._progress import bar

# Decode calls gathered after each prefill (ExportOptions.calibration_decode_steps has the default).

# NNCF's estimator of activation ranges in full quantization (`--quant-mode`): a name in
# `nncf.quantization.range_estimator.RangeEstimatorParametersSet`, or None for NNCF's own default.
# NNCF's default for per-tensor activations, MEAN_MINMAX (the mean over samples of each sample's min
# and max), depends on how many tokens each sample holds: a 52-token prompt and a group of 4 decode
# calls weigh the same, so adding decode samples narrows ranges that prompts reached (measured on the
# SmolLM-135M shape: 83% of activation ranges narrower, down to 0.63x) and int8 error rises on both
# stages. MINMAX takes the min and max over every calibrated token, whatever the batching into samples,
# so decode calls can only extend a range, never shrink it. Applied whatever the decode step count, so
# prefill-only calibration (`--calibration-decode-steps 0`) uses it too. See docs/quantization.md.
ACTIVATION_RANGE_ESTIMATOR: str | None = "MINMAX"

_COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}  # the KV state the fp32 model really produces
_STEP_INPUTS = {"input_ids", "attention_mask", "position_ids"}


@dataclass
class CalibrationReport:
    """How many calibration samples came from each stage (what the manifest records)."""

    prefill: int = 0
    decode: int = 0
    texts: int = 0
    decode_steps: int = 0
    graph: str | None = None  # "stateless" when samples carried their cache explicitly

    def counts(self) -> dict[str, int]:
        return {"prefill": self.prefill, "decode": self.decode}

    def record(self, samples, decode_steps: int) -> None:
        """Fill in what a calibration set (`BothStageSamples`, `StaticCalibrationSamples`) holds."""
        self.prefill, self.decode = samples.prefill_count, samples.decode_count
        self.texts, self.decode_steps, self.graph = samples.texts, decode_steps, "stateless"


def read_text_file(path: str | os.PathLike) -> list[str]:
    """The non-empty lines of a local text file: one calibration text each.

    Raises:
        InvalidOptionsError: the file cannot be read as UTF-8 or has no non-empty line.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidOptionsError(f"cannot read --dataset file {path} ({err}): pass a UTF-8 text file, one sample per line") from err
    texts = [line for line in lines if line.strip()]
    if not texts:
        raise InvalidOptionsError(f"--dataset file {path} has no non-empty line: write one calibration text per line")
    return texts


def resolve_dataset(dataset: Any) -> Any:
    """A `--dataset` value for optimum-intel: a local text file becomes its list of lines.

    Dataset names (`wikitext2`, `c4`, `auto`, `wikitext2:seq_len=64`, ...) and lists pass unchanged.
    """
    if isinstance(dataset, (str, os.PathLike)) and os.path.isfile(dataset):
        return read_text_file(dataset)
    return dataset


def resolve_config_dataset(quantization_config: Any) -> Any:
    """A quantization config dict whose `dataset` may be a local text file, with that file read."""
    if isinstance(quantization_config, dict) and "dataset" in quantization_config:
        return {**quantization_config, "dataset": resolve_dataset(quantization_config["dataset"])}
    return quantization_config


def is_data_aware(quantization_config: Any) -> bool:
    """Whether optimum-intel feeds calibration data to NNCF for this config.

    Full and mixed quantization (`--quant-mode`) always do. Weight compression does when a dataset
    is given and a data-aware algorithm runs (AWQ, scale estimation, GPTQ, LoRA correction, or a
    data-aware mixed-precision metric); 8-bit weight compression never uses data.
    """
    from optimum.intel.openvino.configuration import (
        OVMixedQuantizationConfig,
        OVPipelineQuantizationConfig,
        OVQuantizationConfig,
        OVQuantizationMethod,
        OVWeightQuantizationConfig,
        _quantization_config_from_dict,
    )

    config = quantization_config
    if config is None:
        return False
    if isinstance(config, dict):
        config = _quantization_config_from_dict(config)
    if isinstance(config, OVPipelineQuantizationConfig):
        return any(is_data_aware(c) for c in config.quantization_configs.values())
    if isinstance(config, (OVQuantizationConfig, OVMixedQuantizationConfig)):
        return True
    if isinstance(config, OVWeightQuantizationConfig):
        if config.dataset is None or config.bits == 8:
            return False
        import nncf

        return bool(
            config.quant_method == OVQuantizationMethod.AWQ
            or config.scale_estimation
            or config.gptq
            or config.lora_correction
            or (config.ratio < 1.0 and config.sensitivity_metric != nncf.SensitivityMetric.WEIGHT_QUANTIZATION_ERROR)
        )
    return False


class BothStageSamples:
    """Calibration samples of one stateless decoder graph: each text's prefill call and decode calls.

    Generation runs on the fp32 graph itself (greedy, `decode_steps` decode calls after each
    prefill, never stopping at EOS). Every call is fed exactly as generation made it, past KV
    included. To keep memory at one cache per text, a decode call's past is a slice of the text's
    final cache (the cache only grows by appending); a graph whose cache is not append-only keeps a
    copy per call.

    With `group_decode` (the default), a text's decode calls form one sample, a batch of
    `decode_steps` rows, each row one decode call with its own cache (left-padded to the longest,
    masked): fewer, larger NNCF samples. Under NNCF's default MEAN_MINMAX activation ranges a
    sample's token count sets how far into the tails its range reaches, so grouping limited how far
    one-token samples pulled ranges down; with `ACTIVATION_RANGE_ESTIMATOR = "MINMAX"` (the default
    here) ranges do not depend on the grouping.

    Args:
        ov_model: the stateless `openvino.Model` (past KV inputs `past_key_values.*`, outputs
            `present.*` and `logits`).
        prompts: `{"input_ids": [1, L], "attention_mask": [1, L]}` items (numpy or torch).
        decode_steps: decode calls gathered after each prefill (0: prefill only, optimum-intel's
            behaviour).
        group_decode: one sample per text for its decode calls (see above); otherwise one per call.
    """

    def __init__(self, ov_model, prompts, decode_steps: int, *, group_decode: bool = True):
        import openvino as ov

        if decode_steps < 0:
            raise InvalidOptionsError(f"calibration decode steps must be 0 or more, got {decode_steps}")
        self.decode_steps = decode_steps
        names = {p.get_any_name() for p in ov_model.inputs}
        self._past_names = sorted(n for n in names if n.startswith("past_key_values"))
        if not self._past_names:
            raise SharedGraphError("calibration on both stages needs the stateless graph (past_key_values inputs)")
        unknown = names - _STEP_INPUTS - set(self._past_names)
        if unknown:
            raise SharedGraphError(
                f"calibration on both stages cannot feed graph inputs {sorted(unknown)}: quantize without a "
                "data-aware mode for this model"
            )
        self._inputs = names
        self._past_types = {
            p.get_any_name(): (p.get_element_type().to_dtype(), p.get_partial_shape()) for p in ov_model.inputs
            if p.get_any_name() in self._past_names
        }
        compiled = ov.Core().compile_model(ov_model, "CPU", _COMPILE_CONFIG)
        request = compiled.create_infer_request()
        self._texts: list[dict[str, Any]] = []
        self._keys: list[tuple[int, int | None]] = []
        desc = f"calibration: prefill + {decode_steps} decode calls per text"
        for prompt in bar(desc, iterable=prompts, unit="text"):
            index = len(self._texts)
            text = self._generate(request, prompt)
            self._texts.append(text)
            self._keys.append((index, 0))
            if group_decode and decode_steps > 1 and text["axes"]:
                self._keys.append((index, None))  # all its decode calls, one batch
            else:
                self._keys += [(index, step) for step in range(1, decode_steps + 1)]
        del request, compiled

    @property
    def prefill_count(self) -> int:
        """Prefill calls in the set."""
        return len(self._texts)

    @property
    def texts(self) -> int:
        """Texts calibrated on (one prefill call each)."""
        return len(self._texts)

    @property
    def decode_count(self) -> int:
        """Decode calls in the set (grouped or not)."""
        return len(self._texts) * self.decode_steps

    def __len__(self) -> int:
        """Samples NNCF sees: one per prefill call, and one per decode call or per group of them."""
        return len(self._keys)

    def __iter__(self) -> Iterator[tuple[int, int | None]]:
        return iter(self._keys)

    def nncf_dataset(self):
        """An `nncf.Dataset` whose items become graph feeds only when NNCF asks for them."""
        import nncf

        return nncf.Dataset(self, self.feed)

    def feed(self, key: tuple[int, int | None]) -> dict[str, np.ndarray]:
        """The graph inputs of sample `key`: `(text, 0)` its prefill call, `(text, k)` its k-th decode
        call, `(text, None)` all its decode calls as one batch (row k-1 is decode call k)."""
        index, step = key
        text = self._texts[index]
        if step is None:
            return self._decode_batch(text)
        prompt_ids, prompt_mask, tokens = text["ids"], text["mask"], text["tokens"]
        if step == 0:
            input_ids, past = prompt_ids, self._empty_past()
        else:
            input_ids = tokens[:, step - 1: step]
            past = text["pasts"][step - 1] if text["pasts"] else self._past_prefix(text, prompt_ids.shape[1] + step - 1)
        mask = np.concatenate([prompt_mask, np.ones((1, step), dtype=np.int64)], axis=1)
        return self._feed(input_ids, mask, past)

    def _decode_batch(self, text) -> dict[str, np.ndarray]:
        steps, prompt_len = self.decode_steps, text["ids"].shape[1]
        longest = prompt_len + steps - 1
        masks, pasts = [], {name: [] for name in self._past_names}
        for step in range(1, steps + 1):
            pad = steps - step
            masks.append(np.concatenate([np.zeros((1, pad), np.int64), text["mask"], np.ones((1, step), np.int64)], 1))
            for name, value in self._past_prefix(text, prompt_len + step - 1).items():
                widths = [(0, 0)] * value.ndim
                widths[text["axes"][name]] = (pad, 0)
                pasts[name].append(np.pad(value, widths))
        past = {}
        for name, rows in pasts.items():
            batch_axis = 1 if text["axes"][name] == 0 else 0
            past[name] = np.concatenate(rows, axis=batch_axis)
            assert past[name].shape[text["axes"][name]] == longest
        return self._feed(text["tokens"].reshape(steps, 1), np.concatenate(masks, 0), past)

    def _feed(self, input_ids, mask, past) -> dict[str, np.ndarray]:
        from ._session import position_ids_from_mask

        feed = {"input_ids": input_ids}
        if "attention_mask" in self._inputs:
            feed["attention_mask"] = mask
        if "position_ids" in self._inputs:
            feed["position_ids"] = position_ids_from_mask(mask, input_ids.shape[1])
        feed.update(past)
        return feed

    def _empty_past(self) -> dict[str, np.ndarray]:
        past = {}
        for name, (dtype, shape) in self._past_types.items():
            dims = [d.get_length() if d.is_static else (1 if i == 0 else 0) for i, d in enumerate(shape)]
            past[name] = np.zeros(dims, dtype=dtype)
        return past

    def _generate(self, request, prompt) -> dict[str, Any]:
        ids = _as_numpy(prompt["input_ids"])
        mask = _as_numpy(prompt.get("attention_mask"))
        mask = np.ones_like(ids) if mask is None else mask
        if ids.shape[0] != 1:
            raise SharedGraphError(f"calibration prompts must have batch 1, got {ids.shape[0]}")
        input_ids, full_mask, past = ids, mask, self._empty_past()
        pasts, tokens = [], []
        for step in range(self.decode_steps + 1):
            request.infer(self._feed(input_ids, full_mask, past))
            logits = request.get_tensor("logits").data
            token = int(np.argmax(logits[0, -1]))
            past = {
                name: request.get_tensor(name.replace("past_key_values", "present", 1)).data.copy()
                for name in self._past_names
            }
            tokens.append(token)
            if step < self.decode_steps:
                pasts.append(past)
                input_ids = np.array([[token]], dtype=np.int64)
                full_mask = np.concatenate([full_mask, np.ones((1, 1), dtype=np.int64)], axis=1)
        text = {"ids": ids, "mask": mask, "tokens": np.array([tokens[:-1]], dtype=np.int64), "final": {}, "axes": {}}
        if not self.decode_steps:
            text["pasts"] = []
            return text
        text["final"] = past
        axes = self._append_axes(pasts, past, ids.shape[1])
        if axes is None:
            text["pasts"] = pasts  # not append-only: keep every call's own cache
        else:
            text["pasts"], text["axes"] = [], axes
        return text

    def _append_axes(self, pasts, final, prompt_len) -> dict[str, int] | None:
        """The sequence axis of each cache if every call's past is a prefix of the final cache."""
        axes = {}
        for name in self._past_names:
            grown = [i for i, (a, b) in enumerate(zip(final[name].shape, self._empty_past()[name].shape)) if a != b]
            if len(grown) != 1 or final[name].shape[grown[0]] != prompt_len + self.decode_steps:
                return None
            axes[name] = grown[0]
        for step, past in enumerate(pasts, start=1):
            view = self._past_prefix({"final": final, "axes": axes}, prompt_len + step - 1)
            if any(not np.array_equal(view[n], past[n]) for n in self._past_names):
                return None
        return axes

    def _past_prefix(self, text, length: int) -> dict[str, np.ndarray]:
        out = {}
        for name in self._past_names:
            index = [slice(None)] * text["final"][name].ndim
            index[text["axes"][name]] = slice(0, length)
            out[name] = np.ascontiguousarray(text["final"][name][tuple(index)])
        return out


def _as_numpy(value):
    if value is None:
        return None
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=np.int64).reshape(1, -1) if np.ndim(value) == 1 else np.asarray(value, dtype=np.int64)


def prompt_inputs(model, config, trust_remote_code: bool = False) -> list[dict[str, Any]]:
    """The tokenized calibration texts, from optimum-intel's own causal-LM dataset handling.

    Args:
        model: the `OVModelForCausalLM` being quantized.
        config: its quantization config (with `dataset`, `num_samples`, `tokenizer` set).
    """
    from optimum.intel.openvino.configuration import OVPipelineQuantizationConfig
    from optimum.intel.openvino.quantization import OVCalibrationDatasetBuilder

    if isinstance(config, OVPipelineQuantizationConfig) and config.dataset is None:
        config = next(c for c in config.quantization_configs.values() if c.dataset is not None)
    builder = OVCalibrationDatasetBuilder(model, trust_remote_code=trust_remote_code)
    prefill_only = builder._prepare_causal_lm_calibration_data(config)
    return list(prefill_only["model"].get_data())


def _with_num_samples(config, count: int):
    """A copy of the config whose NNCF subset size takes every gathered sample."""
    config = config.clone()
    config.num_samples = count
    for attr in ("weight_quantization_config", "full_quantization_config"):
        sub = getattr(config, attr, None)
        if sub is not None:
            sub.num_samples = count
    for sub in (getattr(config, "quantization_configs", None) or {}).values():
        if sub is not None:
            sub.num_samples = count
    return config


def _with_activation_range(config, estimator: str | None):
    """The config (already a copy) with NNCF's activation range estimator set on its full-quantization
    parts, through optimum-intel's own `advanced_parameters` kwarg; weight compression, and an estimator
    the config already sets (a Python API user's `advanced_parameters`), are left as they are."""
    if estimator is None:
        return config
    import dataclasses

    import nncf
    from nncf.quantization.range_estimator import RangeEstimatorParameters, RangeEstimatorParametersSet
    from optimum.intel.openvino.configuration import OVQuantizationConfig

    params = getattr(RangeEstimatorParametersSet, estimator.upper())
    parts = [config, getattr(config, "full_quantization_config", None)]
    parts += list((getattr(config, "quantization_configs", None) or {}).values())
    for part in parts:
        if isinstance(part, OVQuantizationConfig):
            advanced = part.kwargs.get("advanced_parameters") or nncf.AdvancedQuantizationParameters()
            if advanced.activations_range_estimator_params != RangeEstimatorParameters():
                continue
            part.kwargs["advanced_parameters"] = dataclasses.replace(advanced, activations_range_estimator_params=params)
    return config


class _NotStatefulWarning:
    """Drops optimum-intel's "Provided model does not contain state ... please reexport" warning: the
    calibration graph is stateless on purpose (every call feeds its KV cache) and is made stateful after."""

    @staticmethod
    def filter(record) -> bool:
        return "does not contain state" not in record.getMessage()


def load_stateless(path, *, trust_remote_code: bool = False, cache_dir: str | None = None,
                   model_kwargs: dict | None = None):
    """optimum-intel's `OVModelForCausalLM` on the stateless graph in `path`, for its quantization
    entry point (not compiled)."""
    import logging

    from optimum.intel import OVModelForCausalLM

    logger = logging.getLogger("optimum.intel.openvino.modeling_decoder")
    logger.addFilter(_NotStatefulWarning)
    try:
        return OVModelForCausalLM.from_pretrained(
            path, compile=False, use_cache=True, trust_remote_code=trust_remote_code, cache_dir=cache_dir,
            **(model_kwargs or {}),
        )
    finally:
        logger.removeFilter(_NotStatefulWarning)


def _prepared_config(model, quantization_config: Any, model_name_or_path: str):
    """The config (object or dict) as optimum-intel's quantizer takes it for `model`."""
    from optimum.intel.openvino.configuration import _quantization_config_from_dict

    config = quantization_config
    if isinstance(config, dict):
        config = _quantization_config_from_dict(config)
    return model._preprocess_quantization_config(config, model_name_or_path)


def _apply_calibrated(model, config, samples, *, model_name_or_path: str, trust_remote_code: bool, **save) -> None:
    """optimum-intel's quantization of `model.model` with NNCF, on `samples` (every one of them, with
    this package's activation range estimator); `save` is `_apply_quantization`'s saving arguments."""
    from optimum.intel.openvino.quantization import OVCalibrationDataset

    model._apply_quantization(
        _with_activation_range(_with_num_samples(config, len(samples)), ACTIVATION_RANGE_ESTIMATOR),
        compile_only=False, compile_model=False, model_name_or_path=model_name_or_path,
        trust_remote_code=trust_remote_code, calibration_dataset=OVCalibrationDataset(samples.nncf_dataset()), **save,
    )


def quantize_both_stages(
    model_name_or_path: str,
    output: str | os.PathLike,
    quantization_config: Any,
    *,
    decode_steps: int,
    stateful: bool,
    report: CalibrationReport,
    trust_remote_code: bool = False,
    cache_dir: str | None = None,
    model_kwargs: dict | None = None,
) -> None:
    """Quantize the stateless graph in `output` on both stages, then make it stateful if asked.

    What optimum-intel's `_main_quantize` does, with the calibration dataset built here.

    Args:
        model_name_or_path: the source model (for the tokenizer and optimum-intel's default
            ignored scopes).
        output: the directory holding optimum-intel's stateless export; rewritten in place.
        quantization_config: the optimum-intel quantization config (object or dict).
        decode_steps: decode calls per text.
        stateful: make the quantized graph stateful (optimum-intel's `patch_stateful`).
        report: filled with the per-stage sample counts.
    """
    output = Path(output)
    model = load_stateless(output, trust_remote_code=trust_remote_code, cache_dir=cache_dir, model_kwargs=model_kwargs)
    if model.stateful:
        raise SharedGraphError("calibration on both stages expected optimum-intel's stateless export")
    config = _prepared_config(model, quantization_config, model_name_or_path)
    samples = BothStageSamples(model.model, prompt_inputs(model, config, trust_remote_code), decode_steps)
    report.record(samples, decode_steps)
    _apply_calibrated(model, config, samples, model_name_or_path=model_name_or_path,
                      trust_remote_code=trust_remote_code, save_directory=output, immediate_save=True)
    model_config = model.config
    del model, samples
    gc.collect()
    if stateful:
        make_stateful(output / "openvino_model.xml", model_config)


def make_stateful(xml: Path, model_config) -> None:
    """Turn the stateless graph at `xml` stateful in place with optimum-intel's `patch_stateful`."""
    import openvino as ov
    from optimum.exporters.openvino.stateful import patch_stateful

    core = ov.Core()
    ov_model = core.read_model(xml)
    patch_stateful(model_config, ov_model)
    tmp = xml.with_name(".stateful-" + xml.name)
    ov.save_model(ov_model, tmp, compress_to_fp16=False)
    del ov_model
    gc.collect()
    os.replace(tmp, xml)
    os.replace(tmp.with_suffix(".bin"), xml.with_suffix(".bin"))


class _ConfigBuilt(Exception):
    """Stops optimum-intel's export command once it has built its quantization config."""


def quantization_config_of(run_command) -> Any:
    """The quantization config optimum-intel's export command builds from its flags.

    `run_command()` runs the command; it is stopped where it calls `main_export`, so nothing is loaded,
    converted or written, and the config is exactly the one the export would use (optimum-intel's
    own flag handling, model defaults included). None when the flags ask for no quantization.
    """
    import optimum.exporters.openvino.__main__ as ov_main

    original = ov_main.main_export
    signature = inspect.signature(original)
    built: dict[str, Any] = {}

    def main_export(*args, **kwargs):
        ov_config = signature.bind(*args, **kwargs).arguments.get("ov_config")
        built["config"] = getattr(ov_config, "quantization_config", None)
        raise _ConfigBuilt

    ov_main.main_export = main_export
    try:
        run_command()
    except _ConfigBuilt:
        pass
    finally:
        ov_main.main_export = original
    return built.get("config")


@contextlib.contextmanager
def both_stage_quantization(decode_steps: int, report: CalibrationReport):
    """While active, optimum-intel's data-aware quantization of a causal LM calibrates on both stages.

    Wraps `optimum.exporters.openvino.__main__.main_export` (a data-aware config exports the graph
    stateless, remembering whether a stateful one was asked for) and `_main_quantize` (which then
    runs `quantize_both_stages`). Anything else goes to optimum-intel unchanged.

    Args:
        decode_steps: decode calls gathered after each prefill.
        report: filled with the per-stage sample counts.
    """
    import optimum.exporters.openvino.__main__ as ov_main

    original_export, original_quantize = ov_main.main_export, ov_main._main_quantize
    export_signature = inspect.signature(original_export)
    quantize_signature = inspect.signature(original_quantize)
    requested: dict[str, bool] = {}
    static = pending_static_quantization()  # a static export calibrates its own graph later

    def main_export(*args, **kwargs):
        bound = export_signature.bind(*args, **kwargs)
        ov_config = bound.arguments.get("ov_config")
        if ov_config is not None and is_data_aware(getattr(ov_config, "quantization_config", None)):
            requested["stateful"] = bound.arguments.get("stateful", True)
            bound.arguments["stateful"] = False
        return original_export(*bound.args, **bound.kwargs)

    def _main_quantize(*args, **kwargs):
        bound = quantize_signature.bind(*args, **kwargs)
        bound.apply_defaults()
        arguments = bound.arguments
        data_aware = is_data_aware(arguments["quantization_config"])
        if static is not None:  # optimum-intel's dynamic graph is replaced: the static one is quantized instead
            if not data_aware:
                static.weight_config = arguments["quantization_config"]
                return None
            static.config, static.report = arguments["quantization_config"], report
            static.model_name_or_path, static.trust_remote_code = arguments["model_name_or_path"], arguments["trust_remote_code"]
            static.cache_dir, static.model_kwargs = arguments["cache_dir"], arguments["model_kwargs"]
            return None
        if "stateful" not in requested or not data_aware:
            return original_quantize(*bound.args, **bound.kwargs)
        quantize_both_stages(
            arguments["model_name_or_path"], arguments["output"], arguments["quantization_config"],
            decode_steps=decode_steps, stateful=requested["stateful"], report=report,
            trust_remote_code=arguments["trust_remote_code"], cache_dir=arguments["cache_dir"],
            model_kwargs=arguments["model_kwargs"],
        )

    ov_main.main_export, ov_main._main_quantize = main_export, _main_quantize
    try:
        yield report
    finally:
        ov_main.main_export, ov_main._main_quantize = original_export, original_quantize


# ------------------------------------------------------------------------------------------ static


@dataclass
class StaticQuantization:
    """A static export's quantization, calibrated on the static graph itself.

    Registered for the current export by `resolve_static_shapes` (before any export work); the
    `_main_quantize` hook of `both_stage_quantization` fills in the config optimum-intel built from
    its flags (and the arguments it was called with) instead of quantizing the dynamic graph, and
    the static path then runs `quantize_static_graph` (data-aware) or compresses the static graph's
    weights with optimum-intel's `_weight_only_quantization` and that config (data-free).
    """

    shapes: Any  # _static.StaticShapes
    decode_steps: int
    config: Any = None  # a data-aware config: calibrated on the static graph's calls
    weight_config: Any = None  # a data-free weight-compression config: applied to the static graph as is
    report: CalibrationReport | None = None
    model_name_or_path: str | None = None
    trust_remote_code: bool = False
    cache_dir: str | None = None
    model_kwargs: dict | None = None


_STATIC_ATTR = "static_quantization"


def expect_static_quantization(shapes, opts) -> None:
    """Check a static export's quantization options and register its `StaticQuantization`.

    Called by `resolve_static_shapes`, before any export work. The Python API's
    `quantization_config` is checked here; the CLI's quantization flags are only known to
    optimum-intel's command, and `run_export` checks the config it builds (`quantization_config_of`)
    right after this.
    The registration lives on the current export's progress scope (`_progress.export_progress`),
    so it ends with the export, whether it succeeds or fails.
    """
    from . import _progress

    config = opts.quantization_config
    if config is not None:
        check_static_quantization(shapes, opts.calibration_decode_steps, config)
        if not is_data_aware(config):
            raise InvalidOptionsError(
                "a quantization_config without calibration data is not applied to static graphs: pass "
                "weight_format='int8' or 'int4' for data-free weight compression, or add a dataset with a "
                "data-aware mode (full quantization, AWQ, scale estimation, GPTQ)"
            )
    export = _progress._current.get()
    if export is not None:
        setattr(export, _STATIC_ATTR, StaticQuantization(shapes=shapes, decode_steps=opts.calibration_decode_steps))


def pending_static_quantization() -> StaticQuantization | None:
    """The current export's `StaticQuantization` (None outside a static export)."""
    from . import _progress

    return getattr(_progress._current.get(), _STATIC_ATTR, None)


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

        from ._static import StaticSession, _layer_order

        if decode_steps < 0:
            raise InvalidOptionsError(f"calibration decode steps must be 0 or more, got {decode_steps}")
        self.decode_steps = decode_steps
        self._past_names = sorted((p.get_any_name() for p in ov_model.inputs
                                   if p.get_any_name().startswith("past_key_values")), key=_layer_order)
        if not self._past_names:
            raise SharedGraphError("static calibration needs the stateless static graph (past_key_values inputs)")
        self._past_specs = {p.get_any_name(): (tuple(p.get_shape()), p.get_element_type().to_dtype())
                            for p in ov_model.inputs if p.get_any_name() in self._past_names}
        compiled = ov.Core().compile_model(ov_model, "CPU", _COMPILE_CONFIG)
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
                raise SharedGraphError(f"calibration prompts must have batch 1, got {ids.shape[0]}")
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
    (pending.report if pending.report is not None else CalibrationReport()).record(samples, pending.decode_steps)
    model.replace_ov_model(model.model, ov_model)  # the dynamic graph is released here
    _apply_calibrated(model, config, samples, model_name_or_path=pending.model_name_or_path,
                      trust_remote_code=pending.trust_remote_code)
    quantized = model.model
    model._openvino_config.save_pretrained(raw)
    del model, samples
    gc.collect()
    return quantized
