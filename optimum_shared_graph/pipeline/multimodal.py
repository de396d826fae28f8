"""A multimodal checkpoint's language model, exported as the one shared graph (stage 1 decides, stage 3 loads it).

Many decoder families are published as multimodal wrappers only: Qwen3.5 and Qwen3.5-MoE as
`Qwen3_5ForConditionalGeneration` / `Qwen3_5MoeForConditionalGeneration` (model type `qwen3_5` /
`qwen3_5_moe`), the language model's configuration under `text_config`, a `vision_config` beside it.
`--task text-generation-shared` asks for text generation, so for such a checkpoint it exports the
language model (`language_model()` says whether it can) and leaves the vision part out; the manifest
(`model.left_out`) and the summary line say so, and how to get the whole model (optimum-intel's
`image-text-to-text` task). docs/multimodal.md says why this is the default.

The language model is loaded by transformers itself, once, from the checkpoint's own weight files:
`text_view()` writes a directory whose `config.json` is the language model's configuration (what
`config.get_text_config()` returns, the text model type, e.g. `qwen3_5_moe_text`) and whose other files
are links to the checkpoint's, so optimum-intel's export loads it with `from_pretrained` like any causal
LM directory. transformers maps the checkpoint's weight names onto the text model
(`model.language_model.*` to `model.*`: its own checkpoint conversion for Qwen3.5; for Gemma 3 and Mistral 3,
whose language model it does not load from their checkpoints on its own, with the `key_mapping` of
`KEY_MAPPINGS`) and skips the vision weights without reading them (nor listing them as unexpected:
`left_out_unreported`), so only the language model's weights are ever in memory. A checkpoint whose
weight names the text model would not find (some of its weights would be left random) is refused
before any work (`check_weights`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import host
from ..errors import ModelNotSupportedError
from ..registration import supported_model_types
from ..tasks import BASE_TASK, TASK, VLM_TASK


# Multimodal types whose language model transformers does not load from their checkpoint on its own, and the
# renaming of the checkpoint's weight names that loads it (`from_pretrained(key_mapping=...)`): the LLaVA layout,
# `model.language_model.*` as transformers 5 saves it and `language_model.model.*` / `language_model.lm_head.*` as
# checkpoints saved by transformers 4 are named, the head `lm_head.*`. `check_weights` confirms the names before
# any work. (llava itself shares the layout; it keeps optimum-intel's image-text-to-text fallback for now.)
LLAVA_LAYOUT = {r"^model\.language_model\.": "model.", r"^language_model\.model\.": "model.",
                r"^language_model\.lm_head\.": "lm_head."}
KEY_MAPPINGS: dict[str, dict[str, str]] = {"gemma3": LLAVA_LAYOUT, "mistral3": LLAVA_LAYOUT}


def whole_model(model_type: str) -> str:
    """How to get the whole multimodal model, left-out parts included (for the manifest, the summary line
    and the errors): optimum-intel's own `image-text-to-text` export, with the transformers it needs."""
    from .fallback import openvino_tasks
    from .version_cap import exceeded_cap

    if VLM_TASK not in openvino_tasks(model_type):
        return f"optimum-intel's OpenVINO exporter has no export of the whole {model_type} model"
    how = f"optimum-cli export openvino --task {VLM_TASK} exports the whole model"
    capped = exceeded_cap(model_type, VLM_TASK)
    if capped is not None:
        cls, cap, installed = capped
        how += f" under transformers<={cap} (optimum-intel's {cls.__name__} caps it; {installed} is installed)"
    return how


@dataclass
class LanguageModel:
    """The language model of a multimodal checkpoint, as transformers loads it on its own."""

    config: Any  # the text configuration (`config.get_text_config()`), with `architectures` set
    architecture: str  # the causal LM class transformers builds for it
    source_type: str  # the checkpoint's model type (`qwen3_5_moe`)
    source_architecture: str  # the checkpoint's class (`Qwen3_5MoeForConditionalGeneration`)
    left_out: list[str] = field(default_factory=list)  # the sub-configurations not exported (`vision_config`)
    whole: str = ""  # how to get the whole model (`whole_model()`)
    key_mapping: dict[str, str] | None = None  # checkpoint weight names -> the text model's (None: transformers' own)
    ignored: list[str] = field(default_factory=list)  # patterns of the left-out parts' weights (`check_weights`)

    @property
    def load_kwargs(self) -> dict:
        """What optimum-intel's `from_pretrained` of the text view gets besides its own arguments."""
        return {"key_mapping": self.key_mapping} if self.key_mapping else {}

    def manifest_facts(self) -> dict:
        """What the manifest's `model` records (`model_type` / `architecture` stay the checkpoint's)."""
        return {
            "model_type": self.source_type,
            "architecture": self.source_architecture,
            "exported_model_type": self.config.model_type,
            "exported_architecture": self.architecture,
            "left_out": {name: f"not exported: {self.whole}" for name in self.left_out},
        }


def _sub_configs(config) -> list[str]:
    """The sub-configurations of a composite config other than its text one (`vision_config`, ...)."""
    names = getattr(config, "sub_configs", None) or {}
    return [name for name in names if name != "text_config" and getattr(config, name, None) is not None]


def is_multimodal(config) -> bool:
    """A composite configuration with a text model and something beside it (vision, audio)."""
    try:
        text = config.get_text_config(decoder=True)
    except Exception:  # noqa: BLE001 - an unusual remote-code config: not one of these
        return False
    return text is not config and bool(_sub_configs(config))


