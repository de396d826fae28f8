"""What `--task image-text-to-text-shared` needs to know of each vision-language family to validate its export.

Beside the architecture fixes (the modules of this package whose `vlm_export_config` repairs a family's
image-text-to-text export), the facts of each family the export's validation reads. The export itself is
optimum-intel's (`pipeline/vlm.py`); its validation (`pipeline/vlm.capture_reference`, `pipeline/vlm.validate_parts`)
is the same for every family: PyTorch's greedy `generate()` on an image and a text prompt, each language model call
recorded, then the OpenVINO vision and text embedding graphs against PyTorch, then the language model graph fed what
the OpenVINO parts computed. A `Family` says what differs:

- `validation_inputs`: the validation image (seeded patches in the processor's output layout, so no processor is
  needed) and the prompt around it, built from the configuration's image token ids: what `generate()` is given;
- `language_module`: the text model, whose calls are recorded;
- `image_module` / `image_embeds`: the module whose output is the image embeddings the language model receives
  (one row per image token), hooked at the prefill (none: they are the prefill's `inputs_embeds` at the image tokens,
  for a family that packs them outside a module); `vision_modules`: held in float32 for the whole forward when a
  16-bit checkpoint is captured with float32 compute (`pipeline/reference.py`);
- `call_inputs`: the language model graph's inputs of one call, other than `inputs_embeds` and `beam_idx`, from
  the model's call (`outer`, the `*ForConditionalGeneration` forward's keyword arguments) and its language model's
  (`language`): what optimum-intel's `OVModelForVisualCausalLM` and OpenVINO GenAI's `VLMPipeline` feed that graph;
- `ov_image_embeds`: the image embeddings computed by the exported vision graphs, run as
  `OVModelForVisualCausalLM` runs them;
- `logits`: the model's logits from its `lm_head` output (Gemma 4 caps them after the head);
- `ov_call_inputs`: language model inputs that other exported graphs compute (Gemma 4's per-layer embeddings of
  the tokens, Qwen3-VL's deepstack image features), run as `OVModelForVisualCausalLM` runs them, fed instead of
  PyTorch's.

`FAMILIES` maps the model types the task exports to their family (`architectures.supported_vlm_types()`); `NOT_EXPORTED` says
why each other vision-language type of optimum-intel's is not exported (`not_exported_reason`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

# the text tokens of the validation prompt (around its image)
PROMPT_TOKENS = 8


def _np(tensor) -> np.ndarray:
    return tensor.detach().numpy().copy()


def _text_tokens(config, special: set[int], generator) -> list[int]:
    """`PROMPT_TOKENS` random text tokens of the vocabulary, none of the `special` ones."""
    import torch

    vocab = config.get_text_config().vocab_size
    drawn = [int(i) for i in torch.randint(0, vocab, (4 * PROMPT_TOKENS,), generator=generator)]
    return [i for i in drawn if i not in special][:PROMPT_TOKENS]


class Family:
    """A vision-language family (see the module docstring); subclasses fill in each item."""

    model_types: tuple[str, ...] = ()
    image_module = ""
    vision_modules: tuple[str, ...] = ()
    language_module = "model.language_model"  # whose calls are recorded
    # the processor resizes every image to what the drawn validation image is (one `image_size` x `image_size`
    # image): its inputs validate the same graphs, so the export's one generate() runs on them (`pipeline/vlm.py`)
    processor_image_as_drawn = False

    def validation_inputs(self, config, seed: int = 0) -> dict[str, Any]:
        raise NotImplementedError

    def image_embeds(self, output) -> np.ndarray:
        raise NotImplementedError

    def call_inputs(self, outer: dict[str, Any], language: dict[str, Any]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def ov_image_embeds(self, parts, inputs: dict[str, np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def describe_image(self, inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        """What the validation report says of the image."""
        raise NotImplementedError

    def logits(self, head_output, config):
        """The logits of the `lm_head` output (as `generate()` picks from them)."""
        return head_output

    def ov_call_inputs(self, parts, directory, token_ids: list[np.ndarray], inputs: dict[str, np.ndarray],
                       compile_config: dict) -> list[dict[str, np.ndarray]]:
        """Per call (its token ids, (1, n); the prefill's are the prompt, with the image `inputs`): language model
        inputs computed by other graphs in `directory` (`parts`: `OVModelForVisualCausalLM` loaded from it; a graph
        compiled here on the CPU with `compile_config`, the validation's properties)."""
        return [{} for _ in token_ids]


class Qwen3_5(Family):
    """Qwen3.5 and Qwen3.5-MoE: patches flattened as `Qwen2VLImageProcessor` gives them with their `image_grid_thw`,
    the vision tower's 2 x 2 merger output at the image tokens, and (4, batch, seq) M-RoPE positions (text,
    temporal, height, width) computed by the model from the grid."""

    model_types = ("qwen3_5", "qwen3_5_moe")
    image_module = "model.visual"
    vision_modules = ("model.visual",)
    grid = (1, 4, 4)  # 2 x 2 merged patches of a 4 x 4 patch grid: 4 image tokens

    def validation_inputs(self, config, seed: int = 0) -> dict[str, Any]:
        """Text tokens, `<vision_start>`, one image token per merged patch, `<vision_end>`, text tokens; the image's
        patches drawn from N(0, 1) (normalised pixels)."""
        import torch

        vision = config.vision_config
        merge = vision.spatial_merge_size
        t, h, w = self.grid[0], self.grid[1] * merge // 2, self.grid[2] * merge // 2
        generator = torch.Generator().manual_seed(seed)
        text = _text_tokens(config, {config.image_token_id, config.video_token_id, config.vision_start_token_id,
                                     config.vision_end_token_id}, generator)
        n_image = t * h * w // merge ** 2
        ids = text[:2] + [config.vision_start_token_id] + [config.image_token_id] * n_image + \
            [config.vision_end_token_id] + text[2:]
        input_ids = torch.tensor([ids])
        patch = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == config.image_token_id).int(),
            "pixel_values": torch.randn(t * h * w, patch, generator=generator),
            "image_grid_thw": torch.tensor([[t, h, w]]),
        }

    def image_embeds(self, output) -> np.ndarray:
        return output.pooler_output.detach().float().numpy().copy()

    def call_inputs(self, outer, language):
        return {"attention_mask": _np(language["attention_mask"]).astype(np.int64),
                "position_ids": _np(language["position_ids"]).astype(np.int64)}

    def ov_image_embeds(self, parts, inputs):
        import torch

        image = parts.get_vision_embeddings(torch.from_numpy(inputs["pixel_values"]),
                                            torch.from_numpy(inputs["image_grid_thw"]))
        return np.asarray(image, dtype=np.float32)

    def describe_image(self, inputs):
        return {"grid_thw": inputs["image_grid_thw"][0].tolist()}


