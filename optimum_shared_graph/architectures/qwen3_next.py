"""Qwen3-Next under transformers 5.5: optimum-intel's Qwen3NextModelPatcher graph with a 5.5 cache holder and MoE.

What broke: transformers 5.5 removed `Qwen3NextDynamicCache`, which optimum-intel's
`Qwen3NextModelPatcher` imports and subclasses first thing (the export stops at that import); the
model now keeps its states in one `DynamicCache` and calls `has_previous_state(layer_idx)` as a
method. 5.5 also stores the MoE experts as 3-D tensors behind a top-k router, so the patcher's
vectorised MoE block (which stacks `experts[i].gate_proj.weight`) no longer applies, and
`Qwen3NextOpenVINOConfig` caps transformers at 4.57.6.

The fix (`_gated_delta_net.GatedDeltaNetPatcher`) keeps optimum-intel's graph: the same inputs
(`cache_params.past.conv.{i}` / `.ssm.{i}` per linear-attention layer, `.key.{i}` / `.value.{i}` per
full-attention layer, all states of the one stateful graph), its recurrent gated-delta-net forward
(`qwen3_next_gated_delta_net_forward` with `ov_causal_conv1d` and the `RecurrentAttentionCell` loop),
and optimum-intel's vectorised MoE block for the 5.5 experts layout (`patched_qwen3_5_moe_sparse_moe_block`,
written for Qwen3.5-MoE, whose 5.5 block is the same as Qwen3-Next's: router, 3-D experts, gated
shared expert). The model sees the graph's states through a plain holder, and left padding is zeroed
before every linear-attention layer from the graph's attention mask, as transformers does at prefill.
"""

from __future__ import annotations

from . import moe_experts

MODEL_TYPES = ("qwen3_next",)
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's Qwen3NextModelPatcher graph with a state holder for transformers 5.5's cache "
           "(Qwen3NextDynamicCache was removed), its vectorised MoE block for the 5.5 3-D experts, and "
           "left padding zeroed before the linear-attention layers")


def _patcher_class() -> type:
    from optimum.exporters.openvino.model_patcher import qwen3_next_gated_delta_net_forward

    from ._gated_delta_net import patcher_class

    class Qwen3NextPatcher(patcher_class()):
        """The gated-delta-net patcher with Qwen3-Next's recurrent forward and MoE block."""

        recurrent_forward = staticmethod(qwen3_next_gated_delta_net_forward)

        @staticmethod
        def sparse_moe_classes() -> tuple[type, ...]:
            from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock

            return (Qwen3NextSparseMoeBlock,)

    return Qwen3NextPatcher


def export_config(base: type) -> type:
    """optimum-intel's `Qwen3NextOpenVINOConfig` without its 4.57.6 cap, patching the model for transformers 5.5,
    its experts traced as the checkpoint stores them (`moe_experts`)."""
    return moe_experts.export_config(type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with a patcher for transformers 5.5 (see {__name__}).",
        "MAX_TRANSFORMERS_VERSION": None,
        "_MODEL_PATCHER": _patcher_class(),
    }))


# the experts load as the checkpoint stores them, memory-mapped (`moe_experts`)
while_exporting = moe_experts.while_exporting
