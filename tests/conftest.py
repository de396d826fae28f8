"""Shared fixtures: tiny decisive random-init models built locally, and the CLI run as a user runs it."""

from __future__ import annotations

import atexit
import os
import subprocess
import threading
import sys
from pathlib import Path

import pytest

from forked_commands import ForkedCommands
from optimum_shared_graph.testing import npu_precision

EXACT = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}

# What an NPU computes in, as far as this CPU can (`testing.npu_precision()`: f16 where the CPU has f16 units, else
# f32): GenAI's NPU pipeline run on the CPU (NPUW_DEVICES=CPU) honours the hint. (optimum_shared_graph.testing
# .NPU_ON_CPU has it with the NPU pipeline's properties; this is the part a judgement of its tokens needs.)
NPU_PRECISION = npu_precision()


def sixteen_bit() -> dict:
    """CPU properties that force reduced precision on this host, whatever its CPU: 16-bit compute (bf16 where the
    CPU has bf16 units, else f16 where it has f16 units), else an 8-bit KV cache, which every x86 CPU runs. The
    precision-dependent checks run under these as well as under the defaults, so a host whose default is f32 still
    exercises the margins' judgement that a host with bf16 units needs. `SHARED_GRAPH_TEST_REDUCED=KEY=VALUE`
    picks the properties instead (`KV_CACHE_PRECISION=u8`: what a CPU without 16-bit units gets)."""
    import openvino as ov

    chosen = os.environ.get("SHARED_GRAPH_TEST_REDUCED")
    if chosen:
        key, _, value = chosen.partition("=")
        return {key: value}

    capabilities = ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    if "BF16" in capabilities:
        return {"INFERENCE_PRECISION_HINT": "bf16"}
    if "FP16" in capabilities:
        return {"INFERENCE_PRECISION_HINT": "f16"}
    return {"KV_CACHE_PRECISION": "u8"}

# Architectures from different families, each exported through optimum-cli in the tests.
ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "gpt_neox", "falcon", "opt", "bloom", "starcoder2"]

# A llama whose projections int4 group sizes (64, and optimum-intel's default 128) divide: the
# quantization tests and the docs examples export it (the `quantizable_model` fixture).
QUANTIZABLE = dict(hidden_size=128, intermediate_size=256)

# Texts no calibration set contains: quantized artifacts are compared with PyTorch on them.
HELD_OUT = [
    "The cache grows by one token at every decode step of the graph.",
    "A static graph is compiled once and runs on every device.",
    "Hello, this is a short sentence about quantized weights.",
    "def mul(a, b):",
    "Prefill reads the whole prompt; decode reads one token.",
    "Dates such as 2025-01-31 and numbers like 77 are common.",
]

PROMPTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog",
    "Static graphs fix every shape: the batch, the query length and the cache capacity. " * 2,
]


@pytest.fixture(scope="session", autouse=True)
def verified_files_cache(tmp_path_factory) -> Path:
    """The tests' own cache of verified graph files (exports record theirs there), not the user's."""
    from optimum_shared_graph.verified import CACHE_DIR_ENV

    path = tmp_path_factory.mktemp("verified-files")
    os.environ[CACHE_DIR_ENV] = str(path)  # inherited by the optimum-cli subprocesses too
    return path


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_model(models_dir):
    """`tiny_model("llama")` -> path of a saved tiny model with a local tokenizer (built once per session)."""
    from optimum_shared_graph.testing import build_tiny_model

    built: dict[str, Path] = {}

    def get(model_type: str, **overrides) -> Path:
        key = model_type + "".join(f"-{k}={v}" for k, v in sorted(overrides.items()))
        if key not in built:
            path = models_dir / key
            build_tiny_model(model_type, path, **overrides)
            built[key] = path
        return built[key]

    return get


# A draft's assistant settings: 4 candidates per round always (no confidence cut-off, no schedule), so a
# round's proposals outlive the candidates the main model rejects and the draft's cache is cropped mid-proposal.
DRAFT_SETTINGS = dict(num_assistant_tokens=4, num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)


