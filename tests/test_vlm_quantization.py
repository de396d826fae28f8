"""Data-aware quantization of an image-text-to-text-shared artifact's language model, calibrated on both stages
(`quantization/visual.py`, `pipeline/plan.py`, `_vlm_calibration`).

The tiny Qwen3.5 checkpoint with its processor (`testing.build_tiny_multimodal(..., processor=True)`: three
gated-delta-net layers and one attention layer, so the language model's state is convolution and recurrent states
besides keys and values) is calibrated on a local JSON-lines file of generated images and instructions. The
refusals run before any work (one line, nothing written); the export itself is `slow`.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import EXACT, error_line, run_cli, widest_int8_weight

import optimum_shared_graph as osg
from optimum_shared_graph import InvalidOptionsError
from optimum_shared_graph.quantization.visual import read_dataset_file, resolve_dataset

TASK = "image-text-to-text-shared"
INSTRUCTIONS = ["What is in the image?", "Describe the picture.", "How many colours are there?", "Is it dark?"]
DECODE_STEPS = 4  # ExportOptions.calibration_decode_steps's default


def write_dataset(directory, count: int = len(INSTRUCTIONS)):
    """`calib.jsonl` in `directory`: `count` generated 64 x 64 images (seeded noise) with an instruction each, the
    images' paths relative to the file."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.RandomState(1)
    lines = []
    for i in range(count):
        Image.fromarray((rng.rand(64, 64, 3) * 255).astype(np.uint8)).save(directory / f"img{i}.png")
        lines.append(json.dumps({"image": f"img{i}.png", "text": INSTRUCTIONS[i % len(INSTRUCTIONS)]}))
    path = directory / "calib.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from optimum_shared_graph.testing import build_tiny_multimodal

    path = tmp_path_factory.mktemp("vlmq") / "qwen3_5"
    build_tiny_multimodal("qwen3_5", path, processor=True)
    return path


# ------------------------------------------------------------------------------- the dataset file, bad input


def test_dataset_file_items(tmp_path):
    """Each line is an image (relative to the file, opened as RGB) and its instruction; blank lines are skipped."""
    path = write_dataset(tmp_path, 2)
    path.write_text(path.read_text() + "\n\n")
    items = read_dataset_file(path)
    assert [item.text for item in items] == INSTRUCTIONS[:2]
    assert all(item.image.mode == "RGB" and item.image.size == (64, 64) for item in items)
    assert resolve_dataset(str(path)).texts == INSTRUCTIONS[:2]
    assert resolve_dataset("textvqa").name == "textvqa" and resolve_dataset("contextual").items is None


@pytest.mark.parametrize("content, message", [
    ('{"image": "img0.png", "text": "hi"}\nnot json\n', r"line 2 is not JSON \(Expecting value\)"),
    ('{"image": "img0.png"}\n', r'line 1 is not an object with a string "image" and a non-empty string "text"'),
    ('["img0.png", "hi"]\n', r"line 1 is not an object"),
    ('{"image": "absent.png", "text": "hi"}\n', r"line 1: cannot open image .*absent\.png \(FileNotFoundError\)"),
    ('{"image": "calib.jsonl", "text": "hi"}\n', r"line 1: cannot open image .*calib\.jsonl \(UnidentifiedImageError\)"),
    ("\n\n", r"has no sample"),
])
def test_malformed_dataset_file_is_refused(tmp_path, content, message):
    write_dataset(tmp_path, 1)
    (tmp_path / "calib.jsonl").write_text(content)
    with pytest.raises(InvalidOptionsError, match=message):
        read_dataset_file(tmp_path / "calib.jsonl")


def test_dataset_that_is_no_vision_language_set_is_refused(tmp_path):
    """A missing file, and a text calibration set's name, are neither a file of images nor a set optimum-intel
    calibrates a vision-language model on."""
    for dataset in (str(tmp_path / "missing.jsonl"), "wikitext2"):
        with pytest.raises(InvalidOptionsError, match=rf"--dataset {dataset} is neither a file nor a vision-language "
                                                      r"calibration set: .* contextual, textvqa"):
            resolve_dataset(dataset)


