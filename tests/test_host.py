"""host/: every patch of a library the package does not own, checked against the installed libraries.

Each row of `host.PATCHES` names its target, the target's parameters the patch relies on, and the library
functions that must look the target up when they run. An optimum-intel, Optimum or transformers upgrade that
moves, renames or re-signs a target, or binds it at import time where it was looked up at call time, fails
here, in one place, instead of deep inside an export.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import inspect
import subprocess
import sys
import textwrap

import pytest

from optimum_shared_graph import host

ROWS = [pytest.param(row, id=f"{row.patch}:{row.target.rpartition(':')[2]}") for row in host.PATCHES]


def _resolve(spec: str):
    """The object `module:dotted.path` names (an AttributeError names what is missing)."""
    module_name, _, path = spec.partition(":")
    obj = importlib.import_module(module_name)
    for part in path.split(".") if path else ():
        obj = getattr(obj, part)
    return obj


def _looks_up_at_call_time(caller_spec: str, row: host.Patch) -> bool:
    """Whether the function `caller_spec` reads the name `row` replaces when it runs: for a module attribute,
    an import of it inside the function's body or (in the target's own module) a global lookup; for an
    attribute of a class or object, an attribute access or a `getattr` with the name."""
    caller = inspect.unwrap(_resolve(caller_spec))
    tree = ast.parse(textwrap.dedent(inspect.getsource(caller)))
    target_module, _, path = row.target.partition(":")
    of_module = row.attribute is None and "." not in path
    caller_module = caller.__module__
    for node in ast.walk(tree):
        if of_module:
            if isinstance(node, ast.ImportFrom) and any(alias.name == row.name for alias in node.names):
                base = caller_module.split(".")[: -node.level] if node.level else []
                if ".".join(base + ([node.module] if node.module else [])) == target_module:
                    return True
            if isinstance(node, ast.Name) and node.id == row.name and caller_module == target_module:
                return True
        elif (isinstance(node, ast.Attribute) and node.attr == row.name) or \
                (isinstance(node, ast.Constant) and node.value == row.name):
            return True
    return False


def test_the_table_names_every_patch_of_host():
    patches = {row.patch for row in host.PATCHES}
    public = {name for name in host.__all__ if name not in {"PATCHES", "Patch", "openvino_entries"}}
    assert patches == public, f"in the table only: {patches - public}; in host/ only: {public - patches}"
    for row in host.PATCHES:
        assert callable(getattr(host, row.patch)), row.patch
        assert row.why and row.used_by and row.lasts in ("while active", "the process"), row


@pytest.mark.parametrize("row", ROWS)
def test_target_exists_with_the_parameters_the_patch_relies_on(row):
    target = _resolve(row.target)
    if row.parameters:
        parameters = inspect.signature(target).parameters
        missing = [p for p in row.parameters if p not in parameters]
        assert not missing, f"{row.target} has no parameter {missing} (it has {list(parameters)})"


@pytest.mark.parametrize("row", [r for r in ROWS if r.values[0].reached_by])
def test_the_library_looks_the_target_up_when_it_runs(row):
    for caller in row.reached_by:
        assert _looks_up_at_call_time(caller, row), (
            f"{caller} no longer reads {row.name} when it runs: host.{row.patch} would not reach it")


def test_the_model_loader_is_a_staticmethod():
    """`model_loads_wrapped` calls the original's `__func__` and puts a staticmethod back."""
    from optimum.exporters.tasks import TasksManager

    assert isinstance(TasksManager.__dict__["get_model_from_task"], staticmethod)


def test_the_command_gives_the_arguments_the_cli_reads():
    """`cli.run` and `cli.options_from_args` read these from optimum-intel's parsed `export openvino` flags."""
    from optimum.commands.export.openvino import OVExportCommand

    parse_args = getattr(OVExportCommand, "_shared_graph_original", (OVExportCommand.parse_args,))[0]
    parser = argparse.ArgumentParser()
    parse_args(parser)
    args = parser.parse_args(["-m", "some-model", "out"])
    for name in ("model", "output", "task", "dataset", "weight_format", "quant_mode", "disable_stateful",
                 "trust_remote_code", "disable_convert_tokenizer"):
        assert hasattr(args, name), name


def test_the_registries_have_the_functions_the_static_trace_wraps():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert {"sdpa", "eager"} <= set(ALL_MASK_ATTENTION_FUNCTIONS.keys())
    assert "sdpa" in ALL_ATTENTION_FUNCTIONS


