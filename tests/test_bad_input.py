"""Bad input: one clear line, a non-zero exit, and the output directory unchanged (docs/errors.md)."""

from __future__ import annotations

import json
from pathlib import Path
import subprocess
import sys
import textwrap

import pytest

from conftest import error_line, remote_code_llama, run_cli, tree_snapshot

TASK = ["--task", "text-generation-shared"]

# A causal LM whose decode step (one new token) does something its traced prefill does not: tracing
# bakes in one branch, so the exported graph cannot reproduce PyTorch and validation must fail.
_FLIP_MODELING = textwrap.dedent(
    '''
    from transformers import LlamaForCausalLM

    class FlipLlamaForCausalLM(LlamaForCausalLM):
        def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            out = super().forward(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                past_key_values=past_key_values, **kwargs,
            )
            if input_ids is not None and input_ids.shape[1] == 1:
                out.logits = out.logits.flip(-1)
            return out
    '''
)


def _export(model, out, *extra):
    return run_cli("export", "openvino", "-m", str(model), *TASK, str(out), *extra)


def _assert_unchanged(out, before):
    assert tree_snapshot(out) == before
    assert not [p for p in out.parent.iterdir() if p.name.endswith(".partial")]


def test_missing_model_path(tmp_path, out_dir):
    before = tree_snapshot(out_dir)
    proc = _export(tmp_path / "no-such-model", out_dir)
    assert proc.returncode != 0
    assert "does not exist" in error_line(proc)
    _assert_unchanged(out_dir, before)


def test_a_missing_model_path_is_refused_before_optimum_intels_exporter_is_imported(tmp_path):
    # a fresh interpreter, as a user's: the exporter's imports are most of a fresh command's 15 s on a 2-core host
    code = ("import sys\nfrom optimum.commands.optimum_cli import main\n"
            "sys.argv = ['optimum-cli', 'export', 'openvino', '-m', sys.argv[1], '--task', 'text-generation-shared', "
            "sys.argv[2]]\ntry:\n    main()\nexcept SystemExit as exit_:\n"
            "    print(exit_.code, 'optimum.exporters.openvino' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "no-such-model"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["2", "False"], proc.stdout + proc.stderr[-2000:]
    assert "does not exist" in error_line(proc)
    assert not (tmp_path / "out").exists()


def test_model_path_naming_a_file(tiny_model, tmp_path, out_dir):
    before = tree_snapshot(out_dir)
    proc = _export(tiny_model("llama") / "config.json", out_dir)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "is a file, not a model directory" in line and "does not exist" not in line, line
    _assert_unchanged(out_dir, before)


def test_corrupt_weights_file(tiny_model, tmp_path, out_dir):
    import shutil

    model = tmp_path / "corrupt"
    shutil.copytree(tiny_model("llama"), model)
    for weights in model.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    before = tree_snapshot(out_dir)
    proc = _export(model, out_dir)
    assert proc.returncode != 0
    line = error_line(proc)
    assert line.startswith(f"error: cannot load the weights of {model}: SafetensorError") and "re-save" in line, line
    _assert_unchanged(out_dir, before)


def test_not_a_causal_lm(tmp_path, out_dir):
    from transformers import BertConfig, BertModel

    model = tmp_path / "bert"
    BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                         vocab_size=128)).save_pretrained(model)
    before = tree_snapshot(out_dir)
    proc = _export(model, out_dir)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "not a causal language model" in line and "bert" in line
    _assert_unchanged(out_dir, before)


def test_model_type_unknown_to_the_exporter(tmp_path, out_dir):
    from optimum_shared_graph.testing import tiny_config

    model = tmp_path / "helium"
    tiny_config("helium").save_pretrained(model)
    before = tree_snapshot(out_dir)
    proc = _export(model, out_dir)
    assert proc.returncode != 0
    line = error_line(proc)
    assert "'helium' is not known to optimum-intel's OpenVINO exporter" in line
    _assert_unchanged(out_dir, before)


def test_model_type_unknown_to_transformers(tmp_path, out_dir):
    model = tmp_path / "strange"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    proc = _export(model, out_dir)
    assert proc.returncode != 0
    assert "no-such-architecture" in error_line(proc)


