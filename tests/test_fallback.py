"""Fallback: optimum-intel's own partitioning when decomposition fails, or a clear error."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch

from conftest import EXACT, PROMPTS, error_line, remote_code_llama, run_cli, tree_snapshot

from optimum_shared_graph import read_manifest
from optimum_shared_graph.manifest import sha256_file

TASK = ["--task", "text-generation-shared"]
NEW_TOKENS = 12
WARNING = "falls back to optimum-intel's"

# A llama whose generate() runs its own greedy loop on the decoder and the head, never through
# forward(), and whose only sub-model (`model`, a LlamaModel) is no causal LM: nothing to decompose.
# Its forward() is plain llama, so optimum-intel's own export of it is exact.
_OPAQUE_MODELING = textwrap.dedent(
    '''
    import torch
    from transformers import LlamaForCausalLM


    class OpaqueLlamaForCausalLM(LlamaForCausalLM):
        @torch.no_grad()
        def generate(self, input_ids=None, attention_mask=None, generation_config=None, max_new_tokens=None, **kwargs):
            config = generation_config if generation_config is not None else self.generation_config
            steps = max_new_tokens or config.max_new_tokens or 20
            ids = input_ids
            for _ in range(steps):
                hidden = self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
                ids = torch.cat([ids, self.lm_head(hidden[:, -1]).argmax(-1, keepdim=True)], dim=-1)
            return ids
    '''
)


def _export(model, out, *extra):
    return run_cli("export", "openvino", "-m", str(model), *TASK, str(out), *extra)


def _greedy(model, enc, **extra):
    return model.generate(**enc, **extra, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                          pad_token_id=0)


def _assert_hashes(out, manifest):
    graphs = sorted(p.name for p in out.glob("openvino_*.xml") if "tokenizer" not in p.name)
    expected = set(graphs) | {g.replace(".xml", ".bin") for g in graphs}
    assert set(manifest.files) == expected
    for name, digest in manifest.files.items():
        assert sha256_file(out / name) == digest
    return graphs


@pytest.fixture(scope="module")
def opaque_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("opaque") / "opaque-llama"
    remote_code_llama(path, "modeling_opaque", "OpaqueLlamaForCausalLM", _OPAQUE_MODELING,
                      architectures=["OpaqueLlamaForCausalLM"])
    return path


@pytest.mark.parametrize("overlap", ["off", pytest.param("on", marks=pytest.mark.slow)])
def test_undecomposable_model_falls_back_to_with_past(opaque_model, tmp_path, overlap, monkeypatch):
    """Found by the capture before optimum-intel converts, or by the capture beside its conversion (converted
    again, as a fallback)."""
    import openvino as ov

    from optimum_shared_graph.pipeline.memory import OVERLAP_ENV

    monkeypatch.setenv(OVERLAP_ENV, overlap)
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoTokenizer, LlamaForCausalLM

    out = tmp_path / "opaque-ov"
    proc = _export(opaque_model, out, "--trust-remote-code")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(WARNING) == 1, proc.stderr[-3000:]  # warned once
    assert "text-generation-with-past" in proc.stderr
    manifest = read_manifest(out)
    assert manifest.partitioning == "fallback"
    reason = manifest.fallback_reason
    assert "OpaqueLlamaForCausalLM" in reason and "expected at least 16" in reason and "captured 0" in reason
    assert "model (LlamaModel) is not a causal LM" in reason
    assert manifest.graph["task"] == "text-generation-with-past"
    assert manifest.logits == "last" and manifest.stateful and manifest.validation["status"] == "skipped"
    assert manifest.requires == ["generation"]  # --logits last is honoured: one position's logits
    assert _assert_hashes(out, manifest) == ["openvino_model.xml"]
    graph = ov.Core().read_model(out / "openvino_model.xml")
    assert graph.output("logits").get_partial_shape()[1].get_length() == 1
    rt = graph.get_rt_info()
    assert rt["shared_graph"]["partitioning"].astype(str) == "fallback"

    tok = AutoTokenizer.from_pretrained(opaque_model)
    reference = LlamaForCausalLM.from_pretrained(opaque_model).eval()  # the same weights, transformers' own generate()
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        assert torch.equal(_greedy(reference, enc), _greedy(ov_model, enc)), prompt


def test_fallback_honours_logits_all(opaque_model, tmp_path):
    import openvino as ov

    out = tmp_path / "opaque-all"
    proc = _export(opaque_model, out, "--trust-remote-code", "--logits", "all")
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = read_manifest(out)
    assert manifest.partitioning == "fallback" and manifest.logits == "all" and "logits-all" in manifest.requires
    assert ov.Core().read_model(out / "openvino_model.xml").output("logits").get_partial_shape()[1].is_dynamic


def test_fallback_never_writes_nothing(opaque_model, out_dir_both):
    out_dir = out_dir_both
    before = tree_snapshot(out_dir)
    proc = _export(opaque_model, out_dir, "--trust-remote-code", "--fallback", "never")
    assert proc.returncode != 0
    line = error_line(proc)
    assert "OpaqueLlamaForCausalLM" in line
    assert "expected at least 16 calls" in line and "captured 0" in line
    assert "--fallback auto" in line and "--fallback never: nothing was written" in line
    assert WARNING not in proc.stderr
    assert tree_snapshot(out_dir) == before
    assert not [p for p in out_dir.parent.iterdir() if p.name.endswith(".partial")]


@pytest.fixture(scope="module")
def llava_model(tmp_path_factory):
    """A tiny random-init llava (CLIP vision tower, llama text model) with a local processor and tokenizer."""
    from transformers import (
        CLIPImageProcessor, CLIPVisionConfig, GenerationConfig, LlavaConfig, LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    from optimum_shared_graph.testing import build_tokenizer, tiny_config

    path = tmp_path_factory.mktemp("vlm") / "tiny-llava"
    tok = build_tokenizer(path)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                              image_size=30, patch_size=15, projection_dim=32, initializer_range=0.1)
    config = LlavaConfig(
        vision_config=vision, text_config=tiny_config("llama", vocab_size=len(tok) + 7),
        image_token_index=tok.convert_tokens_to_ids("<image>"), vision_feature_select_strategy="default",
        vision_feature_layer=-1, image_seq_length=4,  # (30 / 15)^2 patches, the CLS feature dropped
    )
    config.pad_token_id = 0
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(path))
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 30}, crop_size={"height": 30, "width": 30}),
        tokenizer=tok, patch_size=15, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        chat_template="{% for m in messages %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>"
                      "{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}",
    )
    processor.save_pretrained(str(path))
    return path


def test_vision_language_model_falls_back_to_image_text_to_text(llava_model, tmp_path):
    from optimum.intel import OVModelForVisualCausalLM
    from PIL import Image
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    out = tmp_path / "llava-ov"
    proc = _export(llava_model, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count(WARNING) == 1, proc.stderr[-3000:]
    manifest = read_manifest(out)
    assert manifest.partitioning == "fallback" and manifest.graph["task"] == "image-text-to-text"
    assert "LlavaForConditionalGeneration" in manifest.fallback_reason and "pixel_values" in manifest.fallback_reason
    assert "image-text-to-text" in manifest.requires
    graphs = _assert_hashes(out, manifest)
    assert "openvino_language_model.xml" in graphs and "openvino_vision_embeddings_model.xml" in graphs
    assert manifest.graph["decoder"] == "openvino_language_model.xml"
    assert {i["name"] for i in manifest.graph["inputs"]} >= {"inputs_embeds", "attention_mask", "beam_idx"}

    processor = AutoProcessor.from_pretrained(llava_model)
    pt = LlavaForConditionalGeneration.from_pretrained(llava_model).eval()
    ov_model = OVModelForVisualCausalLM.from_pretrained(out, ov_config=EXACT)
    image = Image.fromarray((np.random.default_rng(0).random((30, 30, 3)) * 255).astype("uint8"))
    inputs = processor(images=image, text="<image>The quick brown fox", return_tensors="pt")
    assert torch.equal(_greedy(pt, inputs), _greedy(ov_model, inputs))


def test_vision_language_model_with_fallback_never(llava_model, tmp_path):
    out = tmp_path / "llava-never"
    proc = _export(llava_model, out, "--fallback", "never")
    assert proc.returncode != 0
    line = error_line(proc)
    assert "LlavaForConditionalGeneration (llava) is a vision-language model" in line and "pixel_values" in line
    assert "--task image-text-to-text" in line
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
