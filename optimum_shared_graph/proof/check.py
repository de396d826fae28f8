"""`validate()`: an artifact's stored reference run through an OpenVINO consumer on a device, judged with the
export's rules (`judge.py`). It reads the artifact and writes nothing into it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..errors import ArtifactValidationError, InvalidOptionsError
from ..manifest import read_manifest
from . import consumers
from .judge import REDUCED_PRECISION, judge_logits, judge_tokens, scaled_tolerance
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
            `"continuous-batching"` (its `ContinuousBatchingPipeline`): greedy tokens compared.
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
    reference = Reference.load(path, (manifest.validation or {}).get("reference"))
    started = time.monotonic()
    try:
        outputs, precision = consumers.run(consumer, path, manifest, reference, device, properties)
    except ArtifactValidationError:
        raise
    except Exception as err:  # the consumer could not load or run the artifact: its own error, on one line
        text = " ".join(str(err).split())
        raise ArtifactValidationError(
            f"{consumer} on {device} could not run {path}: {type(err).__name__}: {text[:300]}") from err
    seconds = time.monotonic() - started
    weight_format = (manifest.quantization or {}).get("weight_format") or "fp32"
    if (manifest.quantization or {}).get("quant_mode"):
        weight_format = "int8"
    rule = _rule(weight_format, reference, precision)
    tolerance = scaled_tolerance(rule, reference.calls)
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
        "seconds": round(seconds, 2),
        **judged,
    }
    if why:
        against = "PyTorch" if reference.judged_against == "pytorch" else "the exported graph on the export machine"
        raise ArtifactValidationError(
            f"validation failed: {consumer} on {device} does not reproduce {against}: {why}", report=report)
    return report


def _rule(weight_format: str, reference: Reference, precision: dict) -> str:
    """The tolerance rule: the export's for the weight format when the consumer computes in f32 with an f32 KV
    cache; the 16-bit rule when it does not (or cannot say), or when the reference is the exported graph's own
    logits (quantized weights, where only the consumer's arithmetic can differ)."""
    exact = all(str(value).lower() in F32 for value in precision.values()) and bool(precision)
    if reference.judged_against == "graph" or not exact or weight_format != "fp32":
        return REDUCED_PRECISION
    return "fp32"
