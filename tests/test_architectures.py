"""The architecture fixes (`optimum_shared_graph/architectures/`).

Each model type a fix repairs exports with `--task text-generation-shared` as one validated graph, with
greedy parity through OVModelForCausalLM and OpenVINO GenAI (for the types in `NPU_PARITY` its NPU
pipeline too; for a model with a pure KV cache, a static export); the manifest records the fix. The fix replaces optimum-intel's export config
for one export only: its own `text-generation-with-past` task is untouched.

The default run exports one type per kind of state (`DEFAULT_RUN`); `pytest -m coverage` runs every
repaired type, as `scripts/coverage.py` does for docs/architectures.md.
"""

from __future__ import annotations

import functools

import pytest
import torch

from conftest import EXACT, PROMPTS, run_cli

from optimum_shared_graph import architectures, read_manifest

# The model types this package repairs under transformers 5.5 (optimum-intel's own configs fail there).
REPAIRED = ["dbrx", "deepseek_v2", "deepseek_v3", "falcon_mamba", "gemma4_text", "lfm2", "lfm2_moe", "mamba",
            "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next", "zamba2"]

# With a pure KV cache, so a static export too; the others carry convolution / SSM / linear-attention state.
KV_CACHE_ONLY = {"dbrx", "deepseek_v2", "deepseek_v3", "gemma4_text"}

# optimum-intel's OVModelForCausalLM feeds these mamba-style graphs only the new tokens' attention mask after the
# prompt (runtimes/session.py), so a left-padded row's attention layers cannot tell its padding from its past:
# their left-padded batch is checked through GenAI, which feeds the whole context's mask.
PADDED_BATCH_THROUGH_GENAI_ONLY = {"zamba2"}

# One of each kind in the default run: multi-head latent attention with routed experts (a pure KV cache,
# static too), and a hybrid with linear-attention state beside a KV cache. The rest: `pytest -m coverage`.
DEFAULT_RUN = {"deepseek_v2", "qwen3_next"}

