"""Mamba and Falcon-Mamba under transformers 5.5: the mixer in the recurrent form optimum-intel uses for Mamba-2.

What broke: transformers 5.5 removed `MambaCache` (Mamba models keep their states in a `DynamicCache`
of `LinearAttentionLayer`s) and no longer passes `cache_position` to the mixer (`MambaBlock` calls
`mixer(hidden_states, cache_params=..., attention_mask=...)`), so optimum-intel's `MambaPatcher`
traces its patched mixer with `cache_position=None` and stops at `cache_position.shape`. Its export
config also caps transformers at 5.3.0.

What the fix does, in optimum-intel's own pieces (as its GraniteMoeHybridModelPatcher does for Mamba-2):

- the graph's per-layer states are passed to the model as one small holder (`MambaStates`) in
  `cache_params`, which transformers 5.5 hands to every block unchanged; each mixer reads its
  convolution and SSM state there and puts the new ones back, and the patched forward returns them;
- the convolution is `ov_causal_conv1d` (the cached window concatenated before the new tokens), one
  code path for the prompt and for each new token, so the graph needs no `cache_position`: the
  5.5 model appends every new token at the end of the window, and `OVModelForCausalLM` under 5.5
  counts `cache_position` from 1 after the prompt, which optimum-intel's `ConvSequenceTransform`
  would have used as the write slot;
- the selective scan is optimum-intel's `SelectiveSSMRecurrentCell` (converted to an `ov::Loop`),
  with Mamba-1's per-channel, per-state decay laid out as one head per (channel, state) pair.
  optimum-intel's vectorised `SelectiveScan` divides by the exponential of the decay summed to the
  end of the prompt (plus 1e-12), which vanishes on long prompts: with time steps of 0.05 and
  A = -1..-16, a 120-token prompt gets the outputs of its earlier tokens wrong by up to 1.07 where
  they are at most 1.85;
- falcon-mamba's RMS normalisation of B, C and the time step is applied as in transformers.

The graph keeps optimum-intel's names and states (`input_ids`, `attention_mask`, and per layer
`cache_params.past.ssm.{i}` [batch, intermediate, d_state] and `cache_params.past.conv.{i}`
[batch, intermediate, d_conv], states of the one stateful graph), without the `cache_position` input:
OVModelForCausalLM feeds it only when the graph has it, and OpenVINO GenAI cannot run a graph that
has it. The attention mask may be of the new tokens or of the whole context: the mixer uses its
last `seq_len` columns.
"""

from __future__ import annotations

import types
from typing import Any

from ._states import StatesForward, use_recurrent_cell

MODEL_TYPES = ("mamba", "falcon_mamba")
TRANSFORMERS = ">=5.5"
SUMMARY = ("the Mamba mixer with optimum-intel's ov_causal_conv1d and SelectiveSSMRecurrentCell (ov::Loop), its "
           "states passed in a holder as cache_params, no cache_position input (transformers 5.5 removed MambaCache "
           "and no longer passes cache_position to the mixer)")


class MambaStates:
    """The graph's per-layer SSM and convolution states, where the patched mixers read and replace them."""

    def __init__(self, ssm_states: list[Any], conv_states: list[Any]):
        self.ssm_states = ssm_states
        self.conv_states = conv_states


def _selective_scan(cell, A, dt, B, C, u, ssm_state):
    """Mamba-1's scan through optimum-intel's Mamba-2 `SelectiveSSMRecurrentCell`.

    Mamba-1 decays each (channel d, state n) pair by its own `exp(dt[d] * A[d, n])`; the Mamba-2 cell
    decays per head, so each (d, n) pair is one head with head_dim 1 and state size 1, and the
    readout sums the heads of a channel over n:
        state[d, n] = state[d, n] * exp(dt[d] * A[d, n]) + dt[d] * B[n] * u[d];  y[d] = sum_n state[d, n] * C[n]

    Args: A [D, N]; dt, u [batch, T, D]; B, C [batch, T, N]; ssm_state [batch, D, N] (all float32).
    Returns: y [batch, T, D] (without the D skip), the new ssm_state [batch, D, N].
    """
    batch, steps, channels = u.shape
    states = A.shape[-1]
    heads = channels * states

    def per_pair(x, channel_axis: bool):  # [batch, T, D] or [batch, T, N] -> [batch, T, D*N]
        x = x.unsqueeze(-1) if channel_axis else x.unsqueeze(-2)
        return x.expand(batch, steps, channels, states).reshape(batch, steps, heads)

    out = cell(A.reshape(heads), per_pair(dt, True), per_pair(B, False).unsqueeze(-1), per_pair(u, True).unsqueeze(-1),
               per_pair(C, False).unsqueeze(-1), ssm_state.reshape(batch, heads, 1, 1))
    y = out[: batch * steps * heads].reshape(batch, steps, channels, states).sum(dim=-1)
    return y, out[batch * steps * heads:].reshape(batch, channels, states)


