"""Mixture-of-experts checkpoints exported with their experts as the checkpoint stores them: memory-mapped, never
fused into new tensors.

What it costs without this: transformers 5 merges a checkpoint's per-expert tensors
(`mlp.experts.{e}.gate_proj.weight`, ...) into fused `gate_up_proj` / `down_proj` tensors as the model loads (its
`conversion_mapping.py`): new memory the size of every expert, which are 95% of a Qwen3-30B-A3B. The capture's float32
compute then upcast a whole decoder layer at a time (every expert of it), and OpenVINO's conversion of optimum-intel's
expert form (`lfm2_moe_experts_forward`: the fused tensor chunked and transposed) folds those views into new float32
constants. A 2-layer model of Qwen3-30B-A3B's widths held 2.2x its checkpoint in anonymous memory before the
validation.

The families (`FAMILIES`): qwen3_moe, qwen2_moe, mixtral, phimoe, gpt_oss and afmoe, whose only fix this is, and
deepseek_v2/v3, lfm2_moe, qwen3_next, qwen3_5_moe_text (and the multimodal qwen3_5_moe's language model) and
llama4_text, whose fix modules compose their export configs and loads with this one (`export_config(their_config)`,
`while_exporting`). Llama 4's experts are fused and transposed, and its block scales their inputs
(`Llama4StoredExperts`).
Qwen3.5-MoE's checkpoints store each layer's experts fused (`experts.gate_up_proj`), which transformers loads
memory-mapped as they are; `FusedStoredExperts` keeps them so and gives the capture and the trace per-expert views of
them. gpt-oss's are fused too, transposed, the gate and up columns interleaved, with biases (`GptOssStoredExperts`:
traced in optimum-intel's gpt-oss form, which the CPU plugin fuses into two `GatherMatmul`s per layer).

What this module does instead, in three places, each without a copy of the experts:

* the load (`while_exporting`, host/'s `experts_loaded_as_stored`): the model's experts module is `StoredExperts`,
  one small module per expert with the checkpoint's own projection names, and the fusing conversions are left out,
  so transformers loads every expert's tensors memory-mapped from the safetensors file, as it does a dense model's;
* the capture: `StoredExperts.forward` runs only the routed experts (transformers' own loop), and under the
  capture's float32 compute upcasts one expert's projection at a time (`computes_fp32_itself`);
* the conversion (`export_config`'s patcher): each layer's experts are written once, stacked as optimum-intel's form
  reads them (`[experts, out, in]` per projection, 16-bit), into a file in the export's staging directory that is
  unlinked as soon as it is mapped (a killed export leaves nothing); each stacked projection is traced as an
  `nn.Linear` over the batched weight (`stacked_projection`), so OpenVINO's constants share those file pages and
  optimum-intel saves them into the `.bin` from there. The graph is optimum-intel's form without the chunk of a
  fused tensor: per expert the gate, up and down matmuls over all tokens weighted by the scattered top-k gates,
  which OpenVINO's CPU plugin turns into `GatherMatmul`s over the routed experts. Validation runs such a graph in
  parts that end inside its layers (`graph/experts.py`).
"""

from __future__ import annotations

import contextlib
import os
import types
from pathlib import Path
from typing import Iterator, Self

import torch

# the types whose only fix is this one (deepseek_v2/v3, lfm2_moe, qwen3_next and llama4_text have fix modules of
# their own, whose export configs and loads go through `export_config` and `while_exporting` here too)
MODEL_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral", "phimoe", "gpt_oss", "afmoe")
TRANSFORMERS = ">=5.0"  # the release that fuses experts at load (written and tested under 5.5)
SUMMARY = ("the experts loaded as the checkpoint stores them (memory-mapped, not fused into new tensors), the routed "
           "ones computed one at a time for the capture, and converted from one stacked copy in an unlinked file")

FUSED = ("gate_up_proj", "down_proj")  # a checkpoint's fused experts tensors, `[experts, 2 x inner, hidden]` and
# `[experts, hidden, inner]`

