"""What every calibration of this package shares: the dataset handling, the report the manifest records,
and optimum-intel's quantization entry point with this package's activation range estimator.

The two calibrations built on it: `both_stages` (the dynamic graph, on prefill and decode calls) and
`static` (the static graph, on the calls a static runtime makes). docs/quantization.md explains both.
"""

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidOptionsError

# Decode calls gathered after each prefill where both stages are calibrated: static graphs and vision-language
# models (not measured against prefill only), and `GPTQ_DECODE_STEPS` for a text graph's GPTQ alone
# (`decode_steps_for`).
DEFAULT_DECODE_STEPS = 4
# GPTQ alone on a text graph: 16 decode calls per text (pasts up to 16 tokens past the prompt), merged to
# prompt-length samples. Its Hessian is a sum over tokens, so decode calls add tokens at positions past the prompts;
# on two trained models they gave 0.98x and 0.94x prefill-only's KL (lower in 15 and 20 of 29 windows;
# benchmarks/calibration_design.py's one run, docs/quality.md).
GPTQ_DECODE_STEPS = 16
# Why a text graph's other data-aware weight compression calibrates on prefill calls only unless asked otherwise
# (what the manifest's `calibration_decode_steps_reason` says). NNCF's AWQ and scale estimation reduce each sample
# to one mean activation vector (`OVMeanReducer` over batch and sequence) and weigh every sample the same
# (`activation_stats.process_stats`: the channel magnitude is the max over samples of |mean|, the error is taken on
# the means, and past `subset_size` samples they keep every k-th of the samples sorted by token count): a decode
# sample of a few tokens weighs as much as a prompt of dozens, and it pushes prompts out of the subset. Merged to
# prompt-length samples the decode calls weigh by their tokens, and still did not lower the error: on two trained
# models 16 decode calls per text gave AWQ + scale estimation 0.98x and 1.17x prefill-only's KL, data-aware mixed
# precision 1.00x and 1.00x (benchmarks/calibration_design.py's one run, docs/quality.md).
WEIGHT_COMPRESSION_PREFILL_ONLY = (
    "default for data-aware weight compression but GPTQ alone: prefill calls only (decode calls did not lower AWQ, "
    "scale estimation or mixed precision's error on two trained models, docs/quality.md); "
    "--calibration-decode-steps N adds them"
)
GPTQ_BOTH_STAGES = ("default for GPTQ alone: prefill and 16 decode calls per text, merged to prompt-length samples "
                    "(its Hessian sums over tokens; lower error than prefill only on two trained models, "
                    "docs/quality.md)")
# Full quantization (`--quant-mode`) on a text graph: prefill calls only. Under MINMAX a range is the min and max over
# every calibrated token, so decode calls can only widen it; on two trained models 16 decode calls per text gave
# `--quant-mode int8` 1.04x and 0.91x prefill-only's KL (lower in 11 and 16 of 29 windows; benchmarks/
# calibration_design.py's one run on an AVX-512 VNNI CPU, docs/quality.md): worse on one model, not 0.9x on the other.
FULL_QUANTIZATION_PREFILL_ONLY = (
    "default for full quantization: prefill calls only (decode calls widen the activation ranges and did not lower "
    "--quant-mode int8's error enough on two trained models, docs/quality.md); --calibration-decode-steps N adds them"
)

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

