"""Validation at export: the exported graph against the PyTorch model, on the captured calls."""

from __future__ import annotations

import numpy as np

from .decompose import Capture
from ..errors import ExportValidationError
from ..graph.parts import PartPlan, build_parts
from ..progress import bar
from ..runtimes.session import EXACT_CONFIG, GraphSession

# Largest allowed |logits difference| relative to max(1, max |PyTorch logit|). fp32 graphs differ
# from eager PyTorch only by kernel rounding; fp16 weights add their own rounding. Quantized weights
# are compared and recorded but not enforced: their error is the quantization's, not the export's.
RELATIVE_TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}


def validate_graph(ov_model, capture: Capture, weight_format: str | None, *, session_class=GraphSession,
                   parts: PartPlan | None = None, model_type: str | None = None) -> dict:
    """Compare the graph with PyTorch on the captured prefill and decode calls.

    The graph is teacher-forced with the tokens `generate()` picked: at each call the maximum absolute
    difference of the last-position logits is measured, and the graph's own greedy pick (its argmax) is
    compared with the argmax of PyTorch's logits of the same call (not with `generate()`'s pick, which
    logits processors such as `min_new_tokens`' EOS suppression can change). A pick that differs where PyTorch's own top-2 margin is within the logits tolerance
    is a near-tie (rounding decides it, in PyTorch as in any low-precision runtime), not a failure: the
    check goes on teacher-forced and the logits decide. A pick that differs with a margin above the
    tolerance, or logits beyond it, fail. Every differing step is reported with PyTorch's margin there.

    The report also gives a quality figure that means something at any weight format: teacher-forced
    top-1 agreement with PyTorch and the mean KL divergence of the graph's next-token distribution from
    PyTorch's, per stage. For quantized weights those are what is recorded (not enforced).

    Args:
        ov_model: the `openvino.Model` to check (in memory, before it is written).
        capture: the recorded `generate()` of the PyTorch model.
        weight_format: the export's weight format (`None` means fp32 weights).
        session_class: what feeds the graph: `GraphSession` for dynamic graphs, the runtime's
            `StaticSession` for static ones, so validation makes the calls the runtime makes.
        parts: run a stateful dynamic graph in these consecutive parts (`graph/parts.py`), one part's
            weights compiled at a time, instead of compiling it whole (`pipeline/memory.py` decides).
        model_type: the exported model type, for the inputs of Mamba-style graphs run in parts.

    Returns:
        The report written to the manifest under `validation`.

    Raises:
        ExportValidationError: a greedy pick differs where PyTorch's margin is above the tolerance,
            or the logits differ beyond the tolerance, for fp32/fp16 weights.
    """
    fmt = weight_format or "fp32"
    enforced = fmt in RELATIVE_TOLERANCE
    if parts is None or parts.count == 1:
        outputs, run = _last_logits_whole(ov_model, capture, session_class), {"mode": "whole", "parts": 1}
    else:
        outputs, run = _last_logits_in_parts(ov_model, capture, parts, model_type), {"mode": "parts", **parts.to_dict()}

    diffs, picks, kls = [], [], []
    for call, logits in zip(capture.calls, outputs):
        ref = call.last_logits.astype(np.float32)
        diffs.append(float(np.max(np.abs(logits - ref))))
        picks.append(logits.argmax(-1))
        kls.append(float(np.mean(_kl(ref, logits))))
    ours = np.stack(picks, axis=1)
    # like with like: the graph's raw argmax against PyTorch's raw argmax of the same call. The tokens fed
    # (teacher forcing) are generate()'s picks, which its logits processors can make differ from the raw argmax
    # (EOS suppressed while min_new_tokens is not reached).
    theirs = np.stack([call.last_logits.argmax(-1) for call in capture.calls[: ours.shape[1]]], axis=1)
    matches = ours == theirs
    scale = max(1.0, float(max(np.max(np.abs(c.last_logits)) for c in capture.calls)))
    tolerance = RELATIVE_TOLERANCE.get(fmt, float("nan")) * scale
    differing = []
    for step in np.flatnonzero(~matches.all(axis=0)):
        margin = float(np.max([_margin(capture.calls[step].last_logits[row]) for row in np.flatnonzero(~matches[:, step])]))
        near_tie = enforced and margin <= tolerance
        differing.append({"step": int(step), "pytorch": int(theirs[0, step]), "openvino": int(ours[0, step]),
                          "pytorch_margin": margin, "near_tie": bool(near_tie)})
    first_mismatch = differing[0]["step"] if differing else None
    report = {
        "compile_config": dict(EXACT_CONFIG),
        "run": run,
        "prompt_tokens": int(capture.prompt_ids.shape[1]),
        "decode_steps": len(capture.calls) - 1,
        "greedy_tokens": int(ours.shape[1]),
        "greedy_match": not differing,
        "first_mismatch_step": first_mismatch,
        "differing_steps": differing,
        "max_abs_diff_prefill": diffs[0],
        "max_abs_diff_decode": max(diffs[1:]),
        "top1_agreement": float(matches.mean()),
        "kl_prefill": kls[0],
        "kl_decode": float(np.mean(kls[1:])),
        "tolerance": None if not enforced else tolerance,
        "enforced": enforced,
    }
    real_flips = [d for d in differing if not d["near_tie"]]
    failed = enforced and (bool(real_flips) or max(diffs) > tolerance)
    report["status"] = "failed" if failed else ("passed" if enforced else "recorded")
    if failed:
        if real_flips:
            d = real_flips[0]
            why = (f"greedy token {d['step']} differs (PyTorch {d['pytorch']}, OpenVINO {d['openvino']}) where PyTorch's "
                   f"top-2 margin is {d['pytorch_margin']:.3g}, above the tolerance {tolerance:.3g}")
        else:
            why = f"max |logits difference| {max(diffs):.3g} exceeds the tolerance {tolerance:.3g}"
            if differing:
                why += f" (greedy picks differ at near-ties: {_describe(differing)})"
        raise ExportValidationError(
            f"validation failed: the exported graph does not reproduce {capture.architecture}: {why}; "
            "nothing was written (report the model, or pass --skip-validation to keep an unchecked artifact)",
            report=report,
        )
    return report


