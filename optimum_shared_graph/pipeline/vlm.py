"""`--task image-text-to-text-shared`: the whole vision-language model, its language model the one shared graph.

optimum-intel's `image-text-to-text` export of a vision-language model writes one graph per part: for
Qwen3.5 (`qwen3_5`, `qwen3_5_moe`) `openvino_language_model.xml` (the stateful decoder fed `inputs_embeds`,
`attention_mask`, the (4, batch, seq) M-RoPE `position_ids` and `beam_idx`), `openvino_text_embeddings_model.xml`,
`openvino_vision_embeddings_model.xml`, `openvino_vision_embeddings_merger_model.xml` and
`openvino_vision_embeddings_pos_model.xml` (Qwen2-VL, Qwen2.5-VL: the same but the last, positions (3, batch, seq));
for Gemma 3 (`gemma3`) the language model (fed `inputs_embeds`, `attention_mask`, `position_ids`, `token_type_ids`
and `beam_idx`), the text embeddings and the vision embeddings (LLaVA and LLaVA-NeXT the same without
`token_type_ids`; Mistral 3 and LLaVA-NeXT-Video with a multi-modal projector graph besides; Gemma 4 with a per-layer
text embeddings graph, whose output the language model takes as `per_layer_inputs`; Qwen3-VL as Qwen2-VL, its
language model also fed the deepstack features): the layout `OVModelForVisualCausalLM` and OpenVINO GenAI's
`VLMPipeline` load. This task writes that layout with
optimum-intel's own export (its configs, its file names, its tokenizer conversion), and:

1. the export config of the architecture fix (`architectures.<family>.vlm_export_config`) stands in for
   optimum-intel's for the duration of the export (`architectures.vlm_fix_applied`), where optimum-intel's fails under the
   installed transformers (Qwen3.5's language model patcher imports `Qwen3_5DynamicCache`, gone in 5.5; Qwen2-VL's,
   Qwen2.5-VL's and Qwen3-VL's configs cap transformers at 5.0, LLaVA-NeXT-Video's at 4.57.6; Gemma 4's dummy cache
   gives its layers different past lengths; Gemma 3's, LLaVA's, LLaVA-NeXT's and Mistral 3's export under 5.5 as
   they are);
2. the language model is this package's graph: one stateful graph for prefill and decode whose `logits` are
   `[batch, 1, vocab]` with `--logits last` (the default), sliced before the vocabulary projection
   (`graph/logits.py`) as optimum-intel saves it, its weights written once;
3. before optimum-intel converts the model it loaded, the PyTorch model's greedy `generate()` on an image and
   a text prompt is recorded (`capture_reference`): the image embeddings, and every call of its language model
   (the `inputs_embeds`, and the graph's other inputs as that call had them: mask, positions, token types; its
   last-position logits);
4. validation (`validate_parts`): the vision graphs (run as `OVModelForVisualCausalLM` runs them) against
   PyTorch's image embeddings, the text embeddings graph against PyTorch's embedding, then the language
   model graph fed what the OpenVINO parts computed (the prompt's text embeddings with the OpenVINO image
   embeddings merged in at the image tokens, then each greedy token's OpenVINO embedding), judged against
   PyTorch's logits with the rules of text-generation-shared's validation (`proof/judge.py`);
5. the manifest (`task: image-text-to-text-shared`) and the artifact moved into place, as for a text model, with
   the reference `validate()` runs (`vlm_reference.py`: the `generate()` of item 3, through the checkpoint's processor).

`run_vlm_export()` runs them as `export.run_export()` runs the text task's, with its stage numbers: 1, the plan (`plan.py`'s
`make_plan`, the same `Plan`: the checks that need no weights, the weight format decided by the one rule of both
tasks, the validation's token count and whether its smallest part fits, the family, the calibration set); 2 and 3,
the hand-over to optimum-intel's export (items 1 to 3); 5, the validation (item 4); 6, the write (item 5).

Data-aware weight compression (`--dataset` with `--awq`, `--scale-estimation`, ...: the plan checks the flags, the
dataset and the processor at the start) has optimum-intel export the language model stateless in item 2, and
calibrates it on both stages before it is made stateful again (`quantization/visual.py`); item 4 then records the
compressed graph against PyTorch, as for any compressed weights.

What differs from family to family in items 3 and 4 (the validation image and prompt, where the image embeddings
are, the language model's inputs, how the vision graphs run) is an `architectures._vlm_families.Family`, beside
the other per-family knowledge; its model types are the ones this task exports (`architectures.supported_vlm_types`).
The validation image and prompt go through the checkpoint's processor and chat template where it has them
(`vlm_reference.processor_validation_inputs`): then the one `generate()` of item 3 is also the reference `validate()`
runs. A checkpoint without a processor is validated all the same: the image's pixels are drawn (seeded) in the
processor's output layout and the prompt is built from the configuration's image token ids (`validation_inputs`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import progress
from ..architectures import vlm_fix_applied
from ..architectures._vlm_families import family_of
from ..errors import ExportValidationError, InvalidOptionsError, ModelNotSupportedError
from ..manifest import LANGUAGE_XML, MANIFEST_NAME, Manifest
from ..options import ExportOptions
from ..quantization.calibration import CalibrationReport
from ..tasks import VLM_SHARED_TASK, VLM_TASK
from . import convert, load, vlm_reference, write
from .plan import Plan, make_plan

TEXT_EMBEDDINGS_XML = "openvino_text_embeddings_model.xml"


@dataclass
class Reference:
    """What PyTorch computed on the validation image and prompt."""

    model_type: str
    inputs: dict[str, np.ndarray]  # what generate() was given: input_ids (1, prompt), the image's pixels, ...
    image_embeds: np.ndarray  # (image tokens, hidden): what the language model gets at the image tokens
    text_embeds: np.ndarray  # (1, prompt, hidden): the embedding of the prompt's tokens
    # each language model call: its graph inputs but beam_idx (`Family.call_inputs`), inputs_embeds, logits
    calls: list[dict[str, np.ndarray]] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # generate()'s greedy picks
    generated_logits: np.ndarray | None = None  # (picks, 1, vocab): the logits generate() picked each from
    architecture: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def input_ids(self) -> np.ndarray:
        return self.inputs["input_ids"]


def validation_inputs(config, seed: int = 0) -> dict[str, Any]:
    """The validation image and prompt of `config`'s family (`Family.validation_inputs`), as `generate()` takes them."""
    return family_of(config.model_type).validation_inputs(config, seed)


