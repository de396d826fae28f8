"""DeepSeek-V2 and DeepSeek-V3 (multi-head latent attention + routed experts) under transformers 5.5.

What broke: optimum-intel's `DeepseekOpenVINOConfig` (capped at transformers 4.53.3) exports with
`DeepseekPatcher`, which replaces every attention forward with `deepseek_v2_attn_forward` /
`deepseek_v3_attn_forward` and every MoE's `moe_infer` with `deepseek_moe_infer`. Those functions were
written for the remote-code modules of the Hub checkpoints (`modeling_deepseek.py`), not for the native
`DeepseekV2` / `DeepseekV3` classes transformers 5.5 builds: the native attention has no `q_head_dim`
(deepseek_v2: "'DeepseekV2Attention' object has no attribute 'q_head_dim'") and is called with
`past_key_values=` (deepseek_v3: "deepseek_v3_attn_forward() got an unexpected keyword argument
'past_key_values'"), and the native experts are one module of stacked 3D weights, with no `moe_infer`.

What the fix does: it leaves the attention alone. The native MLA attention traces as it is (V2's rotary
product in complex numbers converts through OpenVINO's complex-tensor support, V3's is cos/sin), and its
cache is the plain `DynamicCache`, so the graph keeps optimum-intel's `past_key_values.N.key/value` states,
each key head qk_nope_head_dim + qk_rope_head_dim wide and each value head v_head_dim wide, as optimum-intel's
MiniCPM3 dummy cache generator (reused by its Deepseek config) already sizes them. Only the routed experts
change: transformers' default "grouped_mm" experts implementation does not convert (aten::histc has no
OpenVINO rule), so the patcher switches the experts to optimum-intel's "ov_batched_mm" (every expert on every
token, weighted by the dense routing weights: the pattern OpenVINO's MoE transformation recognises), as
optimum-intel's own `DeepseekOCR2LMPatcher` does for the native DeepseekV2 text model under transformers 5,
and puts the model's experts implementation back on exit. Under transformers 5 the experts themselves are loaded
as the checkpoint stores them and traced stacked (`moe_experts`, composed with this config): no fused copy at load,
no float32 constants in the conversion.

And DeepSeek-V2's router goes through its gate module. `DeepseekV2Moe.forward` computes the router logits as
`F.linear(hidden.float(), self.gate.weight.float())`, reading the `nn.Linear`'s weight instead of calling it;
for a 16-bit model OpenVINO's PyTorch frontend traces every 16-bit `nn.Linear` with its `.weight` replaced by a
float32 placeholder of zeros (`openvino/frontend/pytorch/patch_model.py`, `_stash_weights_as_fp32_placeholders`:
the real weight is emitted only through the Linear's own call), so the router's weights became a constant of
zeros: uniform routing, the same experts for every token. Measured on deepseek_v2 at 512 wide with V2-Lite's
attention widths (2 layers, fp16 checkpoint): `--weight-format fp16` was refused by validation (greedy token 11
at a PyTorch margin of 0.383 against a tolerance of 0.343; every call's logits off by 1.2 to 2.6), the router's
weight constant all zeros in the graph, while fp32 weights validated; DeepSeek-V3's router owns its weight
(`DeepseekV3TopkRouter`), no Linear, and is unaffected. The patcher gives each `DeepseekV2Moe` a forward that
calls `self.gate` on the float32 hidden states (the same float32 product of the same weights), for the trace only.
"""

from __future__ import annotations

from . import moe_experts

MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's Deepseek export config with a plain decoder patcher (the native transformers 5.5 MLA "
           "attention traces as it is; DeepseekPatcher's forwards are for the remote-code modules) and the routed "
           "experts loaded as the checkpoint stores them, traced stacked (moe_experts; grouped_mm does not convert)")


def export_config(base: type) -> type:
    """optimum-intel's Deepseek export config `base`, uncapped, with `DeepseekNativePatcher` as its patcher, the
    experts traced as the checkpoint stores them (`moe_experts`)."""
    return moe_experts.export_config(_native_config(base))


# the experts load as the checkpoint stores them, memory-mapped (`moe_experts`)
while_exporting = moe_experts.while_exporting


def _native_config(base: type) -> type:
    from optimum.exporters.openvino.model_patcher import OVDecoderModelPatcher, register_ov_batched_mm

    class DeepseekNativePatcher(OVDecoderModelPatcher):
        """optimum-intel's decoder patcher, plus the routed experts on its trace-friendly "ov_batched_mm" and
        DeepSeek-V2's router through its gate module (above)."""

        def __enter__(self) -> "DeepseekNativePatcher":
            super().__enter__()
            self._experts_implementation = self._model.config._experts_implementation
            register_ov_batched_mm(self)  # also lets the model accept "ov_batched_mm" (an instance method)
            self._routers = _route_through_gate(self._model)
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            super().__exit__(exc_type, exc_value, traceback)
            self._model.set_experts_implementation(self._experts_implementation)
            self._model.__dict__.pop("get_correct_experts_implementation", None)
            for moe in self._routers:
                moe.__dict__.pop("forward", None)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} for the native DeepseekV2/V3 classes of transformers 5.5.",
        "_MODEL_PATCHER": DeepseekNativePatcher,
        "MAX_TRANSFORMERS_VERSION": None,
    })


def _route_through_gate(model) -> list:
    """Give each `DeepseekV2Moe` of `model` a forward whose router logits call its gate `nn.Linear` (on float32
    hidden states, as transformers computes them) instead of reading `gate.weight`; return the modules."""
    import types

    import torch

    def forward(self, hidden_states):
        residuals, shape = hidden_states, hidden_states.shape
        gate_input = hidden_states.type(torch.float32).type(self.gate.weight.dtype)  # float32 while traced
        router_logits = self.gate(gate_input).type(torch.float32)
        topk_indices, topk_weights = self.route_tokens_to_experts(router_logits)
        hidden_states = self.experts(hidden_states.view(-1, shape[-1]), topk_indices, topk_weights).view(*shape)
        return hidden_states + self.shared_experts(residuals)

    routers = [m for m in model.modules() if type(m).__name__ == "DeepseekV2Moe"]
    for moe in routers:
        moe.forward = types.MethodType(forward, moe)
    return routers