# Greedy parity through OpenVINO GenAI's NPU pipeline too (NPUW, its partitions on the CPU, computing in f16). The
# Qwen3.5 graphs need two export-time changes for it: no unused position_ids input (architectures/qwen3_5.py) and
# no past length read from a value state (graph/kv_shapes.py). docs/architectures.md has every type's NPU column.
NPU_PARITY = {"deepseek_v2", "deepseek_v3", "gemma4_text", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next"}
NPUW = {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU", "MAX_PROMPT_LEN": 64, "MIN_RESPONSE_LEN": 64}

NEW_TOKENS = 12


def _fixed_here(model_type: str) -> bool:
    return architectures.fix_module(model_type) is not None


needs_fix = pytest.mark.skipif(not any(map(_fixed_here, REPAIRED)),
                               reason="the installed transformers is outside every fix's range")


def _constructor(model_type: str, task: str = "text-generation-with-past"):
    """optimum-intel's TasksManager entry its export builds the config of `model_type` from."""
    return architectures._entries(model_type)[task]


def test_every_fix_module_keeps_the_contract():
    from packaging.specifiers import SpecifierSet

    names = architectures.fix_modules()
    assert names, "no fix modules"
    for name in names:
        module = architectures._load(name)
        assert module.MODEL_TYPES and all(isinstance(t, str) for t in module.MODEL_TYPES), name
        SpecifierSet(module.TRANSFORMERS)  # a valid specifier
        assert module.SUMMARY and "\n" not in module.SUMMARY, name
        assert module.__doc__ and len(module.__doc__.strip()) > 80, f"{name} does not say what broke and what it does"
    assert architectures.fixed_model_types() == set(REPAIRED)


@needs_fix
@pytest.mark.parametrize("model_type", REPAIRED)
def test_fix_is_swapped_in_for_one_export_and_restored(model_type):
    """Inside `fix_applied`, optimum-intel's TasksManager builds the fixed config (a subclass of its own);
    outside, its own config again, also after an error inside."""
    original = _constructor(model_type)
    base = original.func
    with architectures.fix_applied(model_type) as fix:
        inside = _constructor(model_type)
        assert fix is not None and fix.model_type == model_type
        assert inside.func is not base and issubclass(inside.func, base)
        assert inside.args == original.args and inside.keywords == original.keywords
        assert fix.record()["fix"].startswith("optimum_shared_graph.architectures.")
    assert _constructor(model_type) is original
    with pytest.raises(RuntimeError, match="inside"):
        with architectures.fix_applied(model_type):
            raise RuntimeError("inside")
    assert _constructor(model_type) is original


def test_no_fix_for_a_type_optimum_intel_exports_itself():
    original = _constructor("llama")
    with architectures.fix_applied("llama") as fix:
        assert fix is None and _constructor("llama") is original


@pytest.mark.parametrize("model_type", REPAIRED)
def test_fix_applies_only_to_the_transformers_it_was_written_for(model_type):
    """Under transformers 4.57 (in the package's range), optimum-intel's own config exports these types."""
    assert architectures.fix_module(model_type, "4.57.6") is None
    assert architectures.fix_module(model_type, "5.5.4") is not None


@functools.lru_cache(maxsize=None)
def _pytorch_greedy(path: str, prompts: tuple[str, ...]):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    pt = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(list(prompts), return_tensors="pt", padding=True)
    with torch.no_grad():
        out = pt.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return enc, out


def _assert_greedy_parity(model, path) -> None:
    """`model.generate()` (greedy) gives PyTorch's tokens for each prompt alone."""
    for prompt in PROMPTS:
        enc, ref = _pytorch_greedy(str(path), (prompt,))
        ours = model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=0)
        assert torch.equal(ours, ref), prompt


def _cases():
    return [pytest.param(t, marks=() if t in DEFAULT_RUN else (pytest.mark.coverage, pytest.mark.slow))
            for t in REPAIRED]


@needs_fix
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", _cases())
def test_repaired_type_exports_one_graph_with_parity(model_type, tiny_model, tmp_path):
    import openvino as ov
    import openvino_genai as ov_genai
    from optimum.intel import OVModelForCausalLM

    path = tiny_model(model_type)
    out = tmp_path / "shared"
    run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", str(out), check=True)
    graphs = sorted(p.name for p in out.glob("*.xml") if "tokenizer" not in p.name)
    assert graphs == ["openvino_model.xml"]
    manifest = read_manifest(out)
    assert manifest.partitioning == "shared" and manifest.stateful
    assert manifest.validation["status"] == "passed" and manifest.validation["decode_steps"] >= 3
    fix = architectures.fix_module(model_type)
    assert [f["fix"] for f in manifest.model["fixes"]] == [fix.__name__]
    assert manifest.model["fixes"][0]["summary"] == fix.SUMMARY

    # OVModelForCausalLM: each prompt alone, then the prompts left-padded in one batch
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    _assert_greedy_parity(ov_model, path)
    enc, ref = _pytorch_greedy(str(path), tuple(PROMPTS[:2]))
    assert (enc["attention_mask"] == 0).any()  # really left-padded
    if model_type not in PADDED_BATCH_THROUGH_GENAI_ONLY:
        ours = ov_model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=0)
        assert torch.equal(ours, ref)
    del ov_model

    # OpenVINO GenAI's LLMPipeline, as shipped (its default attention backend), and its NPU pipeline
    pipe = ov_genai.LLMPipeline(str(out), "CPU", **EXACT)
    npu = ov_genai.LLMPipeline(str(out), "NPU", **NPUW) if model_type in NPU_PARITY else None
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    for prompt in PROMPTS:
        enc, ref = _pytorch_greedy(str(path), (prompt,))
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        assert list(pipe.generate(inputs, config).tokens[0]) == ref[0, enc["input_ids"].shape[1]:].tolist(), prompt
        if npu is not None:
            assert list(npu.generate(inputs, config).tokens[0]) == ref[0, enc["input_ids"].shape[1]:].tolist(), prompt
    del npu
    if model_type in PADDED_BATCH_THROUGH_GENAI_ONLY:
        enc, ref = _pytorch_greedy(str(path), tuple(PROMPTS[:2]))
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        result = pipe.generate(inputs, config)
        assert [list(t) for t in result.tokens] == ref[:, enc["input_ids"].shape[1]:].tolist()
    del pipe

    if model_type in KV_CACHE_ONLY:  # a static export (C = 4), run through runtime()
        import optimum_shared_graph as osg

        static = tmp_path / "static"
        run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", "--shape-mode", "static",
                "--static-query-len", "4", "--max-cache-len", "128", str(static), check=True)
        assert read_manifest(static).model["fixes"][0]["fix"] == fix.__name__
        model = osg.runtime(static, ov_config=EXACT)
        _assert_greedy_parity(model, path)
    else:  # state other than a KV cache has no static form: refused with one line, nothing written
        static = tmp_path / "static"
        proc = run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", "--shape-mode",
                       "static", "--max-cache-len", "128", str(static))
        assert proc.returncode != 0 and "--shape-mode dynamic" in proc.stderr.strip().splitlines()[-1]
        assert not static.exists()


@needs_fix
def test_data_aware_quantization_of_a_hybrid_is_refused_in_one_line(tiny_model, tmp_path):
    """Both-stage calibration feeds a KV cache; a graph whose state is convolution / linear-attention state is
    refused with what to do instead, and nothing is written."""
    data = tmp_path / "calibration.txt"
    data.write_text("def add(a, b):\n    return a + b\nprint(add(1, 2))\n", encoding="utf-8")
    out = tmp_path / "out"
    proc = run_cli("export", "openvino", "-m", str(tiny_model("qwen3_next")), "--task", "text-generation-shared",
                   "--quant-mode", "int8", "--dataset", str(data), "--num-samples", "1", str(out))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "cache_params.past.conv.0" in last and "quantize without a data-aware mode" in last, last
    assert not out.exists() and not list(tmp_path.glob(".out*"))


@needs_fix
def test_optimum_intel_own_task_does_not_get_the_fix(tiny_model, tmp_path):
    """optimum-intel's own `text-generation-with-past` export of a repaired type runs its own config, as
    before: the fix is ours, for our task only."""
    model_type = "qwen3_next"
    proc = run_cli("export", "openvino", "-m", str(tiny_model(model_type)), "--task", "text-generation-with-past",
                   str(tmp_path / "theirs"))
    assert proc.returncode != 0
    # its own config's cap (4.57.6), which our export lifts only with the fix in place and validation on
    assert "does not allow for the export of the model. Maximum required is 4.57.6" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "theirs" / "openvino_model.xml").exists()
