"""Decomposition: split a model's `generate()` into its prefill call and its decode calls.

We run `generate()` on a short sample while recording every call to the model's top-level
`forward()`. The first call is the prefill, the next ones are decode steps. The recorded calls
(and the logits they returned) are what the export is validated against.

When `generate()` records fewer calls than it generates tokens, it bypasses the top-level
`forward()`: the model is a wrapper that delegates to an inner causal LM. `decompose()` then runs
the wrapper's `generate()` again while recording each inner candidate (`language_model`, `model`,
..., or any sub-model that can generate); the inner model whose `forward()` is called once per
token is the one `generate()` really drives, and its decoder is what gets exported.
"""

from __future__ import annotations

import copy
import functools
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import DecompositionError, GenerateFailedError, SeparatePrefillError
from ..options import ExportOptions
from ..progress import bar
from ..registration import supported_model_types
from ..tasks import BASE_TASK
from . import fallback

# Inputs every generation step may take; anything else the prefill takes but decode steps do not
# (pixel values, encoder states, ...) means the prefill writes modality inputs into the cache.
_STEP_INPUTS = {
    "input_ids", "attention_mask", "position_ids", "cache_position", "past_key_values", "use_cache",
    "logits_to_keep", "num_logits_to_keep", "return_dict", "output_attentions", "output_hidden_states",
    "inputs_embeds", "token_type_ids", "cache_params", "return_legacy_cache",
}

# Attribute names under which wrappers keep the causal LM that `generate()` drives, most specific
# first. Any other sub-model that can generate is tried after these.
INNER_MODEL_NAMES = ("language_model", "model", "text_model", "decoder", "lm", "llm", "base_model")

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
    # Set when the calls were recorded on an inner model: its attribute path in the wrapper
    # ("language_model") and the inner model itself, which is what gets exported.
    module: str | None = None
    exported: Any = field(default=None, repr=False, compare=False)
    beside: bool = False  # recorded in a process of its own, beside optimum-intel's conversion (`capture_beside.py`)

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