@pytest.fixture(scope="module")
def flip_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("flip") / "flip-llama"
    return remote_code_llama(path, "modeling_flip", "FlipLlamaForCausalLM", _FLIP_MODELING)


@pytest.mark.parametrize("memory", ["found", "parts", pytest.param("capture beside", marks=pytest.mark.slow)])
def test_failed_validation_writes_nothing(flip_model, out_dir_both, memory, monkeypatch):
    """The broken-decode model is refused, its graph compiled whole or validated part by part, its capture made in
    the export's process or in one of its own beside optimum-intel's conversion."""
    from optimum_shared_graph.pipeline.memory import OVERLAP_ENV, MEMORY_ENV, RESERVE

    if memory == "parts":  # parts of ~200 KB: the tiny llama in several parts
        monkeypatch.setenv(MEMORY_ENV, str(RESERVE + 300_000))
    if memory == "capture beside":
        monkeypatch.setenv(OVERLAP_ENV, "on")
    before = tree_snapshot(out_dir_both)
    proc = _export(flip_model, out_dir_both, "--trust-remote-code")
    assert proc.returncode != 0
    line = error_line(proc)
    assert line.startswith("error: validation failed") and "greedy token" in line
    _assert_unchanged(out_dir_both, before)


def test_overlap_choice_not_understood(tiny_model, out_dir, monkeypatch):
    from optimum_shared_graph.pipeline.memory import OVERLAP_ENV

    monkeypatch.setenv(OVERLAP_ENV, "sideways")
    before = tree_snapshot(out_dir)
    proc = _export(tiny_model("llama"), out_dir)
    assert proc.returncode != 0
    assert error_line(proc) == ("error: OPTIMUM_SHARED_GRAPH_OVERLAP='sideways' is not one of off, digests, on: set it "
                                "to one of them or unset it")
    _assert_unchanged(out_dir, before)


def test_skip_validation_keeps_an_unchecked_artifact(flip_model, tmp_path):
    out = tmp_path / "unchecked"
    proc = _export(flip_model, out, "--trust-remote-code", "--skip-validation")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "shared_graph.json").read_text())
    assert manifest["validation"]["status"] == "skipped"


def test_remote_code_needed_but_not_allowed(tmp_path, out_dir):
    model = tmp_path / "custom"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "my-custom-lm",
        "auto_map": {"AutoConfig": "configuration_custom.CustomConfig"},
    }))
    (model / "configuration_custom.py").write_text(
        "from transformers import PretrainedConfig\n\nclass CustomConfig(PretrainedConfig):\n    model_type = 'my-custom-lm'\n"
    )
    before = tree_snapshot(out_dir)
    proc = _export(model, out_dir)
    assert proc.returncode != 0
    assert "--trust-remote-code" in error_line(proc)
    _assert_unchanged(out_dir, before)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--logits", "some"], "invalid choice"),
        (["--max-cache-len", "64"], "--max-cache-len only applies to static artifacts"),
        (["--static-query-len", "4"], "--static-query-len only applies to static artifacts"),
    ],
)
def test_invalid_flags(flags, message, tiny_model, out_dir):
    before = tree_snapshot(out_dir)
    proc = _export(tiny_model("gpt2"), out_dir, *flags)
    assert proc.returncode != 0
    assert message in proc.stderr
    _assert_unchanged(out_dir, before)


@pytest.mark.parametrize("flags", [["--logits", "all"], ["--quiet"]], ids=["logits", "quiet"])
def test_plugin_flags_refused_with_other_tasks(flags, tiny_model, tmp_path):
    out = tmp_path / "with-past"
    proc = run_cli("export", "openvino", "-m", str(tiny_model("gpt2")), "--task", "text-generation-with-past",
                   *flags, str(out))
    assert proc.returncode != 0
    assert f"{flags[0]} only applies with --task text-generation-shared" in error_line(proc)
    assert not out.exists()


