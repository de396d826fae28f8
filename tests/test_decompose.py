"""Decomposition: captured prefill and decode calls, and the inner-model retry."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import numpy as np
import pytest
import torch

from conftest import EXACT, PROMPTS, remote_code_llama, run_cli

from optimum_shared_graph import ExportValidationError, export, read_manifest
from optimum_shared_graph.manifest import sha256_file

NEW_TOKENS = 12

# A wrapper whose generate() delegates to an inner causal LM: generate() never calls the wrapper's
# own forward(), only `language_model.forward()`. Saved with the model as remote code, the way
# such wrappers reach users; its own model_type is one optimum-intel does not know.
_WRAPPER_MODELING = textwrap.dedent(
    '''
    from transformers import LlamaConfig, LlamaForCausalLM, PretrainedConfig, PreTrainedModel


    class DelegatingConfig(PretrainedConfig):
        model_type = "delegating-lm"
        sub_configs = {"text_config": LlamaConfig}

        def __init__(self, text_config=None, **kwargs):
            if isinstance(text_config, dict):
                text_config = LlamaConfig(**text_config)
            self.text_config = text_config if text_config is not None else LlamaConfig()
            super().__init__(**kwargs)


    class DelegatingLM(PreTrainedModel):
        config_class = DelegatingConfig
        _no_split_modules = ["LlamaDecoderLayer"]

        def __init__(self, config):
            super().__init__(config)
            self.language_model = LlamaForCausalLM(config.text_config)
            self.post_init()

        def _init_weights(self, module):
            pass  # the inner model initializes itself

        def forward(self, *args, **kwargs):
            return self.language_model(*args, **kwargs)

        def generate(self, *args, **kwargs):
            return self.language_model.generate(*args, **kwargs)
    '''
)

# A llama whose single-token decode steps do something its prefill does not. Tracing bakes in the
# prefill branch, so the graph reproduces the prefill exactly and only the decode calls expose it.
_DECODE_DIFFERS_MODELING = textwrap.dedent(
    '''
    from transformers import LlamaForCausalLM


    class DecodeShiftLlamaForCausalLM(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            out = super().forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                past_key_values=past_key_values, **kwargs,
            )
            if input_ids is not None and input_ids.shape[1] == 1:
                out.logits = out.logits.roll(1, dims=-1)
            return out
    '''
)


def _import_file(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wrapper_model(tmp_path_factory):
    """A saved tiny `DelegatingLM` (remote code) around a tiny llama, with a local tokenizer."""
    from transformers import GenerationConfig

    from optimum_shared_graph.testing import build_tokenizer, tiny_config

    path = tmp_path_factory.mktemp("wrapper") / "delegating-lm"
    path.mkdir()
    (path / "modeling_delegating.py").write_text(_WRAPPER_MODELING)
    module = _import_file("modeling_delegating_test", path / "modeling_delegating.py")
    config = module.DelegatingConfig(text_config=tiny_config("llama").to_dict(), architectures=["DelegatingLM"])
    torch.manual_seed(0)
    model = module.DelegatingLM(config).eval()
    model.language_model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model.save_pretrained(str(path))
    data = json.loads((path / "config.json").read_text())
    data["auto_map"] = {"AutoConfig": "modeling_delegating.DelegatingConfig",
                        "AutoModelForCausalLM": "modeling_delegating.DelegatingLM"}
    (path / "config.json").write_text(json.dumps(data))
    build_tokenizer(path)
    return path


def _greedy(model, enc):
    return model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)


def test_capture_records_prefill_then_decode_steps(tiny_model):
    """The first recorded call is the whole prompt, each next one a single token over a growing cache."""
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.pipeline.decompose import capture_generation

    pt = AutoModelForCausalLM.from_pretrained(tiny_model("llama")).eval()
    ids = torch.tensor([[5, 17, 42, 99, 7, 3]])
    capture = capture_generation(pt, ids, torch.ones_like(ids), 5)
    assert capture.module is None and capture.architecture == "LlamaForCausalLM"
    assert [c.input_ids.shape[1] for c in capture.calls] == [6, 1, 1, 1, 1]
    assert [c.past_length for c in capture.calls] == [0, 6, 7, 8, 9]
    assert np.array_equal(capture.prefill.input_ids, ids.numpy())
    # each decode call is fed the token picked from the previous call's logits
    for prev, call, token in zip(capture.calls, capture.decode, capture.tokens[0]):
        assert int(prev.last_logits.argmax(-1)[0]) == int(token) == int(call.input_ids[0, 0])
    with torch.no_grad():
        full = pt(input_ids=torch.cat([ids, torch.tensor(capture.tokens[:, :4])], dim=1)).logits[0]
    for i, call in enumerate(capture.calls):
        np.testing.assert_allclose(call.last_logits[0], full[ids.shape[1] - 1 + i].numpy(), atol=1e-4)


def test_wrapper_capture_finds_the_inner_model(wrapper_model):
    """Top-level forward() is bypassed; the retry records `language_model.forward()` during the wrapper's generate()."""
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.pipeline.decompose import capture_generation, decompose
    from optimum_shared_graph.errors import DecompositionError

    pt = AutoModelForCausalLM.from_pretrained(wrapper_model, trust_remote_code=True).eval()
    ids = torch.tensor([[5, 17, 42, 99]])
    with pytest.raises(DecompositionError) as info:
        capture_generation(pt, ids, torch.ones_like(ids), 4)
    assert (info.value.expected, info.value.captured) == (4, 0)
    capture = decompose(pt, ids, torch.ones_like(ids), 4, exportable=lambda inner: None)
    assert capture.module == "language_model" and capture.exported is pt.language_model
    assert len(capture.calls) == 4 and capture.decode[0].past_length == 4
    assert "DelegatingLM.language_model (LlamaForCausalLM)" == capture.architecture


