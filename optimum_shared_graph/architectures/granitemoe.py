"""GraniteMoE (ibm-granite/granite-3.*-a*m) and Granite 4 (granitemoehybrid): the experts in the dense form
optimum-intel gives the transformers 5 MoE experts, so GenAI's NPU pipeline can run them.

What broke: optimum-intel's `GraniteMoEModelPatcher` (and the MoE part of its `GraniteMoeHybridModelPatcher`)
keeps transformers' sparse dispatch: the router sorts the tokens by expert and each expert's linear layers take
the slice `inputs[start:start + expert_size[i]]`, with bounds the router computes at run time. A dynamic graph runs
that; GenAI's NPU pipeline (NPUW) reshapes the graph to static shapes and fails on it ("to_shape was called on a
dynamic shape", optimum-intel's artifact and this package's alike: docs/npu-real-width.md).

What the fix does: every expert on every token, weighted by the router's top-k gates scattered densely (zero for
the experts a token was not routed to): the tokens tiled once per expert and the experts' stacked weights applied as
batched matmuls, the form of optimum-intel's own transformers 5 experts (`lfm2_moe_experts_forward`, which its
Qwen3-MoE and LFM2-MoE exports use). OpenVINO's CPU plugin recognises that tiled block and runs only the routed
experts (it becomes a `GatherMatmul`), so a CPU does not pay for the experts a token skips. The router's arithmetic is
transformers' own (top-k of the float32 logits, then a softmax over the k), so the graph is validated against
PyTorch at export like every export. The rest of optimum-intel's patchers (Granite 4's Mamba-2 mixers, the cache)
is unchanged.

The capture (`while_exporting`): transformers' `ParallelExperts` holds every expert of a layer in one tensor, which
the capture's float32 compute would upcast whole with its layer (at granite-4.0-h-tiny's widths, 64 experts, that
held 3.6x the checkpoint in anonymous memory); each expert's weight is upcast alone as its tokens are multiplied.
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path
from typing import Iterator, Self

MODEL_TYPES = ("granitemoe", "granitemoehybrid")
TRANSFORMERS = ">=5.5"  # written and tested under 5.5 (GraniteMoeMoE / GraniteMoeHybridMoE with router, input_linear, output_linear)
SUMMARY = ("optimum-intel's GraniteMoE export with every expert on every token, weighted by the dense top-k gates, as "
           "batched matmuls over the stacked expert weights (optimum-intel's transformers 5 MoE form, which OpenVINO's "
           "CPU plugin runs on the routed experts only), instead of slices with bounds computed at run time, so GenAI's "
           "NPU pipeline can make the graph static")


def dense_moe_forward(self, layer_input):
    """`GraniteMoeMoE.forward` (and GraniteMoeHybridMoE's) without the data-dependent dispatch.

    Args: layer_input [batch, seq, hidden].
    Returns: [batch, seq, hidden], each token's routed experts' outputs summed with their gates.
    """
    import torch

    batch, length, width = layer_input.shape
    tokens = layer_input.reshape(-1, width)
    num_tokens, num_experts = tokens.shape[0], self.router.num_experts
    logits = self.router.layer(tokens).float()  # as GraniteMoeTopKGating: top-k of the float32 logits, softmax over k
    top_k_logits, top_k_indices = logits.topk(self.router.top_k, dim=1)
    top_k_gates = torch.softmax(top_k_logits, dim=1).type_as(tokens)
    gates = torch.zeros(num_tokens, num_experts, dtype=tokens.dtype, device=tokens.device)
    gates = gates.scatter(1, top_k_indices, top_k_gates)  # [tokens, experts]
    tiled = tokens.repeat(num_experts, 1).view(num_experts, -1, width)  # [experts, tokens, hidden]
    gate, up, down = self.stacked  # the stacked weights as traced `nn.Linear`s (`moe_experts`)
    out = down(self.activation(gate(tiled)) * up(tiled))
    out = out.view(num_experts, num_tokens, width)  # a Reshape here, as in optimum-intel's form: OpenVINO's pattern has it
    out = out * gates.transpose(0, 1).view(num_experts, num_tokens)[..., None]
    return out.sum(dim=0).view(batch, length, width)


def _moe_blocks(model) -> list:
    """The model's GraniteMoE blocks (`block_sparse_moe` of each decoder layer that has one)."""
    layers = model.model.layers
    return [layer.block_sparse_moe for layer in layers if getattr(layer, "block_sparse_moe", None) is not None]


def export_config(base: type) -> type:
    """optimum-intel's GraniteMoE / Granite 4 export config `base`, its patcher's experts in the dense form."""
    import torch

    from .moe_experts import mapped_copy, stacked_projection

    patcher_base = base._MODEL_PATCHER

    class DenseExpertsPatcher(patcher_base):
        """optimum-intel's patcher for the type, then each MoE block's forward in the dense form."""

        def __enter__(self) -> Self:
            super().__enter__()
            for block in _moe_blocks(self._model):
                # traced as `nn.Linear`s over the batched 16-bit weights, whose constants share file pages (`bmm`
                # over a transposed weight would fold into new float32 constants, twice the experts' bytes): the
                # checkpoint's own `output_linear`, and `input_linear`'s gate and up halves each copied into an
                # unlinked file (one product over both halves, then split, is not fused into `GatherMatmul`s)
                gate, up = (mapped_copy(half) for half in block.input_linear.weight.detach().chunk(2, dim=-2))
                block.stacked = torch.nn.ModuleList(stacked_projection(w)
                                                    for w in (gate, up, block.output_linear.weight))
                block.forward = types.MethodType(dense_moe_forward, block)
                # out of the traced tree: OpenVINO's 16-bit tracing casts the 16-bit weights of any module but an
                # nn.Linear (these `GraniteMoeParallelExperts`) to float32 in place, twice the experts' bytes
                block.__dict__["_parallel_experts"] = {name: block._modules.pop(name)
                                                       for name in ("input_linear", "output_linear")}
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            for block in _moe_blocks(self._model):
                block._modules.pop("stacked", None)
                block._modules.update(block.__dict__.pop("_parallel_experts", {}))
                block.__dict__.pop("forward", None)  # back to the class's forward
            super().__exit__(exc_type, exc_value, traceback)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with its MoE experts in the dense form (optimum_shared_graph.architectures.granitemoe).",
        "_MODEL_PATCHER": DenseExpertsPatcher,
    })


@contextlib.contextmanager
def while_exporting(model_type: str, scratch: Path | None = None) -> Iterator[None]:
    """For one export of `model_type`: its experts upcast one at a time under the capture's float32 compute."""
    from ..host import parallel_experts_upcast_one_at_a_time

    prefix = {"granitemoe": "GraniteMoe", "granitemoehybrid": "GraniteMoeHybrid"}[model_type]
    with parallel_experts_upcast_one_at_a_time(f"transformers.models.{model_type}.modeling_{model_type}",
                                               f"{prefix}ParallelExperts"):
        yield
