"""transformers' model loading: the weights a model class's load does not report as unexpected."""

from __future__ import annotations

import contextlib
from typing import Iterator

from ._swap import replaced


@contextlib.contextmanager
def unexpected_keys_ignored(model_class: type, patterns: list[str]) -> Iterator[None]:
    """While active, transformers' load of `model_class` does not list checkpoint weights matching `patterns`
    (regular expressions) as unexpected: they are added to the class's `_keys_to_ignore_on_load_unexpected`,
    which is back as it was on exit (the class's own value, or the inherited one)."""
    current = list(getattr(model_class, "_keys_to_ignore_on_load_unexpected", None) or [])
    with replaced(model_class, "_keys_to_ignore_on_load_unexpected", current + list(patterns)):
        yield


# the weight conversions transformers 5 applies to a mixture of experts' checkpoint (`conversion_mapping.py`): the
# per-expert tensors merged into new fused ones (`experts.gate_up_proj`, `experts.down_proj`) as the model loads
_FUSED_EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


@contextlib.contextmanager
def experts_loaded_as_stored(modeling: str, class_name: str, replacement: type) -> Iterator[None]:
    """While active, transformers builds the experts of the model module `modeling` (a module path) as
    `replacement` instead of its class `class_name`, and loads the checkpoint's per-expert tensors into it as they
    are stored: the weight conversions that would merge them into fused tensors (new memory the size of every
    expert) are left out of the conversion mapping, so each expert's weights stay memory-mapped from the
    safetensors file. Both are back as they were on exit."""
    import importlib

    import transformers.conversion_mapping as mapping

    module = importlib.import_module(modeling)
    original = mapping.get_checkpoint_conversion_mapping

    def without_fusion(model_type):
        conversions = original(model_type)
        if conversions is None:
            return None
        return [c for c in conversions
                if not any(target.endswith(fused) for fused in _FUSED_EXPERTS
                           for target in getattr(c, "target_patterns", ()) or ())]

    with replaced(module, class_name, replacement), \
            replaced(mapping, "get_checkpoint_conversion_mapping", without_fusion):
        yield


@contextlib.contextmanager
def parallel_experts_upcast_one_at_a_time(modeling: str, class_name: str) -> Iterator[None]:
    """While active, the experts class `class_name` of the model module `modeling` (GraniteMoE's
    `ParallelExperts`: every expert's weight in one `[experts, out, in]` tensor) multiplies each expert's tokens by
    that expert's weight cast to the tokens' dtype, and says so (`computes_fp32_itself`): the capture's float32
    compute then upcasts one expert at a time instead of the whole tensor with its layer. The same products as the
    class's own `forward` (a no-op cast when the dtypes agree); both attributes are back as they were on exit."""
    import importlib

    import torch
    import torch.nn.functional as F

    experts = getattr(importlib.import_module(modeling), class_name)

    def forward(self, inputs, expert_size):
        parts = inputs.split(expert_size, dim=0)
        return torch.cat([F.linear(x, self.weight[i].to(x.dtype)) for i, x in enumerate(parts)], dim=0)

    with replaced(experts, "forward", forward), replaced(experts, "computes_fp32_itself", True):
        yield
