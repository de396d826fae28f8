"""The Qwen vision towers' merger part traced on a small dummy image: Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen3.5.

optimum-intel traces the merger part of these models (the vision tower's blocks and its merger: its
`vision_embeddings_merger` behaviour) on its dummy generator's default 420 x 420 image, one frame per dummy batch row
(2): 1,352 patches at patch 16, 1,800 at patch 14. `torch.jit.trace`, with its trace check, leaves the freed
activations of every block in glibc's heap, not returned to the system until the export ends
(`pipeline/convert.return_freed_memory`): at Qwen3.5-4B's vision width (27 blocks of 1152) +4.6 GB of anonymous memory
and half a minute or more. The merger's inputs have only dynamic sequence axes (optimum-intel's configs), so the graph
is the same traced on a 4 x 4 grid of merged patches per frame (`merger_dummy_side`); the export validates the vision
graphs on its validation image against PyTorch, as for every family.
"""

from __future__ import annotations

from typing import Any


def merger_dummy_side(vision_config) -> int:
    """The side, in pixels, of the dummy image the merger is traced on: a 4 x 4 grid of merged patches
    (`patch_size * spatial_merge_size` pixels each): 128 x 128 for patch 16 and merge 2 (8 x 8 patches, where
    optimum-intel's 420 x 420 has 26 x 26), 112 x 112 for patch 14."""
    return 4 * int(vision_config.patch_size) * int(getattr(vision_config, "spatial_merge_size", 1) or 1)


def small_merger_dummy(base: type) -> dict[str, Any]:
    """The class members that make a subclass of optimum-intel's config `base` trace its merger part on the
    `merger_dummy_side` image; every other part's dummy inputs as `base` makes them."""
    from optimum.exporters.openvino.model_configs import QwenVLConfigBehavior

    merger = QwenVLConfigBehavior.VISION_EMBEDDINGS_MERGER

    def generate_dummy_inputs(self, framework: str = "pt", **input_shapes):
        if getattr(self, "_behavior", None) in (merger, merger.value):
            side = merger_dummy_side(self._normalized_config.config)
            input_shapes = {"height": side, "width": side, **input_shapes}  # optimum-intel passes neither
        return base.generate_dummy_inputs(self, framework, **input_shapes)

    return {"generate_dummy_inputs": generate_dummy_inputs}
