"""The session that drives a static graph: C slots per call into a fixed-capacity KV cache."""

from __future__ import annotations

import numpy as np

from ..errors import RuntimeSelectionError



def layer_order(name: str):
    _, layer, kind = name.split(".", 2)
    return int(layer), kind


class StaticSession:
    """Feeds a compiled static graph: C slots per call, a fixed-capacity cache, one sequence batch.

    It has the `reset()` / `step()` interface of `GraphSession`, so export-time validation makes the
    very calls the runtime makes.

    Args:
        compiled: the `openvino.CompiledModel` of a static graph.
        pad_token_id: the token fed in masked slots.
        request: an infer request of `compiled` to use (a new one if None).
    """

    def __init__(self, compiled, pad_token_id: int = 0, *, request=None):
        self.compiled = compiled
        self.request = request if request is not None else compiled.create_infer_request()
        self.inputs = {name: p for p in compiled.inputs for name in p.get_names()}
        self.past_names = sorted((n for n in self.inputs if n.startswith("past_key_values.")), key=layer_order)
        self.present_names = [n.replace("past_key_values", "present", 1) for n in self.past_names]
        self.stateful = not self.past_names
        ids_shape = self.inputs["input_ids"].get_shape()
        self.batch_size, self.query_len = int(ids_shape[0]), int(ids_shape[1])
        self.capacity = int(self.inputs["attention_mask"].get_shape()[1])
        self.logits_all = int(compiled.output("logits").get_shape()[1]) == self.query_len and self.query_len > 1
        self.pad_token_id = int(pad_token_id)
        self.reset()

    @property
    def cache_length(self) -> int:
        """Slots written so far (the sequence length, padding included)."""
        return self.filled

    def reset(self) -> None:
        """Forget the cache: the next call starts a new sequence."""
        if self.stateful:
            self.request.reset_state()
        B, cap = self.batch_size, self.capacity
        self.tokens = np.full((B, cap), self.pad_token_id, dtype=np.int64)
        self.mask = np.zeros((B, cap), dtype=np.int64)
        self.filled = 0
        self._rows = B
        self._beam_idx: np.ndarray | None = None
        self._past = {
            name: np.zeros(tuple(self.inputs[name].get_shape()), dtype=self.inputs[name].get_element_type().to_dtype())
            for name in self.past_names
        }

    def check_fits(self, batch: int, total_tokens: int) -> None:
        """Refuse, before any inference, a request the static shapes cannot hold."""
        if batch > self.batch_size:
            raise RuntimeSelectionError(
                f"batch of {batch} sequences does not fit this static artifact (batch size {self.batch_size}): "
                f"generate at most {self.batch_size} at once, or re-export with --static-batch-size {batch}"
            )
        if total_tokens > self.capacity:
            raise RuntimeSelectionError(
                f"prompt plus new tokens ({total_tokens}) exceed this static artifact's KV capacity of {self.capacity}: "
                f"shorten the prompt or max_new_tokens, or re-export with --max-cache-len {total_tokens} or more"
            )

    def crop(self, length: int) -> None:
        """Keep only the first `length` slots (assisted decoding drops rejected candidates)."""
        length = max(0, min(int(length), self.filled))
        self.tokens[:, length:] = self.pad_token_id
        self.mask[:, length:] = 0
        self.filled = length

    def reorder(self, beam_idx) -> None:
        """Reorder the batch rows (beam search), applied to the cache at the next call."""
        beam_idx = np.asarray(beam_idx, dtype=np.int64)
        full = np.arange(self.batch_size, dtype=np.int64)
        full[: beam_idx.shape[0]] = beam_idx
        self.tokens, self.mask = self.tokens[full], self.mask[full]
        if self.stateful:
            self._beam_idx = full if self._beam_idx is None else self._beam_idx[full]
        else:
            self._past = {k: np.ascontiguousarray(v[full]) for k, v in self._past.items()}

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """Write `n` new tokens to the cache, C per call, and return their logits.

        Args:
            input_ids: `[batch, n]` new token ids (batch at most the static batch size).
            attention_mask: `[batch, n]` mask of the new tokens (ones if None).

        Returns:
            `[batch, 1, vocab]` (logits of the last new token) for `logits=last` graphs,
            `[batch, n, vocab]` for `logits=all` graphs.
        """
        input_ids = np.asarray(input_ids, dtype=np.int64)
        rows, n = input_ids.shape
        mask = np.ones_like(input_ids) if attention_mask is None else np.asarray(attention_mask, dtype=np.int64)
        self.check_fits(rows, self.filled + n)
        if self.filled == 0:
            self._rows = rows
        elif rows != self._rows:
            raise RuntimeSelectionError(f"batch changed from {self._rows} to {rows} rows mid-sequence: call reset() first")
        if rows < self.batch_size:  # unused rows repeat row 0 (real content: no fully masked row)
            extra = self.batch_size - rows
            input_ids = np.concatenate([input_ids, np.repeat(input_ids[:1], extra, axis=0)])
            mask = np.concatenate([mask, np.repeat(mask[:1], extra, axis=0)])
        start, end = self.filled, self.filled + n
        C, cap = self.query_len, self.capacity
        outputs = []
        s = start
        while s < end:
            e = min(s + C, end)
            w = min(s, cap - C)
            # Slots from e on are never written yet (or were cleared by crop): pad tokens, mask 0.
            self.tokens[:, s:e] = input_ids[:, s - start : e - start]
            self.mask[:, s:e] = mask[:, s - start : e - start]
            positions = np.cumsum(self.mask[:, : w + C], axis=1) - 1
            positions = np.where(self.mask[:, : w + C] == 0, 1, positions)[:, w:]
            positions[:, e - w :] = positions[:, e - w - 1 : e - w] + 1  # masked slots: any valid position
            feed = {"input_ids": np.ascontiguousarray(self.tokens[:, w : w + C]), "attention_mask": self.mask,
                    "cache_position": np.arange(w, w + C, dtype=np.int64)}
            if "position_ids" in self.inputs:
                feed["position_ids"] = np.ascontiguousarray(positions)
            if "beam_idx" in self.inputs:
                beam = self._beam_idx if self._beam_idx is not None else np.arange(self.batch_size)
                feed["beam_idx"] = beam.astype(np.int32)
                self._beam_idx = None
            if not self.stateful:
                feed.update(self._past)
            self.request.infer(feed)
            logits = self.request.get_tensor("logits").data
            if not self.stateful:
                self._past = {
                    past: self.request.get_tensor(present).data.copy()
                    for past, present in zip(self.past_names, self.present_names)
                }
            if self.logits_all:
                outputs.append(logits[:, s - w : e - w].copy())
            else:
                outputs = [logits.copy()]
            s = e
        self.filled = end
        out = np.concatenate(outputs, axis=1) if len(outputs) > 1 else outputs[0]
        return out[:rows]
