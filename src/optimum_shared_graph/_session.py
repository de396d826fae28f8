"""Step-by-step execution of an exported decoder graph (stateful or stateless), on numpy arrays."""

from __future__ import annotations

import numpy as np

# Compile options for checking a graph against PyTorch: optimum-intel ships KV_CACHE_PRECISION=f16
# in the IR's runtime options, which is right for deployment but not for a strict comparison.
EXACT_CONFIG = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}

_KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", "beam_idx"}


def position_ids_from_mask(attention_mask: np.ndarray, new_tokens: int) -> np.ndarray:
    """Positions of the last `new_tokens` tokens, counting only unmasked ones (left padding aware)."""
    pos = np.cumsum(attention_mask, axis=-1) - 1
    pos = np.where(attention_mask == 0, 1, pos)
    return pos[:, -new_tokens:].astype(np.int64)


class GraphSession:
    """Feeds a compiled optimum-intel decoder graph one call at a time and keeps its cache.

    Args:
        compiled: an `openvino.CompiledModel` of an optimum-intel causal-LM graph.
    """

    def __init__(self, compiled):
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.inputs = {port.get_any_name(): port for port in compiled.inputs}
        self.past_names = [n for n in self.inputs if n.startswith("past_key_values")]
        self.present_names = [p.get_any_name() for p in compiled.outputs if p.get_any_name().startswith("present")]
        self.stateful = not self.past_names
        unknown = set(self.inputs) - _KNOWN_INPUTS - set(self.past_names)
        if unknown:
            raise ValueError(f"graph inputs {sorted(unknown)} are not supported by this session")
        self._mask: np.ndarray | None = None
        self._past: dict[str, np.ndarray] = {}

    def reset(self) -> None:
        """Forget the cache: the next call is a prefill."""
        if self.stateful:
            self.request.reset_state()
        self._mask = None
        self._past = {}

    @property
    def cache_length(self) -> int:
        return 0 if self._mask is None else int(self._mask.shape[1])

    def step(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """Run one call and return the logits (`[batch, positions, vocab]`, float32, a copy).

        Args:
            input_ids: `[batch, new]` token ids.
            attention_mask: `[batch, new]` mask of the new tokens (ones if None). The session
                keeps the mask of the tokens already in the cache.
        """
        input_ids = np.asarray(input_ids, dtype=np.int64)
        batch, new = input_ids.shape
        step_mask = np.ones((batch, new), dtype=np.int64) if attention_mask is None else np.asarray(attention_mask, np.int64)
        full_mask = step_mask if self._mask is None else np.concatenate([self._mask, step_mask], axis=1)
        feed = {"input_ids": input_ids}
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = full_mask
        if "position_ids" in self.inputs:
            feed["position_ids"] = position_ids_from_mask(full_mask, new)
        if "beam_idx" in self.inputs:
            feed["beam_idx"] = np.arange(batch, dtype=np.int32)
        if not self.stateful:
            feed.update(self._past or self._empty_past(batch))
        self.request.infer(feed)
        logits = self.request.get_tensor("logits").data.copy()
        if not self.stateful:
            self._past = {
                name.replace("present", "past_key_values", 1): self.request.get_tensor(name).data.copy()
                for name in self.present_names
            }
        self._mask = full_mask
        return logits

    def _empty_past(self, batch: int) -> dict[str, np.ndarray]:
        past = {}
        for name in self.past_names:
            port = self.inputs[name]
            dims = []
            for i, dim in enumerate(port.get_partial_shape()):
                if dim.is_static:
                    dims.append(dim.get_length())
                else:
                    dims.append(batch if i == 0 else 0)
            past[name] = np.zeros(dims, dtype=port.get_element_type().to_dtype())
        return past
