"""Every OpenVINO deployment path as a consumer of the shared artifact (docs/deploy.md).

- OpenVINO GenAI's NPU LLM pipeline (NPUW), run on the CPU (`NPUW_DEVICES="CPU"`): the code path an
  Intel NPU takes, which reshapes the dynamic artifact into its own static prefill (chunked) and generate
  models and computes in f16. Random-init logits can be near-tied, so an f16 greedy pick may flip
  against PyTorch: the shared artifact is compared with optimum-intel's own `text-generation-with-past`
  artifact of the same model, through the same pipeline with the same properties, in the same test.
- `ContinuousBatchingPipeline` (PagedAttention): many requests of different lengths batched into the same
  inferences, with prefix caching on and off, each answer equal to `LLMPipeline` run alone.
- A static artifact (`shape_mode="static"`) is refused at load by both, never run.

`OVModelForCausalLM`, `LLMPipeline` on the CPU and `runtime()` are covered by test_export_cli.py,
test_static.py and test_runtime.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from conftest import ARCHITECTURES, EXACT

NEW_TOKENS = 16

# NPUW's LLM pipeline on the CPU, as on a machine without an NPU.
NPUW = {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU"}
# Chunked prefill: the prompt goes through a static [1, 16] prefill model, 16 tokens per call, into a
# 64-token prompt cache (NPUW's rules: the chunk size a power of two, MAX_PROMPT_LEN, aligned up to 64,
# a multiple of it); MIN_RESPONSE_LEN sizes the generate model's cache beyond the prompt.
CHUNKED = {"MAX_PROMPT_LEN": 64, "MIN_RESPONSE_LEN": 64, "NPUW_LLM_PREFILL_CHUNK_SIZE": 16}
# Prompt lengths: under a chunk, exactly one, one past it, three chunks and a partial one, MAX_PROMPT_LEN.
NPU_LENGTHS = [1, 3, 16, 17, 44, 64]

# The default run covers llama (the common case) and gpt2 (fused QKV, Conv1D); `pytest -m slow` runs
# every one, and scripts/coverage.py's NPU column every exportable type.


def every_architecture(default_run: set[str]) -> list:
    """Every architecture as a parameter, those outside `default_run` marked slow."""
    return [pytest.param(a, marks=() if a in default_run else pytest.mark.slow) for a in ARCHITECTURES]


@pytest.fixture(scope="module")
def artifact(tiny_model, tmp_path_factory):
    """`artifact(model_type, kind)` -> directory, exported once per module. Kinds: `shared`, `shared-all`
    (`--logits all`), `with-past` (optimum-intel's own export of the same model), `static`,
    `static-stateless`."""
    import optimum_shared_graph as osg

    done = {}
    root = tmp_path_factory.mktemp("deploy")

    def get(model_type: str, kind: str):
        if (model_type, kind) not in done:
            model, out = tiny_model(model_type), root / f"{model_type}-{kind}"
            if kind == "with-past":
                from optimum.exporters.openvino import main_export

                main_export(str(model), str(out), task="text-generation-with-past")
            elif kind == "shared":
                osg.export(model, out)
            elif kind == "shared-all":
                osg.export(model, out, logits="all")
            elif kind == "static":
                osg.export(model, out, shape_mode="static", max_cache_len=64)
            elif kind == "static-stateless":
                osg.export(model, out, shape_mode="static", max_cache_len=64, stateful=False)
            else:
                raise ValueError(kind)
            done[(model_type, kind)] = out
        return done[(model_type, kind)]

    return get


def _prompts(model_dir, lengths, seed=0) -> list[np.ndarray]:
    """Random token ids of exact lengths (no special tokens: ids 0-2 are pad, bos and eos)."""
    import json

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=(1, n), dtype=np.int64) for n in lengths]


def _pytorch_greedy(model_dir, prompts) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    pt = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    out = []
    for p in prompts:
        ids = torch.from_numpy(p)
        gen = pt.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                          min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0, eos_token_id=None)
        out.append(gen[0, p.shape[1]:].tolist())
    return out


def _genai_greedy(pipe, prompts) -> list[list[int]]:
    import openvino as ov
    import openvino_genai as genai

    config = genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    return [list(pipe.generate(genai.TokenizedInputs(ov.Tensor(p), ov.Tensor(np.ones_like(p))), config).tokens[0])
            for p in prompts]


def _npu_outcome(path, prompts, properties) -> str | list:
    """Greedy tokens per prompt through the NPU pipeline, or NPUW's error as one line: `load: ...` for the
    whole artifact, `generate: ...` for a prompt (node numbers left out, so two graphs' errors compare)."""
    import openvino_genai as genai

    def error(stage, exc):
        return f"{stage}: " + re.sub(r"_\d+\b", "_N", str(exc).strip().splitlines()[-1])

    try:
        pipe = genai.LLMPipeline(str(path), "NPU", **NPUW, **properties)
    except RuntimeError as exc:
        return error("load", exc)
    out = []
    for p in prompts:
        try:
            out += _genai_greedy(pipe, [p])
        except RuntimeError as exc:
            out.append(error("generate", exc))
    return out


def _assert_no_worse_than_optimum_intel(ours, theirs, reference):
    """Prompt by prompt, ours equals optimum-intel's token for token (so wherever theirs matches PyTorch,
    ours does too), and the path computes the model: most prompts that run match PyTorch at all. Where
    NPUW cannot run optimum-intel's artifact, ours fails the same way (not refused for its own reasons) or runs
    and computes the model (graph/npuw_forms.py gives some graphs a form NPUW runs: tiny bloom's)."""
    if isinstance(theirs, str):  # NPUW fails optimum-intel's artifact at load
        if isinstance(ours, str):
            assert ours == theirs, f"optimum-intel's artifact: {theirs}; ours: {ours}"
            return
        theirs = [theirs] * len(reference)
    assert not isinstance(ours, str), f"NPUW loads optimum-intel's artifact, not ours: {ours}"
    for i, (o, t, r) in enumerate(zip(ours, theirs, reference)):
        if isinstance(t, str):  # NPUW fails optimum-intel's artifact on this prompt: ours the same way, or it runs
            assert o == t or not isinstance(o, str), f"prompt {i}: optimum-intel's artifact: {t}; ours: {o}"
            continue
        assert o == r or t != r, f"prompt {i}: optimum-intel's artifact matches PyTorch, ours does not: {o} {r}"
        assert o == t, f"prompt {i}: ours {o} against optimum-intel's {t} (PyTorch {r})"
    for ran in ([(t, r) for t, r in zip(theirs, reference) if not isinstance(t, str)],
                [(o, r) for o, t, r in zip(ours, theirs, reference) if isinstance(t, str) and not isinstance(o, str)]):
        assert sum(x == r for x, r in ran) * 2 >= len(ran), (ours, theirs, reference)


# ---------------------------------------------------------------- the NPU pipeline (NPUW on the CPU)


# The tiny 2-layer gpt2 with a chunked prefill: NPUW loads optimum-intel's artifact and not this package's ("Model
# references undeclared parameters ... f16[1,4,16,16]") since graph/npuw_forms.py drops gpt2's identity Reshape of
# input_ids; exported without that edit it loads. At released width (6 layers of 768, fp16, f16 compute) the other way
# round, chunked (16) or not: ours loads and runs, optimum-intel's fails ("Key opset1::MatMul __module.lm_head ... is
# not found in a map"), which is what the edit is for. NPUW partitions a 2-layer model unlike a released one
# (docs/npu-real-width.md), so the tiny case is pinned, not hidden: it fails here as measured, and passes if it changes.
_TINY_GPT2_CHUNKED = pytest.mark.xfail(strict=True, raises=AssertionError, reason="NPUW on a 2-layer gpt2 without "
                                       "its input_ids Reshape: see the comment above")


@pytest.mark.parametrize("model_type", [pytest.param(*p.values, marks=[*p.marks, _TINY_GPT2_CHUNKED]) if p.values == ("gpt2",)
                                        else p for p in every_architecture({"llama", "gpt2"})])
def test_npu_pipeline_chunked_prefill(model_type, tiny_model, artifact):
    """The dynamic shared artifact through the NPU pipeline with a chunked prefill, against optimum-intel's
    own artifact through the same pipeline: no worse against PyTorch, prompt by prompt."""
    prompts = _prompts(tiny_model(model_type), NPU_LENGTHS)
    reference = _pytorch_greedy(tiny_model(model_type), prompts)
    ours = _npu_outcome(artifact(model_type, "shared"), prompts, CHUNKED)
    theirs = _npu_outcome(artifact(model_type, "with-past"), prompts, CHUNKED)
    _assert_no_worse_than_optimum_intel(ours, theirs, reference)


@pytest.mark.parametrize("model_type", every_architecture({"llama"}))
def test_npu_pipeline_logits_all(model_type, tiny_model, artifact):
    """A `--logits all` artifact (every position's logits) through the same chunked NPU pipeline."""
    prompts = _prompts(tiny_model(model_type), NPU_LENGTHS)
    reference = _pytorch_greedy(tiny_model(model_type), prompts)
    ours = _npu_outcome(artifact(model_type, "shared-all"), prompts, CHUNKED)
    theirs = _npu_outcome(artifact(model_type, "with-past"), prompts, CHUNKED)
    _assert_no_worse_than_optimum_intel(ours, theirs, reference)


def test_npu_pipeline_default_properties(tiny_model, artifact):
    """The NPU pipeline as first run, with NPUW's default prompt and response lengths."""
    prompts = _prompts(tiny_model("llama"), [3, 44], seed=1)
    reference = _pytorch_greedy(tiny_model("llama"), prompts)
    ours = _npu_outcome(artifact("llama", "shared"), prompts, {})
    theirs = _npu_outcome(artifact("llama", "with-past"), prompts, {})
    _assert_no_worse_than_optimum_intel(ours, theirs, reference)


def test_npu_pipeline_applies_the_chunking_properties(tiny_model, artifact):
    """The properties above are the ones NPUW applies: its chunk-size rule (checked only when it chunks the
    prefill) refuses a chunk of 12, and a prompt over MAX_PROMPT_LEN is refused before any inference."""
    import openvino_genai as genai

    path = str(artifact("llama", "shared"))
    with pytest.raises(RuntimeError, match=r"chunk size \(12\) is not power of 2"):
        genai.LLMPipeline(path, "NPU", **NPUW, **{**CHUNKED, "NPUW_LLM_PREFILL_CHUNK_SIZE": 12})
    pipe = genai.LLMPipeline(path, "NPU", **NPUW, **CHUNKED)
    with pytest.raises(RuntimeError, match="may only process prompts or hold chat history up to 64 tokens. 65 is"):
        _genai_greedy(pipe, _prompts(tiny_model("llama"), [65]))


# ---------------------------------------------------------------- continuous batching (PagedAttention)

# Ten lengths (one of them over the batch's token budget, so its prefill is split over several steps),
# and two prompts sharing a 96-token prefix (three KV blocks) that prefix caching can reuse.
CB_LENGTHS = [1, 3, 5, 7, 16, 17, 33, 64, 100, 150]


def _cb_prompts(model_dir) -> list[np.ndarray]:
    prompts = _prompts(model_dir, CB_LENGTHS, seed=2)
    prefix = _prompts(model_dir, [96], seed=3)[0]
    prompts += [np.concatenate([prefix, tail], axis=1) for tail in _prompts(model_dir, [5, 9], seed=4)]
    return prompts


def _scheduler(prefix_caching: bool, max_batched_tokens: int):
    import openvino_genai as genai

    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 1  # GB of KV blocks
    scheduler.enable_prefix_caching = prefix_caching
    scheduler.max_num_batched_tokens = max_batched_tokens
    return scheduler


@pytest.fixture(scope="module")
def alone(tiny_model, artifact):
    """`alone(model_type, kind)` -> `LLMPipeline`'s answers (stateful, the whole prompt in one call) on each
    of the batching prompts, one at a time."""
    import openvino_genai as genai

    done = {}

    def get(model_type: str, kind: str = "shared"):
        if (model_type, kind) not in done:
            pipe = genai.LLMPipeline(str(artifact(model_type, kind)), "CPU", **EXACT)
            done[(model_type, kind)] = _genai_greedy(pipe, _cb_prompts(tiny_model(model_type)))
        return done[(model_type, kind)]

    return get


# llama's shared artifact by default; every architecture, and a `--logits all` artifact, under `-m slow`.
CB_CASES = [("llama", "shared"),
            *[pytest.param(a, "shared", marks=pytest.mark.slow) for a in ARCHITECTURES if a != "llama"],
            pytest.param("llama", "shared-all", marks=pytest.mark.slow)]


@pytest.mark.parametrize("prefix_caching", [False, True], ids=["prefix-caching-off", "prefix-caching-on"])
@pytest.mark.parametrize("model_type,kind", CB_CASES)
def test_continuous_batching_matches_llm_pipeline_alone(model_type, kind, prefix_caching, tiny_model, artifact, alone):
    """Twelve requests of 1 to 150 tokens submitted together: at least 8 of them in one inference, and
    every answer equal to LLMPipeline's on the prompt alone; then the same requests again (with prefix
    caching on, their KV blocks come from the cache)."""
    import openvino as ov
    import openvino_genai as genai

    prompts, expected = _cb_prompts(tiny_model(model_type)), alone(model_type, kind)
    config = genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    pipe = genai.ContinuousBatchingPipeline(str(artifact(model_type, kind)), _scheduler(prefix_caching, 32), "CPU",
                                            EXACT)
    handles = [pipe.add_request(i, ov.Tensor(p), config) for i, p in enumerate(prompts)]
    batched = []
    while pipe.has_non_finished_requests():
        pipe.step()
        batched.append(pipe.get_metrics().scheduled_requests)
    assert max(batched) >= 8, batched
    assert [list(h.read_all()[0].generated_ids) for h in handles] == expected

    again = pipe.generate([ov.Tensor(p) for p in prompts], [config] * len(prompts))
    assert [list(r.m_generation_ids[0]) for r in again] == expected


def test_prefix_caching_reuses_the_shared_prefix(tiny_model, artifact, alone):
    """With prefix caching, a request whose first 96 tokens an earlier one computed skips their prefill
    (fewer pipeline steps at 16 tokens per step), and answers as LLMPipeline alone does."""
    import openvino as ov
    import openvino_genai as genai

    first, second = _cb_prompts(tiny_model("llama"))[-2:]
    config = genai.GenerationConfig(max_new_tokens=4, min_new_tokens=4, ignore_eos=True)
    steps, answers = {}, {}
    for prefix_caching in (False, True):
        pipe = genai.ContinuousBatchingPipeline(str(artifact("llama", "shared")), _scheduler(prefix_caching, 16),
                                                "CPU", EXACT)
        for i, p in enumerate((first, second)):
            handle = pipe.add_request(i, ov.Tensor(p), config)
            count = 0
            while pipe.has_non_finished_requests():
                pipe.step()
                count += 1
        steps[prefix_caching], answers[prefix_caching] = count, list(handle.read_all()[0].generated_ids)
    assert steps[True] < steps[False], steps
    assert answers[True] == answers[False] == alone("llama")[-1][:4]


# ---------------------------------------------------------------- static artifacts are refused at load

STATIC_REFUSAL = "Could not find a model in the directory"


@pytest.mark.parametrize("kind", ["static", pytest.param("static-stateless", marks=pytest.mark.slow)])
def test_static_artifact_refused_at_load(kind, artifact):
    """A static artifact's graph is `openvino_static_model.xml`, which neither pipeline loads: both fail in
    their constructor, before any inference, naming the directory."""
    import openvino_genai as genai

    path = artifact("llama", kind)
    assert (path / "openvino_static_model.xml").is_file() and not (path / "openvino_model.xml").exists()
    loaders = {
        "ContinuousBatchingPipeline": lambda: genai.ContinuousBatchingPipeline(str(path), genai.SchedulerConfig(),
                                                                               "CPU"),
        "NPU pipeline": lambda: genai.LLMPipeline(str(path), "NPU", **NPUW, **CHUNKED),
    }
    for name, load in loaders.items():
        with pytest.raises(RuntimeError) as info:
            load()
        assert f"{STATIC_REFUSAL} '\"{path}\"'" in str(info.value), (name, str(info.value))
