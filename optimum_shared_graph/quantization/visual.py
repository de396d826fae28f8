"""Data-aware quantization of a vision-language model's language model, calibrated on both stages.

optimum-intel calibrates a vision-language model's language model on prefill calls only: for each image and
instruction of its dataset, the prompt's embeddings with the image's merged in (its
`_prepare_visual_causal_lm_calibration_data`). The shared language model also runs decode calls, attending to the
state the prefill left. Here, as `both_stages` does for a text model:

1. optimum-intel exports the vision-language model with its language model *stateless* (every state an explicit
   input and output: keys and values, and a hybrid model's convolution and recurrent states), so each calibration
   sample carries the state it runs against;
2. for each image and instruction, `OVModelForVisualCausalLM`'s own preprocessing (`preprocess_inputs`, with the
   checkpoint's processor and chat template) and merging (`get_multimodal_embeddings`: the OpenVINO vision graphs'
   image embeddings put in at the image tokens, and the positions) give the prefill call; generation then runs on
   that exported fp32 graph: the prefill, then `decode_steps` greedy decode calls, each fed the OpenVINO text
   embedding of the previous pick and the real state. Each call is one sample;
3. the samples go to NNCF through optimum-intel's own entry point (`OVModelForVisualCausalLM._apply_quantization(...,
   calibration_dataset=...)`, the language model's samples under its `lm_model`): the language model gets the
   flags' config, the other graphs optimum-intel's own default for them (int8 symmetric weights, data-free); a full
   or mixed config (`--quant-mode`) also goes, as optimum-intel gives it, to the vision embedding graphs, calibrated
   on their own calls for the same images (recorded with optimum-intel's `InferRequestWrapper` while step 2 builds
   the prefills, as its `_prepare_visual_causal_lm_calibration_data` does);
4. the quantized language model is made stateful with optimum-intel's own `patch_stateful`, the transform its
   stateful export applies after conversion.

The images and instructions come from a local JSON-lines file (`read_dataset_file`), or for optimum-intel's dataset
names (`contextual`, `textvqa`) from optimum-intel's own loader of them (`dataset_items`; not run here: it needs the
hub and the `datasets` package).

Qwen3.5 under transformers 5.5: `get_multimodal_embeddings` calls `get_rope_index` without the `mm_token_type_ids`
5.5 requires (as `generate()` does); the positions are computed first with host/'s `qwen3_5_generate_fixed` (5.5's
own position preparation) and passed in.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import host
from ..errors import InvalidOptionsError, ModelNotSupportedError
from ..manifest import LANGUAGE_XML
from ..progress import bar
from .calibration import (
    COMPILE_CONFIG, CalibrationReport, _apply_calibrated, _NotStatefulWarning, _prepared_config, make_stateful,
)

# the language model's inputs other than its state
_STEP_INPUTS = {"inputs_embeds", "attention_mask", "position_ids", "token_type_ids", "beam_idx"}
# what optimum-intel's VLM calibration does to a large image: resized to fit in this many pixels, keeping its aspect
MAX_IMAGE_SIZE = 600


@dataclass
class Item:
    """One calibration sample's image and instruction."""

    image: Any  # a PIL image, RGB
    text: str


@dataclass
class VisualDataset:
    """Where the calibration images and instructions come from: a local file's items, or an optimum-intel name."""

    path: str | None = None
    items: list[Item] | None = None
    name: str | None = None

    @property
    def texts(self) -> list[str]:
        """The instructions (what optimum-intel's config is given as its `dataset`, a list it accepts)."""
        return [item.text for item in self.items] if self.items is not None else []


