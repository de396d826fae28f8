"""A real trained model, SmolLM2-135M-Instruct (`testing.real_model()`), through every consumer: greedy parity with
PyTorch through `OVModelForCausalLM`, `runtime()` and GenAI's `LLMPipeline` (through the chat template), beam
search, a left-padded batch, and `validate()` through every consumer at fp32, int8 and int4 under default
properties. Exact comparisons with PyTorch are made only under `EXACT` (f32 compute, f32 KV cache); under the
device's defaults the artifact is judged by the margins, as `validate()` judges it.

Skipped with the reason where the model cannot be had (no package index). The exports are made once per module,
in-process through `optimum_shared_graph.export()`, and every generation is a few tokens, to keep this file short.
"""

from __future__ import annotations

import json

import pytest

from conftest import EXACT

import optimum_shared_graph as osg

QUESTION = "Write a short story about a lighthouse keeper and a storm."  # an answer longer than NEW_TOKENS
NEW_TOKENS = 10
# int4: SmolLM2-135M's hidden width, 576, is not divisible by optimum-intel's default group size (128)
INT4 = {"quantization_config": {"bits": 4, "group_size": 64, "ratio": 1.0, "sym": False}}
KINDS = {"fp32": {}, "int8": {"weight_format": "int8"}, "int4": INT4}


@pytest.fixture(scope="module")
def real():
    from optimum_shared_graph.testing import RealModelUnavailable, real_model

    try:
        return real_model()
    except RealModelUnavailable as exc:  # a RealModelError (a wrong conversion) fails instead
        pytest.skip(f"SmolLM2-135M-Instruct cannot be had on this machine: {exc}")


@pytest.fixture(scope="module")
def artifacts(real, tmp_path_factory):
    """`artifacts(kind)` -> the real model exported as "fp32", "int8" or "int4" (group size 64), once per module."""
    made = {}

    def get(kind: str):
        if kind not in made:
            out = tmp_path_factory.mktemp("real") / kind
            osg.export(str(real), out, quiet=True, validation_new_tokens=4, **KINDS[kind])
            made[kind] = out
        return made[kind]

    return get


@pytest.fixture(scope="module")
def pytorch(real):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    return AutoModelForCausalLM.from_pretrained(real).eval(), AutoTokenizer.from_pretrained(real)


@pytest.fixture(scope="module")
def consumers(artifacts):
    """The fp32 artifact loaded once by `OVModelForCausalLM` and by `runtime()`, both compiled under `EXACT`."""
    from optimum.intel import OVModelForCausalLM

    return {"optimum": OVModelForCausalLM.from_pretrained(artifacts("fp32"), ov_config=EXACT),
            "runtime": osg.runtime(artifacts("fp32"), ov_config=EXACT)}


@pytest.fixture(scope="module")
def chat(pytorch):
    """The question through the chat template, and PyTorch's greedy answer (NEW_TOKENS tokens, no EOS among them)."""
    import torch

    model, tokenizer = pytorch
    enc = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        ref = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert ref.shape[1] - enc["input_ids"].shape[1] == NEW_TOKENS  # the answer runs past the tokens compared
    return enc, ref


# ------------------------------------------------------------------------------------------- the model


