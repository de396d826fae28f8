"""The rules that judge a graph's results against a reference: the export's validation and `validate()` on
a deployed artifact use the same ones.

Logits (a teacher-forced consumer: every call's last-position logits): the largest |difference| must stay
within the tolerance, and the graph's argmax must equal the reference's wherever the reference's own top-2
margin is above the tolerance (below it, rounding decides the pick: a near-tie, reported, not a failure).

Tokens (a consumer that only returns its greedy tokens, OpenVINO GenAI's pipelines): token i is compared with
the reference's argmax of call i while the consumer's tokens before it are the ones the reference was fed; a
difference is judged by the reference's margin there, and after a near-tie the consumer is restarted from the
reference's context, so every call is compared.
"""

from __future__ import annotations

import numpy as np

# Largest allowed |logits difference| relative to max(1, max |reference logit|). fp32 graphs differ from eager
# PyTorch only by kernel rounding; fp16 weights, or a consumer computing in 16 bits (or with a 16-bit or 8-bit
# KV cache), add their own rounding. Quantized weights are compared with PyTorch and recorded at export, not
# enforced: their error is the quantization's, not the export's.
RELATIVE_TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}
REDUCED_PRECISION = "fp16"  # the rule for a consumer that does not compute in f32

# validate()'s terms beyond its rule (`proof/check.py`, `_rule`): each names one rounding to about 8 significant
# bits that the consumer's arithmetic has and the reference's has not, or the other way round, and costs what the
# 16-bit rule costs (3e-2): the 16-bit rule covers bf16 compute, whose unit rounding is 2**-8 of a value, and each
# of these rounds a value to an 8-bit grid, 1/255 of its group's range (asymmetric u8) or 1/254 of its largest
# magnitude (symmetric i8). Independent roundings add in quadrature, so the relative tolerance is the root of the
# sum of the squares of the rule's and the terms' (`relative_tolerance`). A coarser format (a 4-bit KV cache) has
# no term: what it changes beyond the other terms fails.
TERMS = {
    # keys and values stored as u8/i8 (the CPU plugin's default KV cache precision where it computes in bf16)
    "8-bit KV cache": 3e-2,
    # int4/int8 weights: the CPU plugin quantizes the activations of their matmuls to int8 by default
    # (DYNAMIC_QUANTIZATION_GROUP_SIZE, also under INFERENCE_PRECISION_HINT=f32, as the export's reference was
    # computed), a consumer computing otherwise (bf16, another group size, another device) does not
    "8-bit activations": 3e-2,
}


class CannotRestart(Exception):
    """Raised by a greedy consumer's `generate(row, start)` that cannot start from the reference's context at
    `start` (a pipeline that takes text, where the context's tokens do not come back from their text): the row's
    later calls are not compared, and the report says so under `not_compared`."""


def relative_tolerance(rule: str, terms: list[str] = ()) -> float:
    """The relative tolerance of `rule` ("fp32", "fp16") with the `TERMS` named in `terms`, in quadrature."""
    return float(np.sqrt(RELATIVE_TOLERANCE[rule] ** 2 + sum(TERMS[t] ** 2 for t in terms)))


def margin(logits: np.ndarray) -> float:
    """The reference's top-1 minus top-2 logit: how decisive its greedy pick was."""
    top2 = np.partition(np.asarray(logits, dtype=np.float64).ravel(), -2)[-2:]
    return float(top2[1] - top2[0])


def kl(reference: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """KL(p_reference || p_graph) of the next-token distributions, per row."""
    def log_softmax(x):
        x = x.astype(np.float64)
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    log_p, log_q = log_softmax(reference), log_softmax(logits)
    return np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)


def logit_scale(reference: list[np.ndarray]) -> float:
    """What a relative tolerance is relative to: max(1, max |reference logit|)."""
    return max(1.0, float(max(np.max(np.abs(r)) for r in reference)))


def scaled_tolerance(rule: str, reference: list[np.ndarray], terms: list[str] = ()) -> float:
    """The absolute tolerance of `rule` ("fp32", "fp16") and `terms`: relative to max(1, max |reference logit|)."""
    return relative_tolerance(rule, terms) * logit_scale(reference)