def read_dataset_file(path: str | os.PathLike) -> list[Item]:
    """The items of a local calibration file: JSON lines, each `{"image": PATH, "text": INSTRUCTION}`, the image's
    path absolute or relative to the file's directory (any format PIL opens); blank lines are skipped.

    Raises:
        InvalidOptionsError: the file cannot be read, a line is not such an object, or an image does not open.
    """
    from PIL import Image

    path = Path(path)
    how = 'write one JSON object per line, {"image": "photo.png", "text": "What is in the image?"}'
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise InvalidOptionsError(f"cannot read --dataset file {path} ({err}): {how}") from err
    items = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise InvalidOptionsError(f"--dataset file {path} line {number} is not JSON ({err.msg}): {how}") from err
        if not (isinstance(record, dict) and isinstance(record.get("image"), str)
                and isinstance(record.get("text"), str) and record["text"].strip()):
            raise InvalidOptionsError(
                f"--dataset file {path} line {number} is not an object with a string \"image\" and a non-empty "
                f"string \"text\": {how}")
        image_path = path.parent / record["image"]
        try:
            with Image.open(image_path) as image:
                rgb = image.convert("RGB")
        except (OSError, ValueError) as err:
            raise InvalidOptionsError(f"--dataset file {path} line {number}: cannot open image {image_path} "
                                      f"({type(err).__name__}): give the path of an image file, absolute or relative "
                                      "to the dataset file") from err
        items.append(Item(_fitted(rgb), record["text"]))
    if not items:
        raise InvalidOptionsError(f"--dataset file {path} has no sample: {how}")
    return items


def resolve_dataset(dataset: Any) -> VisualDataset:
    """`--dataset` for a vision-language model: a local file (read now, before any work) or one of optimum-intel's
    vision-language dataset names.

    Raises:
        InvalidOptionsError: a file that does not read as `read_dataset_file` says, or another dataset name.
    """
    from optimum.intel.openvino.utils import PREDEFINED_VISUAL_LM_DATASETS

    if isinstance(dataset, (str, os.PathLike)) and os.path.isfile(dataset):
        return VisualDataset(path=str(dataset), items=read_dataset_file(dataset))
    names = sorted(PREDEFINED_VISUAL_LM_DATASETS)
    if isinstance(dataset, str) and dataset in names:
        return VisualDataset(name=dataset)
    raise InvalidOptionsError(
        f"--dataset {dataset} is neither a file nor a vision-language calibration set: pass a JSON-lines file of "
        f"images and instructions, or one of optimum-intel's {', '.join(names)}")


def _fitted(image):
    """The image resized to fit in `MAX_IMAGE_SIZE` pixels keeping its aspect, as optimum-intel's calibration does."""
    scale = max(image.size[0] / MAX_IMAGE_SIZE, image.size[1] / MAX_IMAGE_SIZE)
    return image.resize((int(image.size[0] / scale), int(image.size[1] / scale))) if scale > 1 else image


def dataset_items(dataset: VisualDataset, model, config, trust_remote_code: bool) -> list[Item]:
    """The calibration items: the file's, or those of optimum-intel's named dataset as its own loader reads them
    (`OVCalibrationDatasetBuilder.load_dataset`, the columns of `PREDEFINED_VISUAL_LM_DATASETS`), at most
    `num_samples` (optimum-intel's default 32). Not run here for a name: it needs the hub."""
    if dataset.items is not None:
        return dataset.items[: config.num_samples] if config.num_samples else dataset.items
    import requests
    from optimum.intel.openvino.quantization import OVCalibrationDatasetBuilder
    from optimum.intel.openvino.utils import PREDEFINED_VISUAL_LM_DATASETS
    from PIL import Image

    name = "textvqa" if dataset.name == "contextual" else dataset.name  # optimum-intel's own substitution
    meta = PREDEFINED_VISUAL_LM_DATASETS[name]
    count = config.num_samples or 32
    builder = OVCalibrationDatasetBuilder(model, trust_remote_code=trust_remote_code)
    items = []
    for row in builder.load_dataset(meta["id"], num_samples=count, dataset_split=meta["split"],
                                    streaming=meta["streaming"]):
        if len(items) >= count:
            break
        columns = meta["inputs"]
        if "image_url" in columns:
            image = Image.open(requests.get(row[columns["image_url"]], stream=True).raw)
        else:
            image = row[columns["image"]]
        items.append(Item(_fitted(image.convert("RGB")), row[columns["instruction"]]))
    return items


def _is_qwen3_5(model) -> bool:
    """Whether `model` is one whose `get_multimodal_embeddings` needs 5.5's positions (module docstring)."""
    from ..architectures.qwen3_5 import VLM_MODEL_TYPES

    return model.config.model_type in VLM_MODEL_TYPES


