"""Gemma 4 text decoder (`gemma4_text`, google/gemma-4-*): optimum-intel's export under transformers 5.5.

What broke: optimum-intel's `Gemma4TextOpenVINOConfig` cannot trace a `Gemma4ForCausalLM` under
transformers 5.5.4, for four reasons of its own (none is the model's):

- its dummy cache (`Gemma4DummyPastKeyValuesGenerator`) gives the sliding-attention layers a past of
  `sliding_window` tokens and the full-attention layers a past of the dummy sequence length. The
  patcher it runs with (`Gemma2ModelPatcher`, inherited from the Gemma 2 config) turns the tuples into
  a plain `DynamicCache`, so the layers see different past lengths, the attention mask is sized from
  layer 0 (a sliding layer: past 512 + 16 = 528 slots) and the first full-attention layer's scores
  (16 + 16 = 32 keys) cannot take it: "The size of tensor a (32) must match the size of tensor b (528)".
  Any config does this whose `sliding_window` is not the dummy sequence length (the released
  checkpoints have 512 or 1024); `Gemma4LMModelPatcher`, which slices the mask per layer, is written
  for the vision-language model's `language_model` and does not apply to `Gemma4ForCausalLM`.
- `Gemma2ModelPatcher` wraps whatever `past_key_values` it gets in a new `DynamicCache`, so a
  transformers `Cache` (what the static export passes) fails with "'Cache' object is not iterable".
- for the MoE checkpoints (gemma-4-26B-A4B, `enable_moe_block`) transformers' default expert dispatch
  traces `aten::histc`, which OpenVINO cannot convert; optimum-intel patches the experts only in the
  vision-language model's patcher.
- the config inherits `MAX_TRANSFORMERS_VERSION = "5.0"` from the Gemma config although it requires
  transformers >= 5.5 (`MIN_TRANSFORMERS_VERSION`): it refuses every version it supports.

The fix: a dummy cache with one past length for every KV-producing layer (the layers before the
`num_kv_shared_layers` ones, with each layer type's KV heads and head size, as `Gemma4TextAttention`
sizes them), which is what the exported graph holds at run time: a plain per-layer cache that grows by
the new tokens, the sliding window applied by the attention mask. The patcher passes a `Cache` through
as it is (legacy tuples still become a `DynamicCache`), computes MoE experts densely with optimum-intel's
`lfm2_moe_experts_forward` (as its `Gemma4LMModelPatcher` does), and the version cap is lifted. Which layers
produce KV is `Gemma4TextAttention`'s rule (layer i shares when i >= num_hidden_layers - num_kv_shared_layers > 0),
for the dummy cache and for the KV inputs and outputs the config declares (`add_past_key_values`): optimum-intel's
slices `layer_types[:-num_kv_shared_layers]`, which is no layer at all where `num_kv_shared_layers` exceeds the
layer count, though PyTorch then shares none (its conversion stopped at "list index out of range"). The graph's
interface is optimum-intel's own (`past_key_values.{i}.key/value` for the KV-producing layers,
`position_ids`), and every export is validated against PyTorch.

The vision-language model (`gemma4`, `--task image-text-to-text-shared`) breaks the same way: optimum-intel's
`Gemma4OpenVINOConfig` builds its language part from the `gemma4_text` text-generation config, whose dummy cache
gives the sliding layers a past of `sliding_window` tokens ("The size of tensor a (32) must match the size of
tensor b (24)" on the tiny checkpoint, traced by its own `Gemma4LMModelPatcher`). `vlm_export_config` builds that
part from the fixed text config above (one past length for every KV-producing layer); the patcher and every other
part (vision embeddings, text embeddings, per-layer text embeddings) are optimum-intel's.
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import Any

MODEL_TYPES = ("gemma4_text",)
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's Gemma4TextOpenVINOConfig with one past length for every KV-producing layer in the "
           "dummy cache (sliding and full layers had different ones), a patcher that passes a transformers Cache "
           "through, MoE experts computed densely (optimum-intel's lfm2_moe_experts_forward), and its inherited 5.0 "
           "cap lifted")


VLM_MODEL_TYPES = ("gemma4",)
VLM_SUMMARY = ("optimum-intel's Gemma4OpenVINOConfig with its language part built from the fixed gemma4_text config "
               "(one past length for every KV-producing layer in the dummy cache); its own patchers for every part")


def kv_layer_shapes(config) -> list[tuple[int, int]]:
    """`(kv_heads, head_dim)` of each layer that writes its own KV cache, in order.

    The last `num_kv_shared_layers` layers read another layer's keys and values and have no cache of
    their own, by `Gemma4TextAttention`'s rule: layer i shares when i >= num_hidden_layers -
    num_kv_shared_layers > 0 (so none shares when `num_kv_shared_layers` exceeds the layers, as PyTorch
    runs it). Full-attention layers use `global_head_dim` (when set), and `num_global_key_value_heads`
    when `attention_k_eq_v` makes them share one projection for keys and values (`Gemma4TextAttention`).
    """
    first_shared = config.num_hidden_layers - (config.num_kv_shared_layers or 0)
    layer_types = list(config.layer_types)
    if first_shared > 0:
        layer_types = layer_types[:first_shared]
    shapes = []
    for layer_type in layer_types:
        full = layer_type != "sliding_attention"
        head_dim = config.global_head_dim if full and config.global_head_dim else config.head_dim
        heads = config.num_global_key_value_heads if full and config.attention_k_eq_v else config.num_key_value_heads
        shapes.append((heads, head_dim))
    return shapes


def _past_generator(base: type) -> type:
    """optimum-intel's Gemma 4 dummy cache generator with the same past length for every layer."""

    class Gemma4SameLengthPastKeyValuesGenerator(base):
        """Dummy `past_key_values`: `[batch, kv_heads, sequence_length, head_dim]` per KV-producing layer."""

        def __init__(self, task: str, normalized_config, **kwargs):
            super().__init__(task, normalized_config, **kwargs)
            self.text_config = normalized_config.config

        def generate(self, input_name: str, framework: str = "pt", int_dtype: str = "int64",
                     float_dtype: str = "fp32"):
            past = []
            for heads, head_dim in kv_layer_shapes(self.text_config):
                shape = (self.batch_size, heads, self.sequence_length, head_dim)
                past.append((self.random_float_tensor(shape, framework=framework, dtype=float_dtype),
                             self.random_float_tensor(shape, framework=framework, dtype=float_dtype)))
            return past

    return Gemma4SameLengthPastKeyValuesGenerator