def parts_inputs(config, processed: dict[str, Any] | None) -> dict[str, Any]:
    """What the parts are validated on: `processed` (the checkpoint's processor's inputs of the validation image and
    prompt, `vlm_reference.processor_validation_inputs`) where the family's processor makes the drawn image's layout
    (`Family.processor_image_as_drawn`), so one `generate()` serves both references; else the drawn ones."""
    if processed is not None and family_of(config.model_type).processor_image_as_drawn:
        return processed
    return validation_inputs(config)


def capture_reference(pt_model, new_tokens: int, inputs: dict[str, Any] | None = None) -> Reference:
    """PyTorch's greedy `generate()` on `inputs` (what the checkpoint's processor made of the validation image and
    prompt; by default the family's drawn ones, `validation_inputs`), each language model call recorded, and the
    logits of each pick as `generate()` returned them (`vlm_reference.greedy_generate`)."""
    import torch

    config = pt_model.config
    family = family_of(config.model_type)
    inputs = dict(inputs) if inputs is not None else validation_inputs(config)
    language = pt_model.get_submodule(family.language_module)
    calls: list[dict[str, np.ndarray]] = []
    outer: list[dict[str, Any]] = []

    def model_call(module, args, kwargs):
        outer[:] = [kwargs]

    def before(module, args, kwargs):
        calls.append({**family.call_inputs(outer[0], kwargs),
                      "inputs_embeds": kwargs["inputs_embeds"].detach().float().numpy().copy()})

    def after(module, args, output):
        calls[-1]["logits"] = family.logits(output[:, -1, :], config).detach().float().numpy().copy()

    images: list[np.ndarray] = []

    def vision(module, args, output):  # the image embeddings, at the prefill
        images.append(family.image_embeds(output))

    hooks = [pt_model.register_forward_pre_hook(model_call, with_kwargs=True),
             language.register_forward_pre_hook(before, with_kwargs=True),
             pt_model.lm_head.register_forward_hook(after)]
    if family.image_module:
        hooks.append(pt_model.get_submodule(family.image_module).register_forward_hook(vision))
    try:  # the vision tower runs inside generate(), under the float32 compute of a 16-bit model
        tokens, logits = vlm_reference.greedy_generate(pt_model, inputs, new_tokens)
        with torch.no_grad():
            text = pt_model.get_input_embeddings()(inputs["input_ids"]).float().numpy()
    finally:
        for hook in hooks:
            hook.remove()
    if not family.image_module:  # the prefill's embeddings at the image tokens
        images = [calls[0]["inputs_embeds"][inputs["input_ids"].numpy() == config.image_token_id]]
    return Reference(
        model_type=config.model_type, inputs={k: np.asarray(v) for k, v in inputs.items()},
        image_embeds=np.concatenate(images, axis=0), text_embeds=text, calls=calls,
        tokens=tokens, architecture=type(pt_model).__name__, generated_logits=logits,
    )