def test_cli_malformed_dataset_is_one_line_and_nothing_written(checkpoint, tmp_path):
    """optimum-cli in a subprocess: one line naming the file's bad line, exit 2, no output directory."""
    write_dataset(tmp_path, 1)
    bad = tmp_path / "calib.jsonl"
    bad.write_text('{"image": "img0.png", "text": "hi"}\nnot json\n')
    out = tmp_path / "out"
    proc = run_cli("export", "openvino", "-m", str(checkpoint), "--task", TASK, "--weight-format", "int4", "--awq",
                   "--dataset", str(bad), str(out))
    assert proc.returncode == 2
    assert error_line(proc) == (f"error: --dataset file {bad} line 2 is not JSON (Expecting value): write one JSON "
                                'object per line, {"image": "photo.png", "text": "What is in the image?"}')
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["calib.jsonl", "img0.png"]


def _refused(checkpoint, tmp_path, config, match):
    out = tmp_path / "out"
    with pytest.raises(InvalidOptionsError, match=match):
        osg.export(checkpoint, out, task=TASK, quantization_config=config, quiet=True)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_dataset_name_without_the_datasets_package_is_refused(checkpoint, tmp_path):
    import importlib.util

    if importlib.util.find_spec("datasets") is not None:
        pytest.skip("the datasets package is installed: optimum-intel's loader would read textvqa from the hub")
    _refused(checkpoint, tmp_path, {"bits": 4, "dataset": "textvqa", "quant_method": "awq"},
             r"^--dataset textvqa is read from the hub by the datasets package, which is not installed")


def test_checkpoint_without_its_processor_is_refused(tmp_path):
    """The images go through the checkpoint's processor and chat template: a checkpoint with only its text
    tokenizer is refused before any work."""
    from optimum_shared_graph.testing import build_tiny_multimodal

    build_tiny_multimodal("qwen3_5", tmp_path / "bare")
    path = write_dataset(tmp_path / "data", 1)
    _refused(tmp_path / "bare", tmp_path, {"bits": 4, "dataset": str(path), "quant_method": "awq"},
             r"^data-aware quantization feeds the calibration images through the checkpoint's processor, and the "
             r"checkpoint('s processor did not load| has no image processor)")


def test_texts_without_images_are_refused(checkpoint, tmp_path):
    """The API's list of texts (a text model's calibration set) has no image to merge into the prefill."""
    _refused(checkpoint, tmp_path, {"bits": 4, "dataset": ["hello"], "quant_method": "awq"},
             r"--dataset \['hello'\] is neither a file nor a vision-language calibration set")


# ------------------------------------------------------------------------------------------------- the export


