"""The rules that judge a graph's results against a reference: the export's validation and `validate()` on
a deployed artifact use the same ones.

Logits (a teacher-forced consumer: every call's last-position logits): the largest |difference| must stay
within the tolerance, and the graph's argmax must equal the reference's wherever the reference's own top-2
margin is above the tolerance (below it, rounding decides the pick: a near-tie, reported, not a failure).

Tokens (a consumer that only returns its greedy tokens, OpenVINO GenAI's pipelines): token i is compared with
the reference's argmax of call i as long as the consumer's tokens before it are the ones the reference was fed;
a difference is judged by the reference's margin there, and nothing after it can be compared (the contexts
differ from then on).
"""

from __future__ import annotations

import numpy as np

# Largest allowed |logits difference| relative to max(1, max |reference logit|). fp32 graphs differ from eager
# PyTorch only by kernel rounding; fp16 weights, or a consumer computing in 16 bits (or with a 16-bit or 8-bit
# KV cache), add their own rounding. Quantized weights are compared with PyTorch and recorded at export, not
# enforced: their error is the quantization's, not the export's.
RELATIVE_TOLERANCE = {"fp32": 1e-3, "fp16": 3e-2}
REDUCED_PRECISION = "fp16"  # the rule for a consumer that does not compute in f32


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


def scaled_tolerance(rule: str, reference: list[np.ndarray]) -> float:
    """The absolute tolerance of `rule` ("fp32", "fp16"): relative to max(1, max |reference logit|)."""
    scale = max(1.0, float(max(np.max(np.abs(r)) for r in reference)))
    return RELATIVE_TOLERANCE[rule] * scale


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


def judge_tokens(tokens: list[list[int]], reference: list[np.ndarray], fed: np.ndarray,
                 tolerance: float | None) -> tuple[dict, str | None]:
    """Judge a consumer's greedy tokens (one list per batch row, from the stored prompt) against the reference.

    `reference[i]` is the reference's last-position logits of call i (`[batch, vocab]`) and `fed[:, i]` the
    token the reference fed after it. Token i is comparable while the consumer's tokens before it equal the fed
    ones: a consumer picks the raw argmax, the reference's feed is `generate()`'s pick (which its logits
    processors can change), and after either kind of divergence the contexts differ.
    """
    differing, compared = [], []
    for row, got in enumerate(tokens):
        count = 0
        for step, ref in enumerate(reference):
            expected = int(ref[row].argmax())
            if step >= len(got):  # the consumer stopped early
                differing.append({"row": row, "step": step, "expected": expected, "got": None,
                                  "margin": margin(ref[row]), "near_tie": False})
                break
            count += 1
            if int(got[step]) != expected:
                m = margin(ref[row])
                differing.append({"row": row, "step": step, "expected": expected, "got": int(got[step]),
                                  "margin": m, "near_tie": bool(tolerance is not None and m <= tolerance)})
                break
            if step + 1 < len(reference) and int(got[step]) != int(fed[row, step]):
                break  # the reference fed another token (a logits processor's pick): nothing more to compare
        compared.append(count)
    report = {
        "greedy_tokens": len(reference),
        "compared_tokens": compared,
        "greedy_match": not differing,
        "first_mismatch_step": differing[0]["step"] if differing else None,
        "differing_steps": differing,
        "tolerance": tolerance,
    }
    flips = [d for d in differing if not d["near_tie"]]
    if tolerance is None or not flips:
        return report, None
    d = flips[0]
    if d["got"] is None:
        return report, f"the consumer stopped after {d['step']} tokens, the reference has {len(reference)}"
    return report, (f"greedy token {d['step']} differs ({d['expected']} expected, {d['got']} got) where the "
                    f"reference's top-2 margin is {d['margin']:.3g}, above the tolerance {tolerance:.3g}")
