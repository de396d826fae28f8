"""Quantization calibrated on both stages of generation.

optimum-intel calibrates a causal LM on prefill calls only: one sample per text, with an empty KV
cache. The shared graph also runs decode calls, whose single-token activations attend to a
populated cache. Here the calibration set holds both, for one graph and one set of scales:

1. optimum-intel exports the graph *stateless* (past KV as explicit inputs), so every calibration
   sample carries the cache it runs against and every NNCF algorithm (min-max, SmoothQuant, AWQ,
   scale estimation, GPTQ's layer-wise replay) sees a self-contained sample;
2. for each dataset text, generation runs on that exported fp32 graph: the prefill call, then
   `decode_steps` greedy decode calls with the real KV state. Each call is one sample;
3. the samples go to NNCF through optimum-intel's own entry point (`OVModelForCausalLM
   ._apply_quantization(..., calibration_dataset=...)`), with every optimum-intel flag's config;
4. the quantized graph is made stateful with optimum-intel's own `patch_stateful`, exactly the
   transform its stateful export applies after conversion (unless `--disable-stateful`).

The texts come from optimum-intel's own dataset handling (dataset names, `seq_len`, `num_samples`,
a list of strings), or from a local text file, one sample per line.

The hooks are installed around optimum-intel's `main_export` / `_main_quantize` for the duration of
the raw export only (`both_stage_quantization`), so the CLI, which runs optimum-intel's own command,
and the Python API go through the same code.

Static artifacts are calibrated on their own graph instead (`quantization.static`).
"""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .. import host
from ..errors import InvalidOptionsError, ModelNotSupportedError
from ..progress import bar
from ..runtimes.session import position_ids_from_mask
from .calibration import (
    COMPILE_CONFIG,
    CalibrationReport, _apply_calibrated, _as_numpy, _prepared_config, decode_steps_for, is_data_aware,
    is_int8_activations, load_stateless, make_stateful, mlp_output_matmuls, prompt_inputs, with_int8_activation_defaults,
)

_STEP_INPUTS = {"input_ids", "attention_mask", "position_ids"}