def validate_parts(directory: Path, reference: Reference, weight_format: str | None) -> dict:
    """The exported parts in `directory` against PyTorch's `reference` (see the module docstring, item 4)."""
    import openvino as ov
    from optimum.intel import OVModelForVisualCausalLM

    from ..proof.judge import RELATIVE_TOLERANCE, judge_logits, scaled_tolerance
    from ..runtimes.session import EXACT_CONFIG

    family = family_of(reference.model_type)
    fmt = weight_format or _compressed_weights(directory / LANGUAGE_XML) or "fp32"
    enforced = fmt in RELATIVE_TOLERANCE
    parts = OVModelForVisualCausalLM.from_pretrained(directory, ov_config=dict(EXACT_CONFIG), compile=False)
    core = ov.Core()
    # the vision parts, run as OVModelForVisualCausalLM runs them
    image = family.ov_image_embeds(parts, reference.inputs)
    text_model = core.compile_model(directory / TEXT_EMBEDDINGS_XML, "CPU", EXACT_CONFIG)
    embed = lambda ids: text_model(ids)[0].astype(np.float32)  # noqa: E731
    text = embed(reference.input_ids)
    vision = {"image_tokens": int(image.shape[0]),
              "max_abs_diff_image_embeds": float(np.max(np.abs(image - reference.image_embeds))),
              "max_abs_diff_text_embeds": float(np.max(np.abs(text - reference.text_embeds)))}
    # the language model fed what the OpenVINO parts computed: the prompt with the image merged in, then each pick
    config = parts.config
    prompt = text.copy()
    prompt[reference.input_ids == config.image_token_id] = image
    embeds = [prompt] + [embed(np.array([[token]])) for token in reference.tokens[: len(reference.calls) - 1]]
    vision["max_abs_diff_merged_prompt"] = float(np.max(np.abs(prompt - reference.calls[0]["inputs_embeds"])))
    # inputs other graphs compute (Gemma 4's per-layer embeddings, Qwen3-VL's deepstack features): the OpenVINO ones
    # are fed, their difference from PyTorch's judged as the image embeddings' (below)
    ids = [reference.input_ids] + [np.array([[token]]) for token in reference.tokens[: len(reference.calls) - 1]]
    computed = family.ov_call_inputs(parts, directory, ids, reference.inputs, dict(EXACT_CONFIG))
    for name in sorted({k for c in computed for k in c if np.asarray(c[k]).dtype != bool}):
        vision[f"max_abs_diff_{name}"] = float(max(np.max(np.abs(c[name] - call[name])) for c, call
                                                   in zip(computed, reference.calls) if name in call and c[name].size))
    del parts  # the vision and text embeddings graphs are freed before the language model compiles
    text_model = embed = None
    feeds = [{**{k: v for k, v in call.items() if k not in ("inputs_embeds", "logits")}, **others,
              "inputs_embeds": inputs_embeds, "beam_idx": np.zeros(inputs_embeds.shape[0], dtype=np.int32)}
             for call, inputs_embeds, others in zip(reference.calls, embeds, computed)]
    outputs, run = language_model_logits(directory / LANGUAGE_XML, feeds)
    logits = [call["logits"] for call in reference.calls]
    tolerance = scaled_tolerance(fmt, logits) if enforced else None
    judged, why = judge_logits(outputs, logits, tolerance)
    differing = [{"step": d["step"], "pytorch": d["expected"], "openvino": d["got"], "pytorch_margin": d["margin"],
                  "near_tie": d["near_tie"]} for d in judged.pop("differing_steps")]
    # what the language model is fed is computed by the other parts: they are judged by the same tolerance
    scale = max(1.0, float(np.max(np.abs(reference.image_embeds))))
    if why is None and enforced and vision["max_abs_diff_image_embeds"] > RELATIVE_TOLERANCE[fmt] * scale:
        why = (f"the image embeddings differ by {vision['max_abs_diff_image_embeds']:.2e} "
               f"(tolerance {RELATIVE_TOLERANCE[fmt] * scale:.2e})")
    for name in sorted({k for c in computed for k in c} & {k[len("max_abs_diff_"):] for k in vision}):
        diff = vision[f"max_abs_diff_{name}"]
        scale = max([1.0] + [float(np.max(np.abs(c[name]))) for c in reference.calls if name in c])
        if why is None and enforced and diff > RELATIVE_TOLERANCE[fmt] * scale:
            why = f"{name} differ by {diff:.2e} (tolerance {RELATIVE_TOLERANCE[fmt] * scale:.2e})"
    report = {
        "compile_config": dict(EXACT_CONFIG),
        "run": {**run, "image": family.describe_image(reference.inputs)},
        "prompt_tokens": int(reference.input_ids.shape[1]),
        "decode_steps": len(reference.calls) - 1,
        **judged,
        "differing_steps": differing,
        "vision": vision,
        **({"notes": list(reference.notes)} if reference.notes else {}),
        "enforced": enforced,
        "status": "failed" if why else ("passed" if enforced else "recorded"),
    }
    if why:
        raise ExportValidationError(
            f"validation failed: the exported model does not reproduce {reference.architecture} on an image and a "
            f"text prompt: {why}; nothing was written (report the model, or pass --skip-validation to keep an "
            "unchecked artifact)", report=report)
    return report