def capture_generation(
    model, input_ids, attention_mask, max_new_tokens: int, *, target=None, module: str | None = None
) -> Capture:
    """Run greedy `generate()` and record the top-level `forward()` calls.

    Args:
        model: a transformers causal LM, in eval mode.
        input_ids: `[batch, seq]` prompt ids (torch tensor).
        attention_mask: `[batch, seq]` mask (torch tensor).
        max_new_tokens: how many tokens to generate (also the number of calls expected).
        target: the model whose `forward()` is recorded while `model.generate()` runs (default:
            `model` itself); an inner model of a wrapper.
        module: the attribute path of `target` in `model`, for messages and the manifest.

    Returns:
        The `Capture`.

    Raises:
        DecompositionError: `generate()` failed, or called the top-level `forward()` fewer times than
            it generated tokens (it delegates to an inner model).
    """
    import torch

    calls: list[StepCall] = []
    target = model if target is None else target
    original_forward = target.forward

    # functools.wraps keeps forward's signature visible: generate() inspects it (logits_to_keep, ...).
    @functools.wraps(original_forward)
    def recording_forward(*args, **kwargs):
        # the cache is updated in place by the call: measure what it held before
        past_length = _past_length(kwargs.get("past_key_values", kwargs.get("cache_params")))
        out = original_forward(*args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        logits = out["logits"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]
        extra = sorted(k for k, v in kwargs.items() if v is not None and k not in _STEP_INPUTS)
        calls.append(
            StepCall(
                input_ids=None if ids is None else ids.detach().cpu().numpy().copy(),
                attention_mask=None if mask is None else mask.detach().cpu().numpy().copy(),
                past_length=past_length,
                extra_inputs=extra,
                last_logits=logits[:, -1, :].detach().float().cpu().numpy().copy(),
            )
        )
        steps.update()
        return out

    from transformers import GenerationConfig

    # A wrapper that is not itself generative has no generation_config: the inner model's applies.
    base = getattr(model, "generation_config", None) or getattr(target, "generation_config", None)
    config = copy.deepcopy(base) if base is not None else GenerationConfig()
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
    recorded = architecture if module is None else f"{architecture}.{module} ({type(target).__name__})"
    steps = bar(f"decomposition: {recorded}.forward()", total=max_new_tokens, unit="call")
    target.forward = recording_forward
    try:
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    except Exception as err:
        raise GenerateFailedError(
            f"generate() failed on {architecture} during decomposition ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); check that the model runs generate() in transformers",
            architecture=architecture, expected=max_new_tokens, captured=len(calls),
        ) from err
    finally:
        del target.forward  # back to the class's forward
        steps.close()
    if len(calls) < max_new_tokens:
        raise DecompositionError(
            f"decomposition of {architecture} expected at least {max_new_tokens} calls to {recorded}.forward() "
            f"during generate(max_new_tokens={max_new_tokens}) but captured {len(calls)}: generate() bypasses "
            "that forward()",
            architecture=architecture, expected=max_new_tokens, captured=len(calls),
        )
    sequences = out if hasattr(out, "shape") else out.sequences
    tokens = sequences[:, input_ids.shape[1]:].cpu().numpy()
    return Capture(
        architecture=architecture if module is None else recorded,
        prompt_ids=input_ids.cpu().numpy(),
        prompt_mask=attention_mask.cpu().numpy(),
        calls=calls[:max_new_tokens],
        tokens=tokens,
        module=module,
        exported=None if module is None else target,
    )


def inner_models(model) -> list[tuple[str, Any]]:
    """The sub-models a wrapper's `generate()` may delegate to: `(attribute path, module)`, best first.

    The names in `INNER_MODEL_NAMES` come first (one level, then two: `model.language_model`), then
    any other transformers sub-model whose class can generate. Each module appears once.
    """
    from transformers import PreTrainedModel

    found: list[tuple[str, Any]] = []
    seen = {id(model)}

    def add(path: str, module: Any) -> None:
        if isinstance(module, PreTrainedModel) and id(module) not in seen:
            seen.add(id(module))
            found.append((path, module))

    for name in INNER_MODEL_NAMES:
        add(name, getattr(model, name, None))
    for name in INNER_MODEL_NAMES:
        outer = getattr(model, name, None)
        for inner in INNER_MODEL_NAMES:
            add(f"{name}.{inner}", getattr(outer, inner, None) if outer is not None else None)
    for path, module in model.named_modules():
        if path and path.count(".") < 2 and isinstance(module, PreTrainedModel) and type(module).can_generate():
            add(path, module)
    return found


def decompose(
    model, input_ids, attention_mask, max_new_tokens: int, *, exportable: Callable[[Any], str | None]
) -> Capture:
    """Capture `generate()` on the model, or on the inner causal LM it really drives.

    Args:
        model: the loaded transformers model, in eval mode.
        input_ids: `[batch, seq]` prompt ids (torch tensor).
        attention_mask: `[batch, seq]` mask (torch tensor).
        max_new_tokens: tokens to generate; one `forward()` call each is expected.
        exportable: returns why an inner model cannot be exported on its own, or None if it can.

    Returns:
        The `Capture`; its `module` names the inner model when the retry was needed.

    Raises:
        DecompositionError: neither the model nor any inner model is called once per token. The
            message names the architecture, the calls expected and captured, the inner models
            tried, and what to do.
    """
    try:
        return capture_generation(model, input_ids, attention_mask, max_new_tokens)
    except DecompositionError as err:
        if err.captured >= err.expected or isinstance(err, GenerateFailedError):
            raise
        top = err
    tried = []
    for path, inner in inner_models(model):
        if not type(inner).can_generate():
            tried.append(f"{path} ({type(inner).__name__}) is not a causal LM")
            continue
        why = exportable(inner)
        if why is not None:
            tried.append(f"{path} ({type(inner).__name__}) {why}")
            continue
        try:
            return capture_generation(model, input_ids, attention_mask, max_new_tokens, target=inner, module=path)
        except DecompositionError as inner_err:
            if isinstance(inner_err, GenerateFailedError):
                raise
            tried.append(f"{path} ({type(inner).__name__}) got {inner_err.captured} calls")
    retry = f"no inner model could be used instead ({'; '.join(tried)})" if tried else "it has no inner causal LM to retry on"
    raise DecompositionError(
        f"{top}, and {retry}: make generate() call forward() once per token, or export the inner causal LM on "
        "its own",
        architecture=top.architecture, expected=top.expected, captured=top.captured,
    )


def save_exported_model(capture: Capture, source: str, directory: Path, *, trust_remote_code: bool = False) -> Path:
    """Save the inner causal LM a capture was recorded on, with the source's tokenizer, for export.

    Args:
        capture: a capture with `module` set.
        source: the wrapper's model id or directory (where the tokenizer comes from).
        directory: where to save.
        trust_remote_code: allow the tokenizer's custom code.

    Returns:
        `directory`.
    """
    directory = Path(directory)
    capture.exported.save_pretrained(str(directory))
    try:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code).save_pretrained(str(directory))
    except Exception:  # no tokenizer with the wrapper: the artifact simply has none
        pass
    source_dir = Path(source)
    if source_dir.is_dir() and not (directory / "generation_config.json").exists():
        if (source_dir / "generation_config.json").is_file():
            shutil.copy(source_dir / "generation_config.json", directory / "generation_config.json")
    return directory