# model type -> (transformers' modeling module, its experts class, the checkpoint's gate, up and down projections,
# or `FUSED`, or the class of a layout of its own: gpt_oss, below)
FAMILIES: dict[str, tuple[str, str, tuple[str, ...] | type]] = {
    "qwen3_moe": ("transformers.models.qwen3_moe.modeling_qwen3_moe", "Qwen3MoeExperts",
                  ("gate_proj", "up_proj", "down_proj")),
    "qwen2_moe": ("transformers.models.qwen2_moe.modeling_qwen2_moe", "Qwen2MoeExperts",
                  ("gate_proj", "up_proj", "down_proj")),
    "mixtral": ("transformers.models.mixtral.modeling_mixtral", "MixtralExperts", ("w1", "w3", "w2")),
    "phimoe": ("transformers.models.phimoe.modeling_phimoe", "PhimoeExperts", ("w1", "w3", "w2")),
    "deepseek_v2": ("transformers.models.deepseek_v2.modeling_deepseek_v2", "DeepseekV2Experts",
                    ("gate_proj", "up_proj", "down_proj")),
    "deepseek_v3": ("transformers.models.deepseek_v3.modeling_deepseek_v3", "DeepseekV3NaiveMoe",
                    ("gate_proj", "up_proj", "down_proj")),
    "lfm2_moe": ("transformers.models.lfm2_moe.modeling_lfm2_moe", "Lfm2MoeExperts", ("w1", "w3", "w2")),
    "qwen3_next": ("transformers.models.qwen3_next.modeling_qwen3_next", "Qwen3NextExperts",
                   ("gate_proj", "up_proj", "down_proj")),
    "afmoe": ("transformers.models.afmoe.modeling_afmoe", "AfmoeExperts", ("gate_proj", "up_proj", "down_proj")),
    # a checkpoint that stores each layer's experts fused (`experts.gate_up_proj`, `experts.down_proj`), as
    # transformers 5 holds them: loaded memory-mapped as they are (`FusedStoredExperts`)
    "qwen3_5_moe_text": ("transformers.models.qwen3_5_moe.modeling_qwen3_5_moe", "Qwen3_5MoeExperts", FUSED),
}
# the multimodal Qwen3.5-MoE (`--task image-text-to-text-shared`): its language model is the text model above
FAMILIES["qwen3_5_moe"] = FAMILIES["qwen3_5_moe_text"]


class _Expert(torch.nn.Module):
    """One expert, its three projections under the checkpoint's names."""

    def __init__(self, hidden: int, intermediate: int, names: tuple[str, str, str]):
        super().__init__()
        gate, up, down = names
        setattr(self, gate, torch.nn.Linear(hidden, intermediate, bias=False))
        setattr(self, up, torch.nn.Linear(hidden, intermediate, bias=False))
        setattr(self, down, torch.nn.Linear(intermediate, hidden, bias=False))


