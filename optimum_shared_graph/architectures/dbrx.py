"""DBRX (databricks/dbrx-*) under transformers 5.5: optimum-intel's export with a patcher for the 5.5 classes.

What broke: optimum-intel's `DBRXOpenVINOConfig` (capped at transformers 4.57.6) exports with
`DBRXModelPatcher`, written for the 4.x DBRX classes. transformers 5.5 rewrote them: `DbrxModel` builds its
mask with `create_causal_mask` and has no `_update_causal_mask` (the patcher stops there: "'DbrxModel' object
has no attribute '_update_causal_mask'"), the rotary embedding is one `DbrxRotaryEmbedding` on the model
instead of one per attention (the patcher reads `attn.rotary_emb`), and `DbrxExperts.forward` takes
`(hidden_states, top_k_index, top_k_weights)` and loops over the experts hit by the batch's tokens
(`nonzero()` on the routing mask), where the patcher's `_dbrx_experts_forward` has the 4.x signature.

What the fix does: optimum-intel's decoder patcher (`OVDecoderModelPatcher`: its fp16-safe causal mask for
`create_causal_mask`), and every expert computed on every token, weighted by the dense routing weights
(zero for the experts a token was not routed to), so the trace does not depend on which experts the dummy
batch hit. The experts are computed together, as batched matmuls over the stacked `w1`, `v1`, `w2` weights
(laid out as `DbrxExperts.forward` slices them) and `DbrxExpertGLU`'s activation: the form of optimum-intel's
"ov_batched_mm" experts. One GLU per expert, summed, is the same computation, but with 3 or more experts and
a static token count of 4 or more OpenVINO 2026.4's CPU plugin crashes compiling it (a segmentation fault in
a graph-rewrite pass that `SNIPPETS_MODE=DISABLE` avoids: a `--shape-mode static --static-query-len 4`
export died in validation). The graph's interface is
optimum-intel's own (`input_ids`, `attention_mask`, `position_ids`, `past_key_values.{i}.key/value`), and
the version cap is lifted.

Note: transformers 5.5's DBRX MoE reads `ffn_config.ffn_hidden_size` where it means the model's hidden size
and has the GLU's transposes inverted (transformers PR #47671), so a released checkpoint (ffn_hidden_size
10752, d_model 6144) fails in PyTorch itself, and no export can be validated against it. The fix follows
the installed classes' computation (it calls their GLU), so it reproduces whatever transformers runs.
"""

from __future__ import annotations

import types
from typing import Self

MODEL_TYPES = ("dbrx",)
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's DBRX export config with its decoder patcher instead of DBRXModelPatcher (written for "
           "the 4.x classes: DbrxModel has no _update_causal_mask under transformers 5.5) and every expert on every "
           "token weighted by the dense routing weights, as batched matmuls (the 5.5 experts loop over the experts a batch "
           "hits; a per-expert sum crashes OpenVINO's CPU compile at a static query length >= 4)")


def dbrx_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """`DbrxExperts.forward` of transformers 5.5 without its data-dependent loop: every expert on every token.

    The experts run as batched matmuls over their stacked weights (optimum-intel's `ov_batched_mm` form),
    not one GLU per expert: OpenVINO 2026.4's CPU plugin crashes compiling the per-expert sum with a static
    token count >= 4 (see the module docstring).

    Args: hidden_states [batch, seq, hidden]; top_k_index, top_k_weights [batch * seq, top_k].
    Returns: [batch, seq, hidden], the routed experts' outputs summed with their routing weights.
    """
    import torch

    batch_size, hidden = hidden_states.shape[0], hidden_states.shape[-1]
    tokens = hidden_states.reshape(-1, hidden)
    num_tokens, num_experts = tokens.shape[0], self.num_experts
    dense_weights = torch.zeros(num_tokens, num_experts, dtype=tokens.dtype, device=tokens.device)
    dense_weights = dense_weights.scatter(1, top_k_index, top_k_weights.to(tokens.dtype))
    split_expert_shape = (num_experts, self.ffn_hidden_size, self.hidden_size)  # as DbrxExperts.forward slices them
    w1 = self.mlp.w1.view(split_expert_shape)
    v1 = self.mlp.v1.view(split_expert_shape)
    w2 = self.mlp.w2.view(split_expert_shape)
    expanded = tokens.repeat(num_experts, 1).view(num_experts, num_tokens, hidden)  # [experts, tokens, hidden]
    intermediate = self.mlp.activation_fn(torch.bmm(expanded, w1)) * torch.bmm(expanded, v1)
    out = torch.bmm(intermediate, w2.transpose(1, 2))  # [experts, tokens, hidden], as DbrxExpertGLU's w2.t()
    out = (out * dense_weights.transpose(0, 1).view(num_experts, num_tokens, 1)).sum(dim=0)
    return out.view(batch_size, -1, hidden)


def export_config(base: type) -> type:
    """optimum-intel's `DBRXOpenVINOConfig` `base`, uncapped, with `DbrxPatcher` as its patcher."""
    from optimum.exporters.openvino.model_patcher import OVDecoderModelPatcher

    class DbrxPatcher(OVDecoderModelPatcher):
        """optimum-intel's decoder patcher, plus DBRX's experts computed densely (no loop over the hit experts)."""

        def __enter__(self) -> Self:
            super().__enter__()
            for block in self._model.transformer.blocks:
                experts = block.ffn.experts
                experts.forward = types.MethodType(dbrx_experts_forward, experts)
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            super().__exit__(exc_type, exc_value, traceback)
            for block in self._model.transformer.blocks:
                block.ffn.experts.__dict__.pop("forward", None)  # back to the class's forward

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} for the DBRX classes of transformers 5.5 (optimum_shared_graph.architectures.dbrx).",
        "_MODEL_PATCHER": DbrxPatcher,
        "MAX_TRANSFORMERS_VERSION": None,
    })
