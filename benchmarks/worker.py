"""Measure one runtime on one artifact, in a process of its own (run by `run.py`, one fresh process per round).

Prints one JSON object on the last line of stdout:
    load_s            load + compile wall time of the runtime
    rss_after_load_mb resident memory once loaded
    ttft_s            {prompt_len: [seconds per run]}: from the generate() call to the first new token
    tpot_s            {prompt_len: [seconds per run]}: (t_last - t_first) / (n - 1) over the n new tokens
    gen_peak_mb       {prompt_len: peak resident memory during that length's runs (VmHWM, reset before)}
    load_peak_mb      peak resident memory while importing, loading and compiling (VmHWM)
    peak_rss_mb       peak resident memory of the whole process: the largest of the above (VmHWM is this
                      process image's own; ru_maxrss would also count the parent's size before exec)
    tokens            {prompt_len: the greedy tokens of the first run}, to compare layouts

Token times come from each runtime's streamer (the moment a token is handed back to the caller).
Prompts are random token ids (seeded; a new prompt for every run, identical across runtimes), batch 1,
greedy; EOS never ends a run early (`eos_token_id=None` for transformers' `generate()`, `ignore_eos` for
GenAI: each runtime's own way, with no per-token check). Every prompt length gets one untimed warm-up
run first (the first inference at a new shape is slower); a static graph, which has one shape, is warmed
up once.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

import children

RUNTIMES = ("optimum", "genai", "runtime", "twograph", "torch", "static", "raw")


# ---- memory ------------------------------------------------------------------------------------

def rss_mb() -> float:
    return children.status_mb("VmRSS")


def reset_peak() -> None:
    """Reset the process's peak-RSS mark (VmHWM) to the current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_since_reset_mb() -> float:
    return children.status_mb("VmHWM")


# ---- runtimes: each returns generate(ids, n_new) -> (per-token timestamps, generated token ids) ----------

Generate = Callable[[np.ndarray, int], list]


def _hf_generate(model) -> Generate:
    """transformers' generate() (OVModelForCausalLM and PyTorch), timed with a streamer."""
    import torch
    from transformers.generation.streamers import BaseStreamer

    class Stamps(BaseStreamer):
        def __init__(self):
            self.times, self._prompt_seen = [], False

        def put(self, value):
            if not self._prompt_seen:  # the first put() is the prompt
                self._prompt_seen = True
                return
            self.times.append(time.perf_counter())

        def end(self):
            pass

    def generate(ids: np.ndarray, n_new: int) -> list:
        stamps = Stamps()
        input_ids = torch.from_numpy(ids)
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n_new,
                eos_token_id=None, do_sample=False, streamer=stamps, pad_token_id=0,
            )
        return stamps.times, out[0, ids.shape[1]:].tolist()

    return generate


def load_optimum(path: str) -> Generate:
    from optimum.intel import OVModelForCausalLM

    return _hf_generate(OVModelForCausalLM.from_pretrained(path, device="CPU", compile=True))


def load_torch(path: str) -> Generate:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _hf_generate(model)


def load_genai(path: str) -> Generate:
    import openvino as ov
    import openvino_genai as genai

    pipe = genai.LLMPipeline(path, "CPU")

    class Stamps(genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.times = []

        def write(self, token):
            now = time.perf_counter()
            self.times.extend([now] * (len(token) if isinstance(token, (list, tuple)) else 1))
            return genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def generate(ids: np.ndarray, n_new: int) -> list:
        config = genai.GenerationConfig(max_new_tokens=n_new, min_new_tokens=n_new, ignore_eos=True, do_sample=False)
        stamps = Stamps()
        result = pipe.generate(ov.Tensor(ids), config, stamps)
        return stamps.times, list(result.tokens[0])

    return generate


def load_runtime(path: str) -> Generate:
    """`optimum_shared_graph.runtime()`, if this version has it: a model with `generate()`."""
    import optimum_shared_graph as osg

    if not hasattr(osg, "runtime"):
        raise NotImplementedError("optimum_shared_graph.runtime() does not exist in this version")
    return _hf_generate(osg.runtime(path, device="CPU"))


def load_twograph(path: str) -> Generate:
    """The two-graph layout: a stateless prefill graph and a stateless decode graph exchanging the KV cache."""
    import openvino as ov

    core = ov.Core()
    root = Path(path)
    prefill = core.compile_model(root / "prefill" / "openvino_model.xml", "CPU")
    decode = core.compile_model(root / "decode" / "openvino_model.xml", "CPU")
    p_req, d_req = prefill.create_infer_request(), decode.create_infer_request()
    past_names = [p.get_any_name() for p in decode.inputs if p.get_any_name().startswith("past_key_values")]
    present_names = [p.get_any_name() for p in decode.outputs if p.get_any_name().startswith("present")]
    prefill_inputs = {p.get_any_name() for p in prefill.inputs}

    def generate(ids: np.ndarray, n_new: int) -> list:
        times, tokens = [], []
        batch, length = ids.shape
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                "position_ids": np.arange(length, dtype=np.int64)[None].repeat(batch, 0)}
        if "beam_idx" in prefill_inputs:
            feed["beam_idx"] = np.arange(batch, dtype=np.int32)
        out = p_req.infer(feed)
        token = np.argmax(out["logits"][:, -1, :], axis=-1).astype(np.int64)[:, None]
        times.append(time.perf_counter())
        tokens.append(int(token[0, 0]))
        past = [np.copy(out[name]) for name in present_names]
        total = length
        for _ in range(n_new - 1):
            total += 1
            feed = {"input_ids": token, "attention_mask": np.ones((batch, total), dtype=np.int64),
                    "position_ids": np.full((batch, 1), total - 1, dtype=np.int64)}
            feed.update(zip(past_names, past))
            out = d_req.infer(feed)
            token = np.argmax(out["logits"][:, -1, :], axis=-1).astype(np.int64)[:, None]
            times.append(time.perf_counter())
            tokens.append(int(token[0, 0]))
            past = [np.copy(out[name]) for name in present_names]
        return times, tokens

    return generate


