"""Decomposition: split a model's `generate()` into its prefill call and its decode calls.

We run `generate()` on a short sample while recording every call to the model's top-level
`forward()`. The first call is the prefill, the next ones are decode steps. The recorded calls
(and the logits they returned) are what the export is validated against.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._errors import DecompositionError

# Inputs every generation step may take; anything else the prefill takes but decode steps do not
# (pixel values, encoder states, ...) means the prefill writes modality inputs into the cache.
_STEP_INPUTS = {
    "input_ids", "attention_mask", "position_ids", "cache_position", "past_key_values", "use_cache",
    "logits_to_keep", "num_logits_to_keep", "return_dict", "output_attentions", "output_hidden_states",
    "inputs_embeds", "token_type_ids", "cache_params", "return_legacy_cache",
}

DEFAULT_PROMPT = (
    "OpenVINO runs one decoder graph for the prompt and for every new token, so the weights are "
    "stored once and compiled once."
)


@dataclass
class StepCall:
    """One recorded call of the top-level `forward()`."""

    input_ids: np.ndarray
    attention_mask: np.ndarray | None
    past_length: int
    extra_inputs: list[str]
    last_logits: np.ndarray  # [batch, vocab], float32


@dataclass
class Capture:
    """What `generate()` did: one prefill call, the decode calls, and the tokens it picked."""

    architecture: str
    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    calls: list[StepCall]
    tokens: np.ndarray  # [batch, new_tokens]
    notes: list[str] = field(default_factory=list)

    @property
    def prefill(self) -> StepCall:
        return self.calls[0]

    @property
    def decode(self) -> list[StepCall]:
        return self.calls[1:]


def _past_length(value: Any) -> int:
    if value is None:
        return 0
    if hasattr(value, "get_seq_length"):
        try:
            return int(value.get_seq_length())
        except Exception:  # some cache classes need a layer index
            return -1
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], (tuple, list)):
        return int(value[0][0].shape[-2])
    return -1


def capture_generation(model, input_ids, attention_mask, max_new_tokens: int) -> Capture:
    """Run greedy `generate()` and record the top-level `forward()` calls.

    Args:
        model: a transformers causal LM, in eval mode.
        input_ids: `[batch, seq]` prompt ids (torch tensor).
        attention_mask: `[batch, seq]` mask (torch tensor).
        max_new_tokens: how many tokens to generate (also the number of calls expected).

    Returns:
        The `Capture`.

    Raises:
        DecompositionError: `generate()` failed, or called the top-level `forward()` fewer times than
            it generated tokens (it delegates to an inner model).
    """
    import torch

    calls: list[StepCall] = []
    original_forward = model.forward

    # functools.wraps keeps forward's signature visible: generate() inspects it (logits_to_keep, ...).
    @functools.wraps(original_forward)
    def recording_forward(*args, **kwargs):
        out = original_forward(*args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        logits = out["logits"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]
        extra = sorted(k for k, v in kwargs.items() if v is not None and k not in _STEP_INPUTS)
        calls.append(
            StepCall(
                input_ids=None if ids is None else ids.detach().cpu().numpy().copy(),
                attention_mask=None if mask is None else mask.detach().cpu().numpy().copy(),
                past_length=_past_length(kwargs.get("past_key_values", kwargs.get("cache_params"))),
                extra_inputs=extra,
                last_logits=logits[:, -1, :].detach().float().cpu().numpy().copy(),
            )
        )
        return out

    config = copy.deepcopy(model.generation_config)
    config.max_new_tokens = max_new_tokens
    config.min_new_tokens = max_new_tokens
    config.do_sample = False
    config.num_beams = 1
    for attr in ("temperature", "top_p", "top_k"):
        if hasattr(config, attr):
            setattr(config, attr, None)
    if config.pad_token_id is None:
        eos = config.eos_token_id
        config.pad_token_id = (eos[0] if isinstance(eos, list) else eos) if eos is not None else 0
    architecture = type(model).__name__
    model.forward = recording_forward
    try:
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    except Exception as err:
        raise DecompositionError(
            f"generate() failed on {architecture} during decomposition ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); check that the model runs generate() in transformers",
            architecture=architecture, expected=max_new_tokens, captured=len(calls),
        ) from err
    finally:
        del model.forward  # back to the class's forward
    if len(calls) < max_new_tokens:
        raise DecompositionError(
            f"decomposition of {architecture} expected at least {max_new_tokens} calls to {architecture}.forward() "
            f"during generate(max_new_tokens={max_new_tokens}) but captured {len(calls)}: generate() bypasses the "
            "top-level forward() (it delegates to an inner model); export the inner language model, or use --fallback auto",
            architecture=architecture, expected=max_new_tokens, captured=len(calls),
        )
    tokens = out[:, input_ids.shape[1]:].cpu().numpy()
    return Capture(
        architecture=architecture,
        prompt_ids=input_ids.cpu().numpy(),
        prompt_mask=attention_mask.cpu().numpy(),
        calls=calls[:max_new_tokens],
        tokens=tokens,
    )


def check_one_graph_serves_both(capture: Capture) -> None:
    """Raise when the prefill takes inputs that decode steps never take (SPEC section 4, step 3)."""
    prefill_only = set(capture.prefill.extra_inputs)
    for call in capture.decode:
        prefill_only -= set(call.extra_inputs)
    if prefill_only:
        raise DecompositionError(
            f"{capture.architecture} needs a separate prefill graph: its prefill takes "
            f"{', '.join(sorted(prefill_only))}, which decode steps never take; one shared graph cannot serve both "
            "(export with --task text-generation-with-past or image-text-to-text instead)",
            architecture=capture.architecture,
        )
