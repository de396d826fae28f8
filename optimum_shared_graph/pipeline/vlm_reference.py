"""The reference an image-text-to-text-shared artifact stores for `validate()` (`proof/vlm.py` runs it).

At export, before optimum-intel converts the PyTorch model it loaded (`vlm._VlmExport.on_model`, inside the
float32 compute of a 16-bit model), the whole model's greedy `generate()` runs on the generated validation image
and prompt, turned into its inputs by the checkpoint's own processor and chat template
(`processor_validation_inputs`): the one `generate()` the export validates its parts on (`vlm.capture_reference`)
and whose picks and logits per pick (`output_logits=True`) are stored here (`recorded`). No family-specific code:
the processor and `generate()` are the model's own. The checkpoint's generation config is set aside for the call
(no sampling, penalties or EOS of its own), so each pick is the argmax of the logits recorded and every call runs.

Stored (`shared_graph_reference.npz`, `validation.reference` in the manifest) with PyTorch's logits where the
export's check was enforced (fp32 and fp16 weights), with the exported model's own for compressed weights (as a
text export stores them, `proof/stored.py`); where the checkpoint has no processor with an image processor and a
chat template, or validation was skipped, nothing is stored and `validation.reference_missing` says why
(`validate()` repeats it).
"""

from __future__ import annotations

import numpy as np

from ..errors import ModelNotSupportedError
from ..proof.stored import Reference
from ..proof.vlm import PROMPT, image_side, load_processor, processor_inputs, validation_image


def processor_validation_inputs(source, trust_remote_code: bool = False):
    """`(inputs, image, None)`: the validation image and prompt turned into the model's inputs (PyTorch tensors) by
    the processor of `source` (the checkpoint) through its chat template; `(None, None, why)` where it has no
    processor to record through."""
    processor, why = load_processor(source, trust_remote_code)
    if processor is None:
        return None, None, (f"{why}, so no image and prompt were recorded at export: re-export from the checkpoint "
                            "directory with its processor files (preprocessor_config.json, the tokenizer and its chat "
                            "template) to get one")
    image = validation_image(side=image_side(processor))
    return processor_inputs(processor, image, PROMPT), image, None


def greedy_generate(pt_model, inputs: dict, new_tokens: int) -> tuple[list[int], np.ndarray]:
    """PyTorch's greedy `generate()` of `new_tokens` on `inputs`, the model's generation config set aside (no
    sampling, penalties or EOS of its own: each pick is the argmax of its logits, every call runs): the picks, and
    the logits of each (picks, 1, vocab)."""
    import torch
    from transformers import GenerationConfig

    saved = pt_model.generation_config
    pt_model.generation_config = GenerationConfig()
    try:
        with torch.no_grad():
            out = pt_model.generate(**inputs, do_sample=False, num_beams=1, max_new_tokens=new_tokens,
                                    min_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True,
                                    pad_token_id=0)
    finally:
        pt_model.generation_config = saved
    picks = out.sequences[0, inputs["input_ids"].shape[1]:].tolist()
    return picks, np.stack([step.float().numpy() for step in out.logits])


def recorded(inputs: dict, image: np.ndarray, tokens: list[int], logits: np.ndarray) -> Reference:
    """validate()'s reference: the processor's `inputs` of `image` and the prompt, the greedy `tokens` PyTorch's
    `generate()` picked on them and the `logits` of each pick (`greedy_generate`)."""
    return Reference(prompt_ids=np.asarray(inputs["input_ids"], dtype=np.int64),
                     prompt_mask=np.asarray(inputs["attention_mask"], dtype=np.int64),
                     fed=np.asarray([tokens], dtype=np.int64), logits=np.asarray(logits, dtype=np.float32),
                     image=image, prompt=PROMPT)


def check_image_token(source, config, trust_remote_code: bool = False) -> None:
    """Refuse, before any work, a checkpoint whose processor marks an image with another token than its
    configuration's image token id: the model would find no image tokens in the processor's prompts, at export (the
    reference) and in every consumer, which all take the processor's. Nothing to check where no processor loads.

    Raises:
        ModelNotSupportedError: the processor's image token id is not the configuration's.
    """
    processor, _why = load_processor(source, trust_remote_code)
    if processor is None:
        return
    token = getattr(processor, "image_token", None)
    marked = getattr(processor, "image_token_id", None)
    if marked is None and isinstance(token, str) and getattr(processor, "tokenizer", None) is not None:
        marked = processor.tokenizer.convert_tokens_to_ids(token)
    key = next((k for k in ("image_token_id", "image_token_index") if k in config.to_dict()), "image_token_id")
    expected = getattr(config, key, None)
    if marked is None or expected is None or int(marked) == int(expected):
        return
    named = f" {token!r}" if isinstance(token, str) else ""
    raise ModelNotSupportedError(
        f"{source}: its processor marks an image with token{named} (id {marked}) and its config.json has {key} "
        f"{expected}, so the model would find no image in the processor's prompts (at export and in every "
        f"consumer): keep the processor files saved with this checkpoint, or set {key} to {marked} in config.json "
        "if that is the token the model was trained with")


def to_store(reference: Reference | None, missing: str | None, validation: dict, directory) -> Reference | None:
    """The reference the artifact in `directory` stores: the captured one where the export's check was enforced;
    for compressed weights (recorded against PyTorch, not judged) the exported model's own logits on the same
    inputs, from `OVModelForVisualCausalLM` on the export machine's CPU in f32 (the CPU plugin's default int8
    activations of the compressed matmuls included, its group size added to `validation["compile_config"]`), as
    a text export stores for quantized weights; else None, with why under `validation["reference_missing"]`."""
    if validation.get("status") == "skipped":
        validation["reference_missing"] = "it was exported with --skip-validation: re-export it without"
        return None
    if reference is None:
        validation["reference_missing"] = missing
        return None
    if validation.get("enforced"):
        return reference
    from dataclasses import replace

    from ..proof.vlm import optimum_vlm
    from ..runtimes.session import EXACT_CONFIG
    from .validate import exact_compile_config

    graph_logits, _precision = optimum_vlm(directory, None, reference, "CPU", dict(EXACT_CONFIG))
    validation["compile_config"] = exact_compile_config(quantized=True)
    return replace(reference, logits=np.stack([g.astype(np.float32) for g in graph_logits]), judged_against="graph")