class BothStageSamples:
    """Calibration samples of one stateless decoder graph: each text's prefill call and decode calls.

    Generation runs on the fp32 graph itself (greedy, `decode_steps` decode calls after each
    prefill, never stopping at EOS). Every call is fed exactly as generation made it, past KV
    included. To keep memory at one cache per text, a decode call's past is a slice of the text's
    final cache (the cache only grows by appending); a graph whose cache is not append-only keeps a
    copy per call.

    With `group_decode` (the default), a text's decode calls form one sample, a batch of
    `decode_steps` rows, each row one decode call with its own cache (left-padded to the longest,
    masked): fewer, larger NNCF samples. Under NNCF's default MEAN_MINMAX activation ranges a
    sample's token count sets how far into the tails its range reaches, so grouping limited how far
    one-token samples pulled ranges down; with `ACTIVATION_RANGE_ESTIMATOR = "MINMAX"` (the default
    here) ranges do not depend on the grouping.

    Args:
        ov_model: the stateless `openvino.Model` (past KV inputs `past_key_values.*`, outputs
            `present.*` and `logits`).
        prompts: `{"input_ids": [1, L], "attention_mask": [1, L]}` items (numpy or torch).
        decode_steps: decode calls gathered after each prefill (0: prefill only, optimum-intel's
            behaviour).
        group_decode: one sample per text for its decode calls (see above); otherwise one per call.
        decode_tokens_per_sample: the decode calls of all texts merged into samples of this many rows (calls),
            each row its own text's call with its own cache (left-padded, masked), so that a decode sample holds
            as many tokens as a prefill sample: NNCF's weight-compression statistics (AWQ, scale estimation) are
            one mean per sample, every sample weighing the same whatever its token count. None: `group_decode`.
    """

    def __init__(self, ov_model, prompts, decode_steps: int, *, group_decode: bool = True,
                 decode_tokens_per_sample: int | None = None):
        import openvino as ov

        if decode_steps < 0:
            raise InvalidOptionsError(f"calibration decode steps must be 0 or more, got {decode_steps}")
        self.decode_steps = decode_steps
        names = {p.get_any_name() for p in ov_model.inputs}
        self._past_names = sorted(n for n in names if n.startswith("past_key_values"))
        if not self._past_names:
            states = sorted(n for n in names if n not in _STEP_INPUTS)
            raise ModelNotSupportedError(
                "calibration on both stages feeds a KV cache (past_key_values inputs), and this graph's state is "
                f"{', '.join(states[:2])}{', ...' if len(states) > 2 else ''} (convolution or SSM state, or no "
                "cache): quantize without a data-aware mode for this model (--weight-format without --dataset or "
                "--quant-mode)"
            )
        unknown = names - _STEP_INPUTS - set(self._past_names)
        if unknown:
            raise ModelNotSupportedError(
                f"calibration on both stages cannot feed graph inputs {sorted(unknown)}: quantize without a "
                "data-aware mode for this model"
            )
        self._inputs = names
        self._past_types = {
            p.get_any_name(): (p.get_element_type().to_dtype(), p.get_partial_shape()) for p in ov_model.inputs
            if p.get_any_name() in self._past_names
        }
        compiled = ov.Core().compile_model(ov_model, "CPU", COMPILE_CONFIG)
        request = compiled.create_infer_request()
        self._texts: list[dict[str, Any]] = []
        self._keys: list[tuple[int, int | None]] = []
        desc = f"calibration: prefill + {decode_steps} decode calls per text"
        for prompt in bar(desc, iterable=prompts, unit="text"):
            index = len(self._texts)
            text = self._generate(request, prompt)
            self._texts.append(text)
            self._keys.append((index, 0))
            if group_decode and decode_steps > 1 and text["axes"]:
                self._keys.append((index, None))  # all its decode calls, one batch
            else:
                self._keys += [(index, step) for step in range(1, decode_steps + 1)]
        del request, compiled
        if decode_tokens_per_sample and decode_steps and all(text["axes"] for text in self._texts):
            rows = [(index, step) for index in range(len(self._texts)) for step in range(1, decode_steps + 1)]
            size = max(1, int(decode_tokens_per_sample))
            chunks = max(1, round(len(rows) / size))
            self._keys = [(index, 0) for index in range(len(self._texts))]
            self._keys += [("rows", tuple(rows[i::chunks])) for i in range(chunks)]

    @property
    def prefill_count(self) -> int:
        """Prefill calls in the set."""
        return len(self._texts)

    @property
    def texts(self) -> int:
        """Texts calibrated on (one prefill call each)."""
        return len(self._texts)

    @property
    def decode_count(self) -> int:
        """Decode calls in the set (grouped or not)."""
        return len(self._texts) * self.decode_steps

    def __len__(self) -> int:
        """Samples NNCF sees: one per prefill call, and one per decode call or per group of them."""
        return len(self._keys)

    def __iter__(self) -> Iterator[tuple[int, int | None]]:
        return iter(self._keys)

    def nncf_dataset(self):
        """An `nncf.Dataset` whose items become graph feeds only when NNCF asks for them."""
        import nncf

        return nncf.Dataset(self, self.feed)

    def feed(self, key: tuple[int, int | None]) -> dict[str, np.ndarray]:
        """The graph inputs of sample `key`: `(text, 0)` its prefill call, `(text, k)` its k-th decode
        call, `(text, None)` all its decode calls as one batch (row k-1 is decode call k)."""
        index, step = key
        if index == "rows":
            return self._decode_rows(step)
        text = self._texts[index]
        if step is None:
            return self._decode_batch(text)
        prompt_ids, prompt_mask, tokens = text["ids"], text["mask"], text["tokens"]
        if step == 0:
            input_ids, past = prompt_ids, self._empty_past()
        else:
            input_ids = tokens[:, step - 1: step]
            past = text["pasts"][step - 1] if text["pasts"] else self._past_prefix(text, prompt_ids.shape[1] + step - 1)
        mask = np.concatenate([prompt_mask, np.ones((1, step), dtype=np.int64)], axis=1)
        return self._feed(input_ids, mask, past)

    def _decode_batch(self, text) -> dict[str, np.ndarray]:
        steps, prompt_len = self.decode_steps, text["ids"].shape[1]
        longest = prompt_len + steps - 1
        masks, pasts = [], {name: [] for name in self._past_names}
        for step in range(1, steps + 1):
            pad = steps - step
            masks.append(np.concatenate([np.zeros((1, pad), np.int64), text["mask"], np.ones((1, step), np.int64)], 1))
            for name, value in self._past_prefix(text, prompt_len + step - 1).items():
                widths = [(0, 0)] * value.ndim
                widths[text["axes"][name]] = (pad, 0)
                pasts[name].append(np.pad(value, widths))
        past = {}
        for name, rows in pasts.items():
            batch_axis = 1 if text["axes"][name] == 0 else 0
            past[name] = np.concatenate(rows, axis=batch_axis)
            assert past[name].shape[text["axes"][name]] == longest
        return self._feed(text["tokens"].reshape(steps, 1), np.concatenate(masks, 0), past)

    def _decode_rows(self, rows) -> dict[str, np.ndarray]:
        """Decode calls of several texts as one batch: row r is call `rows[r] = (text, step)`, each past left-padded
        to the longest and masked there."""
        lengths = [self._texts[index]["ids"].shape[1] + step - 1 for index, step in rows]
        longest = max(lengths)
        masks, ids, pasts = [], [], {name: [] for name in self._past_names}
        for (index, step), length in zip(rows, lengths):
            text, pad = self._texts[index], longest - length
            masks.append(np.concatenate([np.zeros((1, pad), np.int64), text["mask"], np.ones((1, step), np.int64)], 1))
            ids.append(text["tokens"][:, step - 1: step])
            for name, value in self._past_prefix(text, length).items():
                widths = [(0, 0)] * value.ndim
                widths[text["axes"][name]] = (pad, 0)
                pasts[name].append(np.pad(value, widths))
        past = {}
        for name, parts in pasts.items():
            axis = self._texts[rows[0][0]]["axes"][name]
            past[name] = np.concatenate(parts, axis=1 if axis == 0 else 0)
        return self._feed(np.concatenate(ids, 0), np.concatenate(masks, 0), past)

    def _feed(self, input_ids, mask, past) -> dict[str, np.ndarray]:

        feed = {"input_ids": input_ids}
        if "attention_mask" in self._inputs:
            feed["attention_mask"] = mask
        if "position_ids" in self._inputs:
            feed["position_ids"] = position_ids_from_mask(mask, input_ids.shape[1])
        feed.update(past)
        return feed

    def _empty_past(self) -> dict[str, np.ndarray]:
        past = {}
        for name, (dtype, shape) in self._past_types.items():
            dims = [d.get_length() if d.is_static else (1 if i == 0 else 0) for i, d in enumerate(shape)]
            past[name] = np.zeros(dims, dtype=dtype)
        return past

    def _generate(self, request, prompt) -> dict[str, Any]:
        ids = _as_numpy(prompt["input_ids"])
        mask = _as_numpy(prompt.get("attention_mask"))
        mask = np.ones_like(ids) if mask is None else mask
        if ids.shape[0] != 1:
            raise InvalidOptionsError(f"calibration prompts must have batch 1, got {ids.shape[0]}")
        input_ids, full_mask, past = ids, mask, self._empty_past()
        pasts, tokens = [], []
        for step in range(self.decode_steps + 1):
            request.infer(self._feed(input_ids, full_mask, past))
            logits = request.get_tensor("logits").data
            token = int(np.argmax(logits[0, -1]))
            past = {
                name: request.get_tensor(name.replace("past_key_values", "present", 1)).data.copy()
                for name in self._past_names
            }
            tokens.append(token)
            if step < self.decode_steps:
                pasts.append(past)
                input_ids = np.array([[token]], dtype=np.int64)
                full_mask = np.concatenate([full_mask, np.ones((1, 1), dtype=np.int64)], axis=1)
        text = {"ids": ids, "mask": mask, "tokens": np.array([tokens[:-1]], dtype=np.int64), "final": {}, "axes": {}}
        if not self.decode_steps:
            text["pasts"] = []
            return text
        text["final"] = past
        axes = self._append_axes(pasts, past, ids.shape[1])
        if axes is None:
            text["pasts"] = pasts  # not append-only: keep every call's own cache
        else:
            text["pasts"], text["axes"] = [], axes
        return text

    def _append_axes(self, pasts, final, prompt_len) -> dict[str, int] | None:
        """The sequence axis of each cache if every call's past is a prefix of the final cache."""
        axes = {}
        for name in self._past_names:
            grown = [i for i, (a, b) in enumerate(zip(final[name].shape, self._empty_past()[name].shape)) if a != b]
            if len(grown) != 1 or final[name].shape[grown[0]] != prompt_len + self.decode_steps:
                return None
            axes[name] = grown[0]
        for step, past in enumerate(pasts, start=1):
            view = self._past_prefix({"final": final, "axes": axes}, prompt_len + step - 1)
            if any(not np.array_equal(view[n], past[n]) for n in self._past_names):
                return None
        return axes

    def _past_prefix(self, text, length: int) -> dict[str, np.ndarray]:
        out = {}
        for name in self._past_names:
            index = [slice(None)] * text["final"][name].ndim
            index[text["axes"][name]] = slice(0, length)
            out[name] = np.ascontiguousarray(text["final"][name][tuple(index)])
        return out


