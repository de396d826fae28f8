"""LLaVA-NeXT-Video under transformers 5.5: optimum-intel's image-text-to-text config without its cap.

What broke: optimum-intel 2.2's `LlavaNextVideoOpenVINOConfig` sets `MAX_TRANSFORMERS_VERSION = "4.57.6"`, so its
`image-text-to-text` export stops under 5.5 before any part is traced. Nothing else breaks: with the cap lifted,
optimum-intel's own config and patchers trace the parts under 5.5 (the language model fed `inputs_embeds`, the
CLIP tower, the multi-modal projector and the video resampler as graphs of their own), and the graphs reproduce
PyTorch on an image and a text prompt, which the export checks (`pipeline/vlm.py`), as for every type it exports.

The fix is the config unchanged but the cap (`vlm_export_config`), for `--task image-text-to-text-shared` only
(`MODEL_TYPES` is empty).
"""

from __future__ import annotations

MODEL_TYPES: tuple[str, ...] = ()
TRANSFORMERS = ">4.57.6"
SUMMARY = "optimum-intel's LLaVA-NeXT-Video image-text-to-text config without its transformers 4.57.6 cap"

VLM_MODEL_TYPES = ("llava_next_video",)
VLM_SUMMARY = ("optimum-intel's LlavaNextVideoOpenVINOConfig without its 4.57.6 cap (the parts traced by its own "
               "patchers; validated against PyTorch)")


def vlm_export_config(base: type) -> type:
    """optimum-intel's config `base` (every part built from it) without `MAX_TRANSFORMERS_VERSION`."""
    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} without its transformers cap (see {__name__}).",
        "MAX_TRANSFORMERS_VERSION": None,
    })
