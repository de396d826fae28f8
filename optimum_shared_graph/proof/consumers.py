"""The stored calls run through each OpenVINO consumer of an artifact.

Teacher-forced consumers (each call's last-position logits, the reference's tokens fed):

- `openvino`: the graph compiled by OpenVINO Runtime on the device, fed call by call as the export's
  validation feeds it (`runtimes/session.py`, or the static session for a static artifact);
- `optimum`: optimum-intel's `OVModelForCausalLM` (dynamic artifacts), through its `generate()`;
- `runtime`: `optimum_shared_graph.runtime()`, dynamic and static artifacts, through its `generate()`.

Greedy consumers (their tokens, from the stored prompt):

- `genai`: OpenVINO GenAI's `LLMPipeline` (on `"NPU"`, its NPU pipeline);
- `continuous-batching`: OpenVINO GenAI's `ContinuousBatchingPipeline`.

An image-text-to-text-shared artifact has its own three (`proof/vlm.py`): `optimum-vlm` and `runtime-vlm`
(teacher-forced) and `genai-vlm` (greedy).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ArtifactValidationError
from ..manifest import Manifest
from ..tasks import VLM_SHARED_TASK
from .stored import Reference

TEXT_CONSUMERS = ("openvino", "optimum", "runtime", "genai", "continuous-batching")
# an image-text-to-text-shared artifact's consumers (`proof/vlm.py`): optimum-intel's OVModelForVisualCausalLM
# (teacher-forced) and GenAI's VLMPipeline (greedy)
VLM_CONSUMERS = ("optimum-vlm", "genai-vlm", "runtime-vlm")
TEACHER_FORCED = ("openvino", "optimum", "runtime", "optimum-vlm", "runtime-vlm")
GREEDY = ("genai", "continuous-batching", "genai-vlm")
CONSUMERS = TEXT_CONSUMERS + VLM_CONSUMERS
DYNAMIC_ONLY = ("optimum", "genai", "continuous-batching")


def run(consumer: str, path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict) -> tuple[list, dict]:
    """Run the stored calls through `consumer`; return its outputs (logits per call; for a greedy consumer, a
    `generate(row, start)` function as `judge.judge_tokens` calls it) and the precision it computed in (`{"inference": ..., "kv_cache": ...}` as far as it can be read, for the rule)."""
    return _RUNNERS[consumer](path, manifest, reference, device, properties)


# The compile properties the rule reads (`check._rule`), by their name in the report's `precision`.
PRECISION_PROPERTIES = (("INFERENCE_PRECISION_HINT", "inference"), ("KV_CACHE_PRECISION", "kv_cache"),
                        ("DYNAMIC_QUANTIZATION_GROUP_SIZE", "dynamic_quantization_group_size"))


def _as_text(value) -> str:
    return value.to_string() if hasattr(value, "to_string") else str(value)


def _compiled_precision(compiled) -> dict:
    found = {}
    for key, name in PRECISION_PROPERTIES:
        try:
            found[name] = _as_text(compiled.get_property(key))
        except Exception:  # a device without the property
            found[name] = None
    return found


def _openvino(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    import openvino as ov

    from ..runtimes.session import GraphSession
    from ..runtimes.static_session import StaticSession

    graph = (manifest.graph or {}).get("files")[0]
    compiled = ov.Core().compile_model(str(path / graph), device, properties)
    if manifest.shape_mode == "static":
        session = StaticSession(compiled)
    else:
        session = GraphSession(compiled, model_type=(manifest.model or {}).get("exported_model_type")
                               or (manifest.model or {}).get("model_type"))
    session.reset()
    outputs = [session.step(ids, mask)[:, -1, :].astype(np.float32) for ids, mask in reference.teacher_forced()]
    return outputs, _compiled_precision(compiled)


def forced_generate(model, reference: Reference, **inputs) -> list[np.ndarray]:
    """`model.generate(**inputs)` (the reference's prompt ids and mask when none are given) with every pick forced to
    the reference's fed token; the raw logits of each call."""
    import torch
    from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

    fed = torch.from_numpy(reference.fed)

    class Force(LogitsProcessor):
        def __call__(self, input_ids, scores):
            step = input_ids.shape[1] - reference.prompt_ids.shape[1]
            forced = torch.full_like(scores, float("-inf"))
            forced.scatter_(1, fed[:, step : step + 1], 0.0)
            return forced

    calls = reference.fed.shape[1]
    config = GenerationConfig(do_sample=False, max_new_tokens=calls, min_new_tokens=calls, num_beams=1,
                              output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    inputs = inputs or {"input_ids": torch.from_numpy(reference.prompt_ids),
                        "attention_mask": torch.from_numpy(reference.prompt_mask)}
    out = model.generate(**inputs, generation_config=config, logits_processor=LogitsProcessorList([Force()]))
    return [logits.float().numpy() for logits in out.logits]


def _optimum(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    from optimum.intel import OVModelForCausalLM

    model = OVModelForCausalLM.from_pretrained(str(path), device=device, ov_config=dict(properties), compile=True)
    outputs = forced_generate(model, reference)
    return outputs, _compiled_precision(model.request.get_compiled_model())


def _runtime(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    from ..runtimes.registry import runtime

    model = runtime(path, device, ov_config=dict(properties))
    outputs = forced_generate(model, reference)
    model.compile()
    return outputs, _compiled_precision(model._compiled)


def _genai_input(reference: Reference, row: int, start: int):
    """The stored prompt of `row` (its padding dropped) followed by the first `start` fed tokens."""
    import openvino as ov
    import openvino_genai as genai

    keep = reference.prompt_mask[row] != 0
    ids = np.concatenate([reference.prompt_ids[row][keep], reference.fed[row, :start]])[None, :].astype(np.int64)
    return genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(np.ones_like(ids)))


def _greedy_config(new_tokens: int):
    import openvino_genai as genai

    config = genai.GenerationConfig()
    config.max_new_tokens = new_tokens
    config.ignore_eos = True  # the reference's calls run past an EOS pick (min_new_tokens) as generate() did
    config.do_sample = False
    return config


def _requested_precision(path: Path, manifest: Manifest, device: str, properties: dict) -> dict:
    """GenAI's pipelines do not report their compiled precision: what the properties ask for, else the artifact's
    runtime options (the IR's rt_info, which the pipelines honour), else the device's default (None where the
    device cannot say: an absent device, the NPU pipeline's own compile)."""
    import openvino as ov

    core = ov.Core()
    options = {}
    try:
        graph = (manifest.graph or {}).get("files")[0]
        rt_info = core.read_model(str(path / graph)).get_rt_info()
        if "runtime_options" in rt_info:
            options = {key: str(value.value) for key, value in rt_info["runtime_options"].items()}
    except Exception:  # no readable runtime options: the properties and the device's defaults decide
        options = {}
    found = {}
    for key, name in PRECISION_PROPERTIES:
        value = properties.get(key, options.get(key))
        if value is None:
            try:
                value = _as_text(core.get_property(device, key))
            except Exception:  # the device does not have the property (or is not on this machine)
                value = None
        found[name] = None if value is None else str(value)
    return found


def greedy_of(pipe, reference: Reference):
    """`generate(row, start)` as `judge.judge_tokens` calls it, over a loaded GenAI `LLMPipeline` (any device, the
    NPU pipeline included): its greedy tokens from the stored prompt of `row` and the first `start` fed tokens."""
    calls = reference.fed.shape[1]

    def generate(row: int, start: int) -> list[int]:
        return list(pipe.generate(_genai_input(reference, row, start), _greedy_config(calls - start)).tokens[0])

    return generate


def _genai(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    import openvino_genai as genai

    pipe = genai.LLMPipeline(str(path), device, **properties)
    return greedy_of(pipe, reference), _requested_precision(path, manifest, device, properties)


def _continuous_batching(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    import openvino_genai as genai

    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 1  # GB of KV cache blocks: the reference's few calls need far less
    pipe = genai.ContinuousBatchingPipeline(str(path), scheduler, device, dict(properties))
    calls = reference.fed.shape[1]

    def generate(row: int, start: int) -> list[int]:
        result = pipe.generate([_genai_input(reference, row, start).input_ids], [_greedy_config(calls - start)])
        return list(result[0].m_generation_ids[0])

    return generate, _requested_precision(path, manifest, device, properties)


_RUNNERS = {"openvino": _openvino, "optimum": _optimum, "runtime": _runtime, "genai": _genai,
            "continuous-batching": _continuous_batching}


def check_consumer(consumer: str, manifest: Manifest, path: Path) -> None:
    if consumer not in CONSUMERS:
        raise ArtifactValidationError(f"unknown consumer {consumer!r}: choose one of {', '.join(CONSUMERS)}")
    if manifest.task == VLM_SHARED_TASK and consumer not in VLM_CONSUMERS:
        raise ArtifactValidationError(
            f"{path} is an {VLM_SHARED_TASK} artifact, which consumer {consumer!r} does not run (it runs text-generation "
            "artifacts): validate it with consumer 'genai-vlm' (VLMPipeline), 'optimum-vlm' (OVModelForVisualCausalLM) or "
            "'runtime-vlm' (optimum_shared_graph.runtime())")
    if manifest.task != VLM_SHARED_TASK and consumer in VLM_CONSUMERS:
        raise ArtifactValidationError(
            f"{path} is a {manifest.task} artifact, and consumer {consumer!r} runs {VLM_SHARED_TASK} artifacts only: "
            f"validate it with consumer {', '.join(repr(c) for c in TEXT_CONSUMERS)}")
    if manifest.shape_mode == "static" and consumer in DYNAMIC_ONLY:
        raise ArtifactValidationError(
            f"{path} is a static artifact, which {consumer} cannot load: validate it with consumer 'runtime' or 'openvino'")