def test_wrapper_exports_its_inner_causal_lm(wrapper_model, tmp_path):
    """CLI: the inner retry exports one shared graph whose greedy output matches the wrapper's generate()."""
    import openvino as ov
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "wrapper-ov"
    proc = run_cli("export", "openvino", "-m", str(wrapper_model), "--task", "text-generation-shared",
                   "--trust-remote-code", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "falls back" not in proc.stderr
    manifest = read_manifest(out)
    assert manifest.partitioning == "shared" and manifest.fallback_reason is None
    assert manifest.model["model_type"] == "delegating-lm"
    assert manifest.model["exported_module"] == "language_model"
    assert manifest.model["exported_model_type"] == "llama"
    assert manifest.model["exported_architecture"] == "LlamaForCausalLM"
    assert manifest.validation["status"] == "passed" and manifest.validation["greedy_match"]
    assert manifest.validation["decode_steps"] >= 3
    assert sorted(p.name for p in out.glob("*.xml") if "tokenizer" not in p.name) == ["openvino_model.xml"]
    assert set(manifest.files) == {"openvino_model.xml", "openvino_model.bin"}
    for name, digest in manifest.files.items():
        assert sha256_file(out / name) == digest
    logits = ov.Core().read_model(out / "openvino_model.xml").output("logits").get_partial_shape()
    assert logits[1].is_static and logits[1].get_length() == 1
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"

    tok = AutoTokenizer.from_pretrained(wrapper_model)
    pt = AutoModelForCausalLM.from_pretrained(wrapper_model, trust_remote_code=True).eval()
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        assert torch.equal(_greedy(pt, enc), _greedy(ov_model, enc)), prompt

    import openvino_genai as ov_genai

    pipe = ov_genai.LLMPipeline(str(out), "CPU", **EXACT)
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    enc = tok([PROMPTS[1]], return_tensors="pt")
    inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
    assert list(pipe.generate(inputs, config).tokens[0]) == _greedy(pt, enc)[0, enc["input_ids"].shape[1]:].tolist()


@pytest.fixture(scope="module")
def decode_differs_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("decode-differs") / "shift-llama"
    return remote_code_llama(path, "modeling_shift", "DecodeShiftLlamaForCausalLM", _DECODE_DIFFERS_MODELING)


def test_validation_checks_the_captured_decode_calls(decode_differs_model, tmp_path):
    """A model whose decode step differs from its prefill: the prefill matches, the decode calls catch it."""
    out = tmp_path / "shift-ov"
    with pytest.raises(ExportValidationError) as info:
        export(decode_differs_model, out, trust_remote_code=True)
    report = info.value.report
    assert report["decode_steps"] >= 3
    assert report["max_abs_diff_prefill"] <= report["tolerance"]  # the prefill call is reproduced
    assert report["max_abs_diff_decode"] > report["tolerance"]  # the captured decode calls are not
    assert report["first_mismatch_step"] == 1  # the first decode step's pick
    assert not out.exists()


def test_inner_model_under_an_architecture_specific_name(tiny_model):
    """An inner causal LM under a name of the architecture's own is found among the sub-models that can generate."""
    from transformers import AutoModelForCausalLM, LlamaModel

    from optimum_shared_graph.pipeline.decompose import decompose

    class Backboned(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = LlamaModel(inner.config)  # a decoder, but no causal LM: rejected
            self.backbone = inner
            self.generation_config = inner.generation_config

        def forward(self, *args, **kwargs):
            return self.backbone(*args, **kwargs)

        def generate(self, **kwargs):
            return self.backbone.generate(**kwargs)

    wrapper = Backboned(AutoModelForCausalLM.from_pretrained(tiny_model("llama")).eval())
    ids = torch.tensor([[5, 17, 42]])
    capture = decompose(wrapper, ids, torch.ones_like(ids), 4, exportable=lambda inner: None)
    assert capture.module == "backbone" and capture.exported is wrapper.backbone
    assert [c.past_length for c in capture.calls] == [0, 3, 4, 5]