def _patcher(base: type) -> type:
    """optimum-intel's patcher for the text config, with a transformers `Cache` passed through unchanged."""
    from optimum.exporters.openvino.model_patcher import lfm2_moe_experts_forward
    from optimum.exporters.openvino.patching_utils import override_arguments
    from transformers.cache_utils import Cache

    class Gemma4TextModelPatcher(base):
        """`base`'s forward for legacy `(key, value)` tuples (the dynamic export); a `Cache` (the static
        export's fixed-capacity layers) goes to the model's own forward as it is."""

        def __init__(self, config, model, model_kwargs: dict[str, Any] | None = None):
            super().__init__(config, model, model_kwargs)
            legacy_forward = self.patched_forward
            model_forward = self.orig_forward

            @functools.wraps(model_forward)
            def patched_forward(*args, **kwargs):
                signature = inspect.signature(model_forward)
                bound = signature.bind_partial(*args, **kwargs).arguments
                if isinstance(bound.get("past_key_values"), Cache):
                    args, kwargs = override_arguments(args, kwargs, signature, model_kwargs=self.model_kwargs)
                    return model_forward(*args, **kwargs)
                return legacy_forward(*args, **kwargs)

            self.patched_forward = patched_forward

        def __enter__(self):
            super().__enter__()
            # MoE layers (gemma-4-26B-A4B): every expert computed densely with batched matmuls, as
            # optimum-intel's Gemma4LMModelPatcher does for the vision-language model (transformers'
            # default expert dispatch traces `aten::histc`, which OpenVINO cannot convert)
            for layer in self._model.model.layers:
                experts = getattr(layer, "experts", None)
                if experts is not None:
                    experts._orig_forward = experts.forward
                    experts.forward = types.MethodType(lfm2_moe_experts_forward, experts)

        def __exit__(self, exc_type, exc_value, traceback):
            super().__exit__(exc_type, exc_value, traceback)
            for layer in self._model.model.layers:
                experts = getattr(layer, "experts", None)
                if experts is not None and hasattr(experts, "_orig_forward"):
                    experts.forward = experts._orig_forward
                    del experts._orig_forward

    return Gemma4TextModelPatcher


def _add_past_key_values(self, inputs_or_outputs: dict[str, dict[int, str]], direction: str) -> None:
    """optimum-intel's `Gemma4TextOpenVINOConfig.add_past_key_values` with one key and value per layer of
    `kv_layer_shapes` (its own slices `layer_types[:-num_kv_shared_layers]`, none when that exceeds the layers)."""
    if direction not in ("inputs", "outputs"):
        raise ValueError(f'direction must either be "inputs" or "outputs", but {direction} was given')
    name = "past_key_values" if direction == "inputs" else "present"
    sequence = "past_sequence_length" if direction == "inputs" else "past_sequence_length + sequence_length"
    for i in range(len(kv_layer_shapes(self._normalized_config.config))):
        inputs_or_outputs[f"{name}.{i}.key"] = {0: "batch_size", 2: sequence}
        inputs_or_outputs[f"{name}.{i}.value"] = {0: "batch_size", 2: sequence}


def export_config(base: type) -> type:
    """`base` (optimum-intel's `Gemma4TextOpenVINOConfig`) with a consistent dummy cache and KV inputs, a patcher
    that takes a `Cache`, and no transformers cap."""
    from optimum.exporters.openvino.model_patcher import Gemma2ModelPatcher

    generator = _past_generator(base.DUMMY_PKV_GENERATOR_CLASS)
    generators = tuple(generator if cls is base.DUMMY_PKV_GENERATOR_CLASS else cls
                       for cls in base.DUMMY_INPUT_GENERATOR_CLASSES)
    return type(base.__name__, (base,), {
        "__doc__": f"optimum-intel's {base.__name__}, fixed for transformers {TRANSFORMERS} "
                   f"(optimum_shared_graph.architectures.gemma4).",
        "DUMMY_PKV_GENERATOR_CLASS": generator,
        "DUMMY_INPUT_GENERATOR_CLASSES": generators,
        "add_past_key_values": _add_past_key_values,
        "_MODEL_PATCHER": _patcher(getattr(base, "_MODEL_PATCHER", Gemma2ModelPatcher)),
        "MAX_TRANSFORMERS_VERSION": None,
    })


def vlm_export_config(base: type) -> type:
    """`base` (optimum-intel's `Gemma4OpenVINOConfig`) whose language part is built while `gemma4_text`'s
    text-generation config is `export_config`'s (the dummy cache of one past length)."""
    from ..host import export_configs_replaced

    def with_behavior(self, behavior):
        if str(getattr(behavior, "value", behavior)) != "language":
            return base.with_behavior(self, behavior)
        with export_configs_replaced("gemma4_text", ("text-generation-with-past",), export_config):
            return base.with_behavior(self, behavior)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__}, its language part from the fixed gemma4_text config (see {__name__}).",
        "with_behavior": with_behavior,
    })