def _teacher_forced(capture: Capture):
    """The (input_ids, attention_mask) of each call: the prompt, then generate()'s picks one at a time."""
    yield capture.prompt_ids, capture.prompt_mask
    for i in range(len(capture.calls) - 1):
        yield capture.tokens[:, i : i + 1], None


def _last_logits_whole(ov_model, capture: Capture, session_class) -> list[np.ndarray]:
    """Each call's last-position logits, from the whole graph compiled once."""
    import openvino as ov

    compiled = ov.Core().compile_model(ov_model, "CPU", EXACT_CONFIG)
    session = session_class(compiled)
    session.reset()
    calls = bar("validation: prefill + decode calls", iterable=list(_teacher_forced(capture)), unit="call")
    outputs = [session.step(ids, mask)[:, -1, :].astype(np.float32) for ids, mask in calls]
    del session, compiled
    return outputs


def _last_logits_in_parts(ov_model, capture: Capture, plan: PartPlan, model_type: str | None) -> list[np.ndarray]:
    """Each call's last-position logits, from the graph run in consecutive parts: part k compiled, fed every
    call in order (its own state carried from call to call), the values later parts read kept (a few
    activations per call), then freed."""
    import openvino as ov

    from .convert import return_freed_memory

    feeds = GraphSession.feeds_only(ov_model, model_type=model_type)
    values = [feeds.feed(ids, mask) for ids, mask in _teacher_forced(capture)]
    core = ov.Core()
    steps = bar(f"validation: {len(values)} calls x {plan.count} parts", total=len(values) * plan.count, unit="call")
    for part in build_parts(ov_model.clone(), plan):
        compiled = core.compile_model(part, "CPU", EXACT_CONFIG)
        request = compiled.create_infer_request()
        request.reset_state()
        inputs = [port.get_any_name() for port in compiled.inputs]
        outputs = [port.get_any_name() for port in compiled.outputs]
        for call in values:
            request.infer({name: call[name] for name in inputs})
            for name in outputs:
                call[name] = request.get_tensor(name).data.copy()
            steps.update()
        del request, compiled, part
        return_freed_memory()
    steps.close()
    return [call["logits"][:, -1, :].astype(np.float32) for call in values]


def _margin(logits: np.ndarray) -> float:
    """PyTorch's top-1 minus top-2 logit: how decisive its greedy pick was."""
    top2 = np.partition(np.asarray(logits, dtype=np.float64).ravel(), -2)[-2:]
    return float(top2[1] - top2[0])


def _kl(reference: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(p_reference || p_graph) of the next-token distributions, per row."""
    def log_softmax(x):
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    log_p, log_q = log_softmax(reference), log_softmax(logits)
    return np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)


def _describe(differing: list[dict]) -> str:
    return ", ".join(f"step {d['step']} margin {d['pytorch_margin']:.3g}" for d in differing)