@pytest.fixture(scope="module")
def awq(checkpoint, tmp_path_factory):
    """The checkpoint exported by optimum-cli with int4 AWQ and scale estimation, calibrated on 4 images."""
    root = tmp_path_factory.mktemp("awq")
    dataset = write_dataset(root / "data")
    out = root / "out"
    proc = run_cli("export", "openvino", "-m", str(checkpoint), "--task", TASK, "--weight-format", "int4",
                   "--group-size", "16", "--awq", "--scale-estimation", "--dataset", str(dataset), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, dataset, proc


def _weight_types(xml) -> set[str]:
    import openvino as ov

    return {op.get_output_element_type(0).get_type_name() for op in ov.Core().read_model(xml).get_ops()
            if op.get_type_name() == "Constant" and op.get_output_partial_shape(0).rank.get_length() >= 2}


@pytest.mark.slow  # the export: about 75 s
@pytest.mark.timeout(900)
def test_calibration_runs_on_both_stages(awq):
    """The manifest records the calibration: each image's prefill and its 4 decode calls (with the real state); the
    language model is stateful again, in 4-bit weights, the other graphs in optimum-intel's 8-bit default; the
    compressed language model is recorded against PyTorch and the artifact stores its own logits."""
    import openvino as ov

    out, dataset, proc = awq
    manifest = json.loads((out / "shared_graph.json").read_text())
    assert manifest["quantization"] == {
        "weight_format": "int4", "quant_mode": None, "dataset": str(dataset),
        "calibration_samples": {"prefill": len(INSTRUCTIONS), "decode": len(INSTRUCTIONS) * DECODE_STEPS},
        "calibration_decode_steps": DECODE_STEPS, "calibration_graph": "stateless"}
    logged = proc.stdout + proc.stderr  # NNCF's progress
    assert "Applying data-aware AWQ" in logged and "Applying Scale Estimation" in logged
    # NNCF ran the language model on every sample, decode calls included
    samples = len(INSTRUCTIONS) * (1 + DECODE_STEPS)
    assert re.search(rf"Statistics collection .* {samples}/{samples}", logged), logged[-3000:]
    language = ov.Core().read_model(out / "openvino_language_model.xml")
    assert sorted(p.get_any_name() for p in language.inputs) == ["attention_mask", "beam_idx", "inputs_embeds",
                                                                 "position_ids"]
    assert len(language.get_sinks()) == 8  # 3 x (convolution, recurrent) + the attention layer's key and value
    assert manifest["stateful"] and manifest["graph"]["states"] == 8
    assert {"u4"} <= _weight_types(out / "openvino_language_model.xml")
    for graph in ("openvino_text_embeddings_model.xml", "openvino_vision_embeddings_model.xml",
                  "openvino_vision_embeddings_merger_model.xml"):
        assert _weight_types(out / graph) & {"i8", "u8"} and not _weight_types(out / graph) & {"u4", "i4"}, graph
    validation = manifest["validation"]
    assert validation["status"] == "recorded" and not validation["enforced"]
    assert validation["reference"]["judged_against"] == "graph"


@pytest.mark.slow  # the export (the fixture's), then about 10 to 20 s
@pytest.mark.timeout(900)
@pytest.mark.parametrize("quantized", ["awq", "int8"])  # weight compression with AWQ; full int8 quantization
def test_quantized_artifact_through_the_vlm_consumers(quantized, request):
    """OVModelForVisualCausalLM (teacher-forced) and VLMPipeline (greedy) reproduce the exported model's own
    logits and tokens under f32 properties, judged by the margins with the 16-bit rule of compressed weights."""
    out, _dataset, _proc = request.getfixturevalue(quantized)
    optimum = osg.validate(out, consumer="optimum-vlm", properties=EXACT)
    assert optimum["status"] == "passed" and optimum["greedy_match"], optimum
    assert optimum["max_abs_diff_prefill"] < 1e-4 and optimum["max_abs_diff_decode"] < 1e-4, optimum
    genai = osg.validate(out, consumer="genai-vlm", properties=EXACT)
    assert genai["status"] == "passed" and genai["greedy_match"], genai


@pytest.mark.slow  # an export: about 60 s
@pytest.mark.timeout(900)
def test_api_calibration_decode_steps(checkpoint, tmp_path):
    """`export(quantization_config={..., "dataset": FILE}, calibration_decode_steps=2)`: the API's route, with 2
    decode calls per image (3 images: `num_samples` keeps optimum-intel's meaning, how many are taken)."""
    dataset = write_dataset(tmp_path / "data")
    manifest = osg.export(checkpoint, tmp_path / "out", task=TASK, calibration_decode_steps=2, quiet=True,
                          quantization_config={"bits": 4, "group_size": 16, "dataset": str(dataset),
                                               "scale_estimation": True, "num_samples": 3})
    assert manifest.quantization["calibration_samples"] == {"prefill": 3, "decode": 6}
    assert manifest.quantization["dataset"] == str(dataset) and manifest.validation["status"] == "recorded"
    assert {"u4"} <= _weight_types(tmp_path / "out" / "openvino_language_model.xml")


@pytest.mark.slow  # an export: about 60 s
@pytest.mark.timeout(900)
def test_data_free_weights_with_a_dataset_file(checkpoint, tmp_path):
    """8-bit weights never use data (optimum-intel's rule): a dataset file changes nothing, no calibration runs."""
    dataset = write_dataset(tmp_path / "data", 1)
    manifest = osg.export(checkpoint, tmp_path / "out", task=TASK, quiet=True,
                          quantization_config={"bits": 8, "dataset": str(dataset)})
    assert manifest.quantization["calibration_samples"] == {"prefill": 0, "decode": 0}
    assert "calibration_graph" not in manifest.quantization
    assert _weight_types(tmp_path / "out" / "openvino_language_model.xml") & {"u8", "i8"}


@pytest.mark.slow  # an export (about 55 s), then about 5 s
@pytest.mark.timeout(900)
def test_gemma3_calibrates_with_its_token_types(tmp_path):
    """Gemma 3 (attention layers only, `token_type_ids` 1 at the image tokens, positions from 1, which
    `OVModelForVisualCausalLM`'s generation input preparation gives): the same route, both consumers under f32."""
    import openvino as ov

    from optimum_shared_graph.testing import build_tiny_multimodal

    build_tiny_multimodal("gemma3", tmp_path / "gemma3", processor=True)
    dataset = write_dataset(tmp_path / "data")
    out = tmp_path / "out"
    proc = run_cli("export", "openvino", "-m", str(tmp_path / "gemma3"), "--task", TASK, "--weight-format", "int4",
                   "--group-size", "16", "--awq", "--scale-estimation", "--dataset", str(dataset), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads((out / "shared_graph.json").read_text())
    assert manifest["quantization"]["calibration_samples"] == {"prefill": len(INSTRUCTIONS),
                                                               "decode": len(INSTRUCTIONS) * DECODE_STEPS}
    language = ov.Core().read_model(out / "openvino_language_model.xml")
    assert sorted(p.get_any_name() for p in language.inputs) == ["attention_mask", "beam_idx", "inputs_embeds",
                                                                 "position_ids", "token_type_ids"]
    for consumer in ("optimum-vlm", "genai-vlm"):
        report = osg.validate(out, consumer=consumer, properties=EXACT)
        assert report["status"] == "passed" and report["greedy_match"], report


# ------------------------------------------------------------------------------------- full quantization (int8)


@pytest.fixture(scope="module")
def int8(checkpoint, tmp_path_factory):
    """The checkpoint exported by optimum-cli with --quant-mode int8 (int8 activations and weights), calibrated on 4
    images: the language model on both stages, the vision embedding graphs on their calls for the same images."""
    root = tmp_path_factory.mktemp("int8")
    dataset = write_dataset(root / "data")
    out = root / "out"
    proc = run_cli("export", "openvino", "-m", str(checkpoint), "--task", TASK, "--quant-mode", "int8",
                   "--dataset", str(dataset), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, dataset, proc


def _fake_quantize(xml) -> int:
    import openvino as ov

    return sum(op.get_type_name() == "FakeQuantize" for op in ov.Core().read_model(xml).get_ops())


@pytest.mark.slow  # the export: about 45 s
@pytest.mark.timeout(900)
def test_full_quantization_calibrates_the_language_model_on_both_stages_and_the_vision_graphs(int8):
    """optimum-intel's meaning of full quantization for a vision-language model: the language model and the
    vision embedding graphs (its `OVVisionEmbedding` components) get int8 activations, each calibrated on its own
    inputs; the other graphs optimum-intel's 8-bit weights. The language model's samples are each image's prefill
    and its 4 decode calls; the range estimator (MINMAX) is the language model's only."""
    out, dataset, proc = int8
    manifest = json.loads((out / "shared_graph.json").read_text())
    assert manifest["quantization"]["quant_mode"] == "int8"
    assert manifest["quantization"]["calibration_samples"] == {"prefill": len(INSTRUCTIONS),
                                                               "decode": len(INSTRUCTIONS) * DECODE_STEPS}
    assert manifest["quantization"]["dataset"] == str(dataset)
    widest = {xml.name: widest_int8_weight(xml) for xml in out.glob("openvino_*.xml")  # 7-bit: no CPU saturates
              if "tokenizer" not in xml.name}
    assert 0 < widest["openvino_language_model.xml"] <= 64 and max(widest.values()) <= 64, widest
    assert manifest["quantization"]["overflow_fix"] == "enable"
    logged = proc.stdout + proc.stderr
    samples = len(INSTRUCTIONS) * (1 + DECODE_STEPS)
    assert re.search(rf"Statistics collection .* {samples}/{samples}", logged), logged[-3000:]
    # the vision graphs: one call each per image
    assert re.search(rf"Statistics collection .* {len(INSTRUCTIONS)}/{len(INSTRUCTIONS)}", logged), logged[-3000:]
    assert _fake_quantize(out / "openvino_language_model.xml") > 0
    for graph in ("openvino_vision_embeddings_model.xml", "openvino_vision_embeddings_merger_model.xml"):
        assert _fake_quantize(out / graph) > 0, graph
    for graph in ("openvino_text_embeddings_model.xml", "openvino_vision_embeddings_pos_model.xml"):
        assert _fake_quantize(out / graph) == 0 and _weight_types(out / graph) & {"i8", "u8"}, graph
    assert manifest["stateful"] and manifest["graph"]["states"] == 8
    configs = json.loads((out / "openvino_config.json").read_text())["quantization_config"]["quantization_configs"]
    assert sorted(configs) == ["lm_model", "vision_embeddings_merger_model", "vision_embeddings_model"]
    ranges = configs["lm_model"]["advanced_parameters"]["activations_range_estimator_params"]
    assert ranges["min"]["statistics_type"] == "min" and ranges["max"]["aggregator_type"] == "max"
    for name in ("vision_embeddings_model", "vision_embeddings_merger_model"):  # the flags' config, NNCF's ranges
        assert "advanced_parameters" not in configs[name] and configs[name]["dtype"] == "int8", name
    validation = manifest["validation"]
    assert validation["status"] == "recorded" and not validation["enforced"]