# `--quant-mode int8` on a text graph: the MLPs' output projections (the MatMuls with a constant weight reading the
# MLP's activation, `mlp_output_matmuls`: llama's `down_proj`) are left in float (an NNCF ignored scope), and NNCF
# SmoothQuant's alpha for MatMuls is 0.5 where `--smooth-quant-alpha` is not given. A trained LLM's down projections
# read a few channels of huge values at the first token (on SmolLM2-135M-Instruct up to 3,271 where 99.9% of the other
# tokens' values are below 1.3): NNCF's per-tensor int8 range spans them and rounds the other tokens' inputs to a few
# levels; SmoothQuant (its scales capped at 100) cannot fold a one-token outlier away, and NNCF refuses per-channel
# activation quantizers on the CPU. Only the 6 of 30 down projections with the largest outliers in float left +6.0%
# perplexity, all 30 +1.7%; NNCF's alpha (0.95) moves nearly all of a channel's range into the weights and left the
# first positions' KL at 0.65, 0.5 at 0.04. Measured by benchmarks/activation_quantization.py (docs/quality.md).
SMOOTH_QUANT_ALPHA = 0.5
# Int8 activations (`--quant-mode int8`, on any graph: text, static, a vision-language model's): NNCF's overflow fix
# on every layer (int8 weights keep 7 bits), where optimum-intel's config says "disable" (its default). A CPU without
# VNNI (AVX2 only: Intel before Ice Lake and Alder Lake, AMD before Zen 4) multiplies u8 activations by s8 weights in
# pairs summed into int16, which saturates on 8-bit weights, and an artifact runs on CPUs its exporter cannot know.
# On SmolLM2-135M-Instruct (29 windows, the text graph's defaults) 8-bit weights gave +0.59% perplexity from PyTorch
# on an AVX-512 VNNI CPU and +10.99% on the same CPU capped at AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`), 7-bit +2.04% and
# +1.48% (benchmarks/activation_quantization.py, docs/quality.md). A config's "first_layer_only" is kept (8-bit
# weights, for CPUs known to have VNNI).
OVERFLOW_FIX = "enable"
# The activation functions of an MLP, whose output (or its product with the up projection: a gated MLP) a down
# projection reads.
MLP_ACTIVATIONS = ("Swish", "Gelu", "Relu", "HSwish", "Mish", "Sigmoid")

# How calibration compiles the fp32 graph it generates with: the KV state the fp32 model really produces.
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}




@dataclass
class CalibrationReport:
    """How many calibration samples came from each stage (what the manifest records)."""

    prefill: int = 0
    decode: int = 0
    texts: int = 0
    decode_steps: int = 0
    graph: str | None = None  # "stateless" when samples carried their cache explicitly
    reason: str | None = None  # why this many decode steps (`decode_steps_for`)
    float_matmuls: list[str] | None = None  # --quant-mode int8: MatMuls left in float (`mlp_output_matmuls`)
    overflow_fix: str | None = None  # int8 activations: NNCF's overflow fix of their graphs (`OVERFLOW_FIX`)
    samples: int = 0  # what NNCF sees: the prefill calls and the decode calls' samples (merged or not)

    def counts(self) -> dict[str, int]:
        return {"prefill": self.prefill, "decode": self.decode}

    def record(self, samples, decode_steps: int) -> None:
        """Fill in what a calibration set (`BothStageSamples`, `StaticCalibrationSamples`) holds."""
        self.prefill, self.decode, self.samples = samples.prefill_count, samples.decode_count, len(samples)
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
    )

    if quantization_config is None:
        return False
    config = _config_object(quantization_config)
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


def is_weight_compression(quantization_config: Any) -> bool:
    """Whether the config compresses weights only (no activation quantization: no `--quant-mode` part)."""
    from optimum.intel.openvino.configuration import OVPipelineQuantizationConfig, OVWeightQuantizationConfig

    config = _config_object(quantization_config)
    if isinstance(config, OVPipelineQuantizationConfig):
        return all(is_weight_compression(c) for c in config.quantization_configs.values())
    return isinstance(config, OVWeightQuantizationConfig)


def _config_object(quantization_config: Any) -> Any:
    """optimum-intel's config object for a config given as a dict (a local text file as `dataset` read first:
    optimum-intel knows only names); any other value as it is."""
    from optimum.intel.openvino.configuration import _quantization_config_from_dict

    if isinstance(quantization_config, dict):
        return _quantization_config_from_dict(resolve_config_dataset(quantization_config))
    return quantization_config


def both_stage_steps(requested: int | None) -> int:
    """The decode calls calibrated after each prefill of a static graph or a vision-language model:
    `requested` when given (`--calibration-decode-steps`), else `DEFAULT_DECODE_STEPS`."""
    return DEFAULT_DECODE_STEPS if requested is None else requested


def decode_steps_for(requested: int | None, quantization_config: Any) -> tuple[int, str]:
    """The decode calls calibrated after each text's prefill for a text graph, and why: `requested` when given
    (`--calibration-decode-steps`), else `GPTQ_DECODE_STEPS` for GPTQ alone and 0 for every other data-aware
    quantization, as measured (`GPTQ_BOTH_STAGES`, `WEIGHT_COMPRESSION_PREFILL_ONLY`,
    `FULL_QUANTIZATION_PREFILL_ONLY`)."""
    if requested is not None:
        return requested, "--calibration-decode-steps"
    if not is_weight_compression(quantization_config):
        return 0, FULL_QUANTIZATION_PREFILL_ONLY
    if _gptq_alone(quantization_config):
        return GPTQ_DECODE_STEPS, GPTQ_BOTH_STAGES
    return 0, WEIGHT_COMPRESSION_PREFILL_ONLY