def test_the_gemma2_patcher_keeps_the_attributes_cache_passed_through_reads():
    """`cache_passed_through` replaces `patched_forward` and calls `orig_forward` with `model_kwargs`'s
    overrides: attributes optimum-intel's patchers set in `__init__`."""
    from optimum.exporters.openvino.model_patcher import Gemma2ModelPatcher

    assigned = set()
    for cls in Gemma2ModelPatcher.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None or not hasattr(init, "__code__"):
            continue
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(init)))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                    and isinstance(node.ctx, ast.Store):
                assigned.add(node.attr)
    assert {"patched_forward", "orig_forward", "model_kwargs"} <= assigned, assigned


def _state():
    """What the patches active for a while replace, as it is now (identities)."""
    import optimum.exporters.openvino.__main__ as ov_main
    import optimum.exporters.openvino.convert as ov_convert
    from nncf.quantization.algorithms.weight_compression import openvino_backend as nncf_ov
    from optimum.exporters.tasks import TasksManager
    from optimum.intel.openvino.configuration import OVQuantizationConfigBase
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return {
        "compress_weight": nncf_ov.compress_weight,
        "_dataclasses_to_dict": OVQuantizationConfigBase.__dict__["_dataclasses_to_dict"],
        "export_from_model": ov_convert.export_from_model, "_save_model": ov_convert._save_model,
        "export_pytorch": ov_convert.export_pytorch, "main_export": ov_main.main_export,
        "_main_quantize": ov_main._main_quantize,
        "get_model_from_task": TasksManager.__dict__["get_model_from_task"],
        "masks": {k: ALL_MASK_ATTENTION_FUNCTIONS[k] for k in ("sdpa", "eager")},
        "attention": ALL_ATTENTION_FUNCTIONS["sdpa"],
    }


def test_each_patch_is_active_inside_and_undone_on_exit_also_after_an_error(tmp_path):
    from optimum.exporters.openvino.base import OpenVINOConfig
    from transformers import LlamaForCausalLM

    before = _state()
    capped = type("Capped", (OpenVINOConfig,), {"MAX_TRANSFORMERS_VERSION": "4.0.0"})
    uncapped = type("Uncapped", (capped,), {})  # inherits the cap
    ignored = LlamaForCausalLM.__dict__.get("_keys_to_ignore_on_load_unexpected", "absent")
    patches = {
        "export_from_model": lambda: host.models_handed_over(lambda *a: None),
        "_save_model": lambda: host.graphs_before_save(lambda *a: None),
        "export_pytorch": host.dynamic_graph_skipped,
        "main_export": lambda: host.main_export_wrapped(lambda bound, proceed: proceed()),
        "_main_quantize": lambda: host.main_quantize_wrapped(lambda bound, proceed: proceed()),
        "_dataclasses_to_dict": host.config_enums_serialized,
        "get_model_from_task": lambda: host.model_loads_wrapped(lambda err: err),
        "masks": lambda: host.mask_functions_wrapped(("sdpa", "eager"), lambda f: (lambda *a, **k: f(*a, **k))),
        "attention": lambda: host.attention_functions_wrapped(("sdpa",), lambda f: (lambda *a, **k: f(*a, **k))),
        "compress_weight": lambda: host.weights_compressed_in_slices(tmp_path),
    }
    for key, patch in patches.items():
        with patch():
            assert _state()[key] != before[key], f"{key} is not replaced inside"
        assert _state() == before, f"{key} is not restored"
        with pytest.raises(RuntimeError, match="inside"):
            with patch():
                raise RuntimeError("inside")
        assert _state() == before, f"{key} is not restored after an error"

    for cls in (capped, uncapped):
        with host.transformers_cap_lifted(cls):
            assert cls.MAX_TRANSFORMERS_VERSION is None
        assert cls.MAX_TRANSFORMERS_VERSION == "4.0.0"
    assert "MAX_TRANSFORMERS_VERSION" not in vars(uncapped)  # inherited again, not copied

    with host.unexpected_keys_ignored(LlamaForCausalLM, [r"^model\.vision_tower(\.|$)"]):
        assert r"^model\.vision_tower(\.|$)" in LlamaForCausalLM._keys_to_ignore_on_load_unexpected
    assert LlamaForCausalLM.__dict__.get("_keys_to_ignore_on_load_unexpected", "absent") == ignored


