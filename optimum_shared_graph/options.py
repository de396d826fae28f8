"""The one set of export options, shared by the `optimum-cli` flags and the Python API."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import InvalidOptionsError

SHAPE_MODES = ("dynamic", "static")
LOGITS_MODES = ("last", "all")
FALLBACK_MODES = ("auto", "never")
WEIGHT_FORMATS = ("fp32", "fp16", "int8", "int4", "mxfp4", "nf4", "cb4")

# The cap on the default static KV capacity: a model's max positions can be 128k, and a
# fixed-capacity cache is allocated whole, so the default stays at a size a CPU holds easily.
DEFAULT_MAX_CACHE_CAP = 2048


@dataclass(frozen=True)
class ExportOptions:
    """Options of the `text-generation-shared` export.

    The CLI flags of `optimum-cli export openvino --task text-generation-shared` map one to one onto
    these fields (`--shape-mode` is `shape_mode`, and so on); `export()` takes them as keywords.

    Args:
        shape_mode: `"dynamic"` keeps optimum-intel's dynamic interface, so OpenVINO GenAI and
            `OVModelForCausalLM` load the artifact unchanged. `"static"` fixes every shape for
            devices that only run static graphs.
        max_cache_len: static only. The KV capacity. `None` means the model's max positions,
            capped at 2048 so the default cache fits comfortably in memory.
        static_batch_size: static only. The fixed batch size; 1 because single-stream serving is
            what static devices do.
        static_query_len: static only. `C`, the fixed number of query tokens per call. 1 keeps the
            graph smallest; C > 1 prefills C tokens per call (chunked prefill).
        logits: `"last"` computes logits for the last position only, which is all that greedy,
            sampling and beam search need, and saves the `seq x vocab` projection of the prompt.
            `"all"` keeps every position, needed by assisted decoding.
        fallback: `"auto"` exports with optimum-intel's own partitioning when the decomposition
            fails, and says so; `"never"` fails instead.
        skip_validation: skip the PyTorch-against-OpenVINO check. Off by default: an artifact is
            only moved into place once it is proven to match.
        stateful: keep the KV cache as internal state (optimum-intel's default).
        weight_format: optimum-intel's `--weight-format` (`None`: optimum-intel's default).
        quantization_config: Python API only: an optimum-intel quantization config (a dict or an
            `OVQuantizationConfigBase`) for the data-aware modes. The CLI builds it from
            optimum-intel's own flags.
        trust_remote_code: allow custom modeling code from the model repository.
        convert_tokenizer: write `openvino_tokenizer.xml` / `openvino_detokenizer.xml` when
            openvino-tokenizers can convert the tokenizer.
        validation_new_tokens: greedy tokens compared at export (one prefill call and a decode call per
            token after the first; at least 4: the prefill and 3 decode steps at growing cache lengths, what
            proves one graph serves both stages). `None` chooses (`pipeline/memory.captured_tokens`): each
            call reads every weight once, so as many as keep that near 4 GB in all, from 4 to 16 (16 under
            0.25 GB of weights, 8 at 0.5 GB, 4 from 1 GB); 4 where the checkpoint does not fit in the memory
            available, since each call then reads it from disk again.
        validation_prompt: the text validated on; `None` uses a fixed built-in sentence.
        calibration_decode_steps: data-aware quantization only. Decode calls gathered after each
            calibration text's prefill, with the real KV cache (0: prefill calls only, optimum-intel's
            behaviour). `None` (the default) chooses per algorithm, as measured on trained models
            (`quantization.calibration.decode_steps_for`, docs/quality.md): 16 for a text graph's GPTQ
            alone (its Hessian sums over tokens: the decode calls lowered its error), 0 for every other
            data-aware quantization of a text graph (AWQ, scale estimation, data-aware mixed precision,
            `--quant-mode`: they did not, or not enough), 4 for static graphs and vision-language models.
        quiet: no progress display. Progress (the export's stages, the generate() capture,
            validation and calibration steps) goes to stderr only when it is a terminal; `quiet`
            also turns off transformers', huggingface_hub's and NNCF's progress bars during the export.
    """

    shape_mode: str = "dynamic"
    max_cache_len: int | None = None
    static_batch_size: int = 1
    static_query_len: int = 1
    logits: str = "last"
    fallback: str = "auto"
    skip_validation: bool = False
    stateful: bool = True
    weight_format: str | None = None
    quantization_config: Any = None
    trust_remote_code: bool = False
    convert_tokenizer: bool = True
    validation_new_tokens: int | None = None
    validation_prompt: str | None = None
    calibration_decode_steps: int | None = None
    quiet: bool = False

    def __post_init__(self) -> None:
        _choice("--shape-mode", self.shape_mode, SHAPE_MODES)
        _choice("--logits", self.logits, LOGITS_MODES)
        _choice("--fallback", self.fallback, FALLBACK_MODES)
        if self.weight_format is not None:
            _choice("--weight-format", self.weight_format, WEIGHT_FORMATS)
        static_flags = {
            "--max-cache-len": self.max_cache_len is not None,
            "--static-batch-size": self.static_batch_size != 1,
            "--static-query-len": self.static_query_len != 1,
        }
        if self.shape_mode == "dynamic":
            given = [flag for flag, set_ in static_flags.items() if set_]
            if given:
                raise InvalidOptionsError(
                    f"{', '.join(given)} only applies to static artifacts: add --shape-mode static or drop it"
                )
        if self.max_cache_len is not None and self.max_cache_len < 1:
            raise InvalidOptionsError(f"--max-cache-len must be at least 1, got {self.max_cache_len}")
        if self.static_batch_size < 1:
            raise InvalidOptionsError(f"--static-batch-size must be at least 1, got {self.static_batch_size}")
        if self.static_query_len < 1:
            raise InvalidOptionsError(f"--static-query-len must be at least 1, got {self.static_query_len}")
        if self.max_cache_len is not None and self.static_query_len > self.max_cache_len:
            raise InvalidOptionsError(
                f"--static-query-len ({self.static_query_len}) cannot exceed --max-cache-len "
                f"({self.max_cache_len}): lower the query length or raise the capacity"
            )
        if self.calibration_decode_steps is not None and self.calibration_decode_steps < 0:
            raise InvalidOptionsError(
                f"--calibration-decode-steps must be 0 or more, got {self.calibration_decode_steps}"
            )
        if self.validation_new_tokens is not None and self.validation_new_tokens < 4:
            raise InvalidOptionsError(
                f"--validation-tokens must be at least 4 (a prefill and 3 decode steps), got {self.validation_new_tokens}"
            )

    @property
    def is_static(self) -> bool:
        return self.shape_mode == "static"

    def to_dict(self) -> dict[str, Any]:
        """The options as plain JSON-able values (the quantization config as a dict or its repr)."""
        out = dataclasses.asdict(self)
        qc = self.quantization_config
        if qc is not None and not isinstance(qc, Mapping):
            out["quantization_config"] = qc.to_dict() if hasattr(qc, "to_dict") else repr(qc)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExportOptions":
        """Build options from a mapping, refusing keys that are not options."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InvalidOptionsError(
                f"unknown export option(s) {', '.join(unknown)}; known options: {', '.join(sorted(names))}"
            )
        return cls(**dict(data))


def _choice(flag: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InvalidOptionsError(f"{flag} must be one of {', '.join(choices)}, got {value!r}")
