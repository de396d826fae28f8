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


VLM = "image-text-to-text-shared"


@pytest.mark.parametrize("options,expected", [
    ({"shape_mode": "static"}, f"shape_mode does not apply with task '{VLM}'"),
    ({"fallback": "never", "validation_prompt": "hello"}, f"fallback, validation_prompt does not apply with task '{VLM}'"),
])
def test_options_that_do_not_apply_to_a_vision_language_export_are_refused(tmp_path, options, expected):
    """As the CLI refuses its flags for `--task image-text-to-text-shared` (`cli._VLM_FLAGS`): one line, before any
    work, nothing written."""
    with pytest.raises(osg.InvalidOptionsError, match=expected):
        osg.export("unused", tmp_path / "out", task=VLM, **options)
    assert not (tmp_path / "out").exists()


def test_an_unknown_task_or_a_model_type_it_does_not_export_is_refused(tiny_model, tmp_path):
    with pytest.raises(osg.InvalidOptionsError, match="task must be 'text-generation-shared' or "
                                                      "'image-text-to-text-shared', got 'image-text-to-text'"):
        osg.export("unused", tmp_path / "out", task="image-text-to-text")
    with pytest.raises(osg.ModelNotSupportedError, match=f"llama is not a model type --task {VLM} exports"):
        osg.export(str(tiny_model("llama")), tmp_path / "out", task=VLM, quiet=True)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.partial"))


@pytest.mark.slow  # about 60 s: an export of the whole tiny Qwen3.5 model and validate() through OVModelForVisualCausalLM
@pytest.mark.timeout(900)
def test_export_a_vision_language_model(tmp_path):
    """`export(..., task="image-text-to-text-shared")`: the CLI's artifact (optimum-intel's layout, validated at
    export), with the reference `validate()` runs, here through OVModelForVisualCausalLM under f32 properties."""
    from conftest import EXACT

    from optimum_shared_graph.testing import build_tiny_multimodal

    build_tiny_multimodal("qwen3_5", tmp_path / "qwen3_5", processor=True)
    manifest = osg.export(tmp_path / "qwen3_5", tmp_path / "out", task=VLM, quiet=True, validation_new_tokens=6)
    assert manifest.task == VLM and manifest.graph["language_model"] == "openvino_language_model.xml"
    assert manifest.validation["status"] == "passed" and manifest.validation["greedy_tokens"] == 6
    assert manifest.validation["reference"]["calls"] == 6 and manifest.validation["reference"]["image"] == [64, 64]
    assert (tmp_path / "out" / "openvino_vision_embeddings_model.xml").is_file()
    assert (tmp_path / "out" / "preprocessor_config.json").is_file()  # the processor, for validate() and its users
    report = osg.validate(tmp_path / "out", consumer="optimum-vlm", properties=EXACT)
    assert report["status"] == "passed" and report["greedy_tokens"] == 6 and report["max_abs_diff_prefill"] < 1e-4
