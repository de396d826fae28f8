"""Step-by-step execution of an exported decoder graph (stateful or stateless), on numpy arrays."""

from __future__ import annotations

import numpy as np

# Compile options for checking a graph against PyTorch: optimum-intel ships KV_CACHE_PRECISION=f16
# in the IR's runtime options, which is right for deployment but not for a strict comparison.
EXACT_CONFIG = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}

_KNOWN_INPUTS = {"input_ids", "attention_mask", "position_ids", "beam_idx", "cache_position"}

# Cache inputs and outputs of stateless graphs: optimum-intel names the KV cache `past_key_values.*` /
# `present.*`, and the convolution, SSM (and KV) states of Mamba-style models `cache_params.past.*` /
# `cache_params.present.*`.
_PAST_PREFIXES = ("past_key_values", "cache_params.past")
_PRESENT_PREFIXES = ("present", "cache_params.present")

# Mamba-style graphs (a `cache_position` input: optimum-intel's own mamba, falcon_mamba and zamba2
# exports; the graphs of this package's mamba fix have none) take the inputs of optimum-intel's
# OVModelWithMambaForCausalLM: at decode steps these types get the attention mask of the full
# context, the others (mamba, falcon_mamba, zamba2) the mask of the new tokens only.
FULL_MASK_STATE_SPACE_TYPES = frozenset(
    {"lfm2", "lfm2_moe", "granitemoehybrid", "qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
)


def _past_name(present: str) -> str:
    if present.startswith("cache_params.present"):
        return present.replace("cache_params.present", "cache_params.past", 1)
    return present.replace("present", "past_key_values", 1)


def position_ids_from_mask(attention_mask: np.ndarray, new_tokens: int) -> np.ndarray:
    """Positions of the last `new_tokens` tokens, counting only unmasked ones (left padding aware)."""
    pos = np.cumsum(attention_mask, axis=-1) - 1
    pos = np.where(attention_mask == 0, 1, pos)
    return pos[:, -new_tokens:].astype(np.int64)


class GraphSession:
    """Feeds a compiled optimum-intel decoder graph one call at a time and keeps its cache.

    Args:
        compiled: an `openvino.CompiledModel` of an optimum-intel causal-LM graph.
        model_type: the exported model type; needed for Mamba-style graphs, whose attention mask
            at decode steps depends on it (see `FULL_MASK_STATE_SPACE_TYPES`).
    """

    def __init__(self, compiled, *, model_type: str | None = None, graph=None):
        self.compiled, self._graph = compiled, graph
        self.request = None if compiled is None else compiled.create_infer_request()
        ports = compiled if compiled is not None else graph
        self.inputs = {port.get_any_name(): port for port in ports.inputs}
        self.past_names = [n for n in self.inputs if n.startswith(_PAST_PREFIXES)]
        self.present_names = [p.get_any_name() for p in ports.outputs if p.get_any_name().startswith(_PRESENT_PREFIXES)]
        self.stateful = not self.past_names
        unknown = set(self.inputs) - _KNOWN_INPUTS - set(self.past_names)
        if unknown:
            raise ValueError(f"graph inputs {sorted(unknown)} are not supported by this session")
        self._mask: np.ndarray | None = None
        self._past: dict[str, np.ndarray] = {}
        # Mamba-style interface: `cache_position` instead of `position_ids`
        self.state_space = "cache_position" in self.inputs
        self.conv_kernel = self._conv_kernel() if self.state_space else None
        self.full_mask_at_decode = not self.state_space or model_type in FULL_MASK_STATE_SPACE_TYPES
        self._cache_position: np.ndarray | None = None

    @classmethod
    def feeds_only(cls, ov_model, *, model_type: str | None = None) -> "GraphSession":
        """A session that only computes the inputs of each call (`feed()`) for `ov_model`, with nothing
        compiled: what runs a graph in parts feeds every part from it."""
        return cls(None, model_type=model_type, graph=ov_model)

    def reset(self) -> None:
        """Forget the cache: the next call is a prefill."""
        if self.stateful and self.request is not None:
            self.request.reset_state()
        self._mask = None
        self._past = {}
        self._cache_position = None

    def _conv_kernel(self) -> int | None:
        """The convolution window of a Mamba-style graph, read from its conv state's last axis."""
        shapes = [self.inputs[n].get_partial_shape() for n in self.past_names if ".conv" in n]
        if self.request is not None:
            shapes += [state.state.shape for state in self.request.query_state() if ".conv" in state.name]
        else:
            shapes += [v.info.data_shape for v in self._graph.get_variables() if ".conv" in v.info.variable_id]
        for shape in shapes:
            last = shape[len(shape) - 1]
            if not hasattr(last, "is_static"):
                return int(last)
            if last.is_static:
                return last.get_length()
        return None

    def _next_cache_position(self, new: int) -> np.ndarray:
        """`cache_position` as OVModelWithMambaForCausalLM feeds it: the conv window at prefill, then +new."""
        if self.conv_kernel is None:
            positions = np.arange(self.cache_length, self.cache_length + new)
        elif self._cache_position is None:
            positions = np.arange(self.conv_kernel)
        else:
            positions = self._cache_position[-1:] + new
        self._cache_position = positions.astype(np.int64)
        return self._cache_position

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
        feed = self.feed(input_ids, attention_mask)
        if not self.stateful:
            feed.update(self._past or self._empty_past(len(feed["input_ids"])))
        self.request.infer(feed)
        logits = self.request.get_tensor("logits").data.copy()
        if not self.stateful:
            self._past = {
                _past_name(name): self.request.get_tensor(name).data.copy()
                for name in self.present_names
            }
        return logits

    def feed(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The graph inputs of one call (the cache inputs of a stateless graph aside), and the session's
        bookkeeping advanced past it (the mask of the tokens in the cache, a Mamba-style cache position)."""
        input_ids = np.asarray(input_ids, dtype=np.int64)
        batch, new = input_ids.shape
        step_mask = np.ones((batch, new), dtype=np.int64) if attention_mask is None else np.asarray(attention_mask, np.int64)
        full_mask = step_mask if self._mask is None else np.concatenate([self._mask, step_mask], axis=1)
        feed = {"input_ids": input_ids}
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = full_mask if self.full_mask_at_decode or self._mask is None else step_mask
        if "cache_position" in self.inputs:
            feed["cache_position"] = self._next_cache_position(new)
        if "position_ids" in self.inputs:
            feed["position_ids"] = position_ids_from_mask(full_mask, new)
        if "beam_idx" in self.inputs:
            feed["beam_idx"] = np.arange(batch, dtype=np.int32)
        self._mask = full_mask
        return feed

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
