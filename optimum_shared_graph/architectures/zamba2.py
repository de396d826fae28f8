"""Zamba2 (Zyphra/Zamba2-*) under transformers 5.5: Mamba-2 mixers in the recurrent form optimum-intel uses for Granite 4.

What broke: optimum-intel's `Zamba2OpenVINOConfig` (capped at transformers 4.57.6) exports with
`Zamba2ModelPatcher`, which wraps the graph's states in a subclass of transformers' `Zamba2HybridDynamicCache`.
transformers 5.5 removed that class (Zamba2 keeps its convolution and SSM states and the shared attention's
keys and values in a `DynamicCache` built from the config), so the patcher fails on its import ("cannot import
name 'Zamba2HybridDynamicCache'"). Its patched mixer (`zamba2_mamba_mixer`) also reads
`cache_params.conv_states` / `ssm_states` and runs the prompt and the one-token step side by side.

What the fix does, in optimum-intel's own pieces (as its `GraniteMoeHybridModelPatcher` does for the
Mamba-2 layers of Granite 4 under transformers 5.5):

- the graph's states go to the model as one small cache holder (`Zamba2States`) in `past_key_values`: per
  layer a convolution and an SSM state (every Zamba2 layer has a Mamba-2 mixer), and the keys and values of
  the hybrid layers' shared attention, which the holder concatenates with the new ones (`update`) and
  sizes the causal mask from (`get_seq_length`, `get_mask_sizes`);
- each mixer is the transformers 5.5 `Zamba2MambaMixer.torch_forward` in recurrent form: the convolution is
  `ov_causal_conv1d` (the cached window before the new tokens) and the scan is optimum-intel's
  `SelectiveSSMRecurrentCell` (converted to an `ov::Loop`), one code path for the prompt and for each new
  token, starting from the state in the graph;
- the attention mask may be of the new tokens only (what `OVModelForCausalLM` sends Zamba2 after the prompt)
  or of the whole context (OpenVINO GenAI): the mixers use its last `seq_len` columns, and a mask shorter
  than the context is taken as ones for the earlier tokens before the causal mask is built. Its length is
  its own axis ("past_sequence_length + sequence_length", as in optimum-intel's granitemoehybrid config):
  optimum-intel's Zamba2 config names it "sequence_length", the axis of `input_ids`, and OpenVINO then
  computes every sequence length in the graph from the mask's, which breaks on a whole-context mask.

The graph keeps optimum-intel's interface (`input_ids`, `attention_mask`, and `cache_params.past.conv.{i}`
[batch, conv_dim, d_conv] and `cache_params.past.ssm.{i}` [batch, heads, head_dim, d_state] per layer,
`cache_params.past.key/value.{j}` per hybrid layer), states of the one stateful graph.

Known differences outside the graph: with a new-token mask after the prompt, a left-padded batch attends
its padding in the shared attention (the graph cannot know it; GenAI's whole-context mask has parity);
and transformers 5.5's CPU prompt scan is wrong past one chunk (`chunk_size`, 256 in the releases: its
inter-chunk recurrence sums over the wrong axis, transformers PR #47250), where the graph's recurrence
agrees with transformers' own token-by-token decoding.
"""

from __future__ import annotations

import types
from typing import Any

from ._states import AttentionStates, StatesForward, use_recurrent_cell

MODEL_TYPES = ("zamba2",)
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's Zamba2 export config with the states in a cache holder for the 5.5 model (transformers "
           "5.5 removed Zamba2HybridDynamicCache) and the Mamba-2 mixers in recurrent form (optimum-intel's "
           "ov_causal_conv1d and SelectiveSSMRecurrentCell as ov::Loop), as its GraniteMoeHybridModelPatcher does")


class Zamba2States(AttentionStates):
    """The graph's states, where the patched mixers and the shared attention read and replace them.

    Stands in for transformers' cache: each layer's Mamba-2 mixer reads and replaces `conv_states[layer]` /
    `ssm_states[layer]`; `update` appends the new keys and values of a hybrid layer (by model layer index).
    """

    def __init__(self, conv_states: list[Any], ssm_states: list[Any], key_cache: list[Any], value_cache: list[Any],
                 hybrid_layer_ids: list[int]):
        super().__init__(list(hybrid_layer_ids), key_cache, value_cache)
        self.conv_states = conv_states
        self.ssm_states = ssm_states