def test_int4_group_size_that_does_not_divide_a_width(tiny_model, out_dir, tmp_path):
    """A width the int4 group size does not divide (SmolLM2-135M's hidden 576 with the default 128; here 96 with
    64): one line naming the user's task and NNCF's own fix, which works."""
    model = tiny_model("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                       intermediate_size=256)
    before = tree_snapshot(out_dir)
    proc = _export(model, out_dir, "--weight-format", "int4", "--group-size", "64")
    assert proc.returncode != 0
    line = error_line(proc)
    assert line.startswith("error: text-generation-shared cannot quantize llama: group size 64 does not divide the "
                           "input width 96 of "), line
    assert "text-generation-with-past" not in line
    assert "pass --group-size-fallback adjust" in line and "(--group-size 32)" in line
    _assert_unchanged(out_dir, before)
    if before is not None:
        return
    fixed = tmp_path / "adjusted"  # the advice works (once: the refusal is what the two output directories test)
    _export(model, fixed, "--weight-format", "int4", "--group-size", "64", "--group-size-fallback", "adjust").check_returncode()
    assert json.loads((fixed / "shared_graph.json").read_text())["quantization"]["weight_format"] == "int4"


@pytest.mark.parametrize("flags", [
    ["--awq", "--scale-estimation", "--dataset", "CALIBRATION"],
    ["--shape-mode", "static", "--max-cache-len", "64"],
    pytest.param(["--shape-mode", "static", "--max-cache-len", "64", "--awq", "--dataset", "CALIBRATION"],
                 marks=pytest.mark.slow),  # the two paths it joins stay in the default run
], ids=["awq", "static", "static-awq"])
def test_int4_group_size_refused_in_every_quantization_path(flags, tiny_model, out_dir, tmp_path):
    """The NPU form of int4 (--sym --ratio 1.0) with a group size a width does not divide, where the graph is
    quantized elsewhere than in optimum-intel's data-free `_main_quantize`: calibrated on both stages, or the
    static graph (compressed, or calibrated, after optimum-intel's export; it raised NNCF's traceback, exit 1).
    The same one line as the dynamic data-free export, and nothing written (into an earlier artifact: under
    `-m slow`; `test_failed_validation_writes_nothing` keeps one untouched after the export's work by default)."""
    model = tiny_model("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                       intermediate_size=256)
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n".join(f"calibration text number {i} for the quantizer" for i in range(8)) + "\n")
    before = tree_snapshot(out_dir)
    proc = _export(model, out_dir, "--weight-format", "int4", "--sym", "--ratio", "1.0", "--group-size", "64",
                   *[str(calibration) if f == "CALIBRATION" else f for f in flags])
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = error_line(proc)
    assert line.startswith("error: text-generation-shared cannot quantize llama: group size 64 does not divide the "
                           "input width 96 of "), line
    assert "pass --group-size-fallback adjust" in line and "(--group-size 32)" in line, line
    _assert_unchanged(out_dir, before)


def test_non_empty_foreign_output_directory_is_refused(tiny_model, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    before = tree_snapshot(out)
    proc = _export(tiny_model("gpt2"), out)
    assert proc.returncode != 0
    assert "is not empty" in error_line(proc)
    assert tree_snapshot(out) == before


def test_reexport_replaces_a_previous_artifact(tiny_model, tmp_path):
    out = tmp_path / "again"
    _export(tiny_model("gpt2"), out).check_returncode()
    (out / "stale.txt").write_text("from an older export")
    proc = _export(tiny_model("gpt2"), out, "--logits", "all")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "shared_graph.json").read_text())["logits"] == "all"


@pytest.fixture
def small_disk(tmp_path):
    """`small_disk(size_bytes, readonly=False)` -> a directory on a tmpfs of that size (needs root to mount)."""
    import subprocess

    mounts = []

    def mount(size: int, readonly: bool = False) -> Path:
        where = tmp_path / f"disk{len(mounts)}"
        where.mkdir()
        options = f"size={size}" + (",ro" if readonly else "")
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:  # lazily: a library may still hold a descriptor of a file it failed to write
        subprocess.run(["umount", "--lazy", str(where)], check=False)


@pytest.fixture(scope="module")
def artifact_sizes(tiny_model, tmp_path_factory) -> tuple[int, int]:
    """(bytes of a whole artifact of the tiny llama, bytes of its graph .bin), from a real export (once)."""
    out = tmp_path_factory.mktemp("measure") / "out"
    _export(tiny_model("llama"), out, "--quiet").check_returncode()
    return sum(p.stat().st_size for p in out.iterdir()), (out / "openvino_model.bin").stat().st_size


def test_full_disk(small_disk, tiny_model, artifact_sizes):
    total, graph = artifact_sizes
    disk = small_disk(graph // 4)  # too small for optimum-intel's own files
    out = disk / "out"
    proc = _export(tiny_model("llama"), out, "--quiet")
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith(f"error: no space left on the disk holding {disk} (") and "another disk" in line, line
    assert list(disk.iterdir()) == []  # no artifact, no staging directory


def test_weights_are_written_once(small_disk, tiny_model, artifact_sizes):
    """A disk with room for one artifact and half a graph more is enough: optimum-intel writes the weights and
    the export adds the manifest to the XML (the graph used to be saved a second time after validation)."""
    total, graph = artifact_sizes
    disk = small_disk(total + graph // 2)
    proc = _export(tiny_model("llama"), disk / "out", "--quiet")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (disk / "out" / "shared_graph.json").is_file() and [p.name for p in disk.iterdir()] == ["out"]


def test_read_only_output_directory(small_disk, tiny_model):
    disk = small_disk(2**20, readonly=True)
    proc = _export(tiny_model("llama"), disk / "out", "--quiet")
    assert proc.returncode == 2
    line = error_line(proc)
    assert line == (f"error: cannot write the artifact into {disk}: Read-only file system; choose an output directory "
                    "you can write to (nothing was written)"), line


def test_full_disk_from_python(small_disk, tiny_model):
    import optimum_shared_graph as osg

    disk = small_disk(64 * 2**10)
    with pytest.raises(osg.ArtifactWriteError, match="no space left on the disk holding"):
        osg.export(str(tiny_model("llama")), disk / "out", quiet=True)
    assert list(disk.iterdir()) == []


def test_not_enough_memory_for_one_part_is_refused_before_any_work(tiny_model, out_dir, monkeypatch):
    from optimum_shared_graph.pipeline.memory import MEMORY_ENV

    monkeypatch.setenv(MEMORY_ENV, str(100 * 2**20))
    before = tree_snapshot(out_dir)
    proc = _export(tiny_model("llama"), out_dir)
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith("error: validating this export needs at least ") and "0.1 GiB available" in line
    assert "--skip-validation" in line and "nothing was written" in line
    assert "converting" not in proc.stderr  # stopped at the first stage
    _assert_unchanged(out_dir, before)


def test_memory_variable_that_is_not_a_number(tiny_model, out_dir, monkeypatch):
    from optimum_shared_graph.pipeline.memory import MEMORY_ENV

    monkeypatch.setenv(MEMORY_ENV, "3GB")
    before = tree_snapshot(out_dir)
    proc = _export(tiny_model("llama"), out_dir)
    assert proc.returncode == 2
    assert error_line(proc) == f"error: {MEMORY_ENV}='3GB' is not a number of bytes: set it to an integer or unset it"
    _assert_unchanged(out_dir, before)


# ------------------------------------------------------------------------- --task image-text-to-text-shared

VLM_TASK = ["--task", "image-text-to-text-shared"]


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    """A tiny Qwen3.5-MoE vision-language checkpoint laid out as published, with its processor."""
    from optimum_shared_graph.testing import build_tiny_multimodal

    path = tmp_path_factory.mktemp("vlm") / "qwen3_5_moe"
    build_tiny_multimodal("qwen3_5_moe", path, processor=True)
    return path


def _vlm_export(model, out):
    return run_cli("export", "openvino", "-m", str(model), *VLM_TASK, str(out))


@pytest.mark.parametrize("damage, said", [("truncated", "incomplete metadata, file not fully covered"),
                                           ("garbage", "header too large")])
def test_vlm_damaged_weights(damage, said, tiny_vlm, tmp_path, out_dir):
    """A weights file cut at half its size (its header whole, half the tensors' bytes), or not a safetensors file."""
    import shutil

    model = tmp_path / damage
    shutil.copytree(tiny_vlm, model)
    for weights in model.glob("*.safetensors"):
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"not a safetensors file")
    before = tree_snapshot(out_dir)
    proc = _vlm_export(model, out_dir)
    assert proc.returncode == 2
    line = error_line(proc)
    assert line.startswith(f"error: cannot load the weights of {model}: SafetensorError") and said in line, line
    assert "re-download or re-save" in line, line
    _assert_unchanged(out_dir, before)


def test_vlm_processor_whose_image_token_is_not_the_configs(tiny_vlm, tmp_path, out_dir):
    """The processor puts `<|image_pad|>` (id 7) where the images go and config.json says the model's image token is
    9: refused before the weights are read (PyTorch's generate() would find no image token in the processor's
    prompt, reported as optimum-intel's failure)."""
    import shutil

    model = tmp_path / "other-token"
    shutil.copytree(tiny_vlm, model)
    config = json.loads((model / "config.json").read_text())
    assert config["image_token_id"] == 7
    (model / "config.json").write_text(json.dumps({**config, "image_token_id": 9}))
    before = tree_snapshot(out_dir)
    proc = _vlm_export(model, out_dir)
    assert proc.returncode == 2
    line = error_line(proc)
    assert line == (f"error: {model}: its processor marks an image with token '<|image_pad|>' (id 7) and its "
                    "config.json has image_token_id 9, so the model would find no image in the processor's prompts "
                    "(at export and in every consumer): keep the processor files saved with this checkpoint, or set "
                    "image_token_id to 7 in config.json if that is the token the model was trained with"), line
    assert "Loading weights" not in proc.stderr  # stopped before any work
    _assert_unchanged(out_dir, before)


def _vlm_export_stopped(model, out, signum):
    """The CLI export of `model` into `out`, sent `signum` once optimum-intel's conversion has started (its staging
    directory has `raw/`): the finished process."""
    import os
    import subprocess
    import time

    from conftest import _optimum_cli

    args = [_optimum_cli(), "export", "openvino", "-m", str(model), *VLM_TASK, str(out)]
    env = {k: v for k, v in os.environ.items() if k != "OPTIMUM_SHARED_GRAPH_DEBUG"}
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while not list(out.parent.glob(f".{out.name}.*.partial/raw")):
        assert proc.poll() is None and time.monotonic() < deadline, "the export ended before its conversion was seen"
        time.sleep(0.05)
    os.kill(proc.pid, signum)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr), args


@pytest.mark.parametrize("signame, existing", [("SIGTERM", True),
                                               pytest.param("SIGINT", False, marks=pytest.mark.slow)])
def test_vlm_export_interrupted_writes_nothing(signame, existing, tiny_vlm, tmp_path):
    """SIGTERM (`kill`) or SIGINT (Ctrl-C) during optimum-intel's conversion: one line, exit status 128 + the
    signal's number, no traceback, the output directory as it was (an earlier artifact kept) and no staging
    directory left beside it."""
    import signal

    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "shared_graph.json").write_text('{"schema_version": 1}')
        (out / "openvino_model.xml").write_text("<old/>")
    before = tree_snapshot(out)
    signum = getattr(signal, signame)
    proc, _args = _vlm_export_stopped(tiny_vlm, out, signum)
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert error_line(proc) == (f"error: interrupted by {signame}: the export stopped and wrote nothing ({out} is "
                                "as it was); run the command again to export")
    _assert_unchanged(out, before)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out"] if existing else [])


@pytest.mark.slow  # the conversion started, killed, then a whole export (about 60 s)
def test_vlm_export_killed_leaves_litter_the_rerun_removes(tiny_vlm, tmp_path):
    """SIGKILL cannot be caught: the staging directory is left (the output is not created); the next export into the
    same place removes it and completes."""
    import signal
    import subprocess

    out = tmp_path / "out"
    proc, args = _vlm_export_stopped(tiny_vlm, out, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists() and len(list(tmp_path.glob(".out.*.partial"))) == 1
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "validation: passed" in rerun.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
