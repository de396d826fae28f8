"""Every patch of a library this package does not own (optimum-intel, Optimum, transformers, NNCF), in one place.

The export is optimum-intel's own, with this package's stages hooked into it; the hooks are attributes of
optimum-intel's and transformers' modules and classes replaced for a while. Each is a small named context
manager here (active for one export, or one stage of it, and undone on exit whatever happens), or, for the
two that last for the process (the `optimum-cli` command and the task in `TasksManager`), a named install
function. What each does to its library is here; what the package does in the hook is the caller's.

`PATCHES` lists them: the target (`module:attribute`), why, which of the package's modules uses it, the
target's parameters the patch relies on, and the library functions that must look the target up when they
run (a name bound at import time would never see the replacement). `tests/test_host.py` checks every row
against the installed libraries, so an upgrade that moves or changes a target fails there, in one test.

Imports nothing of the package: every layer above may use it. Importing it imports no library either
(`optimum-cli --help` stays cheap); each patch imports its target when entered.
"""

from __future__ import annotations

from dataclasses import dataclass

from .command import export_command_extended
from .compression import weights_compressed_in_slices
from .configuration import config_enums_serialized
from .exporter import (
    dynamic_graph_skipped, graphs_before_save, main_export_wrapped, main_quantize_wrapped, models_handed_over,
    transformers_cap_lifted,
)
from .loading import experts_loaded_as_stored, parallel_experts_upcast_one_at_a_time, unexpected_keys_ignored
from .tasks_manager import (
    export_configs_replaced, model_loads_wrapped, openvino_entries, task_registered,
)
from .trace import attention_functions_wrapped, cache_passed_through, mask_functions_wrapped
from .visual_generate import qwen3_5_generate_fixed


@dataclass(frozen=True)
class Patch:
    """One target of one patch of host/."""

    patch: str  # the function of host/ that patches it
    target: str  # "module:attribute" (a dotted attribute path): what the patch replaces or changes
    why: str
    used_by: str  # the package's module (and export stage) that uses the patch
    parameters: tuple[str, ...] = ()  # the target's parameters (a callable's) the patch relies on
    reached_by: tuple[str, ...] = ()  # "module:function" of the library that looks the target up at call time
    lasts: str = "while active"  # or "the process" (an install function)
    attribute: str | None = None  # the name replaced on the target, when not the target's own last name

    @property
    def name(self) -> str:
        """The name the patch replaces (what `reached_by` must look up when it runs)."""
        return self.attribute or self.target.rpartition(":")[2].rpartition(".")[2]