def judge_logits(outputs: list[np.ndarray], reference: list[np.ndarray], tolerance: float | None) -> tuple[dict, str | None]:
    """Judge each call's last-position logits (`[batch, vocab]`) against the reference's.

    Returns the report (differences, greedy agreement, KL per stage, each differing step with the reference's
    margin) and the reason it fails in one phrase, or None; `tolerance` None records without judging.
    """
    diffs, picks, kls = [], [], []
    for ref, logits in zip(reference, outputs):
        ref = ref.astype(np.float32)
        diffs.append(float(np.max(np.abs(logits - ref))))
        picks.append(logits.argmax(-1))
        kls.append(float(np.mean(kl(ref, logits))))
    ours = np.stack(picks, axis=1)
    theirs = np.stack([r.argmax(-1) for r in reference[: ours.shape[1]]], axis=1)
    matches = ours == theirs
    differing = []
    for step in np.flatnonzero(~matches.all(axis=0)):
        rows = np.flatnonzero(~matches[:, step])
        m = float(np.max([margin(reference[step][row]) for row in rows]))
        differing.append({"step": int(step), "expected": int(theirs[rows[0], step]), "got": int(ours[rows[0], step]),
                          "margin": m, "near_tie": bool(tolerance is not None and m <= tolerance)})
    report = {
        "greedy_tokens": int(ours.shape[1]),
        "greedy_match": not differing,
        "first_mismatch_step": differing[0]["step"] if differing else None,
        "differing_steps": differing,
        "max_abs_diff_prefill": diffs[0],
        "max_abs_diff_decode": max(diffs[1:]) if len(diffs) > 1 else 0.0,
        "top1_agreement": float(matches.mean()),
        "kl_prefill": kls[0],
        "kl_decode": float(np.mean(kls[1:])) if len(kls) > 1 else 0.0,
        "tolerance": tolerance,
    }
    if tolerance is None:
        return report, None
    flips = [d for d in differing if not d["near_tie"]]
    if flips:
        d = flips[0]
        return report, (f"greedy token {d['step']} differs ({d['expected']} expected, {d['got']} got) where the "
                        f"reference's top-2 margin is {d['margin']:.3g}, above the tolerance {tolerance:.3g}")
    if max(diffs) > tolerance:
        why = f"max |logits difference| {max(diffs):.3g} exceeds the tolerance {tolerance:.3g}"
        if differing:
            why += " (greedy picks differ at near-ties: " + ", ".join(
                f"step {d['step']} margin {d['margin']:.3g}" for d in differing) + ")"
        return report, why
    return report, None


def judge_tokens(generate, reference: list[np.ndarray], fed: np.ndarray, tolerance: float | None) -> tuple[dict, str | None]:
    """Judge a consumer's greedy tokens against the reference.

    `generate(row, start)` returns the consumer's greedy tokens for batch row `row` from the stored prompt
    followed by the first `start` tokens the reference was fed (`fed[row, :start]`); `reference[i]` is the
    reference's last-position logits of call i (`[batch, vocab]`). Token i is compared with the reference's
    argmax of call i while the consumer's context is the reference's: a consumer picks the raw argmax, the
    reference fed `generate()`'s pick (which logits processors can change), and after a near-tie the two
    contexts differ. Then the consumer is restarted with the reference's context up to that point (its prompt
    extended by the fed tokens), so every call is compared, most of them as decode steps; where the consumer
    cannot start from that context (`generate` raises `CannotRestart`), the row's later calls are reported under
    `not_compared`, with the reason.
    """
    calls = len(reference)
    differing, compared, restarts, not_compared = [], [], [], []
    failed = False
    for row in range(fed.shape[0]):
        step, count, again = 0, 0, -1
        while step < calls and not failed:
            try:
                got = list(generate(row, step))
            except CannotRestart as err:
                not_compared.append({"row": row, "from_step": step, "calls": calls - step, "reason": str(err)})
                break
            start, again = step, again + 1
            step = calls  # unless the contexts part below
            for s in range(start, calls):
                expected = int(reference[s][row].argmax())
                if s - start >= len(got):  # the consumer stopped early
                    differing.append({"row": row, "step": s, "expected": expected, "got": None,
                                      "margin": margin(reference[s][row]), "near_tie": False})
                    failed = True
                    break
                count, token = count + 1, int(got[s - start])
                if token != expected:
                    m = margin(reference[s][row])
                    near = bool(tolerance is not None and m <= tolerance)
                    differing.append({"row": row, "step": s, "expected": expected, "got": token, "margin": m,
                                      "near_tie": near})
                    failed = tolerance is not None and not near
                    step = s + 1
                    break
                if s + 1 < calls and token != int(fed[row, s]):  # the reference fed another token: restart there
                    step = s + 1
                    break
        compared.append(count)
        restarts.append(again)
    report = {
        "greedy_tokens": calls,
        "compared_tokens": compared,
        "restarts": restarts,
        "greedy_match": not differing,
        "first_mismatch_step": differing[0]["step"] if differing else None,
        "differing_steps": differing,
        "tolerance": tolerance,
        **({"not_compared": not_compared} if not_compared else {}),
    }
    flips = [d for d in differing if not d["near_tie"]]
    if tolerance is None or not flips:
        return report, None
    d = flips[0]
    if d["got"] is None:
        return report, f"the consumer stopped after {d['step']} tokens, the reference has {calls}"
    return report, (f"greedy token {d['step']} differs ({d['expected']} expected, {d['got']} got) where the "
                    f"reference's top-2 margin is {d['margin']:.3g}, above the tolerance {tolerance:.3g}")
