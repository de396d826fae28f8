"""GraniteMoE and GraniteMoeHybrid: the experts computed densely, so GenAI's NPU pipeline can run them.

What broke: optimum-intel's GraniteMoE patchers (`GraniteMoEModelPatcher`, `GraniteMoeHybridModelPatcher`) keep
transformers' sparse experts: the router sorts the tokens by expert and each expert's `Linear` reads the slice
`inputs[start:start + count]` whose bounds the router computes at run time. GenAI's NPU pipeline (NPUW) reshapes
the graph to static shapes, and a slice with data-dependent bounds has none: "to_shape was called on a dynamic
shape" for optimum-intel's artifact and this package's alike (docs/npu-real-width.md).

What the fix does: the form optimum-intel's own Qwen3-MoE and LFM2-MoE exports use under transformers 5
(`lfm2_moe_experts_forward`): every expert computed for every token (one batched matmul per projection over the
stacked expert weights), weighted by a dense [tokens, experts] matrix holding the router's top-k gates (zero for the
experts not chosen), and summed over the experts. The unchosen experts add exact zeros, so the result is the sparse
one up to the order of the additions; validated against PyTorch at export like every export. The cost: each token
runs all experts (40 where the checkpoint routes to 8, at granite-3.1-3b-a800m's widths), which a CPU's decode pays
in weight reads.
"""

from __future__ import annotations

MODEL_TYPES = ("granitemoe", "granitemoehybrid")
TRANSFORMERS = ">=5.5"  # written and tested under 5.5 (its GraniteMoeMoE / GraniteMoeHybridMoE)
SUMMARY = ("optimum-intel's GraniteMoE export with every expert computed densely, weighted by the router's gates (the "
           "form of its own Qwen3-MoE export), so GenAI's NPU pipeline, which needs static shapes, runs it")


def dense_moe_forward(self, layer_input):
    """transformers' `GraniteMoeMoE.forward` (and GraniteMoeHybrid's) with the experts computed densely."""
    import torch

    bsz, length, emb_size = layer_input.size()
    tokens = layer_input.reshape(-1, emb_size)
    router = self.router
    logits = router.layer(tokens).float()  # [tokens, experts], as transformers' router computes it
    top_logits, top_indices = logits.topk(router.top_k, dim=1)
    top_gates = torch.softmax(top_logits, dim=1).type_as(tokens)
    gates = torch.zeros(tokens.shape[0], router.num_experts, dtype=tokens.dtype, device=tokens.device)
    gates = gates.scatter(1, top_indices, top_gates)  # [tokens, experts]: the chosen experts' gates, else 0
    experts = tokens.unsqueeze(0).expand(router.num_experts, -1, -1)  # [experts, tokens, hidden]
    hidden = torch.bmm(experts, self.input_linear.weight.transpose(1, 2))  # [experts, tokens, 2 * intermediate]
    gate, up = hidden.chunk(2, dim=-1)
    hidden = self.activation(gate) * up
    out = torch.bmm(hidden, self.output_linear.weight.transpose(1, 2))  # [experts, tokens, hidden]
    out = (out * gates.transpose(0, 1).unsqueeze(-1)).sum(dim=0)
    return out.view(bsz, length, self.input_size)


def _moe_classes() -> list[type]:
    from transformers.models.granitemoe.modeling_granitemoe import GraniteMoeMoE
    from transformers.models.granitemoehybrid.modeling_granitemoehybrid import GraniteMoeHybridMoE

    return [GraniteMoeMoE, GraniteMoeHybridMoE]


def export_config(base: type) -> type:
    """optimum-intel's GraniteMoE (or GraniteMoeHybrid) export config `base`, its patcher's experts computed densely."""
    patcher_base = base._MODEL_PATCHER

    class DenseExpertsPatcher(patcher_base):
        """optimum-intel's patcher, then transformers' MoE blocks' forward computing every expert."""

        def __enter__(self):
            super().__enter__()
            self._dense_undo = [(cls, cls.__dict__["forward"]) for cls in _moe_classes()]
            for cls, _ in self._dense_undo:
                cls.forward = dense_moe_forward
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            for cls, forward in reversed(getattr(self, "_dense_undo", [])):
                cls.forward = forward
            super().__exit__(exc_type, exc_value, traceback)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with every expert computed densely, weighted by the router's gates.",
        "_MODEL_PATCHER": DenseExpertsPatcher,
    })
