"""Validation at export: the exported graph against the PyTorch model, on the captured calls."""

from __future__ import annotations

import numpy as np

from .decompose import Capture
from ..errors import ExportValidationError
from ..proof.judge import RELATIVE_TOLERANCE, judge_logits, scaled_tolerance
from ..proof.stored import Reference, teacher_forced
from ..graph.parts import PartPlan, build_parts
from .. import progress
from ..runtimes.session import EXACT_CONFIG, GraphSession


def validate_graph(ov_model, capture: Capture, weight_format: str | None, *, session_class=GraphSession,
                   parts: PartPlan | None = None, model_type: str | None = None) -> dict:
    """Compare the graph with PyTorch on the captured prefill and decode calls (`graph_outputs`, then
    `judge_export`); return the report written to the manifest under `validation`."""
    outputs, run = graph_outputs(ov_model, capture, session_class=session_class, parts=parts, model_type=model_type)
    return judge_export(outputs, run, capture, weight_format)


def graph_outputs(ov_model, capture: Capture, *, session_class=GraphSession, parts: PartPlan | None = None,
                  model_type: str | None = None) -> tuple[list[np.ndarray], dict]:
    """Each captured call's last-position logits from the graph, teacher-forced with the tokens `generate()`
    picked, and how it ran.

    Args:
        ov_model: the `openvino.Model` to check (in memory, before it is written).
        capture: the recorded `generate()` of the PyTorch model.
        session_class: what feeds the graph: `GraphSession` for dynamic graphs, the runtime's
            `StaticSession` for static ones, so validation makes the calls the runtime makes.
        parts: run a stateful dynamic graph in these consecutive parts (`graph/parts.py`), one part's
            weights compiled at a time, instead of compiling it whole (`pipeline/memory.py` decides).
        model_type: the exported model type, for the inputs of Mamba-style graphs run in parts.
    """
    if parts is None or parts.count == 1:
        return _last_logits_whole(ov_model, capture, session_class), {"mode": "whole", "parts": 1}
    return _last_logits_in_parts(ov_model, capture, parts, model_type), {"mode": "parts", **parts.to_dict()}


def judge_export(outputs: list[np.ndarray], run: dict, capture: Capture, weight_format: str | None) -> dict:
    """Judge the graph's logits against PyTorch's with the rules of `proof/judge.py`.

    At each call the maximum absolute difference of the last-position logits is measured, and the graph's own
    greedy pick (its argmax) is compared with the argmax of PyTorch's logits of the same call (not with
    `generate()`'s pick, which logits processors such as `min_new_tokens`' EOS suppression can change). A pick
    that differs where PyTorch's own top-2 margin is within the logits tolerance is a near-tie (rounding decides
    it, in PyTorch as in any low-precision runtime), not a failure. A pick that differs with a margin above the
    tolerance, or logits beyond it, fail. Every differing step is reported with PyTorch's margin there.

    The report also gives a quality figure that means something at any weight format: teacher-forced top-1
    agreement with PyTorch and the mean KL divergence of the graph's next-token distribution from PyTorch's, per
    stage. For quantized weights those are what is recorded (not enforced).

    Raises:
        ExportValidationError: a greedy pick differs where PyTorch's margin is above the tolerance, or the
            logits differ beyond the tolerance, for fp32/fp16 weights.
    """
    fmt = weight_format or "fp32"
    enforced = fmt in RELATIVE_TOLERANCE
    reference = [call.last_logits for call in capture.calls]
    tolerance = scaled_tolerance(fmt, reference) if enforced else None
    judged, why = judge_logits(outputs, reference, tolerance)
    differing = [{"step": d["step"], "pytorch": d["expected"], "openvino": d["got"], "pytorch_margin": d["margin"],
                  "near_tie": d["near_tie"]} for d in judged.pop("differing_steps")]
    report = {
        "compile_config": exact_compile_config(quantized=not enforced),
        "run": run,
        "prompt_tokens": int(capture.prompt_ids.shape[1]),
        "decode_steps": len(capture.calls) - 1,
        **judged,
        "differing_steps": differing,
        "enforced": enforced,
        "status": "failed" if why else ("passed" if enforced else "recorded"),
    }
    if why:
        why = why.replace(" expected, ", " PyTorch, ").replace(" got)", " OpenVINO)").replace("the reference's", "PyTorch's")
        raise ExportValidationError(
            f"validation failed: the exported graph does not reproduce {capture.architecture}: {why}; "
            "nothing was written (report the model, or pass --skip-validation to keep an unchecked artifact)",
            report=report,
        )
    return report