def mamba_mixer_forward(self, input_states, cache_params: MambaStates | None = None, attention_mask=None, **kwargs):
    """`MambaMixer.slow_forward` / `FalconMambaMixer.slow_forward` of transformers 5.5, in a traceable recurrent form."""
    import torch
    from optimum.exporters.openvino.model_patcher import ov_causal_conv1d

    batch_size, seq_len, _ = input_states.shape
    dtype = input_states.dtype
    mask = None if attention_mask is None else attention_mask[:, -seq_len:].unsqueeze(1)

    # 1. gated projection: [batch, 2 * intermediate, T]
    hidden_states, gate = self.in_proj(input_states).transpose(1, 2).chunk(2, dim=1)
    if mask is not None:
        hidden_states = hidden_states * mask

    # 2. causal convolution over the cached window and the new tokens
    if cache_params is not None:
        conv_state = cache_params.conv_states[self.layer_idx]
        ssm_state = cache_params.ssm_states[self.layer_idx]
    else:
        conv_state = torch.zeros(batch_size, self.intermediate_size, self.conv_kernel_size, dtype=dtype)
        ssm_state = torch.zeros(batch_size, self.intermediate_size, self.ssm_state_size, dtype=torch.float32)
    hidden_states, new_conv_state = ov_causal_conv1d(conv_state, hidden_states, self.conv1d.weight, self.conv1d.bias)
    hidden_states = self.act(hidden_states)
    if mask is not None:
        hidden_states = hidden_states * mask

    # 3. selection: time step, B, C from the convolved states
    time_step, B, C = torch.split(self.x_proj(hidden_states.transpose(1, 2)),
                                  [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1)
    if self.ssm_rms_normalization is not None:  # falcon-mamba
        B = self.ssm_rms_normalization(B, variance_epsilon=self.rms_eps)
        C = self.ssm_rms_normalization(C, variance_epsilon=self.rms_eps)
        time_step = self.ssm_rms_normalization(time_step, variance_epsilon=self.rms_eps)
    dt = torch.nn.functional.softplus(self.dt_proj(time_step))  # [batch, T, intermediate]

    # 4. selective scan, recurrent (one ov::Loop iteration per token)
    A = -torch.exp(self.A_log.float())
    u = hidden_states.transpose(1, 2).float()
    y, new_ssm_state = _selective_scan(self.selective_ssm_recurrent_cell, A, dt.float(), B.float(), C.float(), u,
                                       ssm_state.float())
    scan_output = (y.to(dtype) + u.to(dtype) * self.D).transpose(1, 2) * self.act(gate)

    if cache_params is not None:
        cache_params.conv_states[self.layer_idx] = new_conv_state
        cache_params.ssm_states[self.layer_idx] = new_ssm_state
    return self.out_proj(scan_output.transpose(1, 2))


def _patcher_class() -> type:
    from optimum.exporters.openvino.model_patcher import (
        ModelPatcher,
        SelectiveSSMRecurrentCell,
        convert_recurrent_selective_ssm_cell,
    )

    class MambaStatesPatcher(StatesForward, ModelPatcher):
        """Patches a (Falcon)Mamba causal LM for tracing: states in and out as lists, recurrent mixers."""

        def __init__(self, config, model, model_kwargs: dict[str, Any] | None = None):
            super().__init__(config, model, model_kwargs)
            use_recurrent_cell(self, SelectiveSSMRecurrentCell, convert_recurrent_selective_ssm_cell)

        def _states_forward(self, input_ids, attention_mask=None, cache_params=None):
            """`(input_ids, attention_mask, [(ssm, conv) per layer]) -> {logits, cache_params_present}`."""
            if cache_params is None:
                return self._logits_only(input_ids, attention_mask)
            states = MambaStates([ssm for ssm, _ in cache_params], [conv for _, conv in cache_params])
            result = self.model_orig_forward(input_ids=input_ids, attention_mask=attention_mask,
                                             cache_params=states, use_cache=True)
            return {"logits": result.logits,
                    "cache_params_present": list(zip(states.ssm_states, states.conv_states))}

        def patch_modules(self):
            rms = None
            if self._model.config.model_type == "falcon_mamba":
                from transformers.models.falcon_mamba.modeling_falcon_mamba import rms_forward as rms
            for layer in self._model.backbone.layers:
                mixer = layer.mixer
                mixer.ssm_rms_normalization = rms
                mixer.selective_ssm_recurrent_cell = SelectiveSSMRecurrentCell()
                mixer.forward = types.MethodType(mamba_mixer_forward, mixer)

        def restore_modules(self):
            for layer in self._model.backbone.layers:  # back to the classes' forward
                del layer.mixer.forward, layer.mixer.ssm_rms_normalization, layer.mixer.selective_ssm_recurrent_cell

    return MambaStatesPatcher


def export_config(base: type) -> type:
    """optimum-intel's `MambaOpenVINOConfig` without its 5.3.0 cap and without `cache_position`, patched for 5.5."""

    class MambaConfig55(base):
        __doc__ = f"{base.__name__} for transformers 5.5 (see {__name__})."
        MAX_TRANSFORMERS_VERSION = None
        _MODEL_PATCHER = _patcher_class()

        @property
        def inputs(self) -> dict[str, dict[int, str]]:
            return {name: axes for name, axes in super().inputs.items() if name != "cache_position"}

    MambaConfig55.__name__ = MambaConfig55.__qualname__ = base.__name__
    return MambaConfig55
