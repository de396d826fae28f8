"""The static forms of modules whose optimum-intel form does not fit a static graph: architecture rewrites that the
static trace (`pipeline/static.py`, `--shape-mode static`) applies to one loaded model for the duration of the trace.

A form replaces one method of a module instance (restored on exit); the module classes are named in
`STATIC_FORMS`. Like the other architecture fixes, every static export is validated against PyTorch.
"""

from __future__ import annotations

import contextlib
import types
from typing import Iterator

from ..errors import ModelNotSupportedError


@contextlib.contextmanager
def static_forms(pt_model, query_slots: dict) -> Iterator[None]:
    """Inside the static trace: the modules whose optimum-intel form does not fit a static graph get one that does
    (`STATIC_FORMS`: a method of the module replaced, on the instance, and restored on exit).

    Attention over the whole static cache. optimum-intel's patchers give the CodeGen, GPT-J and GPT-Neo attentions
    an SDPA `_attn` (`codegen_wrapped_scaled_dot_product`, `_gptj_attn`, `_gpt_neo_attn_sdpa`) that, for a batch of
    1, drops the attention mask: `is_causal=True` for several queries, no mask at all for one. That is right for a
    dynamic cache, whose keys are exactly the tokens so far; a static cache's keys are every slot of the capacity,
    most of them not yet written, so the static graph attended to empty slots (greedy token 0 differed from
    PyTorch's with a 0.08 margin). GPT-J's falls back to transformers' `_attn` with a `head_mask` argument the 5.x
    `_attn` no longer takes (the trace failed). Here CodeGen and GPT-J run transformers' own `_attn` (the additive
    mask over every key), and GPT-Neo a copy of its own whose causal and local-window mask is computed from the
    query slots (`cache_position`, written into `query_slots` by the wrapper) instead of assuming the queries are
    the last keys, which slicing its `bias` buffer by `key_length - query_length` does.

    Experts without data-dependent shapes. optimum-intel's GraniteMoE patcher splits the tokens among the experts
    by how many each one got (`inputs[start:start + expert_size[i]]`), shapes only known at run time, so the
    static graph kept dynamic shapes; here every expert runs on every token, weighted by the dense routing gates
    (zero for the experts a token was not routed to), in the form of `granitemoe.py`'s fix.
    """
    replaced = []
    for module in pt_model.modules():
        form = STATIC_FORMS.get(type(module).__name__)
        if form is not None:
            name, make = form
            replaced.append((module, name, module.__dict__.get(name)))
            setattr(module, name, types.MethodType(make(query_slots), module))
    try:
        yield
    finally:
        for module, name, before in replaced:
            if before is None:
                module.__dict__.pop(name, None)
            else:
                setattr(module, name, before)


def additive(attention_mask, dtype):
    """A transformers attention mask as an additive float mask (0 where attended, the dtype's minimum elsewhere)."""
    import torch

    if attention_mask is None:
        raise ModelNotSupportedError("the static trace got no attention mask: use --shape-mode dynamic for this model")
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, torch.zeros((), dtype=dtype), torch.full((), torch.finfo(dtype).min, dtype=dtype))
    return attention_mask.to(dtype)


def _transformers_attn(query_slots: dict):
    """The attention class's own `_attn` (CodeGen, GPT-J: scores + the additive mask, in float32)."""

    def _attn(self, query, key, value, attention_mask=None, *args, **kwargs):
        import torch

        return type(self)._attn(self, query, key, value, additive(attention_mask, torch.float32))

    return _attn


def _gpt_neo_attn(query_slots: dict):
    """`GPTNeoSelfAttention._attn` with its causal / local-window mask taken at the query slots."""

    def _attn(self, query, key, value, attention_mask=None, *args, **kwargs):
        import torch

        query, key = query.to(torch.float32), key.to(torch.float32)
        weights = torch.matmul(query, key.transpose(-1, -2))  # GPT-Neo does not scale its scores
        distance = query_slots["query"].unsqueeze(1) - torch.arange(key.shape[-2], dtype=torch.int64, device=key.device).unsqueeze(0)  # [C, capacity]
        allowed = distance >= 0
        if self.attention_type == "local":
            allowed = allowed & (distance < self.config.window_size)
        mask_value = torch.full((), torch.finfo(weights.dtype).min, dtype=weights.dtype)
        weights = torch.where(allowed, weights, mask_value)
        weights = weights + additive(attention_mask, weights.dtype)
        weights = torch.nn.functional.softmax(weights, dim=-1).to(value.dtype)
        return torch.matmul(weights, value), weights

    return _attn


def _granite_moe_dense(query_slots: dict):
    """`GraniteMoeMoE.forward` with every expert on every token, weighted by the dense top-k gates: the form of the
    dynamic export's fix (`architectures/granitemoe.py`), for a static trace under transformers it does not apply to."""
    from .granitemoe import dense_moe_forward

    return dense_moe_forward


# module classes (by name) whose optimum-intel form does not fit a static graph: the method replaced, and its maker
STATIC_FORMS = {"CodeGenAttention": ("_attn", _transformers_attn), "GPTJAttention": ("_attn", _transformers_attn),
                 "GPTNeoSelfAttention": ("_attn", _gpt_neo_attn), "GraniteMoeMoE": ("forward", _granite_moe_dense)}
