"""Validation at export: the exported graph against the PyTorch model, on the captured calls."""

from __future__ import annotations

import numpy as np

from .decompose import Capture
from ..errors import ExportValidationError
from ..progress import bar
from ..runtimes.session import EXACT_CONFIG, GraphSession

# Largest allowed |logits difference| relative to max(1, max |PyTorch logit|). fp32 graphs differ
# from eager PyTorch only by kernel rounding; fp16 weights add their own rounding. Quantized weights
# are compared and recorded but not enforced: their error is the quantization's, not the export's.
RELATIVE_TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}


def validate_graph(ov_model, capture: Capture, weight_format: str | None, *, session_class=GraphSession) -> dict:
    """Compare the graph with PyTorch on the captured prefill and decode calls.

    The graph is teacher-forced with PyTorch's greedy tokens: at each call the maximum absolute
    difference of the last-position logits is measured, and the graph's own greedy pick is compared
    with PyTorch's. Equal picks at every call is the same as equal greedy generations.

    Args:
        ov_model: the `openvino.Model` to check (in memory, before it is written).
        capture: the recorded `generate()` of the PyTorch model.
        weight_format: the export's weight format (`None` means fp32 weights).
        session_class: what feeds the graph: `GraphSession` for dynamic graphs, the runtime's
            `StaticSession` for static ones, so validation makes the calls the runtime makes.

    Returns:
        The report written to the manifest under `validation`.

    Raises:
        ExportValidationError: greedy tokens differ, or the logits differ beyond the tolerance,
            for fp32/fp16 weights.
    """
    import openvino as ov

    fmt = weight_format or "fp32"
    enforced = fmt in RELATIVE_TOLERANCE
    compiled = ov.Core().compile_model(ov_model, "CPU", EXACT_CONFIG)
    session = session_class(compiled)
    session.reset()

    diffs, picks = [], []
    feed = capture.prompt_ids
    mask = capture.prompt_mask
    calls = bar("validation: prefill + decode calls", iterable=capture.calls, unit="call")
    for i, call in enumerate(calls):
        logits = session.step(feed, mask)[:, -1, :].astype(np.float32)
        ref = call.last_logits
        diffs.append(float(np.max(np.abs(logits - ref))))
        picks.append(logits.argmax(-1))
        feed = capture.tokens[:, i : i + 1]
        mask = None
    ours = np.stack(picks, axis=1)
    matches = ours == capture.tokens[:, : ours.shape[1]]
    first_mismatch = None if matches.all() else int(np.argmin(matches.all(axis=0)))
    scale = max(1.0, float(max(np.max(np.abs(c.last_logits)) for c in capture.calls)))
    tolerance = RELATIVE_TOLERANCE.get(fmt, float("nan")) * scale
    report = {
        "compile_config": dict(EXACT_CONFIG),
        "prompt_tokens": int(capture.prompt_ids.shape[1]),
        "decode_steps": len(capture.calls) - 1,
        "greedy_tokens": int(ours.shape[1]),
        "greedy_match": first_mismatch is None,
        "first_mismatch_step": first_mismatch,
        "max_abs_diff_prefill": diffs[0],
        "max_abs_diff_decode": max(diffs[1:]),
        "tolerance": None if not enforced else tolerance,
        "enforced": enforced,
    }
    failed = enforced and (first_mismatch is not None or max(diffs) > tolerance)
    report["status"] = "failed" if failed else ("passed" if enforced else "recorded")
    if failed:
        if first_mismatch is not None:
            why = f"greedy token {first_mismatch} differs (PyTorch {int(capture.tokens[0, first_mismatch])}, OpenVINO {int(ours[0, first_mismatch])})"
        else:
            why = f"max |logits difference| {max(diffs):.3g} exceeds the tolerance {tolerance:.3g}"
        raise ExportValidationError(
            f"validation failed: the exported graph does not reproduce {capture.architecture}: {why}; "
            "nothing was written (report the model, or pass --skip-validation to keep an unchecked artifact)",
            report=report,
        )
    return report