@pytest.fixture(scope="session")
def near_draft(tiny_model, models_dir) -> Path:
    """A draft checkpoint for `tiny_model("llama")`: its weights with noise on the last layer's down projection, so
    it proposes some of the llama's greedy tokens and not others (assisted generation accepts part of a round's
    candidates); `DRAFT_SETTINGS` in its generation config. Built once per session."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    path = models_dir / "llama-near-draft"
    if not path.exists():
        source = tiny_model("llama")
        model = AutoModelForCausalLM.from_pretrained(source).eval()
        weight = model.model.layers[-1].mlp.down_proj.weight
        with torch.no_grad():
            weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
        model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0, **DRAFT_SETTINGS)
        model.save_pretrained(str(path))
        for tokenizer_file in source.glob("*token*"):
            shutil.copy(tokenizer_file, path)
    return path


class MainCalls(list):
    """The `input_ids` of every forward call of a PyTorch model while in the `with` block (a forward pre-hook):
    under assisted generation, the candidates a draft proposed, as the main model verified them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def __enter__(self):
        self._hook = self.model.register_forward_pre_hook(
            lambda _module, args, kwargs: self.append(kwargs["input_ids"][0].tolist()), with_kwargs=True
        )
        return self

    def __exit__(self, *exc):
        self._hook.remove()


@pytest.fixture(scope="session")
def quantizable_model(tiny_model) -> Path:
    """The `QUANTIZABLE` llama (built once per session)."""
    return tiny_model("llama", **QUANTIZABLE)


def _out_dir(request, tmp_path) -> Path:
    out = tmp_path / "out"
    if request.param == "existing":
        out.mkdir()
        (out / "shared_graph.json").write_text('{"schema_version": 1}')
        (out / "openvino_model.xml").write_text("<old/>")
    return out


# The refusals run into an absent output directory in the default run, and into one holding an earlier artifact
# (which must survive untouched) under `-m slow`; `out_dir_both` runs both by default, for the failures that come
# after the export's work (validation) and the fallback's refusal.
@pytest.fixture(params=["missing", pytest.param("existing", marks=pytest.mark.slow)])
def out_dir(request, tmp_path):
    """The output directory: absent, or holding a previous artifact that must survive untouched."""
    return _out_dir(request, tmp_path)


@pytest.fixture(params=["missing", "existing"])
def out_dir_both(request, tmp_path):
    """`out_dir`, both forms in the default run."""
    return _out_dir(request, tmp_path)