def check_one_graph_serves_both(capture: Capture) -> None:
    """Raise when the prefill takes inputs that decode steps never take."""
    prefill_only = set(capture.prefill.extra_inputs)
    for call in capture.decode:
        prefill_only -= set(call.extra_inputs)
    if prefill_only:
        raise SeparatePrefillError(
            f"{capture.architecture} needs a separate prefill graph: its prefill takes "
            f"{', '.join(sorted(prefill_only))}, which decode steps never take; one shared graph cannot serve both "
            "(export with --task text-generation-with-past or image-text-to-text instead)",
            architecture=capture.architecture,
        )


def sample_inputs(model: str, pt_model, opts: ExportOptions):
    import torch

    text = opts.validation_prompt or DEFAULT_PROMPT
    vocab = pt_model.config.get_text_config().vocab_size
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model, trust_remote_code=opts.trust_remote_code)
        ids = tokenizer(text, return_tensors="pt")["input_ids"][:, :48]
    except Exception:  # no tokenizer shipped
        ids = None
    # transformers may build an empty tokenizer for a directory without tokenizer files; a prompt
    # that is empty or out of the vocabulary cannot validate anything: use a fixed pseudo-random one.
    if ids is None or ids.shape[1] < 2 or int(ids.max()) >= vocab:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(3, vocab, (1, 24), generator=generator)
    return ids, torch.ones_like(ids)


def decompose_model(pt_model, model: str, opts: ExportOptions, config=None) -> tuple[Capture | None, str | None]:
    """Capture prefill and decode calls; return (capture, None) or (None, fallback reason).

    The calls are recorded on the top-level `forward()`, or on the inner causal LM that a wrapper's
    `generate()` really drives (then `capture.module` names it and that model is exported). A
    vision-language model (`pt_model` None) is not captured: its prefill takes image inputs that
    decode steps never take, which is the reason returned.
    """
    if pt_model is None:
        return None, fallback.vision_language_reason(config)
    ids, mask = sample_inputs(model, pt_model, opts)

    def exportable(inner) -> str | None:
        model_type = getattr(inner.config, "model_type", None)
        if model_type in supported_model_types():
            return None
        return f"is a {model_type} model, which optimum-intel does not export as {BASE_TASK}"

    try:
        capture = with_float32_reference(
            pt_model, lambda: decompose(pt_model, ids, mask, opts.validation_new_tokens, exportable=exportable))
        check_one_graph_serves_both(capture)
    except DecompositionError as err:
        if isinstance(err, SeparatePrefillError):
            raise
        return None, str(err)
    return capture, None


def is_16bit(model) -> bool:
    """Whether the model holds 16-bit (fp16/bf16) floating-point weights."""
    import torch

    return any(p.dtype in (torch.float16, torch.bfloat16) for p in model.parameters())


def with_float32_reference(model, capture_calls: Callable[[], Capture]) -> Capture:
    """Run `capture_calls()` (a `generate()` capture) so its logits are the float32 reference.

    A model loaded in 16 bits (optimum-intel loads fp16/bf16 checkpoints so) computes in float32 for the
    capture, with one layer's weights upcast at a time (`reference.capture_fp32`): the graph computes in
    float32 with those 16-bit weights, so that is what it must reproduce. A float32 model runs as it is.
    """
    if not is_16bit(model):
        return capture_calls()
    from .reference import capture_fp32

    capture, report = capture_fp32(model, capture_calls)
    if report.low_precision_inputs:  # float32 flow broken by the model's own casts: say where
        capture.notes.append("validation reference computed with 16-bit activations into "
                             + ", ".join(sorted(report.low_precision_inputs)))
    return capture


class _Released:
    """Stands in for a released PyTorch model: its class name and config, none of its weights."""

    def __init__(self, model):
        self.config = model.config
        self.architecture = type(model).__name__


def release_pytorch(capture) -> None:
    """Drop the capture's reference to the PyTorch model and collect it (the caller drops its own first).

    An export validates against the captured calls (inputs and the logits PyTorch returned), so the
    capture keeps nothing of the model once it is recorded: optimum-intel frees the one loaded model
    after converting it, before the graph is compiled for validation.
    """
    import gc

    if capture is not None and capture.exported is not None:
        capture.exported = _Released(capture.exported)
    gc.collect()
