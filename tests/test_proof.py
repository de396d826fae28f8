"""`proof/`: the reference an export stores in its artifact, and `validate()` / `optimum-cli shared-graph
validate`, which run it through every OpenVINO consumer on a device and judge it with the export's rules."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from conftest import EXACT, QUANTIZABLE, break_decode, error_line, run_cli, sixteen_bit

import optimum_shared_graph as osg
from optimum_shared_graph.manifest import MANIFEST_NAME, read_manifest
from optimum_shared_graph.proof.stored import REFERENCE_NAME
from optimum_shared_graph.testing import NPU_ON_CPU



@pytest.fixture(scope="module")
def artifacts(tiny_model, tmp_path_factory):
    """`artifacts(kind)` -> an artifact of the tiny llama: "dynamic", "static", "int8", "int4", "unchecked" (exported once,
    through the Python API: the command line's export is the same pipeline, tested in test_export_cli.py)."""
    options = {"dynamic": {}, "static": {"shape_mode": "static", "max_cache_len": 64},
               "int8": {"weight_format": "int8"}, "int4": {"weight_format": "int4"}, "unchecked": {"skip_validation": True}}
    made = {}

    def get(kind: str):
        if kind not in made:
            out = tmp_path_factory.mktemp("proof") / kind
            model = tiny_model("llama", **QUANTIZABLE) if kind in ("int8", "int4") else tiny_model("llama")
            osg.export(str(model), out, quiet=True, **options[kind])
            made[kind] = out
        return made[kind]

    return get


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------------------ the reference


def test_the_export_stores_its_reference_hashed_in_the_manifest(artifacts):
    out = artifacts("dynamic")
    manifest = read_manifest(out)
    record = manifest.validation["reference"]
    assert record["file"] == REFERENCE_NAME and record["judged_against"] == "pytorch"
    assert record["bytes"] == (out / REFERENCE_NAME).stat().st_size
    with np.load(out / REFERENCE_NAME, allow_pickle=False) as data:
        assert sorted(data.files) == ["fed", "logits", "prompt_ids", "prompt_mask"]
        calls, batch, vocab = data["logits"].shape
        assert calls == manifest.validation["greedy_tokens"] == record["calls"] and batch == 1
        assert data["logits"].dtype == np.float32 and data["fed"].shape == (1, calls)
        assert data["prompt_ids"].shape[1] == manifest.validation["prompt_tokens"]
    # no weights in it: the logits of each call, a few ids, and the npz's own framing
    assert record["bytes"] <= calls * vocab * 4 + 8192
    # the rt_info carries the record too (the manifest facts), the graph files' digests are unchanged by it
    assert json.loads(read_manifest(out).rt_info()["validation"])["reference"]["sha256"] == record["sha256"]


def test_a_quantized_export_stores_the_graphs_own_logits(artifacts):
    """int8 weights: the export records their difference from PyTorch; the stored reference is what the graph
    computed on the export machine, so a device is judged on its arithmetic, not on the quantization."""
    out = artifacts("int8")
    manifest = read_manifest(out)
    assert manifest.validation["status"] == "recorded"
    assert manifest.validation["reference"]["judged_against"] == "graph"
    report = osg.validate(out, "openvino", "CPU", EXACT)
    assert report["status"] == "passed" and report["judged_against"] == "graph"
    assert report["max_abs_diff_decode"] < 1e-4  # the same graph, the same arithmetic


# --------------------------------------------------------------------------------- every consumer passes

CONSUMERS = [
    ("openvino", "CPU", EXACT),
    ("openvino", "CPU", {}),  # the artifact's runtime options: an f16 KV cache, judged by the 16-bit rule
    ("optimum", "CPU", EXACT),
    ("runtime", "CPU", {}),
    ("genai", "CPU", {}),
    ("genai", "NPU", NPU_ON_CPU),  # its partitions on the CPU, computing in f16
    ("openvino", "CPU", sixteen_bit()),  # reduced precision forced, whatever this host's default
    ("genai", "CPU", sixteen_bit()),
    ("continuous-batching", "CPU", {}),
]


@pytest.mark.parametrize("consumer,device,properties", CONSUMERS, ids=lambda v: v if isinstance(v, str) else
                         ",".join(f"{k}={x}" for k, x in v.items()) or "defaults")
def test_a_fresh_export_passes_through_every_consumer(artifacts, consumer, device, properties):
    from conftest import tree_snapshot

    before = tree_snapshot(artifacts("dynamic"))
    report = osg.validate(artifacts("dynamic"), consumer=consumer, device=device, properties=properties)
    assert tree_snapshot(artifacts("dynamic")) == before  # nothing written into the artifact, nothing changed
    assert report["status"] == "passed", report  # judged by the margins: a pick may differ only at a near-tie
    assert report["consumer"] == consumer and report["device"] == device
    if consumer in ("genai", "continuous-batching"):
        assert report["compared_tokens"] == [report["greedy_tokens"]]  # every stored call compared
    else:
        assert report["max_abs_diff_decode"] <= report["tolerance"]
    forced = sixteen_bit()
    if properties == forced and consumer == "openvino":  # the compiled graph really computes at reduced precision
        key = "inference" if "INFERENCE_PRECISION_HINT" in forced else "kv_cache"
        assert report["rule"] == "fp16" and report["precision"][key] == next(iter(forced.values())), report
    if properties == EXACT:
        assert report["greedy_match"], report
        assert report["rule"] == "fp32" and report["terms"] == []
        assert report["precision"]["inference"] == report["precision"]["kv_cache"] == "f32"
        assert report["max_abs_diff_decode"] < 1e-4


def test_the_static_artifact_passes_through_runtime_and_openvino(artifacts):
    out = artifacts("static")
    assert read_manifest(out).validation["reference"]["calls"] >= 4
    for consumer in ("runtime", "openvino"):
        report = osg.validate(out, consumer=consumer, properties=EXACT)
        assert report["status"] == "passed" and report["rule"] == "fp32", report


# ------------------------------------------------------------------------------------------ it can fail


def test_a_broken_decode_graph_fails_with_one_line(artifacts, tmp_path):
    broken = break_decode(artifacts("dynamic"), tmp_path / "broken")
    with pytest.raises(osg.ArtifactValidationError, match="greedy token 1 differs") as info:
        osg.validate(broken, "openvino", "CPU", EXACT)
    assert info.value.report["differing_steps"][0]["step"] == 1 and info.value.report["max_abs_diff_prefill"] < 1e-4
    proc = run_cli("shared-graph", "validate", str(broken), "--consumer", "genai")
    assert proc.returncode != 0
    line = error_line(proc)  # after step 1's near-tie GenAI is restarted from the reference's context: a clear flip
    assert line.startswith("error: validation failed: genai on CPU does not reproduce PyTorch: greedy token ")
    assert "above the tolerance" in line


def test_a_quantized_artifact_under_default_properties_passes_and_its_broken_decode_fails(artifacts, tmp_path):
    """int4 weights under the device's defaults: the export's reference was computed in f32, with the CPU plugin's
    int8 quantization of the int4 matmuls' activations; a consumer computing in bf16 (with a u8 KV cache, this
    machine's CPU defaults) rounds differently in each of those. The rule adds a term for each 8-bit rounding
    (docs/deploy.md): this artifact's default-properties difference exceeds the 16-bit rule alone on a CPU with
    bf16 units, and passes; the same graph with its decode logits negated still fails."""
    from optimum_shared_graph.proof.judge import RELATIVE_TOLERANCE, TERMS, logit_scale

    out = artifacts("int4")
    assert read_manifest(out).validation["compile_config"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] >= 0  # recorded
    exact = osg.validate(out, "openvino", "CPU", EXACT)  # computed as the export did: no term, the same logits
    assert exact["rule"] == "fp16" and exact["terms"] == [] and exact["max_abs_diff_decode"] < 1e-4
    report = osg.validate(out, "openvino", "CPU", {})
    assert report["status"] == "passed" and all(d["near_tie"] for d in report["differing_steps"]), report
    precision = report["precision"]
    expected = (["8-bit KV cache"] if precision["kv_cache"] in ("u8", "i8") else []) + (
        ["8-bit activations"] if (precision["inference"], precision["kv_cache"]) != ("f32", "f32") else [])
    assert report["terms"] == expected, report
    scale = logit_scale(list(np.load(out / REFERENCE_NAME)["logits"]))
    assert report["tolerance"] == pytest.approx(scale * np.sqrt(RELATIVE_TOLERANCE["fp16"] ** 2
                                                               + sum(TERMS[t] ** 2 for t in expected)))
    broken = break_decode(out, tmp_path / "broken")
    with pytest.raises(osg.ArtifactValidationError, match="does not reproduce the exported graph") as info:
        osg.validate(broken, "openvino", "CPU", {})
    failed = info.value.report
    assert failed["terms"] == expected and failed["max_abs_diff_prefill"] <= failed["tolerance"]
    assert failed["max_abs_diff_decode"] > 10 * failed["tolerance"]  # a negated decode is far beyond any rounding


def test_a_kv_cache_too_coarse_fails(artifacts):
    """A 4-bit KV cache changes this model's results beyond the 16-bit rule's tolerance: a clear greedy flip."""
    with pytest.raises(osg.ArtifactValidationError, match="differs .* above the tolerance") as info:
        osg.validate(artifacts("dynamic"), "openvino", "CPU", {"KV_CACHE_PRECISION": "u4"})
    assert info.value.report["precision"]["kv_cache"] == "u4" and info.value.report["rule"] == "fp16"


# ------------------------------------------------------------------------------------ refusals, one line


def test_an_artifact_without_a_reference_is_refused(artifacts, tmp_path):
    proc = run_cli("shared-graph", "validate", str(artifacts("unchecked")))
    assert proc.returncode != 0
    assert "has no stored reference" in error_line(proc) and "re-export" in error_line(proc)
    # one made before the reference existed: the manifest has no record of it
    old = _copy(artifacts("dynamic"), tmp_path / "old")
    manifest = json.loads((old / MANIFEST_NAME).read_text())
    del manifest["validation"]["reference"]
    (old / MANIFEST_NAME).write_text(json.dumps(manifest))
    (old / REFERENCE_NAME).unlink()
    with pytest.raises(osg.ArtifactValidationError, match="has no stored reference"):
        osg.validate(old)


def test_a_changed_or_missing_reference_is_refused(artifacts, tmp_path):
    changed = _copy(artifacts("dynamic"), tmp_path / "changed")
    with np.load(changed / REFERENCE_NAME) as data:
        arrays = dict(data)
    arrays["logits"][0, 0, 0] += 1.0
    np.savez_compressed(changed / REFERENCE_NAME, **arrays)
    with pytest.raises(osg.ArtifactValidationError, match="does not match the sha256"):
        osg.validate(changed)
    (changed / REFERENCE_NAME).unlink()
    with pytest.raises(osg.ArtifactValidationError, match="lacks its stored reference"):
        osg.validate(changed)


@pytest.mark.parametrize("args,expected", [
    (["--consumer", "genai"], "is a static artifact, which genai cannot load"),
    (["-p", "INFERENCE_PRECISION_HINT"], "is not KEY=VALUE"),
    (["--device", "NO_SUCH_DEVICE"], "openvino on NO_SUCH_DEVICE could not run"),
    (["--consumer", "genai-vlm"], "is a text-generation-shared artifact, and consumer 'genai-vlm' runs "
                                  "image-text-to-text-shared artifacts only: validate it with consumer 'openvino'"),
])
def test_bad_requests_get_one_line(artifacts, args, expected):
    proc = run_cli("shared-graph", "validate", str(artifacts("static")), *args)
    assert proc.returncode != 0 and expected in error_line(proc)


def test_the_command_prints_the_report_and_changes_nothing(artifacts):
    from conftest import tree_snapshot

    out = artifacts("dynamic")
    before = tree_snapshot(out)
    proc = run_cli("shared-graph", "validate", str(out), "--consumer", "optimum", "-p", "INFERENCE_PRECISION_HINT=f32",
                   "-p", "KV_CACHE_PRECISION=f32", "--json", check=True)
    report = json.loads(proc.stdout)
    assert report["status"] == "passed" and report["rule"] == "fp32"
    assert report["properties"] == EXACT
    assert "reproduces PyTorch through optimum on CPU" in proc.stderr.splitlines()[-1]  # beside the JSON
    assert tree_snapshot(out) == before
    proc = run_cli("shared-graph", "validate", str(out), check=True)  # without --json: the verdict on stdout
    assert proc.stdout.splitlines()[-1].startswith(f"validate: {out} reproduces PyTorch through openvino on CPU (")
    assert "reproduces" not in proc.stderr


def test_the_module_entry_point_is_the_same_command(artifacts):
    """`python -m optimum_shared_graph validate`, for installs without the optimum-cli hook (editable ones)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "optimum_shared_graph", "validate", str(artifacts("dynamic"))],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "reproduces PyTorch through openvino on CPU" in proc.stdout.splitlines()[-1]
    proc = subprocess.run([sys.executable, "-m", "optimum_shared_graph", "validate", str(artifacts("unchecked"))],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "has no stored reference" in error_line(proc)


def test_a_consumer_that_cannot_restart_is_compared_up_to_there():
    """A greedy consumer that takes text (VLMPipeline, `proof/vlm.py`) cannot always restart from the reference's
    token ids after a near-tie: the calls after it are reported as not compared, and the verdict is the judge's on
    the calls compared (a decisive difference before it still fails)."""
    from optimum_shared_graph.proof.judge import CannotRestart, judge_tokens

    logits = np.zeros((4, 1, 8), np.float32)
    for step, (top, second) in enumerate([(1, 0.5), (2, 0.01), (3, 0.5), (4, 0.5)]):
        logits[step, 0, top], logits[step, 0, 7] = 1.0, 1.0 - second  # token 7 the runner-up, `second` behind
    fed = np.array([[1, 2, 3, 4]])

    def generate(row, start):  # picks the runner-up at the near-tie (step 1); cannot start from a fed context
        if start:
            raise CannotRestart("the context does not come back from its text")
        return [1, 7, 3, 4]

    report, why = judge_tokens(generate, list(logits), fed, tolerance=0.05)
    assert why is None and report["compared_tokens"] == [2] and report["differing_steps"][0]["near_tie"]
    assert report["not_compared"] == [{"row": 0, "from_step": 2, "calls": 2,
                                       "reason": "the context does not come back from its text"}]
    report, why = judge_tokens(lambda row, start: [7, 2, 3, 4], list(logits), fed, tolerance=0.05)
    assert "greedy token 0 differs (1 expected, 7 got)" in why and "not_compared" not in report