def remote_code_llama(path: Path, module: str, class_name: str, code: str, **config_changes) -> Path:
    """A tiny llama at `path` whose `AutoModelForCausalLM` is `module.class_name`, defined by `code`."""
    import json

    from optimum_shared_graph.testing import build_tiny_model

    build_tiny_model("llama", path)
    config = json.loads((path / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": f"{module}.{class_name}"}
    config.update(config_changes)
    (path / "config.json").write_text(json.dumps(config))
    (path / f"{module}.py").write_text(code)
    return path


def at_once(calls):
    """Run each zero-argument call in its own thread, all released together; results (or exceptions) in order."""
    start = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def run(i):
        start.wait()
        try:
            results[i] = calls[i]()
        except Exception as error:  # the test inspects it
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def declared_runtime_providers() -> dict[str, str]:
    """The runtime providers setup.cfg declares (entry-point group `optimum_shared_graph.runtimes`): name -> object
    reference, as the installed distribution's entry points list them once installed."""
    import configparser

    config = configparser.ConfigParser()
    config.read(Path(__file__).resolve().parent.parent / "setup.cfg")
    lines = config["options.entry_points"]["optimum_shared_graph.runtimes"].strip().splitlines()
    return dict(tuple(part.strip() for part in line.split("=", 1)) for line in lines if line.strip())


@pytest.fixture
def runtime_providers_declared():
    """Every provider setup.cfg declares is registered: found through the installed entry points, else (an install
    made before the provider was declared) loaded from setup.cfg's declaration as the entry point would load it."""
    import importlib.metadata

    from optimum_shared_graph.runtimes import registry

    installed = {p.name for p in registry.installed_providers()}
    for name, value in declared_runtime_providers().items():
        if name not in installed:
            registry.REGISTRY.register(name, importlib.metadata.EntryPoint(name, value, registry.GROUP).load())
    return {p.name: p for p in registry.installed_providers()}


# commands forked from a process that has imported PyTorch, transformers and optimum-intel's exporter
# (`forked_commands`): each a process of its own, without a fresh interpreter's 10 to 16 s of imports
FORKED = ForkedCommands()
atexit.register(FORKED.close)


def run_command(argv: list, *, cwd=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `optimum-cli ...`, `python SCRIPT ...` or `python -m MODULE ...` as a process of its own, as a user does:
    its exit code, stdout and stderr, in `cwd`, with this process's environment."""
    return FORKED.run(argv, cwd=cwd, timeout=timeout)


def run_cli(*args: str, check: bool = False, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `optimum-cli` as a process of its own, as a user does (`run_command`)."""
    env = dict(os.environ)
    env.pop("OPTIMUM_SHARED_GRAPH_DEBUG", None)
    proc = FORKED.run([_optimum_cli(), *args], env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"optimum-cli {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def run_cli_in_process(*args: str) -> None:
    """Run `optimum-cli` in this process: the same entry point (`optimum.commands.optimum_cli.main`, our
    `commands/register/` hook included) with `sys.argv` set, without a fresh interpreter's ~10 s of imports.
    For exports a test compares rather than tests as a command (`run_cli` runs a command as a user does)."""
    from unittest import mock

    from optimum.commands.optimum_cli import main

    with mock.patch.object(sys, "argv", ["optimum-cli", *args]):
        try:
            main()
        except SystemExit as exit_:
            if exit_.code:
                raise AssertionError(f"optimum-cli {' '.join(args)} exited with {exit_.code}") from exit_


def _optimum_cli() -> str:
    beside = Path(sys.executable).parent / "optimum-cli"
    return str(beside) if beside.exists() else "optimum-cli"


def error_line(proc: subprocess.CompletedProcess) -> str:
    """The one `error: ...` line a failed command printed (and assert there is exactly one, no traceback)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback (most recent call last)" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def widest_int8_weight(xml: Path) -> int:
    """The largest |value| of the int8 weights of its own (not tied to an embedding) that a MatMul with int8
    (FakeQuantize) activations reads in the graph at `xml`: at most 64 where NNCF's overflow fix keeps them to 7
    bits, 127 where it does not."""
    import numpy as np
    import openvino as ov

    def upstream(value, through):
        node, shared = value.get_node(), len(value.get_target_inputs()) > 1
        while node.get_type_name() in through:
            value = node.input_value(0)
            node, shared = value.get_node(), shared or len(value.get_target_inputs()) > 1
        return node, shared

    widest = 0
    for op in ov.Core().read_model(xml).get_ordered_ops():
        if op.get_type_name() != "MatMul" or \
                upstream(op.input_value(0), ("Convert", "Reshape", "Transpose"))[0].get_type_name() != "FakeQuantize":
            continue
        weight, shared = upstream(op.input_value(1), ("Convert", "Subtract", "Multiply", "Reshape", "Transpose"))
        if not shared and weight.get_type_name() == "Constant" and weight.get_element_type() == ov.Type.i8:
            widest = max(widest, int(np.abs(weight.get_data().astype(np.int32)).max()))
    return widest


def tree_snapshot(path: Path) -> dict[str, bytes] | None:
    if not path.exists():
        return None
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def unloadable_copy(model: Path, dest: Path) -> Path:
    """A copy of `model` whose weights file is garbage: a check made before the model is loaded still
    gives its own error; one made after it gives 'cannot load the weights'."""
    import shutil

    shutil.copytree(model, dest)
    for weights in dest.glob("*.safetensors"):
        weights.write_bytes(b"not a safetensors file")
    return dest


def edited_copy(artifact: Path, dest: Path, graph_file: str, edit) -> Path:
    """A copy of `artifact` at `dest` whose graph `graph_file` went through `edit(graph)` (in place), with the
    manifest's digests updated to the new graph, as if a wrong graph had been exported into the directory."""
    import json
    import shutil

    import openvino as ov

    from optimum_shared_graph.manifest import MANIFEST_NAME, digest_graph_files

    shutil.copytree(artifact, dest)
    graph = ov.Core().read_model(dest / graph_file)
    edit(graph)
    graph.validate_nodes_and_infer_types()
    staged = dest.parent / f"{dest.name}.broken"
    ov.save_model(graph, f"{staged}.xml", compress_to_fp16=False)  # not over the .bin it maps
    del graph
    for suffix in (".xml", ".bin"):
        shutil.move(f"{staged}{suffix}", dest / graph_file.replace(".xml", suffix))
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    manifest["files"], manifest["files_xxh3_128"] = digest_graph_files(dest, sorted(manifest["files"]))
    (dest / MANIFEST_NAME).write_text(json.dumps(manifest))


def break_decode(artifact: Path, dest: Path, graph_file: str = "openvino_model.xml") -> Path:
    """A copy of `artifact` at `dest` whose graph (`graph_file`: a vision-language artifact's language model is
    `openvino_language_model.xml`, fed `inputs_embeds`) negates the logits of every one-token call (a broken
    decode), with the manifest's digests updated to the new graph (`edited_copy`)."""
    import numpy as np
    import openvino.opset13 as ops

    def negate_decode(graph):
        result = next(r for r in graph.get_results() if "logits" in r.output(0).get_names())
        logits = result.input(0).get_source_output()
        ids = next(p for p in graph.inputs if p.get_any_name() in ("input_ids", "inputs_embeds"))
        length = ops.gather(ops.shape_of(ids.get_node().output(0)), ops.constant([1]), ops.constant(0))
        one = ops.equal(length, ops.constant(np.array([1], np.int64)))
        result.input(0).replace_source_output(ops.select(one, ops.negative(logits), logits).output(0))

    edited_copy(artifact, dest, graph_file, negate_decode)
    return dest


def pytorch_reference(model, enc, new_tokens: int):
    """PyTorch's greedy `generate()` on `enc` (EOS disabled) as a reference a greedy consumer is judged against:
    the prompt, the tokens it fed and each call's last-position logits (`proof.stored.Reference`)."""
    import numpy as np
    import torch

    from optimum_shared_graph.proof.stored import Reference

    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    prompt = enc["input_ids"].shape[1]
    return Reference(prompt_ids=enc["input_ids"].numpy().astype(np.int64),
                     prompt_mask=enc["attention_mask"].numpy().astype(np.int64),
                     fed=out.sequences[:, prompt:].numpy().astype(np.int64),
                     logits=np.stack([step.float().numpy() for step in out.logits]))


def judged_greedy(pipe, reference, properties: dict | None = None) -> str | None:
    """Judge a GenAI pipeline's greedy tokens (any device, the NPU pipeline included) against `reference` as
    `validate()` judges a consumer at reduced precision: a differing pick is allowed only at a near-tie (the
    reference's top-2 margin within the 16-bit tolerance, with validate()'s term for an 8-bit KV cache where
    `properties` ask for one), where the pipeline is restarted from the reference's context. Returns the reason
    it fails, or None."""
    from optimum_shared_graph.proof.check import EIGHT_BIT
    from optimum_shared_graph.proof.consumers import greedy_of
    from optimum_shared_graph.proof.judge import REDUCED_PRECISION, judge_tokens, scaled_tolerance

    kv_cache = str((properties or {}).get("KV_CACHE_PRECISION", "")).lower()
    terms = ["8-bit KV cache"] if kv_cache in EIGHT_BIT else []
    tolerance = scaled_tolerance(REDUCED_PRECISION, reference.calls, terms)
    return judge_tokens(greedy_of(pipe, reference), reference.calls, reference.fed, tolerance)[1]


def file_mapped(tensor, path) -> bool:
    """Whether `tensor`'s memory lies in a mapping of the file `path` (/proc/self/maps)."""
    address = tensor.data_ptr()
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) >= 6 and fields[5] == str(path):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return True
    return False


def stored_experts_mapped(load, checkpoint) -> int:
    """How many experts modules of the model `load()` returns are `moe_experts.StoredExperts` (at least one), every
    expert's weights asserted to lie in a mapping of `checkpoint`'s safetensors file."""
    from optimum_shared_graph.architectures import moe_experts

    stored = [m for m in load().modules() if isinstance(m, moe_experts.StoredExperts)]
    assert stored
    weights = [w for experts in stored for e in range(experts.num_experts) for w in experts._projections(e)]
    assert all(file_mapped(w, (checkpoint / "model.safetensors").resolve()) for w in weights)
    return len(stored)
