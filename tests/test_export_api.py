"""`optimum_shared_graph.export()`: the Python face of the CLI."""

from __future__ import annotations

import pytest

import optimum_shared_graph as osg


def test_export_a_loaded_model(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model("gpt2"))
    manifest = osg.export(model, tmp_path / "out", logits="all")
    assert manifest.partitioning == "shared" and manifest.logits == "all"
    assert manifest.validation["status"] == "passed"
    assert manifest.path == (tmp_path / "out" / "shared_graph.json").absolute()
    assert osg.read_manifest(tmp_path / "out").to_dict() == manifest.to_dict()


def test_quantization_config_is_recorded(tiny_model, tmp_path):
    model = tiny_model("llama", hidden_size=128, intermediate_size=256)
    manifest = osg.export(model, tmp_path / "out", quantization_config={"bits": 8, "sym": True})
    assert manifest.quantization["weight_format"] == "int8"
    # quantized weights: compared with PyTorch and recorded, not enforced
    assert manifest.validation["status"] == "recorded" and not manifest.validation["enforced"]


def test_unknown_option(tmp_path):
    with pytest.raises(osg.InvalidOptionsError, match="unknown export option.*logit"):
        osg.export("unused", tmp_path / "out", logit="all")
    assert not (tmp_path / "out").exists()