def prefill_inputs(model, processor, tokenizer, item: Item, names: set[str]) -> dict[str, np.ndarray]:
    """The language model's prefill call on `item`, as `OVModelForVisualCausalLM` makes it: the processor's inputs
    through its chat template, the OpenVINO image embeddings merged in, the positions (graph inputs `names`)."""
    import torch

    inputs = model.preprocess_inputs(text=item.text, image=item.image, processor=processor, tokenizer=tokenizer,
                                     config=model.config)
    qwen3_5 = _is_qwen3_5(model)
    with host.qwen3_5_generate_fixed() if qwen3_5 else contextlib.nullcontext(), torch.no_grad():
        extra = {}
        if qwen3_5:
            extra["position_ids"] = model._prepare_position_ids_for_generation(inputs["input_ids"], dict(inputs))
        embeds, mask, positions, *_ = model.get_multimodal_embeddings(**inputs, **extra)
        if positions is None:  # a family whose positions generation's input preparation makes (Gemma 3: from 1)
            positions = model.prepare_inputs_for_generation(**inputs)["position_ids"]
    feed = {"inputs_embeds": embeds.float().numpy(), "attention_mask": mask.long().numpy(),
            "position_ids": positions.long().numpy()}
    if "token_type_ids" in names:  # Gemma 3: 1 at the image tokens
        types = inputs.get("token_type_ids")
        feed["token_type_ids"] = (types.long().numpy() if types is not None
                                  else np.zeros(feed["attention_mask"].shape, np.int64))
    return {k: v for k, v in feed.items() if k in names}


class VisualBothStageSamples:
    """Calibration samples of a vision-language model's stateless language model: each item's prefill call (the
    image merged in) and `decode_steps` greedy decode calls with the real state (module docstring, item 2).

    Every call is kept as it was fed, its state included (a hybrid model's recurrent state is not a prefix of a
    later one, so no call's state is derived from another's): memory grows with items x calls x state size.

    Args:
        ov_model: the stateless language model (state inputs `past_key_values.*` with outputs `present.*`, or a
            hybrid model's `cache_params.past.*` with `cache_params.present.*`).
        text_embeddings: the text embeddings `openvino.Model` (token ids to the language model's embeddings).
        prefills: `prefill_inputs` of each item.
        decode_steps: decode calls after each prefill (0: prefill only, optimum-intel's behaviour).
        state_shapes: the state inputs' shapes as exported (`OVModelForVisualCausalLM` makes every dimension
            of its graphs dynamic on load; an empty state is 1 along the batch, 0 along the others left dynamic).
    """

    def __init__(self, ov_model, text_embeddings, prefills: list[dict[str, np.ndarray]], decode_steps: int, *,
                 state_shapes: dict[str, Any] | None = None):
        import openvino as ov

        if decode_steps < 0:
            raise InvalidOptionsError(f"calibration decode steps must be 0 or more, got {decode_steps}")
        self.decode_steps = decode_steps
        outputs = {name for port in ov_model.outputs for name in port.get_names()}
        self._states: dict[str, tuple[str, Any, Any]] = {}
        for port in ov_model.inputs:
            name = port.get_any_name()
            if name in _STEP_INPUTS:
                continue
            # optimum-intel's names: past_key_values.N.key -> present.N.key; a hybrid model's cache_params.past.* ->
            # cache_params.present.*
            present = name.replace("past_key_values", "present", 1) if name.startswith("past_key_values") \
                else name.replace("past", "present", 1)
            if "past" not in name or present not in outputs:
                raise ModelNotSupportedError(
                    f"calibration on both stages cannot feed the language model's input {name} (no state output "
                    f"{present}): quantize without a data-aware mode for this model")
            shape = (state_shapes or {}).get(name, port.get_partial_shape())
            self._states[name] = (present, port.get_element_type().to_dtype(), shape)
        if not self._states:
            raise ModelNotSupportedError("calibration on both stages expected optimum-intel's stateless language "
                                         "model (its state as inputs)")
        core = ov.Core()
        language = core.compile_model(ov_model, "CPU", COMPILE_CONFIG)
        embed = core.compile_model(text_embeddings, "CPU", COMPILE_CONFIG)
        request = language.create_infer_request()
        self._feeds: list[dict[str, np.ndarray]] = []
        self.prefill_count = 0
        desc = f"calibration: prefill + {decode_steps} decode calls per image"
        for prefill in bar(desc, iterable=prefills, unit="image"):
            self._generate(request, embed, prefill)
            self.prefill_count += 1
        del request, language, embed

    @property
    def texts(self) -> int:
        """Images and instructions calibrated on (one prefill call each)."""
        return self.prefill_count

    @property
    def decode_count(self) -> int:
        return self.prefill_count * self.decode_steps

    def __len__(self) -> int:
        return len(self._feeds)

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self._feeds)))

    def feed(self, index: int) -> dict[str, np.ndarray]:
        return self._feeds[index]

    def nncf_dataset(self):
        import nncf

        return nncf.Dataset(self, self.feed)

    def _empty_state(self) -> dict[str, np.ndarray]:
        state = {}
        for name, (_, dtype, shape) in self._states.items():
            dims = [d.get_length() if d.is_static else (1 if i == 0 else 0) for i, d in enumerate(shape)]
            state[name] = np.zeros(dims, dtype=dtype)
        return state

    def _generate(self, request, embed, prefill: dict[str, np.ndarray]) -> None:
        feed = {**prefill, **self._empty_state()}
        positions = prefill.get("position_ids")
        last = positions.max(axis=-1, keepdims=True) if positions is not None else None  # per M-RoPE row
        for step in range(self.decode_steps + 1):
            self._feeds.append(feed)
            request.infer(feed)
            if step == self.decode_steps:
                break
            token = int(np.argmax(request.get_tensor("logits").data[0, -1]))
            state = {name: request.get_tensor(present).data.copy() for name, (present, _, _) in self._states.items()}
            mask = feed["attention_mask"]
            feed = {"inputs_embeds": embed(np.array([[token]], dtype=np.int64))[0].astype(np.float32),
                    "attention_mask": np.concatenate([mask, np.ones((1, 1), mask.dtype)], axis=1), **state}
            if last is not None:  # each row's next position: its largest so far, plus one per decode call
                feed["position_ids"] = last + step + 1
            if "token_type_ids" in prefill:
                feed["token_type_ids"] = np.zeros((1, 1), np.int64)


