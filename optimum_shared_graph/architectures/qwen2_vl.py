"""Qwen2-VL and Qwen2.5-VL under transformers 5.5: optimum-intel's image-text-to-text configs without their cap.

What broke: optimum-intel 2.2's `Qwen2VLOpenVINOConfig` and `Qwen2_5_VLOpenVINOConfig` set
`MAX_TRANSFORMERS_VERSION = "5.0"`, so their `image-text-to-text` export stops under 5.5 ("Maximum required is 5.0")
after the language model graph is written, at the first vision part. Nothing else breaks: with the cap lifted,
optimum-intel's own configs and patchers trace the parts under 5.5 (the language model fed `inputs_embeds` and the
(3, batch, seq) M-RoPE positions, the vision patch embedding, the vision blocks and merger; for Qwen2.5-VL the
window attention inputs), and the graphs reproduce PyTorch, which the export checks on an image and a text prompt
(`pipeline/vlm.py`), as for every type it exports.

The fix is the configs unchanged but the cap (`vlm_export_config`), for `--task image-text-to-text-shared` only:
it has no text-only form (`MODEL_TYPES` is empty); and, as for Qwen3.5, the vision merger is traced on a 4 x 4 grid
of merged patches per dummy frame instead of 420 x 420 (`_qwen_vision`).
"""

from __future__ import annotations

MODEL_TYPES: tuple[str, ...] = ()
TRANSFORMERS = ">5.0"
SUMMARY = "optimum-intel's Qwen2-VL / Qwen2.5-VL image-text-to-text config without its transformers 5.0 cap"

VLM_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
VLM_SUMMARY = ("optimum-intel's Qwen2VLOpenVINOConfig / Qwen2_5_VLOpenVINOConfig / Qwen3VLOpenVINOConfig without "
               "their 5.0 cap (the parts traced by its own patchers; validated against PyTorch), the vision merger "
               "traced on a 4 x 4 merged-patch grid per frame instead of 420 x 420")


def vlm_export_config(base: type) -> type:
    """optimum-intel's config `base` (every part built from it: `with_behavior` builds the vision parts as
    `self.__class__`) without `MAX_TRANSFORMERS_VERSION`, its vision merger traced on a smaller dummy image
    (`_qwen_vision`: the same graph, without the activations of 1,800 dummy patches left in the heap)."""
    from ._qwen_vision import small_merger_dummy

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} without its transformers cap, its merger traced on a smaller dummy image "
                   f"(see {__name__}).",
        "MAX_TRANSFORMERS_VERSION": None,
        **small_merger_dummy(base),
    })