class Qwen2VL(Qwen3_5):
    """Qwen2-VL and Qwen2.5-VL: as Qwen3.5, but the language model graph takes the (3, batch, seq) M-RoPE positions
    (temporal, height, width), without the text row transformers puts first."""

    model_types = ("qwen2_vl", "qwen2_5_vl")

    def call_inputs(self, outer, language):
        inputs = super().call_inputs(outer, language)
        positions = inputs["position_ids"]
        return {**inputs, "position_ids": positions[1:] if positions.shape[0] == 4 else positions}


class Qwen3VL(Qwen2VL):
    """Qwen3-VL: as Qwen2-VL (the vision tower's merged patches, (3, batch, seq) M-RoPE positions), and the
    deepstack: the features of the tower's `deepstack_visual_indexes` blocks, each merged by a merger of its own, are
    added to the image tokens' hidden states after the text model's first layers. The language model graph takes
    them as `deepstack_visual_embeds` (layers, image tokens, hidden) with `visual_pos_masks` (the image tokens),
    zeros and no image tokens at the decode steps, as `OVModelForVisualCausalLM` feeds them."""

    model_types = ("qwen3_vl",)

    @staticmethod
    def _deepstack(config, mask: np.ndarray, features) -> dict[str, np.ndarray]:
        layers, hidden = len(config.vision_config.deepstack_visual_indexes), config.get_text_config().hidden_size
        if features is None:  # no image tokens in the call
            features = np.zeros((layers, mask.size, hidden), dtype=np.float32)
        return {"visual_pos_masks": mask.astype(bool), "deepstack_visual_embeds": np.asarray(features, np.float32)}

    def call_inputs(self, outer, language):
        # the deepstack features where the call has image tokens (the prefill); a decode step's zeros are the
        # OpenVINO side's (`ov_call_inputs`), as OVModelForVisualCausalLM feeds them
        inputs = super().call_inputs(outer, language)
        mask, features = language.get("visual_pos_masks"), language.get("deepstack_visual_embeds")
        if mask is None or features is None:
            return {**inputs, "visual_pos_masks": np.zeros(language["inputs_embeds"].shape[:2], dtype=bool)}
        return {**inputs, "visual_pos_masks": _np(mask).astype(bool),
                "deepstack_visual_embeds": np.stack([f.detach().float().numpy() for f in features])}

    def ov_image_embeds(self, parts, inputs):
        import torch

        image, _deepstack = parts.get_vision_embeddings(torch.from_numpy(inputs["pixel_values"]),
                                                        torch.from_numpy(inputs["image_grid_thw"]))
        return np.asarray(image, dtype=np.float32)

    def ov_call_inputs(self, parts, directory, token_ids, inputs, compile_config):
        import torch

        _image, deepstack = parts.get_vision_embeddings(torch.from_numpy(inputs["pixel_values"]),
                                                        torch.from_numpy(inputs["image_grid_thw"]))
        config = parts.config
        calls = [self._deepstack(config, token_ids[0] == config.image_token_id, np.asarray(deepstack))]
        return calls + [self._deepstack(config, ids == config.image_token_id, None) for ids in token_ids[1:]]