def exact_compile_config(quantized: bool) -> dict:
    """The properties the graph was compiled with for validation. For quantized weights, also the dynamic
    quantization group size the CPU plugin used by default (it quantizes the activations of int4/int8 matmuls
    to int8 even under an f32 inference precision): the stored reference carries that rounding, and
    `validate()` asks whether a consumer computes the same (`proof/check.py`, `_rule`)."""
    config = dict(EXACT_CONFIG)
    if quantized:
        import openvino as ov

        try:
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = int(ov.Core().get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE"))
        except Exception:  # a CPU plugin without the property: nothing to record
            pass
    return config


def _teacher_forced(capture: Capture):
    """The (input_ids, attention_mask) of each captured call: the prompt, then generate()'s picks one at a time."""
    return teacher_forced(capture.prompt_ids, capture.prompt_mask, capture.tokens, len(capture.calls))


def _last_logits_whole(ov_model, capture: Capture, session_class) -> list[np.ndarray]:
    """Each call's last-position logits, from the whole graph compiled once."""
    import openvino as ov

    progress.step("validation: compile")
    compiled = ov.Core().compile_model(ov_model, "CPU", EXACT_CONFIG)
    progress.step("validation: run")
    session = session_class(compiled)
    session.reset()
    calls = progress.bar("validation: prefill + decode calls", iterable=list(_teacher_forced(capture)), unit="call")
    outputs = [session.step(ids, mask)[:, -1, :].astype(np.float32) for ids, mask in calls]
    del session, compiled
    return outputs


def _last_logits_in_parts(ov_model, capture: Capture, plan: PartPlan, model_type: str | None) -> list[np.ndarray]:
    """Each call's last-position logits, from the graph run in consecutive parts (`run_in_parts`)."""
    feeds = GraphSession.feeds_only(ov_model, model_type=model_type)
    values = [feeds.feed(ids, mask) for ids, mask in _teacher_forced(capture)]
    return [call["logits"][:, -1, :].astype(np.float32) for call in run_in_parts(ov_model, values, plan)]


def run_in_parts(ov_model, values: list[dict[str, np.ndarray]], plan: PartPlan) -> list[dict[str, np.ndarray]]:
    """Run `ov_model` in the consecutive parts of `plan` on the calls `values` (each the graph's inputs by name, in
    order from the prefill): part k compiled, fed every call in order (its own state carried from call to call),
    the values later parts read kept (a few activations per call), then freed. Returns `values`, each call with
    the graph's outputs added by name (`logits`). What both tasks' validation runs in parts: text-generation-shared
    feeds the token ids, image-text-to-text-shared the language model's `inputs_embeds`."""
    import openvino as ov

    from .convert import return_freed_memory

    core = ov.Core()
    steps = progress.bar(f"validation: {len(values)} calls x {plan.count} parts", total=len(values) * plan.count, unit="call")
    progress.step("validation: parts cut")
    for k, part in enumerate(build_parts(ov_model.clone(), plan), 1):
        # the part's own names, by position: the compiled model can give a cut's tensor the names of the value it
        # was computed from as well (Qwen3.5's first operations), and any one of them as `get_any_name()`
        inputs = [port.get_any_name() for port in part.inputs]
        outputs = [port.get_any_name() for port in part.outputs]
        progress.step(f"validation: part {k}/{plan.count} compile")
        compiled = core.compile_model(part, "CPU", EXACT_CONFIG)
        progress.step(f"validation: part {k}/{plan.count} run")
        request = compiled.create_infer_request()
        request.reset_state()
        for call in values:
            request.infer({i: call[name] for i, name in enumerate(inputs)})
            for i, name in enumerate(outputs):
                call[name] = request.get_output_tensor(i).data.copy()
            steps.update()
        del request, compiled, part
        return_freed_memory()
    steps.close()
    return values


def validate_export(ov_model, capture, config, opts, manifest) -> tuple[dict, Reference | None]:
    """Stage 5: the graph against the captured prefill and decode calls, compiled whole or in consecutive parts
    where it cannot fit (`memory.validation_parts`); return the report the manifest records under `validation` and
    the reference stored in the artifact for `validate()` where it is deployed (`proof/stored.py`: PyTorch's logits
    when the check is enforced, the graph's own for quantized weights). `--skip-validation`: skipped, no reference."""
    import functools

    from ..runtimes.static_session import StaticSession
    from .memory import validation_parts

    if opts.skip_validation:
        return {"status": "skipped", "reason": "--skip-validation"}, None
    progress.stage("validating")
    exported_type = capture.exported.config.model_type if capture.module is not None else config.model_type
    session = StaticSession if opts.is_static else functools.partial(GraphSession, model_type=exported_type)
    parts = None if opts.is_static else validation_parts(ov_model)  # whole, or in parts where it cannot fit
    outputs, run = graph_outputs(ov_model, capture, session_class=session, parts=parts, model_type=exported_type)
    progress.step("validation: judged")
    report = judge_export(outputs, run, capture, manifest.judged_weight_format())
    report["captured"] = "beside the conversion" if capture.beside else "in the export's process"
    return report, Reference.from_capture(capture, None if report["enforced"] else outputs)