class StoredExperts(torch.nn.ModuleList):
    """A MoE layer's experts as the checkpoint stores them (`experts.{e}.<projection>.weight`), in the call
    signature of transformers 5's fused experts module: `(hidden_states [tokens, hidden], top_k_index, top_k_weights)`.
    """

    names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    # pipeline/reference.py's float32 compute leaves this subtree's 16-bit weights alone: forward upcasts them itself,
    # one expert's projection at a time, instead of the whole layer's experts at once
    computes_fp32_itself = True

    def __init__(self, config):
        from transformers.activations import ACT2FN

        intermediate = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        experts = (getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
                   or config.n_routed_experts)
        super().__init__([_Expert(config.hidden_size, intermediate, self.names) for _ in range(experts)])
        self.num_experts = experts
        # not a child: the list holds the experts only (LFM2-MoE's config names no activation: its experts' SiLU)
        self.__dict__["act_fn"] = ACT2FN[getattr(config, "hidden_act", None) or "silu"]
        # no tensors of its own: transformers' initialisation of the fused class (whose name this class takes during
        # the load) would look for them; each expert's projections are initialised, where missing, as any nn.Linear
        self._is_hf_initialized = True

    def _projections(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The gate, up and down weights of `expert`, `[out, in]` (views of the loaded tensors)."""
        module = self[expert]
        return tuple(getattr(module, name).weight for name in self.names)

    def _biases(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The gate, up and down biases of `expert`, or None (the experts have none)."""
        return None

    def _gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """The expert's inner activation from its gate and up projections."""
        return self.act_fn(gate) * up

    def _stacked(self, expert: int) -> tuple[torch.Tensor, ...]:
        """The weights `[out, in]` of `expert` the conversion stacks over the experts (`_stack`), in `_traced`'s order."""
        return self._projections(expert)

    def _stacked_biases(self, expert: int) -> tuple[torch.Tensor, ...] | None:
        """The biases of `expert` the conversion stacks (`[experts, 1, out]` each), or None."""
        return None

    def _traced(self, hidden_states, top_k_index, top_k_weights):
        """The form the conversion traces, over `self.stacked` (`stacked_forward`)."""
        return stacked_forward(self, hidden_states, top_k_index, top_k_weights)

    def forward(self, hidden_states, top_k_index, top_k_weights):
        """transformers' own loop over the routed experts (each token's top-k), an expert's weights in the input's
        dtype while it computes."""
        linear = torch.nn.functional.linear
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():
            mask = torch.nn.functional.one_hot(top_k_index, num_classes=self.num_experts).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert in hit[:, 0].tolist():
            top_k_pos, token_idx = torch.where(mask[expert])
            state = hidden_states[token_idx]
            gate, up, down = (w.to(state.dtype) for w in self._projections(expert))
            biases = self._biases(expert)
            gate_b, up_b, down_b = (None,) * 3 if biases is None else (b.to(state.dtype) for b in biases)
            out = linear(self._gated(linear(state, gate, gate_b), linear(state, up, up_b)), down, down_b)
            out = out * top_k_weights[token_idx, top_k_pos, None]
            final.index_add_(0, token_idx, out.to(final.dtype))
        return final


class FusedStoredExperts(StoredExperts):
    """A MoE layer's experts as a checkpoint stores them fused (`experts.gate_up_proj` `[experts, 2 x inner,
    hidden]`, `experts.down_proj` `[experts, hidden, inner]`), loaded memory-mapped as they are: each expert's
    projections are views of them, computed and stacked for the trace as `StoredExperts`' are."""

    names = FUSED

    def __init__(self, config):
        from transformers.activations import ACT2FN

        torch.nn.ModuleList.__init__(self)
        inner, experts = config.moe_intermediate_size, config.num_experts
        self.gate_up_proj = torch.nn.Parameter(torch.empty(experts, 2 * inner, config.hidden_size))
        self.down_proj = torch.nn.Parameter(torch.empty(experts, config.hidden_size, inner))
        self.num_experts = experts
        self.__dict__["act_fn"] = ACT2FN[config.hidden_act]
        self._is_hf_initialized = True

    def _projections(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gate_up = self.gate_up_proj[expert]
        inner = gate_up.shape[0] // 2
        return gate_up[:inner], gate_up[inner:], self.down_proj[expert]


class GptOssStoredExperts(FusedStoredExperts):
    """gpt-oss's experts as its checkpoints store them (`gate_up_proj` `[experts, hidden, 2 x inner]`, the gate and up
    columns interleaved, `down_proj` `[experts, inner, hidden]`, each with a bias), loaded memory-mapped as they
    are: each expert's projections are (transposed, strided) views of them, and its activation is gpt-oss's clamped
    GLU (`GptOssExperts._apply_gate`)."""

    def __init__(self, config):
        torch.nn.ModuleList.__init__(self)
        inner, hidden, experts = config.intermediate_size, config.hidden_size, config.num_local_experts
        self.gate_up_proj = torch.nn.Parameter(torch.empty(experts, hidden, 2 * inner))
        self.gate_up_proj_bias = torch.nn.Parameter(torch.empty(experts, 2 * inner))
        self.down_proj = torch.nn.Parameter(torch.empty(experts, inner, hidden))
        self.down_proj_bias = torch.nn.Parameter(torch.empty(experts, hidden))
        self.num_experts = experts
        self.alpha, self.limit = 1.702, 7.0  # transformers' GptOssExperts'
        self._is_hf_initialized = True

    def _projections(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gate_up = self.gate_up_proj[expert]
        return gate_up[:, ::2].t(), gate_up[:, 1::2].t(), self.down_proj[expert].t()

    def _biases(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gate_up = self.gate_up_proj_bias[expert]
        return gate_up[::2], gate_up[1::2], self.down_proj_bias[expert]

    def _gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(min=None, max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))

    def _stacked(self, expert: int) -> tuple[torch.Tensor, ...]:
        # the gate and up columns kept interleaved in one projection: the form OpenVINO's CPU plugin fuses into two
        # `GatherMatmul`s (its `ConvertTiledMoeBlockTo2GatherMatmuls`: one product, its bias, two strided slices)
        return self.gate_up_proj[expert].t(), self.down_proj[expert].t()

    def _stacked_biases(self, expert: int) -> tuple[torch.Tensor, ...]:
        return self.gate_up_proj_bias[expert], self.down_proj_bias[expert]

    def _traced(self, hidden_states, top_k_index, top_k_weights):
        """optimum-intel's gpt-oss form (`batched_mm_experts_forward_patched`) over the stacked projections."""
        expanded, weigh = _every_expert(self, hidden_states, top_k_index, top_k_weights)
        (gate_up_proj, down_proj), (gate_up_bias, down_bias) = self.stacked, self.stacked_biases
        gate_up = gate_up_proj(expanded) + gate_up_bias
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        return weigh(down_proj(self._gated(gate, up)) + down_bias)


FAMILIES["gpt_oss"] = ("transformers.models.gpt_oss.modeling_gpt_oss", "GptOssExperts", GptOssStoredExperts)


class Llama4StoredExperts(FusedStoredExperts):
    """Llama 4's experts as its checkpoints store them (`gate_up_proj` `[experts, hidden, 2 x inner]`, the gate half
    first, `down_proj` `[experts, inner, hidden]`), loaded memory-mapped as they are. Llama 4's MoE block
    (`Llama4TextMoe`, transformers' forward, kept) scales each expert's copy of the tokens by its router score (zero
    where the token was not routed to it) and sums the experts' outputs; the experts module takes those copies,
    `[experts x tokens, hidden]`, and returns the experts' outputs in the same layout."""

    def __init__(self, config):
        from transformers.activations import ACT2FN

        torch.nn.ModuleList.__init__(self)
        inner, hidden, experts = config.intermediate_size, config.hidden_size, config.num_local_experts
        self.gate_up_proj = torch.nn.Parameter(torch.empty(experts, hidden, 2 * inner))
        self.down_proj = torch.nn.Parameter(torch.empty(experts, inner, hidden))
        self.num_experts = experts
        self.__dict__["act_fn"] = ACT2FN[config.hidden_act]
        self._is_hf_initialized = True

    def _projections(self, expert: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        gate_up = self.gate_up_proj[expert]
        inner = gate_up.shape[1] // 2
        return gate_up[:, :inner].t(), gate_up[:, inner:].t(), self.down_proj[expert].t()

    def forward(self, hidden_states):
        """transformers' `Llama4TextExperts.forward`, one expert at a time, its weights in the input's dtype while
        it computes; an expert none of whose tokens was routed to it (its copy all zeros) gives zeros, uncomputed."""
        linear = torch.nn.functional.linear
        routed = hidden_states.view(self.num_experts, -1, hidden_states.shape[-1])
        out = torch.zeros_like(routed)
        for expert in range(self.num_experts):
            state = routed[expert]
            rows = state.abs().sum(dim=-1) != 0  # an unrouted token's copy is exactly zero: so is its output
            if not bool(rows.any()):
                continue
            gate, up, down = (w.to(state.dtype) for w in self._projections(expert))
            x = state[rows]
            out[expert, rows] = linear(self._gated(linear(x, gate), linear(x, up)), down)
        return out.view(-1, hidden_states.shape[-1])

    def _traced(self, hidden_states):
        """The stacked projections over every expert's copy of the tokens, returned `[experts, tokens, hidden]` (the
        block reshapes them so: a Reshape that keeps the shape, which graph/experts.py finds its MoE block through,
        so validation sums it over ranges of its experts)."""
        gate_proj, up_proj, down_proj = self.stacked
        routed = hidden_states.view(self.num_experts, -1, hidden_states.shape[-1])
        return down_proj(self._gated(gate_proj(routed), up_proj(routed)))


FAMILIES["llama4_text"] = ("transformers.models.llama4.modeling_llama4", "Llama4TextExperts", Llama4StoredExperts)


def stacked_forward(self, hidden_states, top_k_index, top_k_weights):
    """The traced form: optimum-intel's `lfm2_moe_experts_forward` (every expert on every token, weighted by the
    scattered top-k gates) over the stacked projections, gate and up apart (no chunk for OpenVINO to fold)."""
    expanded, weigh = _every_expert(self, hidden_states, top_k_index, top_k_weights)
    gate_proj, up_proj, down_proj = self.stacked
    return weigh(down_proj(self._gated(gate_proj(expanded), up_proj(expanded))))


def _every_expert(experts, hidden_states, top_k_index, top_k_weights):
    """The traced form's two ends: the tokens repeated for every expert `[experts, tokens, hidden]`, and what sums
    the experts' outputs weighted by the scattered top-k gates (the form OpenVINO's CPU plugin fuses)."""
    routing = top_k_weights.to(hidden_states.dtype)
    tokens, hidden = hidden_states.shape
    dense = torch.zeros(tokens, experts.num_experts, dtype=hidden_states.dtype, device=hidden_states.device)
    dense.scatter_(dim=1, index=top_k_index, src=routing)
    expanded = hidden_states.repeat(experts.num_experts, 1).view(experts.num_experts, -1, hidden)

    def weigh(out):
        # the view is a no-op that OpenVINO's CPU plugin's GatherMatmul fusion expects there (without it: none)
        gates = dense.transpose(0, 1).view(experts.num_experts, tokens)[..., None]
        return (out.view(experts.num_experts, tokens, hidden) * gates).sum(dim=0)

    return expanded, weigh


def stacked_projection(weight: torch.Tensor) -> torch.nn.Linear:
    """One projection of every expert of a layer as the trace sees it: an `nn.Linear` over the batched weight
    `[experts, out, in]` (in the checkpoint's 16 bits), `[experts, tokens, in] -> [experts, tokens, out]`.

    OpenVINO's 16-bit tracing (`__make_16bit_traceable`, which optimum-intel applies) records an `nn.Linear` as one
    operation reading its 16-bit weight as a parameter, and its frontend makes of it MatMul(x, Convert(weight),
    transpose_b): the weight's constant shares the file's pages, and the form is the one OpenVINO's CPU plugin fuses
    into a `GatherMatmul` over the routed experts. Traced as `torch.bmm` over a transposed weight (optimum-intel's
    form), the frontend folds the transpose and the Convert into a new float32 constant: twice the experts' bytes in
    anonymous memory; held outside the module's tensors, torch's trace check compares them as constants, with
    temporaries the size of the weights."""
    linear = torch.nn.Linear(1, 1, bias=False)
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    linear.in_features, linear.out_features = weight.shape[2], weight.shape[1]
    # what runs where the 16-bit tracing does not replace it (a float32 checkpoint): the batched product
    linear.forward = types.MethodType(_batched_linear, linear)
    return linear


def _batched_linear(self, x: torch.Tensor) -> torch.Tensor:
    return torch.bmm(x, self.weight.transpose(1, 2).to(x.dtype))


def _experts_class(model_type: str) -> type:
    names = FAMILIES[model_type][2]
    if isinstance(names, type):  # a layout of its own (gpt-oss)
        return names
    base = FusedStoredExperts if names == FUSED else StoredExperts
    return type(f"Stored{FAMILIES[model_type][1]}", (base,), {"names": names, "__module__": __name__})


_scratch: list[Path | None] = []  # where the conversion's stacked experts are written (the export's staging directory)


@contextlib.contextmanager
def while_exporting(model_type: str, scratch: Path | None = None) -> Iterator[None]:
    """For one export of `model_type`: its experts load as stored (host/'s `experts_loaded_as_stored`), and the
    conversion writes their stacked copies under `scratch` (None: the system's temporary directory). A type without
    experts of `FAMILIES` (LFM2, dense Qwen3.5, sharing a fix module with a MoE type) loads as it would anyway."""
    from ..host import experts_loaded_as_stored

    if model_type not in FAMILIES:
        yield
        return

    modeling, class_name, _ = FAMILIES[model_type]
    _scratch.append(None if scratch is None else Path(scratch))
    try:
        with experts_loaded_as_stored(modeling, class_name, _experts_class(model_type)):
            yield
    finally:
        _scratch.pop()


def _mapped(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed tensor whose memory is a file's pages (reclaimable, not anonymous), the file unlinked at once."""
    import tempfile

    directory = _scratch[-1] if _scratch else None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    handle, path = tempfile.mkstemp(prefix="experts.", dir=directory)
    try:
        count = 1
        for size in shape:
            count *= size
        os.ftruncate(handle, count * torch.empty((), dtype=dtype).element_size())
        tensor = torch.from_file(path, shared=True, size=count, dtype=dtype).view(shape)
    finally:
        os.close(handle)
        os.unlink(path)
    return tensor


def mapped_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` in file pages (`_mapped`): reclaimable memory, not anonymous."""
    copy = _mapped(tuple(tensor.shape), tensor.dtype)
    copy.copy_(tensor)
    return copy


def _stack(experts: StoredExperts) -> None:
    """Give `experts` its stacked projections (`[experts, out, in]`, file-backed) and the traced forward."""
    first = experts._stacked(0)
    stacked = [_mapped((experts.num_experts, *w.shape), w.dtype) for w in first]
    for expert in range(experts.num_experts):
        for target, weight in zip(stacked, experts._stacked(expert)):
            target[expert].copy_(weight)
    experts.stacked = torch.nn.ModuleList(stacked_projection(w) for w in stacked)  # not an expert: popped after
    # biases `[experts, 1, out]`, small: float32 copies, constants of the trace (what the CPU plugin's fusion reads)
    biases = [experts._stacked_biases(e) for e in range(experts.num_experts)]
    experts.__dict__["stacked_biases"] = None if biases[0] is None else tuple(
        torch.stack(column)[:, None, :].float() for column in zip(*biases))
    experts.forward = experts._traced
    # out of the traced tree: OpenVINO's 16-bit tracing casts the 16-bit tensors of any module but an nn.Linear (and
    # a few others) to float32, in place (a fused checkpoint's `gate_up_proj`: twice its bytes, new memory)
    experts.__dict__["_hidden_parameters"] = dict(experts._parameters)
    experts._parameters.clear()


def _unstack(experts: StoredExperts) -> None:
    experts._modules.pop("stacked", None)
    experts.__dict__.pop("forward", None)
    experts.__dict__.pop("stacked_biases", None)
    experts._parameters.update(experts.__dict__.pop("_hidden_parameters", {}))


# optimum-intel patchers that stack every expert of a layer into new tensors themselves (`torch.concat` over the
# experts: a copy of them all) and replace the MoE block's forward to read those: the export extends the patcher
# they extend instead, and the block keeps transformers' forward, which calls the stored experts
_RESTACKING = ("AfmoeModelPatcher",)


def export_config(base: type) -> type:
    """optimum-intel's export config `base`, its patcher tracing each `StoredExperts` in the stacked form."""
    patcher_base = base._MODEL_PATCHER
    if patcher_base.__name__ in _RESTACKING:
        patcher_base = patcher_base.__mro__[1]
    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} tracing the experts as stored (optimum_shared_graph.architectures.moe_experts).",
        "_MODEL_PATCHER": patcher(patcher_base),
    })


def patcher(patcher_base: type) -> type:
    """The model patcher `patcher_base`, then each layer's `StoredExperts` traced in the stacked form."""

    class StoredExpertsPatcher(patcher_base):
        """optimum-intel's patcher for the type, then each layer's stored experts stacked for the trace."""

        def __enter__(self) -> Self:
            super().__enter__()
            for module in list(self._model.modules()):
                if isinstance(module, StoredExperts):
                    _stack(module)
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            for module in self._model.modules():
                if isinstance(module, StoredExperts):
                    _unstack(module)
            super().__exit__(exc_type, exc_value, traceback)

    return StoredExpertsPatcher