def quantize_both_stages(
    model_name_or_path: str,
    output: str | os.PathLike,
    quantization_config: Any,
    *,
    decode_steps: int,
    stateful: bool,
    report: CalibrationReport,
    trust_remote_code: bool = False,
    cache_dir: str | None = None,
    model_kwargs: dict | None = None,
) -> None:
    """Quantize the stateless graph in `output` on both stages, then make it stateful if asked.

    What optimum-intel's `_main_quantize` does, with the calibration dataset built here.

    Args:
        model_name_or_path: the source model (for the tokenizer and optimum-intel's default
            ignored scopes).
        output: the directory holding optimum-intel's stateless export; rewritten in place.
        quantization_config: the optimum-intel quantization config (object or dict).
        decode_steps: decode calls per text.
        stateful: make the quantized graph stateful (optimum-intel's `patch_stateful`).
        report: filled with the per-stage sample counts.
    """
    output = Path(output)
    model = load_stateless(output, trust_remote_code=trust_remote_code, cache_dir=cache_dir, model_kwargs=model_kwargs)
    if model.stateful:
        raise ModelNotSupportedError("calibration on both stages expected optimum-intel's stateless export")
    config = _prepared_config(model, quantization_config, model_name_or_path)
    prompts = prompt_inputs(model, config, trust_remote_code)
    # weight compression's statistics are one mean per sample, every sample weighing the same: decode calls are merged
    # into samples as long as a mean prompt, so they weigh by their tokens (benchmarks/calibration_design.py); for full
    # quantization's min-max ranges the merge changes nothing but the sample count (the design measured)
    merged = None
    if decode_steps and prompts:
        merged = max(1, round(float(np.mean([_as_numpy(p["input_ids"]).shape[-1] for p in prompts]))))
    samples = BothStageSamples(model.model, prompts, decode_steps, decode_tokens_per_sample=merged)
    report.record(samples, decode_steps)
    if is_int8_activations(config):  # the down projections, whose inputs hold outliers, stay in float; alpha 0.5
        report.float_matmuls = mlp_output_matmuls(model.model)
        config = with_int8_activation_defaults(config.clone(), report.float_matmuls)
    report.overflow_fix = _apply_calibrated(model, config, samples, model_name_or_path=model_name_or_path,
                                            trust_remote_code=trust_remote_code, save_directory=output,
                                            immediate_save=True)
    model_config = model.config
    del model, samples
    gc.collect()
    if stateful:
        make_stateful(output / "openvino_model.xml", model_config)