def quantize_vlm_both_stages(model_name_or_path: str, output: str | os.PathLike, quantization_config: Any, *,
                             dataset: VisualDataset, decode_steps: int, stateful: bool, report: CalibrationReport,
                             trust_remote_code: bool = False, cache_dir: str | None = None,
                             model_kwargs: dict | None = None) -> None:
    """Quantize optimum-intel's export in `output` (the language model stateless) on both stages of its language
    model, then make the language model stateful if asked: what optimum-intel's `_main_quantize` does for a
    vision-language model, with the calibration set built here (module docstring)."""
    import logging

    import openvino as ov
    from optimum.intel import OVModelForVisualCausalLM
    from transformers import AutoProcessor, AutoTokenizer

    output = Path(output)
    logger = logging.getLogger("optimum.intel.openvino.modeling_decoder")  # its language model class warns
    logger.addFilter(_NotStatefulWarning)
    try:
        # f32: optimum-intel gives a stateless language model's `present` outputs the device's inference precision
        # on load (bf16 on a CPU with bf16 units), which would be saved with the quantized graph
        model = OVModelForVisualCausalLM.from_pretrained(output, compile=False, trust_remote_code=trust_remote_code,
                                                         cache_dir=cache_dir, ov_config=dict(COMPILE_CONFIG),
                                                         **(model_kwargs or {}))
    finally:
        logger.removeFilter(_NotStatefulWarning)
    config = _prepared_config(model, quantization_config, model_name_or_path)
    source = config.processor or model_name_or_path
    try:
        processor = AutoProcessor.from_pretrained(source, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or source, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise InvalidOptionsError(
            f"data-aware quantization of a vision-language model feeds images through the checkpoint's processor, "
            f"and it did not load from {source} ({type(err).__name__}): export from the checkpoint directory with "
            "its processor files") from err
    language = model.ov_models["lm_model"]
    names = {port.get_any_name() for port in language.inputs}
    items = dataset_items(dataset, model, config, trust_remote_code)
    with vision_inputs_collected(model, config) as vision:
        prefills = [prefill_inputs(model, processor, tokenizer, item, names) for item in items]
    exported = ov.Core().read_model(output / LANGUAGE_XML)  # the shapes as exported (weights mapped, not read)
    shapes = {port.get_any_name(): port.get_partial_shape() for port in exported.inputs}
    del exported
    samples = VisualBothStageSamples(language, model.ov_models["text_embeddings_model"], prefills, decode_steps,
                                     state_shapes=shapes)
    report.record(samples, decode_steps)
    with host.config_enums_serialized():  # the range estimator in openvino_config.json
        report.overflow_fix = _apply_calibrated(
            model, config, samples, model_name_or_path=model_name_or_path, trust_remote_code=trust_remote_code,
            submodel="lm_model", others=vision_datasets(vision), save_directory=output, immediate_save=True)
    model_config = model.config
    del model, samples, language
    gc.collect()
    if stateful:
        make_stateful(output / LANGUAGE_XML, model_config, shapes)


def is_full(config) -> bool:
    """Whether `config` is full or mixed quantization (`--quant-mode`): optimum-intel then quantizes the vision
    embedding graphs' activations too, calibrated on their own inputs."""
    from optimum.intel.openvino.configuration import OVMixedQuantizationConfig, OVQuantizationConfig

    return isinstance(config, (OVQuantizationConfig, OVMixedQuantizationConfig))


@contextlib.contextmanager
def vision_inputs_collected(model, config) -> Iterator[dict[str, list]]:
    """While active, for a full or mixed `config`, every call of `model`'s vision embedding graphs (its
    `OVVisionEmbedding` components, those optimum-intel's `_construct_pipeline_quantization_config` gives the full
    config) is recorded by optimum-intel's own `InferRequestWrapper`, as its `_prepare_visual_causal_lm_calibration_data`
    does: the yielded dict, `{"<component>_model": [inputs, ...]}`, empty for weight compression."""
    from optimum.intel.openvino.modeling_visual_language import OVVisionEmbedding
    from optimum.intel.openvino.quantization import InferRequestWrapper

    collected: dict[str, list] = {}
    wrapped = []
    if is_full(config):
        for name, component in model.components.items():
            if isinstance(component, OVVisionEmbedding):
                collected[f"{name}_model"] = []
                component.compile()
                component.request = InferRequestWrapper(component.request, collected[f"{name}_model"])
                wrapped.append(component)
    try:
        yield collected
    finally:
        for component in wrapped:
            component.request = component.request.request


def vision_datasets(collected: dict[str, list]) -> dict[str, Any]:
    """The NNCF datasets of the vision graphs' recorded calls; a call on a 4-D `pixel_values` of several images is
    split into one sample per image, as optimum-intel's calibration does (lower peak memory)."""
    import nncf
    import torch

    datasets = {}
    for name, calls in collected.items():
        single = []
        for call in calls:
            pixels = call.get("pixel_values") if isinstance(call, dict) else None
            if isinstance(pixels, torch.Tensor) and pixels.dim() == 4 and pixels.shape[0] > 1:
                single += [{k: v[i: i + 1] for k, v in call.items()} for i in range(pixels.shape[0])]
            else:
                single.append(call)
        datasets[name] = nncf.Dataset(single)
    return datasets


def quantizer(dataset: VisualDataset, decode_steps: int, report: CalibrationReport):
    """`both_stages.both_stage_quantization`'s `quantize` for a vision-language model: `quantize_vlm_both_stages`
    on `dataset`, given optimum-intel's `_main_quantize` arguments."""

    def quantize(arguments, stateful: bool) -> None:
        quantize_vlm_both_stages(
            arguments["model_name_or_path"], arguments["output"], arguments["quantization_config"], dataset=dataset,
            decode_steps=decode_steps, stateful=stateful, report=report,
            trust_remote_code=arguments["trust_remote_code"], cache_dir=arguments["cache_dir"],
            model_kwargs=arguments["model_kwargs"])

    return quantize


@contextlib.contextmanager
def dataset_unused() -> Iterator[None]:
    """While active, optimum-intel's `_main_quantize` of a data-free config (8-bit weights, or no data-aware
    algorithm) is given it without its `dataset`: for a vision-language model optimum-intel would build the
    calibration set from it (its loader knows only its dataset names, not a local file's instructions) and then
    not use it, so the weights are the same."""
    from optimum.intel.openvino.configuration import _quantization_config_from_dict

    def _main_quantize(bound, proceed):
        config = bound.arguments["quantization_config"]
        config = _quantization_config_from_dict(config) if isinstance(config, dict) else config.clone()
        if getattr(config, "dataset", None) is not None:
            config.dataset = None
            bound.arguments["quantization_config"] = config
        return proceed()

    with host.main_quantize_wrapped(_main_quantize):
        yield