PATCHES: tuple[Patch, ...] = (
    # the process: the optimum-cli command and the task
    Patch("export_command_extended", "optimum.commands.export.openvino:OVExportCommand.parse_args",
          "adds the task's flags to `optimum-cli export openvino`", "cli.register (the optimum-cli hook)",
          parameters=("parser",), lasts="the process"),
    Patch("export_command_extended", "optimum.commands.export.openvino:OVExportCommand.run",
          "runs the pipeline for --task text-generation-shared, optimum-intel's command otherwise (which then "
          "does the raw export, every flag with its meaning)", "cli.register (the optimum-cli hook)",
          parameters=("self",), lasts="the process"),
    Patch("task_registered", "optimum.exporters.tasks:TasksManager._SUPPORTED_MODEL_TYPE",
          "text-generation-shared for every model type exported as text-generation-with-past, with its config",
          "registration.register_tasks (stage 1, and on import of optimum-intel's exporter)", lasts="the process"),
    Patch("task_registered", "optimum.exporters.tasks:TasksManager._TRANSFORMERS_TASKS_TO_MODEL_LOADERS",
          "the task's model loader (AutoModelForCausalLM)", "registration.register_tasks", lasts="the process"),
    Patch("task_registered", "optimum.exporters.tasks:TasksManager._TRANSFORMERS_TASKS_TO_MODEL_MAPPINGS",
          "the task's model classes, text-generation's", "registration.register_tasks", lasts="the process"),
    Patch("task_registered", "optimum.intel.openvino.utils:_HEAD_TO_AUTOMODELS",
          "the task's OVModel class, text-generation's", "registration.register_tasks", lasts="the process"),
    # one export
    Patch("export_configs_replaced", "optimum.exporters.tasks:TasksManager._SUPPORTED_MODEL_TYPE",
          "an architecture fix's config (architectures/) instead of optimum-intel's for one export",
          "architectures.fix_applied (stage 3)",
          reached_by=("optimum.exporters.tasks:TasksManager.get_exporter_config_constructor",)),
    Patch("transformers_cap_lifted", "optimum.exporters.openvino.base:OpenVINOConfig",
          "an export config class's transformers cap lifted for one validated export",
          "pipeline/version_cap.lifted_cap (stage 3)", attribute="MAX_TRANSFORMERS_VERSION",
          reached_by=("optimum.exporters.openvino.convert:export",)),
    Patch("model_loads_wrapped", "optimum.exporters.tasks:TasksManager.get_model_from_task",
          "a load failure as one line; a multimodal checkpoint's weight renaming passed to from_pretrained",
          "pipeline/convert.one_model_load (stage 3)", parameters=("task", "model_name_or_path", "model_kwargs"),
          reached_by=("optimum.exporters.openvino.__main__:main_export",)),
    Patch("models_handed_over", "optimum.exporters.openvino.convert:export_from_model",
          "the one model optimum-intel loads goes to decomposition (stage 2) before its conversion and to the "
          "static trace (stage 4) after", "pipeline/convert.one_model_load (stages 2-4)",
          parameters=("model", "output"), reached_by=("optimum.exporters.openvino.__main__:main_export",)),
    Patch("graphs_before_save", "optimum.exporters.openvino.convert:_save_model",
          "the logits slice and past lengths from keys, and fp16 weights with float32 vectors, applied to the "
          "graph optimum-intel saves", "pipeline/convert.one_model_load (stage 3)",
          parameters=("model", "path", "ov_config"), reached_by=("optimum.exporters.openvino.convert:export_pytorch",)),
    Patch("dynamic_graph_skipped", "optimum.exporters.openvino.convert:export_pytorch",
          "a static export without calibration skips the dynamic graph its static one replaces",
          "pipeline/convert.no_dynamic_graph (stage 3, --shape-mode static)",
          parameters=("model", "config", "output", "library_name"),
          reached_by=("optimum.exporters.openvino.convert:export",)),
    Patch("main_export_wrapped", "optimum.exporters.openvino.__main__:main_export",
          "data-aware quantization exports the graph stateless (both-stage calibration); the CLI's quantization "
          "config read without exporting", "quantization/both_stages (stage 3; quantization_config_of: stage 1)",
          parameters=("ov_config", "stateful"), reached_by=("optimum.commands.export.openvino:OVExportCommand.run",)),
    Patch("main_quantize_wrapped", "optimum.exporters.openvino.__main__:_main_quantize",
          "calibration on prefill and decode calls; a static export's quantization config kept for its own graph",
          "quantization/both_stages.both_stage_quantization (stage 3)",
          parameters=("model_name_or_path", "output", "quantization_config", "trust_remote_code", "cache_dir",
                      "model_kwargs"),
          reached_by=("optimum.commands.export.openvino:OVExportCommand.run",)),
    Patch("config_enums_serialized", "optimum.intel.openvino.configuration:OVQuantizationConfigBase._dataclasses_to_dict",
          "a vision-language model's full quantization config written to openvino_config.json with its NNCF range "
          "estimator (enum members as values)", "quantization/visual.quantize_vlm_both_stages (stage 3)",
          parameters=("d",),
          reached_by=("optimum.intel.openvino.configuration:OVQuantizationConfigBase.to_dict",)),
    Patch("unexpected_keys_ignored", "transformers:PreTrainedModel._keys_to_ignore_on_load_unexpected",
          "a multimodal checkpoint's left-out weights not listed as unexpected when its language model loads",
          "pipeline/multimodal.left_out_unreported (stage 3)",
          reached_by=("transformers.modeling_utils:PreTrainedModel._adjust_missing_and_unexpected_keys",)),
    Patch("experts_loaded_as_stored", "transformers.conversion_mapping:get_checkpoint_conversion_mapping",
          "a mixture of experts' per-expert tensors loaded as stored (memory-mapped), not merged into new fused ones",
          "architectures/moe_experts.while_exporting (stage 3's load)", parameters=("model_type",),
          reached_by=("transformers.conversion_mapping:extract_weight_conversions_for_model",)),
    *(Patch("parallel_experts_upcast_one_at_a_time", f"transformers.models.{t}.modeling_{t}:{c}.forward",
            "each expert's weight upcast alone for the capture's float32 compute, not every expert's with the layer",
            "architectures/granitemoe.while_exporting (stage 3's capture)", parameters=("inputs", "expert_size"))
      for t, c in (("granitemoe", "GraniteMoeParallelExperts"),
                   ("granitemoehybrid", "GraniteMoeHybridParallelExperts"))),
    Patch("weights_compressed_in_slices",
          "nncf.quantization.algorithms.weight_compression.openvino_backend:compress_weight",
          "a large weight's data-free integer compression a slice of rows at a time, into memory-mapped files, "
          "not with NNCF's temporaries of twice its float32 size and its compressed values in anonymous memory",
          "pipeline/convert.convert (stage 3's weight compression)",
          parameters=("weight", "reduction_axes", "config", "precomputed_compressed_weight"),
          reached_by=("nncf.quantization.algorithms.weight_compression.openvino_backend:"
                      "OVWeightCompressionAlgoBackend._create_compression_subgraph",)),
    # the static trace
    Patch("mask_functions_wrapped", "transformers.masking_utils:ALL_MASK_ATTENTION_FUNCTIONS.register",
          "the sdpa and eager masks with an integer query length", "pipeline/static.export_static_graph (stage 4)",
          parameters=("key", "value")),
    Patch("attention_functions_wrapped", "transformers.modeling_utils:ALL_ATTENTION_FUNCTIONS.register",
          "grouped-query SDPA without repeating the KV buffers", "pipeline/static.export_static_graph (stage 4)",
          parameters=("key", "value")),
    Patch("cache_passed_through", "optimum.exporters.openvino.model_patcher:Gemma2ModelPatcher.__init__",
          "a static Cache through optimum-intel's Gemma 2 patcher (it sets patched_forward in __init__)",
          "pipeline/static.export_static_graph (stage 4)", parameters=("config", "model", "model_kwargs")),
    Patch("cache_passed_through", "optimum.exporters.openvino.patching_utils:override_arguments",
          "the patcher's argument overrides, applied as optimum-intel applies them",
          "pipeline/static.export_static_graph (stage 4)",
          parameters=("args", "kwargs", "forward_signature", "model_kwargs")),
    # validate() of an image-text-to-text-shared artifact through OVModelForVisualCausalLM (host/visual_generate.py)
    Patch("qwen3_5_generate_fixed",
          "optimum.intel.openvino.modeling_visual_language:_OVQwen3_5ForCausalLM._prepare_position_ids_for_generation",
          "transformers 5.5's M-RoPE positions for generate() (optimum-intel's calls 5.5's get_rope_index without "
          "mm_token_type_ids)",
          "proof/vlm.optimum_vlm (validate(), consumer optimum-vlm); runtimes/visual.py (as a subclass's own "
          "methods: visual_generate.qwen3_5_generate_fixed_class)",
          parameters=("inputs_tensor", "model_kwargs"),
          reached_by=("transformers.generation.utils:GenerationMixin.generate",)),
    Patch("qwen3_5_generate_fixed",
          "optimum.intel.openvino.modeling_visual_language:_OVQwen3_5ForCausalLM.prepare_inputs_for_generation",
          "optimum-intel's, given the cache_position 5.5's generate() no longer passes and each call's own "
          "positions; generate() takes the processor's mm_token_type_ids",
          "proof/vlm.optimum_vlm (validate(), consumer optimum-vlm); runtimes/visual.py (as a subclass's own "
          "methods: visual_generate.qwen3_5_generate_fixed_class)",
          parameters=("input_ids", "past_key_values", "attention_mask", "inputs_embeds", "cache_position",
                      "position_ids"),
          reached_by=("transformers.generation.utils:GenerationMixin._sample",)),
    Patch("qwen3_5_generate_fixed", "optimum.intel.openvino.modeling_visual_language:_OVQwen3_5ForCausalLM",
          "Qwen3_5Model.get_vision_position_ids, which transformers 5.5's get_rope_index (borrowed by the class) "
          "calls",
          "proof/vlm.optimum_vlm (validate(), consumer optimum-vlm); runtimes/visual.py (as a subclass's own "
          "methods: visual_generate.qwen3_5_generate_fixed_class)",
          attribute="get_vision_position_ids",
          reached_by=("transformers.models.qwen3_5.modeling_qwen3_5:Qwen3_5Model.get_rope_index",)),
)

__all__ = [
    "PATCHES", "Patch", "attention_functions_wrapped", "cache_passed_through", "config_enums_serialized",
    "dynamic_graph_skipped", "experts_loaded_as_stored",
    "export_command_extended", "export_configs_replaced", "graphs_before_save", "main_export_wrapped",
    "main_quantize_wrapped", "mask_functions_wrapped", "model_loads_wrapped", "models_handed_over",
    "openvino_entries", "parallel_experts_upcast_one_at_a_time", "qwen3_5_generate_fixed", "task_registered",
    "transformers_cap_lifted", "unexpected_keys_ignored", "weights_compressed_in_slices",
]
