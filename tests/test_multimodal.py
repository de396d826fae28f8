"""A multimodal checkpoint's language model exported as the shared graph (`pipeline/multimodal.py`).

Qwen3.5 and Qwen3.5-MoE, whose language model transformers loads from the checkpoint itself, and Mistral 3 and
Gemma 3, whose weights are renamed on load (`multimodal.KEY_MAPPINGS`). The checkpoints are laid out like the published ones (`testing.build_tiny_multimodal`: a
`*ForConditionalGeneration` with `text_config` and a one-block `vision_config`, the released config's
keys only, so no `intermediate_size` in a Qwen3.5-MoE text config). The artifact is checked against the
multimodal model's own PyTorch `generate()` on text prompts, through OVModelForCausalLM and GenAI.
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import EXACT, PROMPTS, error_line, run_cli

from optimum_shared_graph import read_manifest

NEW_TOKENS = 12
LEFT_OUT = "vision_config left out, optimum-cli export openvino --task image-text-to-text exports the whole model"


@pytest.fixture(scope="module")
def multimodal_model(tmp_path_factory):
    """`multimodal_model("qwen3_5_moe")` -> path of a tiny checkpoint laid out like the published one."""
    from optimum_shared_graph.testing import build_tiny_multimodal

    built = {}

    def get(model_type: str):
        if model_type not in built:
            path = tmp_path_factory.mktemp("multimodal") / model_type
            build_tiny_multimodal(model_type, path)
            built[model_type] = path
        return built[model_type]

    return get


def _export(model, out, *extra):
    return run_cli("export", "openvino", "-m", str(model), "--task", "text-generation-shared", str(out), *extra)


def _pytorch_greedy(path, prompt):
    """The multimodal model's own greedy generate() on a text prompt."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    enc = AutoTokenizer.from_pretrained(path)([prompt], return_tensors="pt")
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0)
    return enc, out


@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type, text_type", [
    ("qwen3_5_moe", "qwen3_5_moe_text"),
    pytest.param("qwen3_5", "qwen3_5_text", marks=(pytest.mark.coverage, pytest.mark.slow)),
    ("mistral3", "mistral"),  # a language model transformers loads from the checkpoint only with its weights renamed
    pytest.param("gemma3", "gemma3_text", marks=(pytest.mark.coverage, pytest.mark.slow)),
])
def test_published_layout_exports_its_language_model_with_parity(model_type, text_type, multimodal_model, tmp_path):
    import openvino as ov
    import openvino_genai as ov_genai
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoConfig, AutoModelForCausalLM

    path = multimodal_model(model_type)
    source = json.loads((path / "config.json").read_text())
    assert source["model_type"] == model_type and "vision_config" in source
    if model_type == "qwen3_5_moe":  # as published: the text config has no intermediate_size
        assert "intermediate_size" not in source["text_config"]

    out = tmp_path / "shared"
    proc = _export(path, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "left out" in line]
    assert len(said) == 1 and said[0].startswith("text-generation-shared: wrote"), proc.stderr[-3000:]
    assert LEFT_OUT in said[0] and f"the language model only ({text_type})" in said[0]
    assert "UNEXPECTED" not in proc.stderr  # transformers does not list the vision weights it skipped

    graphs = sorted(p.name for p in out.glob("*.xml") if "tokenizer" not in p.name)
    assert graphs == ["openvino_model.xml"]
    manifest = read_manifest(out)
    assert manifest.partitioning == "shared" and manifest.validation["status"] == "passed"
    assert manifest.model["model_type"] == model_type
    assert manifest.model["architecture"] == source["architectures"][0]
    assert manifest.model["exported_model_type"] == text_type
    assert list(manifest.model["left_out"]) == ["vision_config"]
    assert "--task image-text-to-text" in manifest.model["left_out"]["vision_config"]

    # the artifact's config.json is the language model's, which transformers loads as it was
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == text_type and "vision_config" not in config
    text_config = AutoConfig.from_pretrained(path).get_text_config()
    if model_type == "qwen3_5_moe":  # what OVModelForCausalLM reads, added
        assert config["intermediate_size"] == config["moe_intermediate_size"]
        assert list(manifest.model["config_added"]) == ["intermediate_size"]
    with torch.device("meta"):
        theirs = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out))
        ours = AutoModelForCausalLM.from_config(text_config)
    assert {k: v.shape for k, v in theirs.state_dict().items()} == {k: v.shape for k, v in ours.state_dict().items()}

    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    pipe = ov_genai.LLMPipeline(str(out), "CPU", **EXACT)
    gen_config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    for prompt in PROMPTS:
        enc, ref = _pytorch_greedy(path, prompt)
        ours = ov_model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=0)
        assert torch.equal(ours, ref), prompt
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        assert list(pipe.generate(inputs, gen_config).tokens[0]) == ref[0, enc["input_ids"].shape[1]:].tolist(), prompt


def test_multimodal_type_whose_language_model_cannot_be_exported(tmp_path):
    """glm4v: its language model (glm4v_text) is no type optimum-intel exports as a causal LM, and optimum-intel
    has no export of the whole model either: one line at stage 1, before any weights, nothing written."""
    from transformers import AutoConfig

    model = tmp_path / "glm4v"
    AutoConfig.for_model("glm4v").save_pretrained(str(model))
    out = tmp_path / "out"
    proc = _export(model, out)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "is a multimodal model whose language model (glm4v_text) text-generation-shared cannot export" in line
    assert "optimum-intel's OpenVINO exporter has no export of the whole glm4v model" in line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_checkpoint_without_the_language_model_weights_is_refused(multimodal_model, tmp_path):
    """A qwen3_5_moe checkpoint whose language model weights are under names transformers does not load them from
    (they would be left random, and the PyTorch reference with them): refused before any work."""
    import shutil

    from safetensors.torch import load_file, save_file

    model = tmp_path / "renamed"
    shutil.copytree(multimodal_model("qwen3_5_moe"), model)
    weights = model / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k.replace("model.language_model.", "model.text."): v for k, v in tensors.items()}, str(weights),
              metadata={"format": "pt"})
    out = tmp_path / "out"
    proc = _export(model, out)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "the checkpoint has no weights for" in line and "Qwen3_5MoeForConditionalGeneration" in line, line
    assert "nothing was written" in line
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