@pytest.mark.parametrize("mode", ["INT4_ASYM", "INT4_SYM", "INT8_ASYM", "INT8_SYM"])
def test_weights_compressed_in_slices_are_nncfs_own_bytes_in_files_removed_after(mode, tmp_path):
    """A vocabulary-like matrix (its rows sliced), an experts-like `[experts, out, in]` stack (sliced by experts) and
    one under the slice size, compressed data-free as optimum-intel does: the saved graph is byte for byte NNCF's
    own; the compressed values were file-backed (the patch's files, one directory, gone on exit)."""
    import nncf
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    rng = np.random.default_rng(0)

    def model():
        x = ops.parameter([1, 256], ov.Type.f32, name="x")
        # 956 rows: slices of 156 and a last one of 20, too short for NNCF's OpenVINO implementation (joined)
        vocab = ops.constant(rng.standard_normal((956, 256), dtype=np.float32).astype(np.float16))
        logits = ops.matmul(x, ops.convert(vocab, ov.Type.f32), False, True)
        experts = ops.constant(rng.standard_normal((6, 128, 256), dtype=np.float32).astype(np.float16))
        routed = ops.matmul(ops.broadcast(ops.reshape(x, [1, 1, 256], False), [6, 1, 256]),
                            ops.convert(experts, ov.Type.f32), False, True)
        small = ops.constant(rng.standard_normal((16, 256), dtype=np.float32).astype(np.float16))
        return ov.Model([logits, routed, ops.matmul(x, ops.convert(small, ov.Type.f32), False, True)], [x])

    options = {"mode": getattr(nncf.CompressWeightsMode, mode)}
    if mode.startswith("INT4"):
        options.update(group_size=64, ratio=1.0, all_layers=True)
    saved = {}
    for sliced in (False, True):
        rng = np.random.default_rng(0)
        files = []
        with (host.weights_compressed_in_slices(tmp_path / "scratch", slice_elements=40_000) if sliced
              else contextlib.nullcontext()):
            compressed = nncf.compress_weights(model(), **options)
            if sliced:
                files = sorted(p.name for p in (tmp_path / "scratch").rglob("*") if p.is_file())
            ov.save_model(compressed, tmp_path / f"{sliced}.xml", compress_to_fp16=False)
        saved[sliced] = (tmp_path / f"{sliced}.bin").read_bytes()
        if sliced:  # the vocabulary's and the experts' values (and zero points), not the small weight's
            assert len([f for f in files if f.endswith(".tensor")]) == 2, files
            assert len([f for f in files if f.endswith(".zero_point")]) == (2 if "ASYM" in mode else 0), files
    assert saved[True] == saved[False]
    assert list((tmp_path / "scratch").iterdir()) == []  # the patch's directory is gone


@pytest.mark.slow  # two exports; the default run compares the compression alone (above)
def test_an_int4_export_compressed_in_slices_is_byte_for_byte_the_whole_weights(quantizable_model, tmp_path,
                                                                              monkeypatch):
    """Through the export (optimum-intel's conversion and save, validation, the staging directory's removal): every
    weight compressed in slices gives the artifact NNCF's own compression gives, and no file is left behind."""
    import optimum_shared_graph as osg
    from optimum_shared_graph.host import compression

    osg.export(str(quantizable_model), tmp_path / "whole", weight_format="int4", quiet=True)
    written = []
    monkeypatch.setattr(compression, "SLICE_ELEMENTS", 10_000)  # the tiny model's matrices, in slices
    fsync = compression.os.fsync
    monkeypatch.setattr(compression.os, "fsync", lambda fd: written.append(fd) or fsync(fd))
    manifest = osg.export(str(quantizable_model), tmp_path / "sliced", weight_format="int4", quiet=True)
    assert len(written) >= 8 and manifest.validation["status"] in ("passed", "recorded")
    assert (tmp_path / "sliced" / "openvino_model.bin").read_bytes() == \
        (tmp_path / "whole" / "openvino_model.bin").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sliced", "whole"]


def test_importing_host_imports_no_library():
    """The optimum-cli hook imports `cli`, which imports host/: `optimum-cli --help` must not pay for it."""
    code = ("import sys, optimum_shared_graph.host; "
            "print(sorted(m for m in ('optimum', 'transformers', 'torch', 'openvino') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_qwen3_5_generate_fix_is_active_inside_and_undone_on_exit_also_after_an_error():
    """`qwen3_5_generate_fixed` replaces three entries of `_OVQwen3_5ForCausalLM` for a while (it has no
    `get_vision_position_ids` of its own): on exit the class is as it was."""
    from optimum.intel.openvino.modeling_visual_language import _OVQwen3_5ForCausalLM as cls

    names = ("_prepare_position_ids_for_generation", "prepare_inputs_for_generation", "get_vision_position_ids")
    before = {name: vars(cls).get(name, "absent") for name in names}
    assert before["get_vision_position_ids"] == "absent"
    with host.qwen3_5_generate_fixed():
        assert all(vars(cls).get(name, "absent") is not before[name] for name in names)
        assert "mm_token_type_ids" in inspect.signature(cls.prepare_inputs_for_generation).parameters
    assert {name: vars(cls).get(name, "absent") for name in names} == before
    with pytest.raises(RuntimeError, match="inside"):
        with host.qwen3_5_generate_fixed():
            raise RuntimeError("inside")
    assert {name: vars(cls).get(name, "absent") for name in names} == before
