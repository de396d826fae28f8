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
and puts the model's experts implementation back on exit.
"""

from __future__ import annotations

MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's Deepseek export config with a plain decoder patcher (the native transformers 5.5 MLA "
           "attention traces as it is; DeepseekPatcher's forwards are for the remote-code modules) and the routed "
           "experts on optimum-intel's ov_batched_mm (grouped_mm does not convert)")


def export_config(base: type) -> type:
    """optimum-intel's Deepseek export config `base`, uncapped, with `DeepseekNativePatcher` as its patcher."""
    from optimum.exporters.openvino.model_patcher import OVDecoderModelPatcher, register_ov_batched_mm

    class DeepseekNativePatcher(OVDecoderModelPatcher):
        """optimum-intel's decoder patcher, plus the routed experts on its trace-friendly "ov_batched_mm"."""

        def __enter__(self) -> "DeepseekNativePatcher":
            super().__enter__()
            self._experts_implementation = self._model.config._experts_implementation
            register_ov_batched_mm(self)  # also lets the model accept "ov_batched_mm" (an instance method)
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            super().__exit__(exc_type, exc_value, traceback)
            self._model.set_experts_implementation(self._experts_implementation)
            self._model.__dict__.pop("get_correct_experts_implementation", None)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} for the native DeepseekV2/V3 classes of transformers 5.5.",
        "_MODEL_PATCHER": DeepseekNativePatcher,
        "MAX_TRANSFORMERS_VERSION": None,
    })
