"""What `--task image-text-to-text-shared` needs to know of each vision-language family to validate its export.

The export itself is optimum-intel's (`pipeline/vlm.py`); its validation (`vlm.capture_reference`,
`vlm.validate_parts`) is the same for every family: PyTorch's greedy `generate()` on an image and a text prompt,
each language model call recorded, then the OpenVINO vision and text embedding graphs against PyTorch, then the
language model graph fed what the OpenVINO parts computed. A `Family` says what differs:

- `validation_inputs`: the validation image (seeded patches in the processor's output layout, so no processor is
  needed) and the prompt around it, built from the configuration's image token ids: what `generate()` is given;
- `image_module` / `image_embeds`: the module whose output is the image embeddings the language model receives
  (one row per image token), hooked at the prefill; `vision_modules`: held in float32 for the whole forward when a
  16-bit checkpoint is captured with float32 compute (`pipeline/reference.py`);
- `call_inputs`: the language model graph's inputs of one call, other than `inputs_embeds` and `beam_idx`, from
  the model's call (`outer`, the `*ForConditionalGeneration` forward's keyword arguments) and its language model's
  (`language`): what optimum-intel's `OVModelForVisualCausalLM` and OpenVINO GenAI's `VLMPipeline` feed that graph;
- `ov_image_embeds`: the image embeddings computed by the exported vision graphs, run as
  `OVModelForVisualCausalLM` runs them.
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


class Gemma3(_ProjectedImage):
    """Gemma 3: the SigLIP tower's patches pooled and projected to `mm_tokens_per_image` image tokens between
    `<start_of_image>` and `<end_of_image>`; the language model takes `token_type_ids` (1 at the image tokens), from
    which it attends bidirectionally within an image at the prefill."""

    model_types = ("gemma3",)

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


FAMILIES: dict[str, Family] = {t: family for family in (Qwen3_5(), Qwen2VL(), Gemma3(), LLaVA(), Mistral3())
                               for t in family.model_types}


def family_of(model_type: str) -> Family:
    return FAMILIES[model_type]