class _ProjectedImage(Family):
    """One `image_size` x `image_size` image (what the image processor resizes or crops to) through the vision tower
    and the multi-modal projector, whose output rows are the image tokens' embeddings; plain (batch, seq)
    positions."""

    image_module = "model.multi_modal_projector"
    vision_modules = ("model.vision_tower", "model.multi_modal_projector")

    def image_tokens(self, config) -> tuple[list[int], set[int]]:
        """The image's tokens in the prompt, and the special ids no text token may be."""
        raise NotImplementedError

    def validation_inputs(self, config, seed: int = 0) -> dict[str, Any]:
        """Text tokens, the image's tokens, text tokens; the image's pixels drawn from N(0, 1) (normalised)."""
        import torch

        vision = config.vision_config
        generator = torch.Generator().manual_seed(seed)
        image, special = self.image_tokens(config)
        text = _text_tokens(config, special, generator)
        input_ids = torch.tensor([text[:2] + image + text[2:]])
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "pixel_values": torch.randn(1, vision.num_channels, vision.image_size, vision.image_size,
                                        generator=generator),
        }

    def image_embeds(self, output) -> np.ndarray:
        return output.detach().float().numpy().reshape(-1, output.shape[-1]).copy()

    def call_inputs(self, outer, language):
        # the 2D mask as the model was given it (a language model may get 4D masks made from it); the positions as
        # its language model got them
        return {"attention_mask": _np(outer["attention_mask"]).astype(np.int64),
                "position_ids": _np(language["position_ids"]).astype(np.int64)}

    def ov_image_embeds(self, parts, inputs):
        import torch

        image = np.asarray(parts.get_vision_embeddings(torch.from_numpy(inputs["pixel_values"])), dtype=np.float32)
        return image.reshape(-1, image.shape[-1])

    def describe_image(self, inputs):
        return {"size": list(inputs["pixel_values"].shape[-2:])}


