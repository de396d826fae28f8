"""One model load per export (pipeline/export.py, pipeline/convert.py, pipeline/reference.py): the model
optimum-intel loads is the one the capture, the conversion and the validation reference come from, in the
dtype optimum-intel picks; and the export's peak memory stays near optimum-intel's own export's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import _optimum_cli

# Runs an export with transformers' model loading counted (not changed): every load of a checkpoint goes
# through PreTrainedModel.from_pretrained once.
_COUNTING_EXPORT = """
import json, sys
from transformers import modeling_utils
loads = []
original = modeling_utils.PreTrainedModel.from_pretrained.__func__
def counted(cls, *args, **kwargs):
    model = original(cls, *args, **kwargs)
    loads.append(str(next(p.dtype for p in model.parameters())))
    return model
modeling_utils.PreTrainedModel.from_pretrained = classmethod(counted)
import optimum_shared_graph as osg
manifest = osg.export(sys.argv[1], sys.argv[2], quiet=True, **json.loads(sys.argv[3]))
print(json.dumps({"loads": loads, "status": manifest.validation["status"], "notes": manifest.model.get("notes")}))
"""


@pytest.fixture(scope="module")
def fp16_model(tiny_model, tmp_path_factory):
    """The quickstart-sized llama saved as an fp16 checkpoint, as released checkpoints are."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    source = tiny_model("llama", hidden_size=128, intermediate_size=256, num_hidden_layers=4)
    path = tmp_path_factory.mktemp("fp16") / "llama-fp16"
    AutoModelForCausalLM.from_pretrained(source, dtype=torch.float16).save_pretrained(path)
    for item in source.iterdir():
        if "token" in item.name:
            shutil.copy(item, path / item.name)
    return path


def _counted_export(model: Path, out: Path, **options) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _COUNTING_EXPORT, str(model), str(out), json.dumps(options)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("options", [
    pytest.param({}, marks=pytest.mark.slow, id="default"),  # an fp16 checkpoint loads in fp16 as with fp16
    pytest.param({"weight_format": "fp16"}, id="fp16"),
    pytest.param({"weight_format": "int8"}, id="int8", marks=pytest.mark.slow),  # the fp16 and static cases stay
    pytest.param({"shape_mode": "static", "max_cache_len": 48, "static_query_len": 4}, id="static",
                 marks=pytest.mark.slow),
])
def test_an_export_loads_the_weights_once_in_optimum_intels_dtype(fp16_model, tmp_path, options):
    result = _counted_export(fp16_model, tmp_path / "ov", **options)
    assert result["loads"] == ["torch.float16"], result  # one load, 16-bit as optimum-intel loads it
    assert result["status"] == ("recorded" if options.get("weight_format") == "int8" else "passed"), result
    assert not result["notes"], result  # the float32 reference flowed through every layer


def test_the_reference_of_a_16bit_model_is_float32_compute(fp16_model, tmp_path):
    """The graph computes in float32 with the 16-bit weights; so does the reference, one layer's weights
    upcast at a time: they agree to float32 rounding, far below what 16-bit activations would give."""
    import optimum_shared_graph as osg

    manifest = osg.export(str(fp16_model), tmp_path / "ov", quiet=True)
    v = manifest.validation
    assert v["status"] == "passed" and v["greedy_match"], v
    assert max(v["max_abs_diff_prefill"], v["max_abs_diff_decode"]) < 1e-4, v


def _peak_rss_mb(args: list[str]) -> float:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, proc.stderr.read()[-3000:]
    return rusage.ru_maxrss / 1024


@pytest.fixture(scope="module")
def heavier_fp16_model(tmp_path_factory):
    """A llama whose fp16 weights (about 200 MB) stand out from the interpreter's own memory."""
    import torch

    from optimum_shared_graph.testing import build_tiny_model

    path = tmp_path_factory.mktemp("heavier") / "llama-200mb"
    model = build_tiny_model("llama", path, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                             num_attention_heads=8, num_key_value_heads=2, vocab_size=32000)
    model.to(torch.float16).save_pretrained(path)
    return path


def test_export_peak_memory_is_held_near_optimum_intels(heavier_fp16_model, tmp_path):
    """Measured here: one load, 1.08x optimum-intel's own export's peak (the rest is the validation's compiled
    graph); the two loads before (an fp32 copy beside optimum-intel's 16-bit one) passed 1.18x."""
    cli = _optimum_cli()
    common = ["export", "openvino", "-m", str(heavier_fp16_model), "--weight-format", "fp16"]
    with_past = _peak_rss_mb([cli, *common, "--task", "text-generation-with-past", str(tmp_path / "with-past")])
    shared = _peak_rss_mb([cli, *common, "--task", "text-generation-shared", "--quiet", str(tmp_path / "shared")])
    assert shared <= 1.15 * with_past, (shared, with_past)