class _ConfigBuilt(Exception):
    """Stops optimum-intel's export command once it has built its quantization config."""


def quantization_config_of(run_command) -> Any:
    """The quantization config optimum-intel's export command builds from its flags.

    `run_command()` runs the command; it is stopped where it calls `main_export`, so nothing is loaded,
    converted or written, and the config is exactly the one the export would use (optimum-intel's
    own flag handling, model defaults included). None when the flags ask for no quantization.
    """
    built: dict[str, Any] = {}

    def main_export(bound, proceed):
        built["config"] = getattr(bound.arguments.get("ov_config"), "quantization_config", None)
        raise _ConfigBuilt

    with host.main_export_wrapped(main_export):
        try:
            run_command()
        except _ConfigBuilt:
            pass
    return built.get("config")


@contextlib.contextmanager
def both_stage_quantization(decode_steps: int | None, report: CalibrationReport, *, static=None, quantize=None):
    """While active, optimum-intel's data-aware quantization of a causal LM calibrates on both stages.

    Wraps `optimum.exporters.openvino.__main__.main_export` (a data-aware config exports the graph
    stateless, remembering whether a stateful one was asked for) and `_main_quantize` (which then
    runs `quantize_both_stages`), with host/'s `main_export_wrapped` and `main_quantize_wrapped`. Anything
    else goes to optimum-intel unchanged.

    Args:
        decode_steps: decode calls gathered after each prefill; None: per algorithm (`decode_steps_for`).
        report: filled with the per-stage sample counts.
        static: a static export's `StaticQuantization` plan: its config is kept for the static graph,
            which is calibrated on its own calls, instead of quantizing optimum-intel's dynamic graph.
        quantize: `quantize(arguments, stateful)` in place of `quantize_both_stages`, given `_main_quantize`'s
            arguments and whether a stateful graph was asked for (a vision-language model's: `visual.quantizer`).
    """
    requested: dict[str, bool] = {}

    def main_export(bound, proceed):
        ov_config = bound.arguments.get("ov_config")
        if ov_config is not None and is_data_aware(getattr(ov_config, "quantization_config", None)):
            requested["stateful"] = bound.arguments.get("stateful", True)
            bound.arguments["stateful"] = False
        return proceed()

    def _main_quantize(bound, proceed):
        arguments = bound.arguments
        data_aware = is_data_aware(arguments["quantization_config"])
        if static is not None:  # optimum-intel's dynamic graph is replaced: the static one is quantized instead
            if not data_aware:
                static.weight_config = arguments["quantization_config"]
                return None
            static.config, static.report = arguments["quantization_config"], report
            static.model_name_or_path, static.trust_remote_code = arguments["model_name_or_path"], arguments["trust_remote_code"]
            static.cache_dir, static.model_kwargs = arguments["cache_dir"], arguments["model_kwargs"]
            return None
        if "stateful" not in requested or not data_aware:
            return proceed()
        if quantize is not None:
            return quantize(arguments, requested["stateful"])
        steps, report.reason = decode_steps_for(decode_steps, arguments["quantization_config"])
        quantize_both_stages(
            arguments["model_name_or_path"], arguments["output"], arguments["quantization_config"],
            decode_steps=steps, stateful=requested["stateful"], report=report,
            trust_remote_code=arguments["trust_remote_code"], cache_dir=arguments["cache_dir"],
            model_kwargs=arguments["model_kwargs"],
        )

    with host.main_export_wrapped(main_export), host.main_quantize_wrapped(_main_quantize):
        yield report