class LLaVANext(_ProjectedImage):
    """LLaVA-NeXT: the CLIP tower and projector run on each crop (the resized base image, then the crops of the image
    at its best `image_grid_pinpoints` resolution); the crops' features are packed in Python, by the model as by
    `OVModelForVisualCausalLM` (unpadded to the image's aspect, the learned `image_newline` after each row), so the
    image embeddings are taken where the language model gets them: the prefill's `inputs_embeds` at the image
    tokens. The validation image is at the size of the largest square pinpoint, which is its own best resolution
    (nothing unpadded): optimum-intel 2.2's packing reads the crop grid's height as its width (transformers 5.5's
    does not), which only a square grid leaves unchanged."""

    model_types = ("llava_next",)
    image_module = ""  # the prefill's embeddings at the image tokens

    @staticmethod
    def pinpoint(config) -> tuple[int, int]:
        square = [tuple(p) for p in config.image_grid_pinpoints if p[0] == p[1]]
        return max(square) if square else tuple(config.image_grid_pinpoints[0])

    def image_tokens(self, config):
        vision = config.vision_config
        height, width = self.pinpoint(config)
        patch, side = vision.patch_size, vision.image_size
        base = (side // patch) ** 2 + (config.vision_feature_select_strategy == "full")
        count = base + (height // patch) * (width // patch + 1)
        return [config.image_token_id] * count, {config.image_token_id}

    def validation_inputs(self, config, seed: int = 0) -> dict[str, Any]:
        import torch

        inputs = super().validation_inputs(config, seed)
        height, width = self.pinpoint(config)
        side = config.vision_config.image_size
        crops = 1 + (height // side) * (width // side)
        generator = torch.Generator().manual_seed(seed + 1)
        return {**inputs, "pixel_values": torch.randn(1, crops, 3, side, side, generator=generator),
                "image_sizes": torch.tensor([[height, width]])}

    def ov_image_embeds(self, parts, inputs):
        import torch

        pixels = torch.from_numpy(inputs["pixel_values"])
        crops = np.asarray(parts.get_vision_embeddings(pixels.reshape(-1, *pixels.shape[2:])), dtype=np.float32)
        packed, _lengths = parts.pack_image_features([torch.from_numpy(crops)], torch.from_numpy(inputs["image_sizes"]),
                                                     image_newline=torch.tensor(parts.config.image_newline))
        return np.asarray(packed, dtype=np.float32).reshape(-1, crops.shape[-1])

    def describe_image(self, inputs):
        return {"size": inputs["image_sizes"][0].tolist(), "crops": int(inputs["pixel_values"].shape[1])}


class LLaVANextVideo(LLaVANext):
    """LLaVA-NeXT-Video on an image: LLaVA-NeXT's image path (`OVModelForVisualCausalLM` runs the tower and the
    multi-modal projector as graphs of their own); its video path (the resampler) is not validated."""

    model_types = ("llava_next_video",)


class Gemma3(_ProjectedImage):
    """Gemma 3: the SigLIP tower's patches pooled and projected to `mm_tokens_per_image` image tokens between
    `<start_of_image>` and `<end_of_image>`; the language model takes `token_type_ids` (1 at the image tokens), from
    which it attends bidirectionally within an image at the prefill."""

    model_types = ("gemma3",)
    processor_image_as_drawn = True

    def image_tokens(self, config):
        image = [config.boi_token_id] + [config.image_token_id] * config.mm_tokens_per_image + [config.eoi_token_id]
        return image, {config.image_token_id, config.boi_token_id, config.eoi_token_id}

    def validation_inputs(self, config, seed: int = 0) -> dict[str, Any]:
        inputs = super().validation_inputs(config, seed)
        return {**inputs, "token_type_ids": (inputs["input_ids"] == config.image_token_id).long()}

    def call_inputs(self, outer, language):
        # and the token types of the call's tokens, as the model was given them
        return {**super().call_inputs(outer, language),
                "token_type_ids": _np(outer["token_type_ids"]).astype(np.int64)}


class LLaVA(_ProjectedImage):
    """LLaVA: the CLIP tower's features of `vision_feature_layer` (less the CLS one with the `default` strategy)
    projected to one image token each (`image_seq_length` of them)."""

    model_types = ("llava",)
    processor_image_as_drawn = True

    def image_tokens(self, config):
        vision = config.vision_config
        patches = (vision.image_size // vision.patch_size) ** 2
        count = patches + (config.vision_feature_select_strategy == "full")
        return [config.image_token_id] * count, {config.image_token_id}


class Mistral3(_ProjectedImage):
    """Mistral 3: the Pixtral tower's patches of an image of `image_sizes`, merged `spatial_merge_size` x
    `spatial_merge_size` and projected to one image token each (the processor puts `[IMG_BREAK]` after each row and
    `[IMG_END]` last: text tokens to the model, left out of the validation prompt, which needs no processor)."""

    model_types = ("mistral3",)

    def image_tokens(self, config):
        vision = config.vision_config
        side = vision.image_size // vision.patch_size // config.spatial_merge_size
        return [config.image_token_id] * side ** 2, {config.image_token_id}

    def validation_inputs(self, config, seed: int = 0) -> dict[str, Any]:
        import torch

        inputs = super().validation_inputs(config, seed)
        return {**inputs, "image_sizes": torch.tensor([list(inputs["pixel_values"].shape[-2:])])}

    def ov_image_embeds(self, parts, inputs):
        import torch

        image = parts.get_vision_embeddings(torch.from_numpy(inputs["pixel_values"]),
                                            image_sizes=torch.from_numpy(inputs["image_sizes"]))
        image = np.asarray(image, dtype=np.float32)
        return image.reshape(-1, image.shape[-1])


class Gemma4(Family):
    """Gemma 4: the image as `Gemma4ImageProcessor` gives it (patches of `patch_size` flattened, their (x, y)
    positions, padded with (-1, -1) to `max_soft_tokens` x `pooling_kernel_size`^2 patches), the vision tower's
    pooled patches projected by `embed_vision` to one image token each between `boi_token_id` and `eoi_token_id`;
    the language model also takes `per_layer_inputs` (the per-layer embeddings of the tokens, the image tokens as
    padding), which optimum-intel exports as a graph of its own, and its logits are capped after the head
    (`final_logit_softcapping`)."""

    model_types = ("gemma4",)
    image_module = "model.embed_vision"
    vision_modules = ("model.vision_tower", "model.embed_vision")
    PER_LAYER_XML = "openvino_text_embeddings_per_layer_model.xml"

    @staticmethod
    def max_soft_tokens(config) -> int:
        """The image processor's `max_soft_tokens` (its saved files beside the config), else 280 (the processor's
        default): optimum-intel traces the vision graph for that many patches, which the processor pads to."""
        import json
        from pathlib import Path

        directory = Path(getattr(config, "_name_or_path", "") or ".")
        for name in ("preprocessor_config.json", "processor_config.json"):
            path = directory / name
            if path.is_file():
                saved = json.loads(path.read_text())
                saved = saved.get("image_processor", saved)
                if "max_soft_tokens" in saved:
                    return int(saved["max_soft_tokens"])
        return 280

    def validation_inputs(self, config, seed: int = 0) -> dict[str, Any]:
        """Text tokens, `<boi>`, one image token per pooled patch of a square grid as large as the padded patches
        hold, `<eoi>`, text tokens; the patches' pixels drawn from U(0, 1) (the processor's rescaled pixels)."""
        import math

        import torch

        vision = config.vision_config
        kernel = vision.pooling_kernel_size
        patches = self.max_soft_tokens(config) * kernel ** 2
        side = math.isqrt(patches // kernel ** 2) * kernel  # patches on each side of the image
        generator = torch.Generator().manual_seed(seed)
        special = {config.image_token_id, config.boi_token_id, config.eoi_token_id, config.video_token_id,
                   getattr(config, "audio_token_id", None)}
        text = _text_tokens(config, special, generator)
        n_image = (side // kernel) ** 2
        ids = text[:2] + [config.boi_token_id] + [config.image_token_id] * n_image + [config.eoi_token_id] + text[2:]
        input_ids = torch.tensor([ids])
        grid = torch.stack(torch.meshgrid(torch.arange(side), torch.arange(side), indexing="xy"), -1).reshape(-1, 2)
        positions = torch.cat([grid, torch.full((patches - side * side, 2), -1)])[None]
        pixels = torch.rand(1, patches, 3 * vision.patch_size ** 2, generator=generator)
        pixels[:, side * side:] = 0  # the processor's padding
        return {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "mm_token_type_ids": (input_ids == config.image_token_id).long(),
            "pixel_values": pixels,
            "image_position_ids": positions.long(),
        }

    def image_embeds(self, output) -> np.ndarray:
        return output.detach().float().numpy().reshape(-1, output.shape[-1]).copy()

    def call_inputs(self, outer, language):
        return {"attention_mask": _np(outer["attention_mask"]).astype(np.int64),
                "position_ids": _np(language["position_ids"]).astype(np.int64),
                "per_layer_inputs": language["per_layer_inputs"].detach().float().numpy().copy()}

    def ov_image_embeds(self, parts, inputs):
        import torch

        image = parts.get_vision_embeddings(torch.from_numpy(inputs["pixel_values"]),
                                            image_position_ids=torch.from_numpy(inputs["image_position_ids"]))
        image = np.asarray(image, dtype=np.float32)
        return image.reshape(-1, image.shape[-1])

    def describe_image(self, inputs):
        positions = inputs["image_position_ids"][0]
        return {"patches": int(positions.shape[0]), "image_patches": int((positions[:, 0] >= 0).sum())}

    def logits(self, head_output, config):
        import torch

        cap = config.get_text_config().final_logit_softcapping
        return head_output if cap is None else torch.tanh(head_output / cap) * cap

    def ov_call_inputs(self, parts, directory, token_ids, inputs, compile_config):
        import openvino as ov

        model = ov.Core().compile_model(directory / self.PER_LAYER_XML, "CPU", compile_config)
        return [{"per_layer_inputs": model(ids)[0].astype(np.float32)} for ids in token_ids]


FAMILIES: dict[str, Family] = {t: family for family in (Qwen3_5(), Qwen2VL(), Qwen3VL(), Gemma3(), LLaVA(), LLaVANext(),
                                                          LLaVANextVideo(), Mistral3(), Gemma4())
                               for t in family.model_types}


# Why `--task image-text-to-text-shared` does not export each other type of optimum-intel 2.2's
# `MODEL_TYPE_TO_CLS_MAPPING` (modeling_visual_language.py), as measured with transformers 5.5.4, optimum-intel 2.2.0
# and OpenVINO GenAI 2026.4 installed: the one line of its refusal at stage 1. "remote code": transformers 5.5.4 has
# no configuration class for the type (its checkpoints ship their own modelling code); "caps": the transformers
# versions optimum-intel's image-text-to-text config for the type declares, checked before any part is traced.
_REMOTE = "transformers 5.5.4 has no configuration class for it (remote code only); not tried"
NOT_EXPORTED: dict[str, str] = {
    **{t: _REMOTE for t in ("minicpmv", "llava-qwen2", "maira2", "phi3_v", "internvl_chat", "phi4mm", "minicpmo",
                            "videochat_flash_qwen")},
    "muse_glimmer": "optimum-intel's MuseGlimmerOpenVINOConfig requires transformers>=5.15.0 and transformers 5.5.4 "
                    "has no configuration class for it",
    "deepseek_ocr2": "optimum-intel's DeepseekOCR2OpenVINOConfig requires transformers>=5.11 and transformers 5.5.4 "
                     "has no configuration class for it",
    "gemma4_unified": "optimum-intel's Gemma4UnifiedOpenVINOConfig requires transformers 5.10 to 5.10.99 and "
                      "transformers 5.5.4 has no configuration class for it",
    "got_ocr2": "with optimum-intel's 4.57.6 cap lifted its image-text-to-text export of a tiny checkpoint ran (not "
                "validated here), and GenAI 2026.4 has no VLMPipeline for it ('Unsupported 'got_ocr2' VLM model "
                "type'); not added yet",
    "idefics3": "with optimum-intel's 4.57.6 cap lifted it exports, but its OVModelForVisualCausalLM computes the "
                "vision patch positions by another formula than transformers 5.5.4 (h / n x (1 - 1e-6), not "
                "min(h / n, 1 - 1e-6): one position lower for every patch row and column but the first), so the "
                "tiny checkpoint's image embeddings differed from PyTorch's by 0.21 and the export's check refused "
                "it; GenAI 2026.4 has no VLMPipeline for it ('Unsupported 'idefics3' VLM model type')",
    "smolvlm": "optimum-intel's SmolVLMOpenVINOConfig caps transformers at 4.57.6 (5.5.4 is installed), and its "
               "OVModelForVisualCausalLM class inherits idefics3's vision patch positions, which are not transformers "
               "5.5.4's (the export's check refused idefics3 for them); not tried",
    "phi4_multimodal": "optimum-intel's Phi4MMOpenVINOConfig caps transformers at 4.53.3 (5.5.4 is installed); not "
                       "tried with the cap lifted",
    "llama4": "optimum-intel's Llama4OpenVINOConfig caps transformers at 4.57.6 (5.5.4 is installed); not tried with "
              "the cap lifted (--task text-generation-shared exports its language model)",
    "gemma3n": "not tried: transformers builds its vision tower (MobileNetV5) through timm, which is not installed "
               "here ('TimmWrapperModel requires the timm library'); it also has an audio tower",
    "qwen3_omni_moe": "not tried yet (an audio encoder and a speech talker besides the vision tower)",
    **{t: "a text model type (the language model of a vision-language type), not a vision-language checkpoint: "
          "--task text-generation-shared" for t in ("qwen2_vl_text", "qwen2_5_vl_text", "qwen3_5_text",
                                                    "qwen3_5_moe_text")},
}
NOT_VLM = ("optimum-intel's OVModelForVisualCausalLM has no class for it (not a vision-language type of its "
           "image-text-to-text export)")


def not_exported_reason(model_type: str) -> str:
    """The one line's reason `model_type` is not exported (`NOT_EXPORTED`, else `NOT_VLM`)."""
    return NOT_EXPORTED.get(model_type, NOT_VLM)


def family_of(model_type: str) -> Family:
    return FAMILIES[model_type]