def language_model(config) -> LanguageModel | None:
    """The language model to export for a multimodal `config`, or None when it is not multimodal.

    Raises:
        ModelNotSupportedError: the checkpoint is multimodal but its language model is not a causal LM type
            optimum-intel exports, or transformers has no causal LM class that loads it from this checkpoint.
    """
    if not is_multimodal(config):
        return None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as CAUSAL

    text = config.get_text_config(decoder=True)
    source = getattr(config, "model_type", None)
    architecture = (getattr(config, "architectures", None) or [source])[0]
    text_type = getattr(text, "model_type", None)
    if text_type not in supported_model_types() or text_type not in CAUSAL:
        why = ("transformers has no causal LM class for it" if text_type in supported_model_types()
               else f"optimum-intel does not export it as {BASE_TASK}")
        raise ModelNotSupportedError(
            f"{architecture} ({source}) is a multimodal model whose language model ({text_type}) {TASK} cannot "
            f"export: {why}; {whole_model(source)}"
        )
    # transformers loads the text model from the multimodal checkpoint itself where its causal LM mapping sends
    # the multimodal type to the text model's class ("VLM compatibility"); KEY_MAPPINGS renames the others' weights
    if CAUSAL.get(source) != CAUSAL[text_type] and source not in KEY_MAPPINGS:
        raise ModelNotSupportedError(
            f"{architecture} ({source}) is a multimodal model whose language model ({text_type}) transformers "
            f"does not load from this checkpoint on its own ({CAUSAL[text_type]} from a {source} checkpoint), so "
            f"{TASK} cannot export it yet; {whole_model(source)}"
        )
    import copy

    text = copy.deepcopy(text)
    text.architectures = [CAUSAL[text_type]]
    # the multimodal model ties its head to the embeddings as its own config says (transformers' `tie_weights`
    # reads the top-level `tie_word_embeddings`), whatever the text config says: that is the model
    text.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return LanguageModel(config=text, architecture=CAUSAL[text_type], source_type=source,
                         source_architecture=architecture, left_out=_sub_configs(config), whole=whole_model(source),
                         key_mapping=None if CAUSAL.get(source) == CAUSAL[text_type] else KEY_MAPPINGS[source])


def plan(config) -> LanguageModel | None:
    """Stage 1: the language model to export for `config`, or None (not a multimodal checkpoint, or one the
    fallback exports with optimum-intel's `image-text-to-text` partitioning: its language model cannot be
    exported on its own, `fallback.py`).

    Raises:
        ModelNotSupportedError: a multimodal checkpoint neither its language model nor a fallback can export.
    """
    from . import fallback

    if getattr(config, "model_type", None) in supported_model_types() or not is_multimodal(config):
        return None  # optimum-intel exports the type itself as a causal LM (llama4, ...), or not multimodal
    try:
        return language_model(config)
    except ModelNotSupportedError:
        if fallback.is_vision_language(config):
            return None
        raise


def _local_files(model: str) -> Path:
    """The checkpoint's directory: `model` itself, or the hub snapshot optimum-intel's export would download."""
    if os.path.isdir(model):
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model))


def text_view(model: str, language: LanguageModel, directory: Path) -> Path:
    """A directory optimum-intel's export loads as the language model: its `config.json`, and links to
    every other file of the checkpoint (weights, tokenizer, generation config). Returns `directory`."""
    source = _local_files(model).absolute()
    directory.mkdir(parents=True)
    for item in source.iterdir():
        if item.name != "config.json" and not item.name.startswith("."):
            os.symlink(item, directory / item.name)
    language.config.save_pretrained(str(directory))
    return directory


def check_weights(model: str, language: LanguageModel) -> None:
    """Refuse, before any work, a checkpoint whose weight names the language model would not find.

    The language model's parameter names (built on the meta device: no memory) are compared with the
    checkpoint's (read from the safetensors headers), after transformers' own renaming for the type.

    Raises:
        ModelNotSupportedError: some language model weights are not in the checkpoint.
    """
    source = _local_files(model)
    names = _checkpoint_names(source)
    if names is None:  # not safetensors: transformers reports what it cannot load
        return
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    with torch.device("meta"):
        text_model = AutoModelForCausalLM.from_config(language.config)
    expected = text_model.state_dict()
    transforms = get_model_conversion_mapping(text_model, language.key_mapping)
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamed = {name: rename_source_key(name, renamings, converters, prefix=text_model.base_model_prefix,
                                       meta_state_dict=expected)[0] for name in names}
    found = set(renamed.values())
    tied = set(getattr(text_model, "_tied_weights_keys", None) or {}) if language.config.tie_word_embeddings else set()
    missing = sorted(k for k in expected if k not in found and k not in tied)
    if missing:
        raise ModelNotSupportedError(
            f"{language.source_architecture} ({language.source_type}): the checkpoint has no weights for "
            f"{len(missing)} of its language model's parameters ({', '.join(missing[:3])}, ...) under the names "
            f"transformers loads them from, so {TASK} cannot export it (nothing was written)"
        )
    # the left-out parts' weights, by their two leading name components (`model.vision_tower`, `model.visual`)
    unused = {".".join(name.split(".")[:2]) for name, new in renamed.items() if new not in expected}
    language.ignored = sorted("^" + re.escape(prefix) + r"(\.|$)" for prefix in unused)


@contextlib.contextmanager
def left_out_unreported(language: LanguageModel | None):
    """While active, transformers' load of the language model does not list the left-out parts' weights as
    unexpected (hundreds of lines for a real vision tower): the summary line says they were left out."""
    if language is None or not language.ignored:
        yield
        return
    import transformers

    with host.unexpected_keys_ignored(getattr(transformers, language.architecture), language.ignored):
        yield


def _checkpoint_names(source: Path) -> set[str] | None:
    index = source / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text())["weight_map"])
    files = sorted(source.glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    names = set()
    for file in files:
        with safe_open(str(file), "pt") as handle:
            names.update(handle.keys())
    return names