_OWN_LOADING = """
import sys
from optimum_shared_graph.options import ExportOptions
from optimum_shared_graph.pipeline.load import load_config, load_model
from optimum_shared_graph.testing import build_tiny_model
build_tiny_model("llama", sys.argv[2], tokenizer=False)
load_model(sys.argv[1], load_config(sys.argv[1], ExportOptions()), ExportOptions())
# the check's own control, after a marker: the deprecated keyword, which must warn (once per process: had the
# export's loading warned already, the control would not, and the check fails all the same)
print("--- control ---", file=sys.stderr, flush=True)
import torch
from transformers import AutoModelForCausalLM
AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
"""


@pytest.mark.slow  # a fresh export process and a control load: 14 s
def test_the_export_s_own_loading_uses_dtype_not_the_deprecated_torch_dtype(tiny_model, tmp_path):
    """transformers 5 warns "`torch_dtype` is deprecated" (once per process, on stderr) when a load passes it;
    the export's own loading (a remote-code wrapper's, `pipeline/load.py`) and the test models' (`testing.py`)
    pass `dtype`. The control run passes `torch_dtype` and must see the warning, so the check can fail."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")]))
    args = [sys.executable, "-c", _OWN_LOADING, str(tiny_model("llama")), str(tmp_path / "built")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ours, control = proc.stderr.split("--- control ---")
    assert "torch_dtype" in control, control[-2000:]
    assert "torch_dtype" not in ours, ours[-2000:]


@pytest.mark.slow  # the opt-in capture beside the conversion (OPTIMUM_SHARED_GRAPH_OVERLAP=on): 29 s
def test_capture_beside_the_conversion_is_the_same_capture(fp16_model, tmp_path, monkeypatch):
    """The capture in a process of its own, on its own load of the same files, while optimum-intel converts
    (`pipeline/capture_beside.py`): the same calls and logits as the capture in the export's process, and nothing
    of it left behind."""
    import optimum_shared_graph as osg
    from optimum_shared_graph.pipeline.memory import OVERLAP_ENV

    manifests = {}
    for where, overlap in (("inline", "off"), ("beside", "on")):
        monkeypatch.setenv(OVERLAP_ENV, overlap)
        manifests[where] = osg.export(fp16_model, tmp_path / where, quiet=True).validation
    assert manifests["inline"]["captured"] == "in the export's process"
    assert manifests["beside"]["captured"] == "beside the conversion"
    for key in ("status", "greedy_tokens", "decode_steps", "max_abs_diff_prefill", "max_abs_diff_decode"):
        assert manifests["inline"][key] == manifests["beside"][key], key
    assert manifests["beside"]["status"] == "passed"
    reference = "shared_graph_reference.npz"
    assert (tmp_path / "inline" / reference).read_bytes() == (tmp_path / "beside" / reference).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["beside", "inline"]  # no staging, no capture files
    # the .bin's digests, computed beside the validation, are the file's
    from optimum_shared_graph.manifest import fast_digest_file, read_manifest, sha256_file

    for where in ("inline", "beside"):
        manifest = read_manifest(tmp_path / where, verify=False)
        for name in manifest.files:
            target = tmp_path / where / name
            assert sha256_file(target) == manifest.files[name]
            assert fast_digest_file(target) == manifest.files_xxh3_128[name]
    assert not [p for p in (tmp_path / "beside").iterdir() if p.name.startswith("capture")]


@pytest.mark.slow
def test_capture_beside_that_dies_is_made_in_the_export(fp16_model, tmp_path, monkeypatch):
    """A capture process that dies (killed here, as the kernel's OOM killer would) costs its time, not the export:
    the capture is made in the export's process on the model optimum-intel loaded."""
    import optimum_shared_graph as osg
    from optimum_shared_graph.pipeline import capture_beside
    from optimum_shared_graph.pipeline.memory import OVERLAP_ENV

    result = capture_beside.CaptureBeside.result

    def killed_first(self):
        self.proc.kill()
        return result(self)

    monkeypatch.setattr(capture_beside.CaptureBeside, "result", killed_first)
    monkeypatch.setenv(OVERLAP_ENV, "on")
    validation = osg.export(fp16_model, tmp_path / "out", quiet=True).validation
    assert validation["status"] == "passed" and validation["captured"] == "in the export's process"
