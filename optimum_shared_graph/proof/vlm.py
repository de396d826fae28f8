"""`validate()` of an image-text-to-text-shared artifact: the stored image and prompt through a vision-language
consumer, judged as the export was (`judge.py`).

The reference (`stored.Reference` with `image` and `prompt`, recorded at export by `pipeline/vlm_reference.py`)
is the whole PyTorch model's greedy `generate()` on a generated image (`validation_image`: 8 x 8 blocks of seeded
colours, 64 x 64 pixels, a few hundred bytes compressed) and a text prompt, turned into the model's inputs by
the checkpoint's own processor and chat template (`processor_inputs`), with each call's logits. Nothing here
knows a model family: the processor and the consumer do the family's work.

- `optimum-vlm`: optimum-intel's `OVModelForVisualCausalLM`, fed what the artifact's processor makes of the
  stored image and prompt (checked to be the stored input ids), its `generate()` with every pick forced to the
  reference's token: each call's logits, teacher-forced. optimum-intel 2.2's `generate()` does not run Qwen3.5
  under transformers 5.5; `host.qwen3_5_generate_fixed` is active while it runs (`host/visual_generate.py`).
- `runtime-vlm`: `optimum_shared_graph.runtime()` (its image-text-to-text provider, `runtimes/visual.py`), fed as
  `optimum-vlm` is and teacher-forced the same way; the provider applies Qwen3.5's fix itself.
- `genai-vlm`: OpenVINO GenAI's `VLMPipeline`, given the stored image and prompt as a user gives them (its own
  image preprocessing and chat template): its greedy tokens. A pipeline that takes text cannot be restarted from
  the reference's token ids after a pick that differs at a near-tie (`judge.judge_tokens`): it is restarted from
  the chat-templated prompt followed by the decoded tokens only when the artifact's tokenizer gives back exactly
  those ids; otherwise the row's later calls are not compared, and the report says so (`not_compared`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import ArtifactValidationError
from ..manifest import Manifest
from .consumers import _compiled_precision, _requested_precision, forced_generate
from .judge import CannotRestart
from .stored import Reference

PROMPT = "Describe the picture."
_SIDE, _BLOCK = 64, 8  # the image: at least 64 x 64 pixels, in blocks of 8 x 8


def image_side(processor) -> int:
    """The validation image's side: 64 pixels, or the next size the image processor takes as it is, where it cuts
    images into merged patches (Qwen2-VL's `patch_size` x `merge_size`, at least its `min_pixels`). An image the
    processor resizes would be resized by GenAI's own code too, with other filters: a difference of the
    preprocessing, not of the model (measured: Qwen2.5-VL's first token through VLMPipeline at 64 x 64)."""
    image = getattr(processor, "image_processor", None)
    patch, merge = getattr(image, "patch_size", None), getattr(image, "merge_size", None)
    if not (isinstance(patch, int) and isinstance(merge, int)):
        return _SIDE
    size = getattr(image, "size", None)
    least = size.get("shortest_edge") if isinstance(size, dict) else getattr(size, "shortest_edge", None)
    side = max(_SIDE, math.isqrt(int(least) - 1) + 1 if least else 0)
    return -(-side // (patch * merge)) * (patch * merge)


def validation_image(seed: int = 0, side: int = _SIDE) -> np.ndarray:
    """The image the reference is recorded on: `[side, side, 3]` uint8, 8 x 8-pixel blocks of seeded random colours."""
    blocks = np.random.default_rng(seed).integers(0, 256, (-(-side // _BLOCK),) * 2 + (3,), dtype=np.uint8)
    return np.repeat(np.repeat(blocks, _BLOCK, axis=0), _BLOCK, axis=1)[:side, :side]


def conversation(prompt: str) -> list[dict]:
    """One user turn: the image, then the text."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]


def templated(processor, prompt: str) -> str:
    """The prompt through the processor's chat template, with the generation prompt."""
    return processor.apply_chat_template(conversation(prompt), add_generation_prompt=True)


def processor_inputs(processor, image: np.ndarray, prompt: str) -> dict:
    """The model's inputs (PyTorch tensors) for `image` and `prompt`, made by `processor` through its chat template."""
    from PIL import Image

    return dict(processor(images=Image.fromarray(np.asarray(image, np.uint8)), text=templated(processor, prompt),
                          return_tensors="pt"))


def load_processor(source, trust_remote_code: bool = False):
    """`(processor, None)`, or `(None, why)` where `source` has no processor with an image processor and a chat
    template (what the reference is recorded through)."""
    try:
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(source), trust_remote_code=trust_remote_code)
    except Exception as err:  # no processor files, or ones transformers cannot read
        text = " ".join(str(err).split()).split(". ")[0][:200]
        return None, f"the checkpoint's processor did not load ({type(err).__name__}: {text})"
    if getattr(processor, "image_processor", None) is None:
        return None, "the checkpoint has no image processor (its processor files: preprocessor_config.json)"
    if not getattr(processor, "chat_template", None):
        return None, "the checkpoint's processor has no chat template"
    return processor, None


def _inputs(path: Path, reference: Reference) -> dict:
    """What the artifact's processor makes of the stored image and prompt, checked against the stored input ids."""
    processor, why = load_processor(path)
    if processor is None:
        raise ArtifactValidationError(f"{path}: {why}: copy the whole artifact directory (its processor files), "
                                      "or re-export it")
    inputs = processor_inputs(processor, reference.image, reference.prompt)
    ids = inputs["input_ids"].numpy()
    if not np.array_equal(ids, reference.prompt_ids):
        raise ArtifactValidationError(
            f"{path}: the artifact's processor makes {ids.shape[1]} input ids of the stored image and prompt where the "
            f"export's made {reference.prompt_ids.shape[1]} (or other ids): its processor files are not the "
            "checkpoint's; copy the whole artifact directory, or re-export it")
    return inputs


def optimum_vlm(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    """`OVModelForVisualCausalLM.generate()`, every pick forced to the reference's: each call's raw logits."""
    from optimum.intel import OVModelForVisualCausalLM

    from ..host import qwen3_5_generate_fixed

    inputs = _inputs(path, reference)
    model = OVModelForVisualCausalLM.from_pretrained(str(path), device=device, ov_config=dict(properties), compile=True)
    with qwen3_5_generate_fixed():
        outputs = forced_generate(model, reference, **inputs)
    return outputs, _compiled_precision(model.language_model.request.get_compiled_model())


def runtime_vlm(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    """`optimum_shared_graph.runtime()`'s `generate()`, every pick forced to the reference's: each call's raw logits."""
    from ..runtimes.registry import runtime

    inputs = _inputs(path, reference)
    model = runtime(path, device, ov_config=dict(properties))
    outputs = forced_generate(model, reference, **inputs)
    return outputs, _compiled_precision(model.language_model.request.get_compiled_model())


def genai_vlm(path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    """`openvino_genai.VLMPipeline`: `generate(row, start)` as `judge.judge_tokens` calls it."""
    import openvino as ov
    import openvino_genai as genai

    pipe = genai.VLMPipeline(str(path), device, **properties)
    image = ov.Tensor(np.ascontiguousarray(reference.image, dtype=np.uint8))
    calls = reference.fed.shape[1]
    restart = _restarts(path, pipe.get_tokenizer(), reference)

    class Tokens(genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.tokens = []

        def write(self, token):
            self.tokens.extend(token if isinstance(token, list) else [token])
            return genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def generate(row: int, start: int) -> list[int]:
        config = genai.GenerationConfig()
        config.max_new_tokens = calls - start
        config.ignore_eos = True  # the reference ran every call
        config.do_sample = False
        prompt = reference.prompt
        if start:  # the chat-templated prompt and the decoded tokens, only where they give back the reference's ids
            prompt, config.apply_chat_template = restart(row, start), False
        streamer = Tokens()
        pipe.generate(prompt, images=[image], generation_config=config, streamer=streamer)
        return streamer.tokens

    return generate, _requested_precision(path, manifest, device, properties)


def _restarts(path: Path, tokenizer, reference: Reference):
    """`restart(row, start)`: the text that restarts a text-taking pipeline from the reference's context at `start`
    (the processor's chat-templated prompt, the image tag in it, followed by the first `start` fed tokens decoded),
    checked to tokenize back to those ids; else `judge.CannotRestart`."""
    processor, _why = load_processor(path)
    head = templated(processor, reference.prompt) if processor is not None else None

    def ids(text: str) -> list[int]:
        return [int(i) for i in np.asarray(tokenizer.encode(text).input_ids.data)[0]]

    def restart(row: int, start: int) -> str:
        if head is None:
            raise CannotRestart("the artifact has no processor with a chat template to rebuild the prompt")
        tokens = [int(t) for t in reference.fed[row, :start]]
        text = head + tokenizer.decode(tokens, skip_special_tokens=False)
        before = ids(head)
        if ids(text) != before + tokens:
            raise CannotRestart(f"VLMPipeline takes text, and the reference's first {start} tokens do not "
                                "tokenize back to themselves once decoded")
        return text

    return restart


RUNNERS = {"optimum-vlm": optimum_vlm, "genai-vlm": genai_vlm, "runtime-vlm": runtime_vlm}


def run(consumer: str, path: Path, manifest: Manifest, reference: Reference, device: str, properties: dict):
    """As `consumers.run`, for the consumers of an image-text-to-text-shared artifact."""
    if reference.image is None:
        raise ArtifactValidationError(f"{path}'s stored reference has no image: re-export it with --task "
                                      "image-text-to-text-shared")
    return RUNNERS[consumer](path, manifest, reference, device, properties)