def _gptq_alone(quantization_config: Any) -> bool:
    """Whether a weight compression config runs GPTQ without AWQ or scale estimation (whose per-sample means the
    decode calls did not help), every part of a pipeline config so."""
    from optimum.intel.openvino.configuration import OVPipelineQuantizationConfig, OVQuantizationMethod

    config = _config_object(quantization_config)
    if isinstance(config, OVPipelineQuantizationConfig):
        return all(_gptq_alone(c) for c in config.quantization_configs.values())
    return bool(getattr(config, "gptq", False)) and not getattr(config, "scale_estimation", False) and \
        getattr(config, "quant_method", None) != OVQuantizationMethod.AWQ


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


def _full_quantization_parts(config) -> list:
    """The full-quantization parts (`OVQuantizationConfig`) of a config: itself, a mixed config's
    `full_quantization_config`, a pipeline config's graphs' configs."""
    from optimum.intel.openvino.configuration import OVQuantizationConfig

    parts = [config, getattr(config, "full_quantization_config", None)]
    parts += list((getattr(config, "quantization_configs", None) or {}).values())
    return [part for part in parts if isinstance(part, OVQuantizationConfig)]


def _with_overflow_fix(config) -> str | None:
    """`OVERFLOW_FIX` on every int8 full-quantization part of the config (already a copy) whose overflow fix is
    optimum-intel's default ("disable"); the setting its int8 parts then have (None: no int8 activations)."""
    applied = None
    for part in _full_quantization_parts(config):
        if part.dtype == "int8":
            if part.overflow_fix == "disable":
                part.overflow_fix = OVERFLOW_FIX
            applied = part.overflow_fix
    return applied