def load_raw(path: str) -> Generate:
    """A diagnostic: the one stateful graph driven by a bare OpenVINO infer loop (greedy argmax in numpy).

    What the graph itself costs, without a generation framework around it.
    """
    import openvino as ov

    compiled = ov.Core().compile_model(Path(path) / "openvino_model.xml", "CPU")
    request = compiled.create_infer_request()

    def generate(ids: np.ndarray, n_new: int) -> tuple[list, list]:
        times, tokens = [], []
        batch, length = ids.shape
        request.reset_state()
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                "position_ids": np.arange(length, dtype=np.int64)[None].repeat(batch, 0),
                "beam_idx": np.arange(batch, dtype=np.int32)}
        total = length
        for step in range(n_new):
            request.infer(feed)
            logits = request.get_tensor("logits").data
            token = np.argmax(logits[:, -1, :], axis=-1).astype(np.int64)[:, None]
            times.append(time.perf_counter())
            tokens.append(int(token[0, 0]))
            total += 1
            feed = {"input_ids": token, "attention_mask": np.ones((batch, total), dtype=np.int64),
                    "position_ids": np.full((batch, 1), total - 1, dtype=np.int64),
                    "beam_idx": np.arange(batch, dtype=np.int32)}
        return times, tokens

    return generate


def load_static(path: str) -> Generate:
    """A static artifact, through `optimum_shared_graph.runtime()` (the only runtime that drives one)."""
    return load_runtime(path)


def preload(runtime: str) -> None:
    """Import what `runtime` needs before the load timer starts: load time is load + compile, not imports."""
    if runtime in ("optimum", "runtime", "static"):
        from optimum.intel import OVModelForCausalLM  # noqa: F401
        from optimum.intel.openvino import modeling_decoder  # noqa: F401
    if runtime in ("runtime", "static"):
        import optimum_shared_graph  # noqa: F401
    if runtime == "genai":
        import openvino_genai  # noqa: F401
    if runtime == "torch":
        from transformers import AutoModelForCausalLM  # noqa: F401
    import openvino  # noqa: F401


LOADERS = {"raw": load_raw, "optimum": load_optimum, "genai": load_genai, "runtime": load_runtime, "twograph": load_twograph,
           "torch": load_torch, "static": load_static}


# ---- measurement -------------------------------------------------------------------------------

def prompt(seed: int, length: int, index: int, vocab: int) -> np.ndarray:
    """A random prompt, the same for every runtime given (seed, length, index); a new one for each run,
    so no runtime can answer from a prefix cache."""
    rng = np.random.default_rng([seed, length, index])
    return rng.integers(3, vocab, size=(1, length), dtype=np.int64)


def measure(runtime: str, path: str, prompt_lens: list[int], reps: int, new_tokens: int, vocab: int, seed: int,
            warmup: bool = True) -> dict:
    preload(runtime)
    start = time.perf_counter()
    generate = LOADERS[runtime](path)
    result = {"runtime": runtime, "load_s": time.perf_counter() - start, "rss_after_load_mb": rss_mb(),
              "load_peak_mb": peak_since_reset_mb(), "ttft_s": {}, "tpot_s": {}, "gen_peak_mb": {}, "tokens": {}}
    for n in prompt_lens:
        reset_peak()
        # The first inference at a new shape is slower; a static graph has one shape, warmed up once.
        if warmup and (runtime != "static" or n == prompt_lens[0]):
            generate(prompt(seed, n, 10_000, vocab), 2)
        ttft, tpot = [], []
        for i in range(reps):
            t0 = time.perf_counter()
            stamps, tokens = generate(prompt(seed, n, i, vocab), new_tokens)
            ttft.append(stamps[0] - t0)
            if len(stamps) >= 2:
                tpot.append((stamps[-1] - stamps[0]) / (len(stamps) - 1))
            if i == 0:
                result["tokens"][n] = [int(t) for t in tokens]
        result["ttft_s"][n] = ttft
        result["tpot_s"][n] = tpot
        result["gen_peak_mb"][n] = peak_since_reset_mb()
    result["peak_rss_mb"] = max([result["load_peak_mb"], *result["gen_peak_mb"].values()])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", choices=RUNTIMES, required=True)
    parser.add_argument("--path", required=True, help="artifact (or model) directory")
    parser.add_argument("--prompt-lens", type=int, nargs="+", required=True)
    parser.add_argument("--reps", type=int, default=1, help="timed runs per prompt length")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per run")
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        result = measure(args.runtime, args.path, args.prompt_lens, args.reps, args.new_tokens, args.vocab,
                         args.seed, warmup=not args.no_warmup)
    except NotImplementedError as err:
        result = {"runtime": args.runtime, "skipped": str(err)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
