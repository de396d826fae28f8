"""optimum-intel's `OVModelForVisualCausalLM.generate()` for Qwen3.5 under transformers 5.5.

optimum-intel 2.2's `_OVQwen3_5ForCausalLM` was written for transformers 5.2: under 5.5 its `generate()` fails
before the first call. transformers 5.5's `generate()` computes the (4, batch, seq) M-RoPE positions once, in
`_prepare_position_ids_for_generation`, and extends them by one per token; optimum-intel's version of that
method calls 5.5's `get_rope_index` without the `mm_token_type_ids` it now requires (and 5.5's `get_rope_index`
calls `get_vision_position_ids`, which the class does not borrow from `Qwen3_5Model` as it borrows
`get_rope_index`); its `prepare_inputs_for_generation` indexes the `cache_position` 5.5's `generate()` no
longer passes, and has no `mm_token_type_ids` parameter (so `generate()` refuses the processor's). While `qwen3_5_generate_fixed()` is active, the class has transformers 5.5's own
`Qwen3_5ForConditionalGeneration` behaviour for these three: its `_prepare_position_ids_for_generation`
(reading the OpenVINO model's `rope_deltas` and `get_rope_index`), `get_vision_position_ids` from `Qwen3_5Model`,
and optimum-intel's own `prepare_inputs_for_generation` given the `cache_position` (the positions not in the cache
yet, from the model's past length) and the positions of those tokens only (5.5 extends the whole sequence's).

`qwen3_5_generate_fixed_class(cls)` gives the same three methods to a subclass of its own instead, for one
model's lifetime (`runtimes/visual.py`): optimum-intel's class is not touched, so other threads' models are not
affected while it is used.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from ._swap import replaced

TARGET = "optimum.intel.openvino.modeling_visual_language:_OVQwen3_5ForCausalLM"


def _fixed_methods(cls: type) -> dict[str, Any]:
    """The three methods of `cls` (`_OVQwen3_5ForCausalLM` or a subclass) that run `generate()` under 5.5."""
    import torch
    from transformers import GenerationMixin
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    own = cls.prepare_inputs_for_generation

    def _prepare_position_ids_for_generation(self, inputs_tensor, model_kwargs):
        # transformers 5.5's Qwen3_5ForConditionalGeneration._prepare_position_ids_for_generation, on this model
        text = GenerationMixin._prepare_position_ids_for_generation(self, inputs_tensor, model_kwargs)
        ids = model_kwargs.get("input_ids")
        ids = ids if ids is not None and ids.shape[1] > 0 else inputs_tensor
        is_ids = ids.ndim == 2 and ids.dtype in (torch.int, torch.long)
        if is_ids and model_kwargs.get("mm_token_type_ids") is not None and (
                model_kwargs.get("image_grid_thw") is not None or model_kwargs.get("video_grid_thw") is not None):
            vision, self.rope_deltas = self.get_rope_index(
                ids, **{k: v for k, v in model_kwargs.items() if k != "input_ids"})
        else:
            vision = text.unsqueeze(0).expand(3, -1, -1)
            self.rope_deltas = torch.zeros(ids.shape[0], 1, dtype=torch.long, device=ids.device)
        return torch.cat([text[None], vision], dim=0)

    def prepare_inputs_for_generation(self, input_ids, past_key_values=None, attention_mask=None, inputs_embeds=None,
                                      cache_position=None, position_ids=None, mm_token_type_ids=None, **kwargs):
        if cache_position is None:  # what 5.5's generate() no longer passes: the positions not in the cache yet
            past = self.language_model._get_past_length(past_key_values) if past_key_values is not None else 0
            cache_position = torch.arange(past, input_ids.shape[1], device=input_ids.device)
        inputs = own(self, input_ids, past_key_values=past_key_values, attention_mask=attention_mask,
                     inputs_embeds=inputs_embeds, cache_position=cache_position, position_ids=position_ids, **kwargs)
        if position_ids is not None and position_ids.shape[-1] != cache_position.shape[0]:
            inputs["position_ids"] = position_ids[..., cache_position]  # generate() extends the whole sequence's
        return inputs

    return {"_prepare_position_ids_for_generation": _prepare_position_ids_for_generation,
            "prepare_inputs_for_generation": prepare_inputs_for_generation,
            "get_vision_position_ids": Qwen3_5Model.get_vision_position_ids}


@contextlib.contextmanager
def qwen3_5_generate_fixed() -> Iterator[None]:
    """While active, `OVModelForVisualCausalLM.generate()` runs for Qwen3.5 under transformers 5.5 (module
    docstring); the class's own entries are back on exit."""
    from optimum.intel.openvino import modeling_visual_language as visual

    cls = visual._OVQwen3_5ForCausalLM
    with contextlib.ExitStack() as stack:
        for name, method in _fixed_methods(cls).items():
            stack.enter_context(replaced(cls, name, method))
        yield


def qwen3_5_generate_fixed_class(cls: type) -> type:
    """`cls` (an `OVModelForVisualCausalLM` class) itself, or for Qwen3.5's (`_OVQwen3_5ForCausalLM` and its
    subclasses) a subclass of it with the three methods of `qwen3_5_generate_fixed` as its own: the same fix for
    the models of that subclass only, optimum-intel's class unchanged."""
    from optimum.intel.openvino import modeling_visual_language as visual

    if not issubclass(cls, visual._OVQwen3_5ForCausalLM):
        return cls
    return type(cls.__name__, (cls,), {**_fixed_methods(cls), "__module__": __name__,
                                       "__doc__": f"{cls.__name__} whose generate() runs under transformers 5.5 "
                                                  f"(see {__name__})."})
