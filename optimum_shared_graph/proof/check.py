"""`validate()`: an artifact's stored reference run through an OpenVINO consumer on a device, judged with the
export's rules (`judge.py`). It reads the artifact and writes nothing into it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..errors import ArtifactValidationError, InvalidOptionsError
from ..manifest import read_manifest
from . import consumers, vlm
from .judge import REDUCED_PRECISION, judge_logits, judge_tokens, relative_tolerance, scaled_tolerance
from .stored import Reference

F32 = {"f32", "float32"}


def validate(path: str | os.PathLike, consumer: str = "openvino", device: str = "CPU",
             properties: dict[str, Any] | None = None) -> dict:
    """Run the calls the export validated through `consumer` on `device`, and judge them with the export's rules.

    Args:
        path: the artifact directory (copied anywhere: the check needs only its files).
        consumer: `"openvino"` (the graph compiled by OpenVINO Runtime), `"optimum"` (`OVModelForCausalLM`) or
            `"runtime"` (`optimum_shared_graph.runtime()`): teacher-forced, every call's logits compared;
            `"genai"` (OpenVINO GenAI's `LLMPipeline`; its NPU pipeline on device `"NPU"`) or
            `"continuous-batching"` (its `ContinuousBatchingPipeline`): greedy tokens compared. An
            image-text-to-text-shared artifact: `"optimum-vlm"` (`OVModelForVisualCausalLM`) or `"runtime-vlm"`
            (`optimum_shared_graph.runtime()`), teacher-forced, or `"genai-vlm"` (GenAI's `VLMPipeline`, greedy
            tokens), on the stored image and prompt (`proof/vlm.py`).
        device: the OpenVINO device (`"CPU"`, `"GPU"`, `"NPU"`, ...).
        properties: compile properties for the consumer (as `ov_config` / `LLMPipeline(**properties)` take them).
            None: the artifact's defaults (its runtime options in the rt_info).

    Returns:
        The report: `status` `"passed"`, the consumer, device, properties, precision and tolerance used, and the
        judge's figures (max |logits difference|, greedy agreement, each differing step with the reference's
        top-2 margin).

    Raises:
        ArtifactValidationError: the consumer's results differ beyond the tolerance (`.report` has them); or the
            artifact has no intact stored reference (one line saying how to get one).
        ManifestError: the manifest is missing or a graph file does not match its digest.

    Example:
        >>> import optimum_shared_graph as osg
        >>> report = osg.validate("./my-model-ov", consumer="genai", device="NPU")  # doctest: +SKIP
        >>> report["status"]  # doctest: +SKIP
        'passed'
    """
    path = Path(path)
    properties = dict(properties or {})
    if not isinstance(device, str) or not device:
        raise InvalidOptionsError(f"device must be an OpenVINO device name such as 'CPU', got {device!r}")
    manifest = read_manifest(path)  # the graph files checked against their digests
    consumers.check_consumer(consumer, manifest, path)
    validation = manifest.validation or {}
    reference = Reference.load(path, validation.get("reference"), validation.get("reference_missing"))
    started = time.monotonic()
    run = vlm.run if consumer in consumers.VLM_CONSUMERS else consumers.run
    try:
        outputs, precision = run(consumer, path, manifest, reference, device, properties)
    except ArtifactValidationError:
        raise
    except Exception as err:  # the consumer could not load or run the artifact: its own error, on one line
        text = " ".join(str(err).split())
        raise ArtifactValidationError(
            f"{consumer} on {device} could not run {path}: {type(err).__name__}: {text[:300]}") from err
    seconds = time.monotonic() - started
    weight_format = manifest.judged_weight_format()
    exported_with = (manifest.validation or {}).get("compile_config") or {}
    rule, terms = _rule(weight_format, reference, precision, exported_with)
    tolerance = scaled_tolerance(rule, reference.calls, terms)
    if consumer in consumers.TEACHER_FORCED:
        judged, why = judge_logits(outputs, reference.calls, tolerance)
    else:
        judged, why = judge_tokens(outputs, reference.calls, reference.fed, tolerance)
    report = {
        "status": "failed" if why else "passed",
        "consumer": consumer,
        "device": device,
        "properties": {k: str(v) for k, v in properties.items()},
        "precision": precision,
        "judged_against": reference.judged_against,
        "rule": rule,
        "terms": terms,
        "relative_tolerance": relative_tolerance(rule, terms),
        "seconds": round(seconds, 2),
        **judged,
    }
    if why:
        against = "PyTorch" if reference.judged_against == "pytorch" else "the exported graph on the export machine"
        raise ArtifactValidationError(
            f"validation failed: {consumer} on {device} does not reproduce {against}: {why}", report=report)
    return report


EIGHT_BIT = {"u8", "i8", "uint8", "int8", "uint8_t", "int8_t"}
QUANTIZED_WEIGHTS_EXEMPT = {"fp32", "fp16"}  # weight formats whose matmuls the CPU plugin does not quantize


def _rule(weight_format: str, reference: Reference, precision: dict, exported_with: dict) -> tuple[str, list[str]]:
    """The tolerance rule and the `judge.TERMS` added to it (in quadrature).

    The rule: the export's for the weight format when the consumer computes in f32 with an f32 KV cache; the
    16-bit rule when it does not (or cannot say), or when the reference is the exported graph's own logits
    (quantized weights, where only the consumer's arithmetic can differ).

    The terms, one per rounding to 8 bits the consumer's results carry and the reference's do not (or the other
    way round): "8-bit KV cache" for a u8/i8 KV cache; "8-bit activations" for int4/int8 weights unless the
    consumer computes as the export did (f32, f32 KV cache and the dynamic quantization group size the export's
    CPU compile used, `exported_with`): the export's reference carries the CPU plugin's int8 quantization of
    those matmuls' activations, which a consumer computing in bf16, with another group size or on another
    device does not reproduce.
    """
    inference, kv_cache = (str(precision.get(k) or "").lower() for k in ("inference", "kv_cache"))
    exact = inference in F32 and kv_cache in F32
    terms = []
    if kv_cache in EIGHT_BIT:
        terms.append("8-bit KV cache")
    if weight_format not in QUANTIZED_WEIGHTS_EXEMPT:
        group = precision.get("dynamic_quantization_group_size")
        exported = exported_with.get("DYNAMIC_QUANTIZATION_GROUP_SIZE")
        if not (exact and group is not None and exported is not None and str(group) == str(exported)):
            terms.append("8-bit activations")
    if reference.judged_against == "graph" or not exact or weight_format != "fp32":
        return REDUCED_PRECISION, terms
    return "fp32", terms