def zamba2_mixer_forward(self, hidden_states, conv_state, ssm_state, attention_mask=None):
    """`Zamba2MambaMixer.torch_forward` of transformers 5.5, recurrent: -> (output, new conv state, new SSM state).

    transformers masks padded tokens (before the input projection and after the convolution) on the
    prompt; on a new token the mask's last column is 1, so masking with the last `seq_len` columns is
    the same computation on both paths.
    """
    import torch
    from optimum.exporters.openvino.model_patcher import ov_causal_conv1d

    batch_size, seq_len, _ = hidden_states.shape
    dtype = hidden_states.dtype
    mask = None if attention_mask is None else attention_mask[:, -seq_len:, None].to(dtype)

    # 1. gated projection (split as transformers splits it; its MLP part, d_mlp, is empty for Zamba2's in_proj)
    if mask is not None:
        hidden_states = hidden_states * mask
    projected = self.in_proj(hidden_states)
    d_mlp = (projected.shape[-1] - 2 * self.intermediate_size - 2 * self.n_groups * self.ssm_state_size
             - self.num_heads) // 2
    _, _, gate, hidden_states_B_C, dt = projected.split(
        [d_mlp, d_mlp, self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)

    # 2. causal convolution over the cached window and the new tokens
    conv_out, new_conv_state = ov_causal_conv1d(conv_state, hidden_states_B_C.transpose(1, 2), self.conv1d.weight,
                                                self.conv1d.bias)
    hidden_states_B_C = self.act(conv_out.transpose(1, 2))
    if mask is not None:
        hidden_states_B_C = hidden_states_B_C * mask
    x, B, C = torch.split(hidden_states_B_C, [self.intermediate_size, self.n_groups * self.ssm_state_size,
                                              self.n_groups * self.ssm_state_size], dim=-1)

    # 3. selective scan, one ov::Loop iteration per token, from the state in the graph
    A = -torch.exp(self.A_log.float())
    dt = torch.clamp(torch.nn.functional.softplus(dt + self.dt_bias), self.time_step_min).float()
    x = x.reshape(batch_size, seq_len, self.num_heads, self.head_dim).float()
    B = B.reshape(batch_size, seq_len, self.n_groups, self.ssm_state_size).float()
    C = C.reshape(batch_size, seq_len, self.n_groups, self.ssm_state_size).float()
    out = self.selective_ssm_recurrent_cell(A, dt, B, x, C, ssm_state.float())
    elements = batch_size * seq_len * self.num_heads * self.head_dim
    y = out[:elements].reshape(batch_size, seq_len, self.num_heads, self.head_dim)
    new_ssm_state = out[elements:].reshape(ssm_state.shape)

    # 4. D skip, gated norm, output projection
    y = (y + x * self.D.view(1, 1, -1, 1)).reshape(batch_size, seq_len, -1)
    return self.out_proj(self.norm(y, gate).to(dtype)), new_conv_state, new_ssm_state


def _mixers(model) -> list:
    """Each layer's Mamba-2 mixer, in layer order (a hybrid layer's is in its `mamba_decoder`)."""
    return [layer.mamba_decoder.mamba if hasattr(layer, "mamba_decoder") else layer.mamba
            for layer in model.model.layers]


def _patcher_class() -> type:
    import torch
    from optimum.exporters.openvino.model_patcher import (
        OVDecoderModelPatcher,
        SelectiveSSMRecurrentCell,
        convert_recurrent_selective_ssm_cell,
    )

    class Zamba2StatesPatcher(StatesForward, OVDecoderModelPatcher):
        """Patches a Zamba2 causal LM for tracing: states in and out as one flat list, recurrent mixers."""

        def __init__(self, config, model, model_kwargs: dict[str, Any] | None = None):
            super().__init__(config, model, model_kwargs)
            use_recurrent_cell(self, SelectiveSSMRecurrentCell, convert_recurrent_selective_ssm_cell)

        def _states_forward(self, input_ids, attention_mask=None, cache_params=None):
            """`(input_ids, attention_mask, [conv, ssm per layer] + [key, value per hybrid layer])`
            -> `{logits, present_key_values}` in the same order (optimum-intel's Zamba2 interface)."""
            config = self._model.config
            if cache_params is None:
                return self._logits_only(input_ids, attention_mask)
            layers = config.num_hidden_layers
            states = Zamba2States(
                conv_states=list(cache_params[0:2 * layers:2]), ssm_states=list(cache_params[1:2 * layers:2]),
                key_cache=list(cache_params[2 * layers::2]), value_cache=list(cache_params[2 * layers + 1::2]),
                hybrid_layer_ids=list(config.hybrid_layer_ids))
            if attention_mask is not None:  # a mask of the new tokens only: ones for the earlier ones
                context = states.get_seq_length() + input_ids.shape[1]
                earlier = torch.ones(attention_mask.shape[0], context - attention_mask.shape[1],
                                     dtype=attention_mask.dtype)
                attention_mask = torch.cat([earlier, attention_mask], dim=1)
            result = self.model_orig_forward(input_ids=input_ids, attention_mask=attention_mask,
                                             past_key_values=states, use_cache=True)
            present = [state for pair in zip(states.conv_states, states.ssm_states) for state in pair]
            return {"logits": result.logits, "present_key_values": present + states.present_key_values()}

        def patch_modules(self):
            for mixer in _mixers(self._model):
                mixer.selective_ssm_recurrent_cell = SelectiveSSMRecurrentCell()
                mixer.forward = types.MethodType(_mixer_with_states, mixer)

        def restore_modules(self):
            for mixer in _mixers(self._model):  # back to the class's forward
                del mixer.forward, mixer.selective_ssm_recurrent_cell

    return Zamba2StatesPatcher


def _mixer_with_states(self, hidden_states, cache_params: Zamba2States | None = None, attention_mask=None, **kwargs):
    """The mixer's forward while patched: read this layer's states from the holder, put the new ones back."""
    import torch

    batch_size = hidden_states.shape[0]
    if cache_params is not None:
        conv_state = cache_params.conv_states[self.layer_idx]
        ssm_state = cache_params.ssm_states[self.layer_idx]
    else:
        conv_state = torch.zeros(batch_size, self.conv_dim, self.conv_kernel_size, dtype=hidden_states.dtype)
        ssm_state = torch.zeros(batch_size, self.num_heads, self.head_dim, self.ssm_state_size, dtype=torch.float32)
    out, new_conv_state, new_ssm_state = zamba2_mixer_forward(self, hidden_states, conv_state, ssm_state,
                                                              attention_mask)
    if cache_params is not None:
        cache_params.conv_states[self.layer_idx] = new_conv_state
        cache_params.ssm_states[self.layer_idx] = new_ssm_state
    return out


def export_config(base: type) -> type:
    """optimum-intel's `Zamba2OpenVINOConfig` `base`, uncapped, with `Zamba2StatesPatcher` as its patcher and the
    attention mask's length its own axis."""

    class Zamba2Config55(base):
        __doc__ = f"{base.__name__} for transformers 5.5 (optimum_shared_graph.architectures.zamba2)."
        MAX_TRANSFORMERS_VERSION = None
        _MODEL_PATCHER = _patcher_class()

        @property
        def inputs(self) -> dict[str, dict[int, str]]:
            # optimum-intel names the mask's length "sequence_length", the axis of input_ids, so OpenVINO takes
            # them as equal and a whole-context mask (GenAI's) breaks the graph; granitemoehybrid's config names
            # it "past_sequence_length + sequence_length", and the patcher takes either length
            inputs = super().inputs
            if self.use_past_in_inputs:
                inputs["attention_mask"] = {0: "batch_size", 1: "past_sequence_length + sequence_length"}
            return inputs

    Zamba2Config55.__name__ = Zamba2Config55.__qualname__ = base.__name__
    return Zamba2Config55