def language_model_logits(xml: Path, feeds: list[dict[str, np.ndarray]], memory=None) -> tuple[list[np.ndarray], dict]:
    """The language model graph `xml` on the calls `feeds` (its inputs by name, from the prefill): each call's
    last-position logits, and how it ran. As text-generation-shared's validation runs its graph
    (`validate.graph_outputs`): compiled whole where it fits, else in consecutive parts cut at decoder-layer
    boundaries, one part's weights compiled at a time (`memory.validation_parts` decides, from `memory` or the
    memory available now)."""
    import openvino as ov

    from ..runtimes.session import EXACT_CONFIG
    from .convert import return_freed_memory
    from .memory import validation_parts
    from .validate import run_in_parts

    return_freed_memory()  # what the vision parts held, before the memory available is read
    core = ov.Core()
    graph = core.read_model(xml)
    plan = validation_parts(graph, memory)
    if plan is not None and plan.count > 1:
        values = run_in_parts(graph, feeds, plan)
        return [call["logits"][:, -1, :].astype(np.float32) for call in values], {"mode": "parts", **plan.to_dict()}
    compiled = core.compile_model(graph, "CPU", EXACT_CONFIG)
    request = compiled.create_infer_request()
    request.reset_state()
    names = {port.get_any_name() for port in compiled.inputs}
    outputs = []
    for feed in feeds:
        request.infer({k: v for k, v in feed.items() if k in names})
        outputs.append(request.get_tensor("logits").data[:, -1, :].astype(np.float32).copy())
    del request, compiled
    return outputs, {"mode": "whole", "parts": 1}


