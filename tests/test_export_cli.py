"""`optimum-cli export openvino --task text-generation-shared`, driven in a subprocess as a user drives it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import ARCHITECTURES, EXACT, PROMPTS, run_cli, run_cli_in_process

from optimum_shared_graph import read_manifest
from optimum_shared_graph.manifest import sha256_file

NEW_TOKENS = 12

# The default run covers one architecture per family of cache layout and generation class (llama:
# the common case; qwen2: grouped KV heads with bias; phi3: optimum-intel's own model class; gpt2:
# fused QKV, Conv1D; bloom: ALiBi and its own beam reordering); `pytest -m slow` runs every one.
# The `--logits all` slice is architecture-independent past the decoder: three suffice by default.


def every_architecture(default_run: set[str]) -> list:
    """Every architecture as a parameter, those outside `default_run` marked slow."""
    return [pytest.param(a, marks=() if a in default_run else pytest.mark.slow) for a in ARCHITECTURES]


@pytest.fixture(scope="module")
def exported(tiny_model, tmp_path_factory):
    """`exported(model_type, logits)` -> artifact directory (exported once per module)."""
    done = {}
    root = tmp_path_factory.mktemp("artifacts")

    def get(model_type: str, logits: str = "last"):
        if (model_type, logits) not in done:
            out = root / f"{model_type}-{logits}"
            args = ["export", "openvino", "-m", str(tiny_model(model_type)), "--task", "text-generation-shared", str(out)]
            if logits != "last":
                args += ["--logits", logits]
            # optimum-cli's entry point in this process: the same command without a fresh interpreter's ~10 s of
            # imports per architecture (the command in a subprocess: the tests below that check its output)
            run_cli_in_process(*args)
            done[(model_type, logits)] = out
        return done[(model_type, logits)]

    return get


def _greedy(model, enc):
    return model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("model_type", every_architecture({"llama", "qwen2", "phi3", "gpt2", "bloom"}))
def test_one_graph_and_parity(model_type, tiny_model, exported):
    import openvino as ov
    import openvino_genai as ov_genai
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = exported(model_type)
    graphs = sorted(p.name for p in out.glob("*.xml") if "tokenizer" not in p.name)
    assert graphs == ["openvino_model.xml"]
    manifest = read_manifest(out)
    assert manifest.partitioning == "shared" and manifest.logits == "last" and manifest.stateful
    assert manifest.validation["status"] == "passed" and manifest.validation["greedy_match"]
    assert manifest.validation["decode_steps"] >= 3
    for name, digest in manifest.files.items():
        assert sha256_file(out / name) == digest
    assert set(manifest.files) == {"openvino_model.xml", "openvino_model.bin"}
    rt = ov.Core().read_model(out / "openvino_model.xml").get_rt_info()
    assert rt["shared_graph"]["partitioning"].astype(str) == "shared"

    logits_shape = ov.Core().read_model(out / "openvino_model.xml").output("logits").get_partial_shape()
    assert logits_shape[1].is_static and logits_shape[1].get_length() == 1

    path = tiny_model(model_type)
    tok = AutoTokenizer.from_pretrained(path)
    pt = AutoModelForCausalLM.from_pretrained(path).eval()
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        assert torch.equal(_greedy(pt, enc), _greedy(ov_model, enc)), prompt
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    assert enc["attention_mask"][0, 0] == 0 or enc["attention_mask"][1, 0] == 0  # really left-padded
    assert torch.equal(_greedy(pt, enc), _greedy(ov_model, enc))

    pipe = ov_genai.LLMPipeline(str(out), "CPU", **EXACT)
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        ours = list(pipe.generate(inputs, config).tokens[0])
        ref = _greedy(pt, enc)[0, enc["input_ids"].shape[1]:].tolist()
        assert ours == ref, prompt


@pytest.mark.parametrize("model_type", every_architecture({"llama", "gpt2", "bloom"}))
def test_logits_all_keeps_every_position(model_type, tiny_model, exported):
    import openvino as ov
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM

    out = exported(model_type, "all")
    manifest = read_manifest(out)
    assert manifest.logits == "all" and "logits-all" in manifest.requires
    shape = ov.Core().read_model(out / "openvino_model.xml").output("logits").get_partial_shape()
    assert shape[1].is_dynamic
    ids = torch.tensor([[5, 17, 42, 99, 7, 3, 250]])
    pt = AutoModelForCausalLM.from_pretrained(tiny_model(model_type)).eval()
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    ours = ov_model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    with torch.no_grad():
        ref = pt(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert ours.shape == ref.shape == (1, 7, pt.config.vocab_size)
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-3 * max(1.0, ref.abs().max().item()))


def test_stateless_export(tiny_model, tmp_path):
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "stateless"
    run_cli("export", "openvino", "-m", str(tiny_model("llama")), "--task", "text-generation-shared",
            "--disable-stateful", str(out), check=True)
    manifest = read_manifest(out)
    assert not manifest.stateful and "stateless" in manifest.requires
    assert manifest.validation["status"] == "passed"
    tok = AutoTokenizer.from_pretrained(tiny_model("llama"))
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    pt = AutoModelForCausalLM.from_pretrained(tiny_model("llama")).eval()
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT, use_cache=True)
    assert torch.equal(_greedy(pt, enc), _greedy(ov_model, enc))


# int8 also in the default run through test_proof.py's int8 artifact (exported and validated) and test_calibration.py
@pytest.mark.parametrize("weight_format", ["fp16", pytest.param("int8", marks=pytest.mark.slow), "int4"])
def test_weight_formats_and_bin_size(weight_format, tiny_model, tmp_path):
    """Weights stored once: the .bin is at most 1.02x optimum-intel's text-generation-with-past export."""
    model = str(tiny_model("qwen2", hidden_size=128, intermediate_size=256))
    ours, theirs = tmp_path / "shared", tmp_path / "with-past"
    # both through optimum-cli's entry point, in this process (the command itself is tested by the README's examples)
    run_cli_in_process("export", "openvino", "-m", model, "--task", "text-generation-shared",
                       "--weight-format", weight_format, str(ours))
    run_cli_in_process("export", "openvino", "-m", model, "--task", "text-generation-with-past",
                       "--weight-format", weight_format, str(theirs))
    size, base = (ours / "openvino_model.bin").stat().st_size, (theirs / "openvino_model.bin").stat().st_size
    assert size <= 1.02 * base, (size, base)
    manifest = read_manifest(ours)
    assert manifest.quantization["weight_format"] == weight_format
    expected = "passed" if weight_format == "fp16" else "recorded"
    assert manifest.validation["status"] == expected, manifest.validation
    if expected == "recorded":  # quantized: the summary line says how far from PyTorch the graph is
        v = manifest.validation
        assert f"KL from PyTorch prefill {v['kl_prefill']:.2g}, decode {v['kl_decode']:.2g}" in manifest.summary()


def test_manifest_is_json_with_schema(exported):
    data = json.loads((exported("gpt2") / "shared_graph.json").read_text())
    assert data["schema_version"] == 1 and data["task"] == "text-generation-shared"
    assert data["requires"] == ["generation"]
    assert {i["name"] for i in data["graph"]["inputs"]} >= {"input_ids", "attention_mask", "beam_idx"}
