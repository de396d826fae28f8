"""The causal LMs of mbart, marian, pegasus, blenderbot and bigbird_pegasus: positions GenAI's paged rewrite can replace.

What broke: optimum-intel's own configs (`BartOpenVINOConfig` and its subclasses) export these decoders as one
validated graph, and the graph runs as exported (OVModelForCausalLM, GenAI's SDPA backend). But the graph has no
`position_ids` input: the decoder of transformers 5.5 computes each token's position as the past length plus
`arange(seq)`. OpenVINO GenAI's default backend (PagedAttention, also the ContinuousBatchingPipeline's) flattens the
tokens of a call into one axis, so it must replace that computation with its own per-token positions. OpenVINO's
`PositionIDsReplacer` does so only for the embedding sum it recognises: `Gather(token table, input_ids)` (optionally
through a MatMul) plus `Gather(position table, positions + a constant offset)`, as bart's decoder (learned positions,
offset 2, no embedding scale) has it. These decoders do not: mbart, blenderbot and bigbird_pegasus scale the token
embedding by sqrt(d_model) (a Multiply after the Gather), marian and pegasus too and read a sinusoidal table without
an offset, blenderbot and bigbird_pegasus a learned one without an offset. The rewrite then leaves the graph's
`arange` over an axis of length 1 (every token of a prompt gets the same position), and GenAI's tokens differ from
PyTorch's (bigbird_pegasus at the first token).

What the fix does: the same computation in the form the rewrite recognises. For the export only, the token
embedding is the plain Gather (its scale s taken out), the position table is divided by s and read at positions + 1
from a copy with one leading zero row, and the sum is multiplied by s before its next use (the first decoder layer,
or mbart's `layernorm_embedding`): s * (t + p / s) for s * t + p, the same up to fp32 rounding, and the export is
validated against PyTorch as always. The position table replaces the original one in the graph (no weight is stored
twice). Written and tested for the decoders of transformers 5.5 (which hand the positions to `embed_positions`); under
4.57 optimum-intel's own config runs as before. blenderbot-small is left out: its decoder normalises the scaled token embedding (`layernorm_embedding`)
before adding the positions, which no rewrite of this kind turns into a plain Gather.
"""

from __future__ import annotations

MODEL_TYPES = ("mbart", "marian", "pegasus", "blenderbot", "bigbird_pegasus")
TRANSFORMERS = ">=5.5"
SUMMARY = ("optimum-intel's seq2seq decoder export with the embedding sum in the form OpenVINO's PagedAttention rewrite "
           "recognises (plain token Gather + position Gather at positions + 1, the scale applied after the sum), so "
           "GenAI's default backend and continuous batching get the positions right")


def _patch(model) -> list:
    """Rewrite `model`'s decoder embedding sum for the export; return what `_restore` needs."""
    import torch

    decoder = model.model.decoder
    undo = []
    tokens, positions = decoder.embed_tokens, decoder.embed_positions
    scale = 1.0
    if hasattr(decoder, "embed_scale"):  # marian, pegasus: the decoder multiplies
        scale = float(decoder.embed_scale)
        undo.append((decoder, "embed_scale", decoder.embed_scale))
        decoder.embed_scale = 1.0
    if getattr(tokens, "embed_scale", None) is not None:  # mbart, blenderbot, bigbird_pegasus: a scaled embedding
        scale = float(tokens.embed_scale)
        tokens.forward = lambda input_ids: torch.nn.functional.embedding(input_ids, tokens.weight, tokens.padding_idx)
        undo.append((tokens, None, None))
    weight = positions.weight.detach()
    offset = int(getattr(positions, "offset", 0))
    table = torch.cat([torch.zeros_like(weight[:1]), weight[offset:] / scale])

    def positions_forward(input_ids_shape, past_key_values_length=0, position_ids=None):
        if position_ids is None:
            seq_len = input_ids_shape[1]
            position_ids = torch.arange(past_key_values_length, past_key_values_length + seq_len,
                                        dtype=torch.long, device=table.device)
        return torch.nn.functional.embedding(position_ids + 1, table)

    positions.forward = positions_forward
    undo.append((positions, None, None))
    if scale != 1.0:
        after_sum = getattr(decoder, "layernorm_embedding", None) if type(decoder).__name__.startswith("MBart") else None
        after_sum = after_sum if after_sum is not None else decoder.layers[0]

        def rescale(module, args, kwargs):
            if args:
                return (args[0] * scale, *args[1:]), kwargs
            kwargs = dict(kwargs, hidden_states=kwargs["hidden_states"] * scale)
            return args, kwargs

        undo.append(after_sum.register_forward_pre_hook(rescale, with_kwargs=True))
    return undo


def _restore(undo: list) -> None:
    for item in reversed(undo):
        if hasattr(item, "remove"):
            item.remove()
        else:
            module, name, value = item
            if name is None:
                module.__dict__.pop("forward", None)  # back to the class's forward
            else:
                setattr(module, name, value)


def export_config(base: type) -> type:
    """optimum-intel's seq2seq export config `base`, with its patcher rewriting the decoder's embedding sum."""
    patcher_base = base._MODEL_PATCHER

    class PagedPositionsPatcher(patcher_base):
        """optimum-intel's patcher for the family, plus the embedding sum in the form the paged rewrite recognises."""

        def __enter__(self):
            super().__enter__()
            self._positions_undo = _patch(self._model)
            return self

        def __exit__(self, exc_type, exc_value, traceback) -> None:
            super().__exit__(exc_type, exc_value, traceback)
            _restore(self._positions_undo)

    return type(base.__name__, (base,), {
        "__doc__": f"{base.__name__} with the decoder's positions in the form OpenVINO's PagedAttention rewrite replaces.",
        "_MODEL_PATCHER": PagedPositionsPatcher,
    })