def _compressed_weights(xml: Path) -> str | None:
    """"int8" (or "int4") when optimum-intel compressed the graph's weights without being asked (its default for a
    model over a billion parameters), else None: such a graph is recorded against PyTorch, not judged at fp32."""
    import openvino as ov

    kinds = {op.get_output_element_type(0).get_type_name() for op in ov.Core().read_model(xml).get_ops()
             if op.get_type_name() == "Constant" and op.get_output_partial_shape(0).rank.get_length() >= 2}
    if kinds & {"u4", "i4", "nf4", "f4e2m1"}:
        return "int4"
    return "int8" if kinds & {"u8", "i8"} else None


def run_vlm_export(model: str, output_dir, opts: ExportOptions, *, raw_export: Callable[..., None],
                   quantization: dict[str, Any] | None = None,
                   quantization_config: Callable[[], Any] | None = None) -> Manifest:
    """Export the vision-language model `model` into `output_dir` (module docstring); return the manifest.

    `quantization_config` returns the config the CLI's quantization flags give (without exporting); with a
    data-aware one the language model is calibrated on both stages (`quantization/visual.py`)."""
    stages = ["loading", "recording generate()", "converting (optimum-intel)"]
    stages += ([] if opts.skip_validation else ["validating"]) + ["writing"]
    with progress.export_progress(stages, quiet=opts.quiet):
        # 1. plan: every check that needs no weights, every fact the later stages read (the text task's `Plan`)
        progress.stage("loading")
        progress.step("plan")
        plan = make_plan(model, output_dir, opts, task=VLM_SHARED_TASK, quantization=quantization,
                         quantization_config=quantization_config)
        calibration = CalibrationReport() if plan.calibrating else None
        with convert.staging(plan.output) as staging:
            raw = staging / "raw"
            progress.step("load (optimum-intel)")
            # 2. capture and 3. convert, in the hand-over to optimum-intel's image-text-to-text export
            export, fix = hand_over_to_optimum_intel(plan, raw_export, raw, calibration)
            convert.return_freed_memory()
            # 5. validate (no stage 4: no static graph): the vision and text embedding graphs, then the language
            # model fed what they computed
            validation = _validate(plan, export, raw)
            # 6. write: the manifest, validate()'s reference, the graphs with their rt_info, moved into place
            progress.stage("writing")
            progress.step("write")
            manifest = write.prepare_parts(raw, plan, quantization, calibration, validation,
                                           model_extra={"fixes": [fix.record()]} if fix is not None else {})
            stored = vlm_reference.to_store(export.stored, export.stored_missing, validation, raw)
            write.write_artifact(raw, staging / "final", dict.fromkeys(manifest.graph["files"]), manifest,
                                 reference=stored)
            progress.step("move into place")
            write.move_into_place(staging / "final", plan.output)
        manifest.path = plan.output / MANIFEST_NAME
        return manifest


def hand_over_to_optimum_intel(plan: Plan, raw_export: Callable[..., None], raw: Path, calibration):
    """Items 1 to 3 on the one model optimum-intel loads: its `image-text-to-text` export into `raw`, with the
    family's architecture fix swapped in (`architectures.vlm_fix_applied`), this package's hooks (`_VlmExport`: the
    reference before its conversion, the language model's form before it saves) and the calibration the plan asks
    for. Returns the hooks' record (the references) and the fix it ran with (or None).

    Raises:
        ModelNotSupportedError: optimum-intel's export failed, or wrote no language model graph fed `inputs_embeds`.
    """
    export, model_type = _VlmExport(plan), plan.config.model_type
    try:
        with vlm_fix_applied(model_type, scratch=raw.parent) as fix, convert.one_model_load(
                export.on_model, load_error=lambda err: load.load_error(plan.model, plan.config, err),
                before_save=export.before_save), _calibrated(plan, calibration):
            raw_export(plan.model, raw, task=VLM_TASK)
    except (ModelNotSupportedError, InvalidOptionsError, ExportValidationError):
        raise
    except (Exception, SystemExit) as err:  # optimum-intel reports with ValueError, RuntimeError, ...
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelNotSupportedError(
            f"optimum-intel could not export {model_type} for {VLM_SHARED_TASK} (its {VLM_TASK} export"
            f"{', with ' + fix.module if fix else ''}): {first}") from err
    if export.language_graphs != 1 or not (raw / plan.shared_graph).is_file():
        raise ModelNotSupportedError(
            f"optimum-intel's {VLM_TASK} export of {model_type} wrote no language model graph fed "
            f"inputs_embeds ({plan.shared_graph}): {VLM_SHARED_TASK} cannot export it")
    return export, fix