def _with_activation_range(config, estimator: str | None):
    """The config (already a copy) with NNCF's activation range estimator set on its full-quantization
    parts, through optimum-intel's own `advanced_parameters` kwarg; weight compression, and an estimator
    the config already sets (a Python API user's `advanced_parameters`), are left as they are."""
    if estimator is None:
        return config
    import dataclasses

    import nncf
    from nncf.quantization.range_estimator import RangeEstimatorParameters, RangeEstimatorParametersSet

    params = getattr(RangeEstimatorParametersSet, estimator.upper())
    for part in _full_quantization_parts(config):
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
    entry point (not compiled).

    With `INFERENCE_PRECISION_HINT=f32` (`COMPILE_CONFIG`): on load optimum-intel gives a stateless graph's past
    and present KV the device's inference precision (bf16 on a CPU with bf16 units), and that graph is what gets
    quantized and saved: the artifact then kept a bf16 KV state behind Converts, which GenAI's NPU pipeline refuses
    (`NPUW: Assertion ov::npuw::RemoveEmptyKVInputs().run_on_model(prefill_model) failed`)."""
    import logging

    from optimum.intel import OVModelForCausalLM

    kwargs = dict(model_kwargs or {})
    kwargs["ov_config"] = {**COMPILE_CONFIG, **(kwargs.get("ov_config") or {})}
    logger = logging.getLogger("optimum.intel.openvino.modeling_decoder")
    logger.addFilter(_NotStatefulWarning)
    try:
        return OVModelForCausalLM.from_pretrained(
            path, compile=False, use_cache=True, trust_remote_code=trust_remote_code, cache_dir=cache_dir, **kwargs,
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


def mlp_output_matmuls(ov_model) -> list[str]:
    """The names of the MatMuls of `ov_model` with a constant weight (through Converts) that read an MLP's activation
    (`MLP_ACTIVATIONS`), directly or multiplied by another branch (a gated MLP: llama's `down_proj`)."""

    def source(value):
        node = value.get_node()
        while node.get_type_name() == "Convert":
            node = node.input_value(0).get_node()
        return node

    found = []
    for op in ov_model.get_ordered_ops():
        if op.get_type_name() != "MatMul" or source(op.input_value(1)).get_type_name() != "Constant":
            continue
        act = source(op.input_value(0))
        feeding = [act] + ([source(v) for v in act.input_values()] if act.get_type_name() == "Multiply" else [])
        if any(node.get_type_name() in MLP_ACTIVATIONS for node in feeding):
            found.append(op.get_friendly_name())
    return found


def is_int8_activations(config) -> bool:
    """Whether the config quantizes activations to int8 with NNCF (`--quant-mode int8`): what `SMOOTH_QUANT_ALPHA` and
    `mlp_output_matmuls` were measured for (not the `*_f8e4m3` modes, whose activations keep a float format)."""
    from optimum.intel.openvino.configuration import OVQuantizationConfig

    return isinstance(config, OVQuantizationConfig) and config.dtype == "int8"


def with_int8_activation_defaults(config, ignored: list[str]):
    """The config (already a copy) of `--quant-mode int8` with this package's defaults for a text graph: `ignored`
    MatMuls left in float (`mlp_output_matmuls`, the user's own ignored scope kept), and `SMOOTH_QUANT_ALPHA` where the
    user gave no alpha."""
    if config.smooth_quant_alpha is None:
        config.smooth_quant_alpha = SMOOTH_QUANT_ALPHA
    return _with_ignored(config, ignored)


def _with_ignored(config, names: list[str]):
    """The config (already a copy) with `names` added to the ignored scope of its full-quantization parts (optimum-
    intel's `ignored_scope` dict, the user's own scope kept)."""
    if not names:
        return config
    for part in _full_quantization_parts(config):
        scope = dict(part.ignored_scope or {})
        scope["names"] = list(dict.fromkeys([*(scope.get("names") or []), *names]))
        scope.setdefault("validate", False)
        part.ignored_scope = scope
    return config


def _apply_calibrated(model, config, samples, *, model_name_or_path: str, trust_remote_code: bool,
                      submodel: str | None = None, others: dict | None = None, **save) -> str | None:
    """optimum-intel's quantization of `model.model` with NNCF, on `samples` (every one of them, with
    this package's activation range estimator, and `OVERFLOW_FIX` on every graph with int8 activations);
    `submodel`: the name of the graph of a model of several the samples are of (`"lm_model"`: a vision-language
    model's language model), `others` the NNCF datasets of other graphs of it (a vision-language model's vision
    graphs in full quantization); `save` is `_apply_quantization`'s saving arguments. Returns the overflow fix of
    the int8 parts (None: no int8 activations)."""
    from optimum.intel.openvino.configuration import OVPipelineQuantizationConfig
    from optimum.intel.openvino.quantization import OVCalibrationDataset, OVQuantizer

    dataset = samples.nncf_dataset()
    config = _with_num_samples(config, len(samples))
    if submodel and not isinstance(config, OVPipelineQuantizationConfig):
        # optimum-intel's own config of each graph (a vision-language model's full config: the language model's and
        # the vision embedding graphs'), the range estimator on the calibrated graph's only: the others keep NNCF's
        pipeline = OVQuantizer(model)._construct_pipeline_quantization_config(config)
        if submodel in pipeline.quantization_configs:
            part = _with_activation_range(pipeline.quantization_configs[submodel].clone(), ACTIVATION_RANGE_ESTIMATOR)
            pipeline.quantization_configs[submodel] = part
        config = pipeline
    else:
        config = _with_activation_range(config, ACTIVATION_RANGE_ESTIMATOR)
    overflow_fix = _with_overflow_fix(config)
    model._apply_quantization(
        config,
        compile_only=False, compile_model=False, model_name_or_path=model_name_or_path,
        trust_remote_code=trust_remote_code,
        calibration_dataset=OVCalibrationDataset({submodel: dataset, **(others or {})} if submodel else dataset),
        **save,
    )
    return overflow_fix


def make_stateful(xml: Path, model_config, shapes: dict | None = None) -> None:
    """Turn the stateless graph at `xml` stateful in place with optimum-intel's `patch_stateful`; `shapes`: its
    inputs' shapes as exported, given back first (optimum-intel's loader makes every dimension dynamic, and
    `patch_stateful` builds each state's initial value from its input's shape)."""
    import openvino as ov
    from optimum.exporters.openvino.stateful import patch_stateful

    core = ov.Core()
    ov_model = core.read_model(xml)
    if shapes:
        ov_model.reshape(shapes)
    patch_stateful(model_config, ov_model)
    tmp = xml.with_name(".stateful-" + xml.name)
    ov.save_model(ov_model, tmp, compress_to_fp16=False)
    del ov_model
    gc.collect()
    os.replace(tmp, xml)
    os.replace(tmp.with_suffix(".bin"), xml.with_suffix(".bin"))