def test_the_converted_tokenizer_gives_the_gguf_tokenizers_ids(real, tmp_path):
    """The saved tokenizer gives the GGUF tokenizer's ids recorded at conversion (checked at every `real_model()`
    call); one that adds a BOS, as the GGUF says not to, fails that check with the string and both ids."""
    import shutil

    from transformers import AutoTokenizer

    from optimum_shared_graph.testing import REAL_MODEL, RealModelError, check_real_tokenizer

    stamp = json.loads((real / "real_model.json").read_text())
    assert stamp["sha256"] == REAL_MODEL["sha256"] and len(stamp["tokenizer_ids"]) >= 5
    assert check_real_tokenizer(real, stamp["tokenizer_ids"]) == len(stamp["tokenizer_ids"])
    saved = AutoTokenizer.from_pretrained(real)
    assert saved.eos_token == "<|im_end|>" and saved.eos_token_id == 2 and saved.chat_template
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(real / name, tmp_path / name)
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    spec["post_processor"] = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                                                                      {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(RealModelError, match="differs from SmolLM2-135M-Instruct's GGUF tokenizer on 'Hello world"):
        check_real_tokenizer(tmp_path, stamp["tokenizer_ids"])


# ------------------------------------------------------------------- greedy parity, exact under f32 compute


def test_the_export_validated_against_pytorch(artifacts):
    validation = json.loads((artifacts("fp32") / "shared_graph.json").read_text())["validation"]
    assert validation["status"] == "passed" and validation["greedy_match"], validation
    assert validation["max_abs_diff_decode"] < 1e-3


@pytest.mark.parametrize("consumer", ["optimum", "runtime"])
def test_answers_as_pytorch_through_the_chat_template(consumers, consumer, chat):
    import torch

    enc, ref = chat
    assert torch.equal(consumers[consumer].generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False), ref)


def test_genai_answers_as_pytorch_text_in_text_out(artifacts, chat, pytorch):
    """GenAI applies the chat template from the artifact's own tokenizer: the same text as PyTorch's answer."""
    import openvino_genai

    enc, ref = chat
    tokenizer = pytorch[1]
    pipe = openvino_genai.LLMPipeline(str(artifacts("fp32")), "CPU", **EXACT)
    answer = pipe.generate(QUESTION, openvino_genai.GenerationConfig(max_new_tokens=NEW_TOKENS))
    expected = tokenizer.decode(ref[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    assert answer == expected and len(expected.split()) >= 5, (answer, expected)


@pytest.mark.parametrize("consumer", ["optimum", "runtime"])
def test_beam_search_as_pytorch(consumers, consumer, chat, pytorch):
    import torch

    enc, _ = chat
    gen = dict(max_new_tokens=4, num_beams=3, do_sample=False)
    with torch.no_grad():
        ref = pytorch[0].generate(**enc, **gen)
    assert torch.equal(consumers[consumer].generate(**enc, **gen), ref)


@pytest.mark.parametrize("consumer", ["optimum", "runtime"])
def test_a_left_padded_batch_as_pytorch(consumers, consumer, pytorch):
    import torch

    model, tokenizer = pytorch
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in ("Hi!", "Name three rivers of Europe and say in which countries they flow.")]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    assert tokenizer.padding_side == "left" and enc["attention_mask"][0, 0] == 0  # the short row is padded
    gen = dict(max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        ref = model.generate(**enc, **gen)
    assert torch.equal(consumers[consumer].generate(**enc, **gen), ref)


# ---------------------------------------------------- validate() through every consumer, default properties


# int8 (its export, 44 s, then five validations) runs with -m slow; fp32 and int4 (which validate() once refused
# under the defaults) in the default run
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slow) if k == "int8" else k for k in KINDS])
@pytest.mark.parametrize("consumer", ["openvino", "optimum", "runtime", "genai", "continuous-batching"])
def test_validate_under_default_properties(artifacts, kind, consumer):
    """The device's defaults (whatever this host computes in: bf16 compute and an f16 KV cache on a CPU with bf16
    units, by the artifact's runtime options) judged by the margins, as validate() judges them."""
    out = artifacts(kind)
    manifest = json.loads((out / "shared_graph.json").read_text())
    assert manifest["validation"]["status"] == ("passed" if kind == "fp32" else "recorded")
    report = osg.validate(out, consumer=consumer, device="CPU", properties={})
    assert report["status"] == "passed", report
    assert report["judged_against"] == ("pytorch" if kind == "fp32" else "graph")
    if consumer in ("genai", "continuous-batching"):
        assert report["compared_tokens"] == [report["greedy_tokens"]]
    else:
        assert report["max_abs_diff_decode"] <= report["tolerance"]