def _calibrated(plan: Plan, calibration):
    """While active, optimum-intel's quantization as the plan says: a data-aware one on both stages of the language
    model, on the plan's images (`quantization/visual.py`); a data-free one given no `--dataset` it would not use."""
    from ..quantization import visual

    if plan.calibration_set is not None:
        from ..quantization.both_stages import both_stage_quantization
        from ..quantization.calibration import both_stage_steps

        steps = both_stage_steps(plan.opts.calibration_decode_steps)
        return both_stage_quantization(steps, calibration,
                                       quantize=visual.quantizer(plan.calibration_set, steps, calibration))
    return visual.dataset_unused() if plan.dataset_unused else contextlib.nullcontext()


def _validate(plan: Plan, export: "_VlmExport", raw: Path) -> dict:
    """Item 4 (`validate_parts`) on the graphs in `raw`; the report the manifest records under `validation`."""
    if export.reference is None:
        return {"status": "skipped", "reason": "--skip-validation"}
    progress.stage("validating")
    progress.step("validation")
    return validate_parts(raw, export.reference, plan.weight_format)


class _VlmExport:
    """The hooks on optimum-intel's export: the reference before conversion, the logits slice at save."""

    def __init__(self, plan: Plan):
        self.plan = plan  # read, never changed
        self.reference: Reference | None = None
        self.language_graphs = 0
        self.stored, self.stored_missing = None, None  # validate()'s reference (vlm_reference)

    def on_model(self, pt_model, convert_model, written_to: Path):
        opts = self.plan.opts
        pt_model.eval()
        if not opts.skip_validation:
            progress.stage("recording generate()")
            progress.step("capture")
            tokens = opts.validation_new_tokens  # planned (`plan.VLM_NEW_TOKENS` where the options leave it open)
            from .decompose import is_16bit

            def capture():  # the parts' reference, and validate()'s through the checkpoint's processor
                inputs, image, why = vlm_reference.processor_validation_inputs(self.plan.model, opts.trust_remote_code)
                validated_on = parts_inputs(pt_model.config, inputs)
                both = validated_on is inputs  # one generate() for both references, else one on each
                reference = capture_reference(pt_model, tokens, validated_on)
                if inputs is None:
                    self.stored, self.stored_missing = None, why
                    return reference
                picks, logits = ((reference.tokens, reference.generated_logits) if both
                                 else vlm_reference.greedy_generate(pt_model, inputs, tokens))
                self.stored = vlm_reference.recorded({k: np.asarray(v) for k, v in inputs.items()}, image, picks,
                                                     logits)
                return reference

            if is_16bit(pt_model):  # the graph computes in float32 with the 16-bit weights: so does the reference
                from .reference import capture_fp32

                # the decoder layers upcast one at a time; the vision tower (it reads its weights' dtype) held in
                # float32 for the whole forward
                self.reference, report = capture_fp32(pt_model, capture, whole_forward=self.plan.family.vision_modules)
                if report.low_precision_inputs:
                    self.reference.notes.append("validation reference computed with 16-bit activations into "
                                                + ", ".join(sorted(report.low_precision_inputs)))
            else:
                self.reference = capture()
        progress.stage("converting (optimum-intel)")
        progress.step("conversion (optimum-intel)")
        return convert_model()

    def before_save(self, ov_model) -> None:
        """The language model part (fed `inputs_embeds`, with `logits`) becomes the shared graph's form."""
        from ..graph.kv_shapes import read_lengths_from_keys
        from ..graph.logits import slice_logits
        from ..graph.npuw_forms import npuw_forms

        inputs = {name for port in ov_model.inputs for name in port.get_names()}
        outputs = {name for port in ov_model.outputs for name in port.get_names()}
        if "inputs_embeds" not in inputs or "logits" not in outputs:
            return
        self.language_graphs += 1
        read_lengths_from_keys(ov_model)
        npuw_forms(ov_model)
        if self.plan.opts.logits == "last":
            slice_logits(ov_model)
