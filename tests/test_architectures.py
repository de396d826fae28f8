"""The architecture fixes (`optimum_shared_graph/architectures/`).

Each model type a fix repairs exports with `--task text-generation-shared` as one validated graph, with
greedy parity through OVModelForCausalLM and OpenVINO GenAI (for the types in `NPU_PARITY` its NPU
pipeline too; for a model with a pure KV cache, a static export); the manifest records the fix. The fix replaces optimum-intel's export config
for one export only: its own `text-generation-with-past` task is untouched.

The default run exports one type per kind of state (`DEFAULT_RUN`); `pytest -m coverage` runs every
repaired type, as `scripts/coverage.py` does for docs/architectures.md.
"""

from __future__ import annotations

import contextlib
import functools
import json

import numpy as np
import pytest
import torch

from conftest import (EXACT, NPU_PRECISION, PROMPTS, break_decode, file_mapped, judged_greedy, pytorch_reference,
                      run_cli, run_cli_in_process, sixteen_bit, stored_experts_mapped)

import optimum_shared_graph as osg
from optimum_shared_graph import architectures, read_manifest
from optimum_shared_graph.testing import NPU_ON_CPU

# The model types this package repairs under transformers 5.5 (optimum-intel's own configs fail there).
REPAIRED = ["afmoe", "bigbird_pegasus", "blenderbot", "dbrx", "deepseek_v2", "deepseek_v3", "falcon_mamba",
            "gemma4_text", "gpt_neo", "gpt_oss", "granitemoe", "granitemoehybrid", "lfm2", "lfm2_moe", "llama4_text",
            "mamba", "marian", "mbart",
            "mixtral", "mpt", "pegasus", "phimoe", "qwen2_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_moe", "qwen3_next",
            "starcoder2", "zamba2"]

# The decoder-only (`*ForCausalLM`) form of the sequence-to-sequence families optimum-intel registers for
# text-generation-with-past. optimum-intel's own configs export them under transformers 5.5: the coverage sweep
# refused them ("Sizes of tensors must match") because their tiny configs sized the encoder only (these configs map
# num_attention_heads / num_hidden_layers to the encoder's keys) and left the decoder at the class defaults (16
# heads), while optimum-intel's dummy cache is sized from num_attention_heads (4); `testing._SEQ2SEQ` sizes the
# decoder by its own keys, as the released checkpoints (as many heads in both) do. Five of them get a fix for
# GenAI's default backend (architectures/seq2seq_positions.py, in REPAIRED); bart and blenderbot-small none.
SEQ2SEQ_DECODERS = ["bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "pegasus"]
SEQ2SEQ_WITHOUT_FIX = ["bart", "blenderbot-small"]

# OpenVINO GenAI's default PagedAttention backend rewrites the graph for a paged cache and must replace the graph's
# own positions (past length + arange) with its per-token position_ids; a graph without a position_ids input gets
# that only where OpenVINO's PositionIDsReplacer recognises the embedding sum (token Gather + position Gather of
# positions + a constant offset). architectures/seq2seq_positions.py gives five decoders that form; blenderbot-small's
# decoder normalises the scaled token embedding before the sum, so its graph has parity through GenAI's SDPA backend
# only, which is what is checked for it (the coverage table's "parity with ATTENTION_BACKEND=SDPA" cell); so has mpt's
# (its ALiBi bias, with or without architectures/mpt.py, differs through the paged rewrite).
GENAI_SDPA_ONLY = {"blenderbot-small", "mpt"}

# With a pure KV cache, so a static export too; the others carry convolution / SSM / linear-attention state.
KV_CACHE_ONLY = {"dbrx", "deepseek_v2", "deepseek_v3", "gemma4_text", "gpt_neo", "granitemoe", "mpt", "starcoder2",
                 *SEQ2SEQ_DECODERS}

# optimum-intel's OVModelForCausalLM feeds these mamba-style graphs only the new tokens' attention mask after the
# prompt (runtimes/session.py), so a left-padded row's attention layers cannot tell its padding from its past:
# their left-padded batch is checked through GenAI, which feeds the whole context's mask.
PADDED_BATCH_THROUGH_GENAI_ONLY = {"zamba2"}

# One of each kind in the default run: multi-head latent attention with routed experts (a pure KV cache,
# static too), and a hybrid with linear-attention state beside a KV cache. The rest: `pytest -m coverage`. (The
# sequence-to-sequence decoders' configs are checked in the default run, their exports, ~50 s each with the static
# one, under `-m coverage`.)
DEFAULT_RUN = {"deepseek_v2"}  # qwen3_next: 40 s, under `-m slow` (the suite's budget on a 2-core host)

# Greedy parity through OpenVINO GenAI's NPU pipeline too (NPUW, its partitions on the CPU), computing in f16 as an
# NPU does (NPU_PRECISION; its KV cache f16 too): its tokens are judged against PyTorch's logits as `validate()`
# judges such a consumer, a differing pick allowed only at a near-tie, and a broken decode fails. The
# Qwen3.5 graphs need two export-time changes for it: no unused position_ids input (architectures/qwen3_5.py) and
# no past length read from a value state (graph/kv_shapes.py). docs/architectures.md has every type's NPU column.
NPU_PARITY = {"deepseek_v2", "deepseek_v3", "gemma4_text", "mpt", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next"}
NPUW = {**NPU_ON_CPU, "MAX_PROMPT_LEN": 64, "MIN_RESPONSE_LEN": 64}

NEW_TOKENS = 12


def _fixed_here(model_type: str) -> bool:
    return architectures.fix_module(model_type) is not None


needs_fix = pytest.mark.skipif(not any(map(_fixed_here, REPAIRED)),
                               reason="the installed transformers is outside every fix's range")


def _constructor(model_type: str, task: str = "text-generation-with-past"):
    """optimum-intel's TasksManager entry its export builds the config of `model_type` from."""
    return architectures._entries(model_type)[task]


def test_every_fix_module_keeps_the_contract():
    from packaging.specifiers import SpecifierSet

    names = architectures.fix_modules()
    assert names, "no fix modules"
    for name in names:
        module = architectures._load(name)
        # types it repairs: text models, and (or only) whole vision-language models
        assert module.MODEL_TYPES or getattr(module, "VLM_MODEL_TYPES", ()), name
        assert all(isinstance(t, str) for t in module.MODEL_TYPES + getattr(module, "VLM_MODEL_TYPES", ())), name
        if module.MODEL_TYPES:
            assert callable(module.export_config), name
        if getattr(module, "VLM_MODEL_TYPES", ()):
            assert callable(module.vlm_export_config) and module.VLM_SUMMARY and "\n" not in module.VLM_SUMMARY, name
        SpecifierSet(module.TRANSFORMERS)  # a valid specifier
        assert module.SUMMARY and "\n" not in module.SUMMARY, name
        assert module.__doc__ and len(module.__doc__.strip()) > 80, f"{name} does not say what broke and what it does"
    assert architectures.fixed_model_types() == set(REPAIRED)


@needs_fix
@pytest.mark.parametrize("model_type", REPAIRED)
def test_fix_is_swapped_in_for_one_export_and_restored(model_type):
    """Inside `fix_applied`, optimum-intel's TasksManager builds the fixed config (a subclass of its own);
    outside, its own config again, also after an error inside."""
    original = _constructor(model_type)
    base = original.func
    with architectures.fix_applied(model_type) as fix:
        inside = _constructor(model_type)
        assert fix is not None and fix.model_type == model_type
        assert inside.func is not base and issubclass(inside.func, base)
        assert inside.args == original.args and inside.keywords == original.keywords
        assert fix.record()["fix"].startswith("optimum_shared_graph.architectures.")
    assert _constructor(model_type) is original
    with pytest.raises(RuntimeError, match="inside"):
        with architectures.fix_applied(model_type):
            raise RuntimeError("inside")
    assert _constructor(model_type) is original


def test_no_fix_for_a_type_optimum_intel_exports_itself():
    original = _constructor("llama")
    with architectures.fix_applied("llama") as fix:
        assert fix is None and _constructor("llama") is original


@pytest.mark.parametrize("model_type", REPAIRED)
def test_fix_applies_only_to_the_transformers_it_was_written_for(model_type):
    """Under transformers 4.57 (in the package's range), optimum-intel's own config exports these types."""
    assert architectures.fix_module(model_type, "4.57.6") is None
    assert architectures.fix_module(model_type, "5.5.4") is not None


@functools.lru_cache(maxsize=None)
def _pytorch_greedy(path: str, prompts: tuple[str, ...]):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    pt = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    enc = tok(list(prompts), return_tensors="pt", padding=True)
    with torch.no_grad():
        out = pt.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return enc, out


@functools.lru_cache(maxsize=2)
def _pytorch_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _pytorch_reference(path: str, enc):
    """PyTorch's greedy run on `enc` with each call's logits: what a greedy consumer at a precision of its own
    (GenAI's NPU pipeline) is judged against."""
    return pytorch_reference(_pytorch_model(path), enc, NEW_TOKENS)


def _assert_greedy_parity(model, path) -> None:
    """`model.generate()` (greedy) gives PyTorch's tokens for each prompt alone."""
    for prompt in PROMPTS:
        enc, ref = _pytorch_greedy(str(path), (prompt,))
        ours = model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=0)
        assert torch.equal(ours, ref), prompt


def _cases(model_types):
    return [pytest.param(t, marks=() if t in DEFAULT_RUN else (pytest.mark.coverage, pytest.mark.slow))
            for t in model_types]


@needs_fix
@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", _cases(REPAIRED))
def test_repaired_type_exports_one_graph_with_parity(model_type, tiny_model, tmp_path):
    _exports_one_graph_with_parity(model_type, tiny_model(model_type), tmp_path)


@pytest.mark.timeout(600)
def test_granitemoe_dense_experts_run_only_the_routed_ones_on_a_cpu(tiny_model, tmp_path):
    """GraniteMoE's experts exported densely (every expert on every token, architectures/granitemoe.py, so NPUW can
    make the graph static) in the form OpenVINO's CPU plugin turns into `GatherMatmul`s over the routed experts:
    three per MoE layer (gate, up, down), so a CPU does not pay for the experts a token skips. The form is validated
    against PyTorch at export."""
    import openvino as ov

    if architectures.fix_module("granitemoe") is None:
        pytest.skip("the installed transformers is outside architectures/granitemoe.py's range")
    model = tiny_model("granitemoe")
    manifest = osg.export(str(model), tmp_path / "ov", quiet=True)
    assert manifest.validation["status"] == "passed" and manifest.validation["greedy_match"]
    assert [f["fix"] for f in manifest.model["fixes"]] == ["optimum_shared_graph.architectures.granitemoe"]
    compiled = ov.Core().compile_model(tmp_path / "ov" / "openvino_model.xml", "CPU")
    kinds = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    assert kinds.count("GatherMatmul") == 3 * layers, sorted(set(kinds))


@pytest.mark.parametrize("model_type", ["granitemoe", "granitemoehybrid"])
def test_granitemoe_capture_upcasts_one_expert_at_a_time(model_type, tiny_model):
    """The capture's float32 compute of a 16-bit GraniteMoE (`granitemoe.while_exporting`): each expert's weight
    upcast alone as its tokens are multiplied, not the layer's whole `[experts, out, in]` tensor with the layer, and
    the logits those of the 16-bit weights upcast whole."""
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.architectures import granitemoe
    from optimum_shared_graph.pipeline.reference import capture_fp32

    if architectures.fix_module(model_type) is None:
        pytest.skip("the installed transformers is outside architectures/granitemoe.py's range")
    model = tiny_model(model_type)
    ids = torch.tensor([[5, 7, 9, 11, 3, 2]])
    with granitemoe.while_exporting(model_type), torch.no_grad():
        half = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float16).eval()
        logits, report = capture_fp32(half, lambda: half(ids).logits)
    with torch.no_grad():
        own = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float16).float().eval()(ids).logits
    torch.testing.assert_close(logits, own, atol=1e-5, rtol=1e-5)
    experts = max(sum(p.numel() * 4 for n, p in layer.named_parameters() if "linear" in n and p.dim() == 3)
                  for layer in half.model.layers)
    assert experts and report.peak_transient_bytes < experts, (report.peak_transient_bytes, experts)
    assert not hasattr(type(half.model.layers[0].block_sparse_moe.input_linear), "computes_fp32_itself")  # undone


@pytest.mark.timeout(600)
@pytest.mark.parametrize("model_type", [
    # one of each layout in the default run: experts stored one by one (afmoe, whose export restacks them in
    # optimum-intel's own patcher), fused per layer (Qwen3.5-MoE), fused with interleaved gate and up columns (gpt-oss),
    # fused and transposed (Llama 4); the other per-expert families under `-m slow`
    "afmoe", "qwen3_5_moe_text", "gpt_oss", "llama4_text",
    *(pytest.param(t, marks=pytest.mark.slow) for t in ("deepseek_v2", "deepseek_v3", "lfm2_moe", "qwen3_next", "mixtral"))])
def test_moe_experts_of_every_per_expert_checkpoint_load_as_stored_and_fuse(model_type, tiny_model, tmp_path):
    """The other families whose checkpoints store each expert's projections, or (Qwen3.5-MoE, gpt-oss) each layer's
    experts fused (some with fix modules of their own, which compose with `moe_experts`): loaded memory-mapped, the
    export validated, and three `GatherMatmul`s per MoE layer in the CPU plugin's compiled graph (two for gpt-oss:
    its gate and up projections are one, their columns interleaved; none for Llama 4, whose block scales each
    expert's copy of the tokens by its router score before the experts, not their outputs after), whose validation
    in parts below one layer gives the logits of the graph compiled whole."""
    import openvino as ov
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.architectures import moe_experts

    if architectures.fix_module(model_type) is None:
        pytest.skip("the installed transformers is outside the fix's range")
    model = tiny_model(model_type)
    with moe_experts.while_exporting(model_type, tmp_path / "scratch"):
        layers = stored_experts_mapped(lambda: AutoModelForCausalLM.from_pretrained(model, dtype="auto"), model)
    # the stored experts compute what transformers' own experts module does (the export's reference is theirs)
    ids = torch.tensor([[5, 7, 9, 11, 3, 2]])
    with moe_experts.while_exporting(model_type, tmp_path / "scratch"), torch.no_grad():
        as_stored = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()(ids).logits
    with torch.no_grad():
        own = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()(ids).logits
    torch.testing.assert_close(as_stored, own, atol=1e-5, rtol=1e-5)

    manifest = osg.export(str(model), tmp_path / "ov", quiet=True)
    assert manifest.validation["status"] == "passed" and manifest.validation["greedy_match"]
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging directory left
    compiled = ov.Core().compile_model(tmp_path / "ov" / "openvino_model.xml", "CPU")
    kinds = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]
    assert kinds.count("GatherMatmul") == {"gpt_oss": 2, "llama4_text": 0}.get(model_type, 3) * layers, sorted(set(kinds))

    # each MoE block recognised for validation in parts (`graph/experts.py`), and the same logits split into ranges
    from optimum_shared_graph.graph import experts as moe_graph

    graph = ov.Core().read_model(tmp_path / "ov" / "openvino_model.xml")
    assert len(moe_graph.blocks(graph)) == layers
    split = ov.Core().read_model(tmp_path / "ov" / "openvino_model.xml")
    assert moe_graph.split_experts(split, 1) == layers
    ids = np.array([[5, 7, 9, 11, 3, 2]])
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "position_ids": np.arange(6)[None],
            "beam_idx": np.array([0])}
    logits = []
    for model in (graph, split):
        run = ov.Core().compile_model(model, "CPU", EXACT)
        names = {p.get_any_name() for p in run.inputs}
        logits.append(run({k: v for k, v in feed.items() if k in names})[run.output(0)])
    np.testing.assert_allclose(logits[1], logits[0], atol=1e-5)


def _qwen3_moe_logits(graph, plan):
    """A qwen3_moe graph's last-position logits for a prompt and two decode calls, run in the parts of `plan`."""
    from optimum_shared_graph.pipeline.validate import run_in_parts
    from optimum_shared_graph.runtimes.session import GraphSession

    feeds = GraphSession.feeds_only(graph, model_type="qwen3_moe")
    calls, mask = [np.array([[5, 17, 99, 3, 11]]), np.array([[7]]), np.array([[8]])], np.ones((1, 0), np.int64)
    values = []
    for ids in calls:
        mask = np.ones((1, mask.shape[1] + ids.shape[1]), np.int64)
        values.append(feeds.feed(ids, mask))
    return np.stack([v["logits"][:, -1] for v in run_in_parts(graph, values, plan)])


@pytest.mark.timeout(600)
def test_moe_experts_load_memory_mapped_and_run_only_the_routed_ones_on_a_cpu(tiny_model, tmp_path):
    """architectures/moe_experts.py: while the export loads a Qwen3-MoE checkpoint, each expert's projections are the
    checkpoint's own tensors, memory-mapped from its safetensors file (transformers 5 alone fuses them into new
    memory); the export is validated with greedy parity, and its graph is one OpenVINO's CPU plugin turns into
    `GatherMatmul`s over the routed experts (three per MoE layer)."""
    import openvino as ov
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.architectures import moe_experts

    if architectures.fix_module("qwen3_moe") is None:
        pytest.skip("the installed transformers is outside architectures/moe_experts.py's range")
    model = tiny_model("qwen3_moe")
    with moe_experts.while_exporting("qwen3_moe", tmp_path / "scratch"):
        loaded = AutoModelForCausalLM.from_pretrained(model, dtype="auto")
    experts = loaded.model.layers[0].mlp.experts
    assert isinstance(experts, moe_experts.StoredExperts)
    weights = [getattr(expert, name).weight for expert in experts for name in experts.names]
    assert all(file_mapped(w, (model / "model.safetensors").resolve()) for w in weights)
    fused = AutoModelForCausalLM.from_pretrained(model, dtype="auto")  # outside: transformers' own fused experts
    assert not isinstance(fused.model.layers[0].mlp.experts, moe_experts.StoredExperts)
    assert not file_mapped(fused.model.layers[0].mlp.experts.gate_up_proj, (model / "model.safetensors").resolve())
    del loaded, fused, experts, weights

    manifest = osg.export(str(model), tmp_path / "ov", quiet=True)
    assert manifest.validation["status"] == "passed" and manifest.validation["greedy_match"]
    assert [f["fix"] for f in manifest.model["fixes"]] == ["optimum_shared_graph.architectures.moe_experts"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ov"]  # the stacked copies' files unlinked, no staging left
    compiled = ov.Core().compile_model(tmp_path / "ov" / "openvino_model.xml", "CPU")
    kinds = [op.get_rt_info()["layerType"].astype(str) for op in compiled.get_runtime_model().get_ops()]
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    assert kinds.count("GatherMatmul") == 3 * layers, sorted(set(kinds))

    # validation in parts smaller than one layer: each MoE block summed over expert ranges and lm_head over ranges
    # of its rows (graph/experts.py), whose weights are views of the original constants (the graph's weight bytes
    # grow only by the ranges' index constants), gives the logits of the graph compiled whole
    from optimum_shared_graph.graph import experts as moe_graph
    from optimum_shared_graph.graph.parts import plan_parts

    graph = ov.Core().read_model(tmp_path / "ov" / "openvino_model.xml")
    found = moe_graph.blocks(graph)
    assert len(found) == layers
    per_layer = sum(int(w.get_byte_size()) for w in found[0][2])
    whole = plan_parts(graph, 10**12)
    head = max((op.input(1).get_source_output().get_node() for op in graph.get_ordered_ops() if op.get_type_name() ==
                "MatMul" and op.input(1).get_source_output().get_node().get_type_name() == "Constant"
                and len(op.get_input_shape(1)) == 2), key=lambda c: c.get_byte_size())
    cut = graph.clone()
    ranged = plan_parts(cut, per_layer // 2, experts_range_bytes=per_layer // 4, rows_range_bytes=head.get_byte_size() // 3)
    assert whole.count == 1 and ranged.count >= 2 * layers + 1, ranged.part_bytes
    heads = [op for op in cut.get_ordered_ops() if op.get_type_name() == "Concat"
             and all(i.get_source_output().get_node().get_type_name() == "MatMul" for i in op.inputs())]
    assert len(heads) == 1 and heads[0].get_input_size() >= 2  # lm_head over ranges of its rows
    assert 0 <= ranged.total_bytes - whole.total_bytes < 4096 and max(ranged.part_bytes) < per_layer

    np.testing.assert_allclose(_qwen3_moe_logits(graph, ranged), _qwen3_moe_logits(graph, whole), rtol=1e-4, atol=1e-4)

    # every weight over the bound, an expert range's too (a Mixtral expert is 352 MB, against parts of 384 MiB
    # compiled at about 4 bytes per byte): a part per expert range (a quarter of a layer's), not the whole layer's
    # experts in one part
    single = plan_parts(graph.clone(), 1, experts_range_bytes=per_layer // 4, rows_range_bytes=head.get_byte_size() // 3)
    assert single.count >= 4 * layers and max(single.part_bytes) < per_layer // 2, single.part_bytes
    np.testing.assert_allclose(_qwen3_moe_logits(graph, single), _qwen3_moe_logits(graph, whole), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("weights", [  # 31 to 44 s each: benchmarks/moe.py's int4 rows validate so in parts at scale
    pytest.param(["--weight-format", "int4", "--group-size", "16", "--ratio", "1.0"], marks=pytest.mark.slow),
    pytest.param(["--weight-format", "int8"], marks=pytest.mark.slow)])
def test_compressed_experts_stay_whole_in_their_part_with_their_router(weights, tiny_model, tmp_path):
    """A MoE export with NNCF-compressed experts: validation's parts never separate a block from its router, its
    normed tokens or its sum (graph/experts.whole_spans), so each part holding experts is one the CPU plugin fuses
    into `GatherMatmul`s over the compressed weights (cut from them, it decompressed one layer of Qwen3-30B-A3B's
    widths to float32: +2.3 GB); the compressed experts are never cut into ranges; the logits are the whole graph's."""
    import openvino as ov

    from optimum_shared_graph.graph import experts as moe_graph
    from optimum_shared_graph.graph.parts import build_parts, plan_parts

    model = tiny_model("qwen3_moe")
    run_cli("export", "openvino", "-m", str(model), "--task", "text-generation-shared", *weights, "--quiet",
            str(tmp_path / "ov"), check=True)
    graph = ov.Core().read_model(tmp_path / "ov" / "openvino_model.xml")
    layers = json.loads((model / "config.json").read_text())["num_hidden_layers"]
    found = moe_graph.blocks(graph)
    assert len(found) == layers and all(moe_graph.is_compressed(w) for _, _, w in found)
    whole = plan_parts(graph.clone(), 10**12)
    finest = plan_parts(graph.clone(), 1, experts_range_bytes=1, rows_range_bytes=1)  # as many parts as it allows
    assert finest.count > layers and finest.total_bytes == whole.total_bytes  # no expert ranges

    names = {w.get_friendly_name() for _, _, weights in found for w in weights}
    fused = []
    for part in build_parts(graph.clone(), finest):
        if any(c.get_friendly_name() in names for c in part.get_ops() if c.get_type_name() == "Constant"):
            compiled = ov.Core().compile_model(part, "CPU", EXACT)
            fused.append([op.get_rt_info()["layerType"].astype(str) for op in
                          compiled.get_runtime_model().get_ops()].count("GatherMatmul"))
    assert fused == [3] * layers

    np.testing.assert_allclose(_qwen3_moe_logits(graph, finest), _qwen3_moe_logits(graph, whole), rtol=1e-4, atol=1e-4)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("model_type", _cases(SEQ2SEQ_WITHOUT_FIX))
def test_seq2seq_decoder_exports_one_graph_with_parity(model_type, tiny_model, tmp_path):
    """A sequence-to-sequence family's causal LM exports with optimum-intel's own config (no fix), with parity."""
    assert architectures.fix_module(model_type) is None
    _exports_one_graph_with_parity(model_type, tiny_model(model_type), tmp_path)


@pytest.mark.parametrize("model_type", SEQ2SEQ_DECODERS)
def test_seq2seq_tiny_config_sizes_the_decoder(model_type):
    """The tiny config of a sequence-to-sequence family sizes the decoder (what its causal LM is) by its own keys,
    with as many heads as the encoder (what optimum-intel sizes its dummy cache by), as the released checkpoints do."""
    from optimum_shared_graph.testing import tiny_config

    config = tiny_config(model_type)
    assert (config.d_model, config.decoder_layers, config.decoder_attention_heads, config.decoder_ffn_dim) == (64, 2, 4, 256)
    assert config.num_attention_heads == config.decoder_attention_heads  # the encoder's, by the config's attribute map
    assert config.init_std == 0.1 and not config.tie_word_embeddings  # a tied head only echoes the prompt
    for key in ("num_key_value_heads", "head_dim", "intermediate_size"):
        assert key not in config.to_dict(), key  # not a key of these configs


@pytest.mark.parametrize("shared", [0, 1, 2, 5])
def test_gemma4_dummy_cache_has_the_layers_pytorch_caches(shared):
    """The Gemma 4 fix's dummy cache (`gemma4.kv_layer_shapes`) has one entry per layer that keeps keys and values of
    its own in the model transformers builds, with that layer's shapes: `num_kv_shared_layers` above the layer count
    (5 of 4) shares none in PyTorch, which builds and runs it."""
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.architectures.gemma4 import kv_layer_shapes
    from optimum_shared_graph.testing import tiny_config

    config = tiny_config("gemma4_text")
    config.num_kv_shared_layers = shared
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    own = [layer.self_attn for layer in model.model.layers if not layer.self_attn.is_kv_shared_layer]
    assert kv_layer_shapes(config) == [(a.k_proj.out_features // a.head_dim, a.head_dim) for a in own]
    assert len(own) == (config.num_hidden_layers - shared if shared < config.num_hidden_layers
                        else config.num_hidden_layers)


@pytest.mark.slow  # an export through optimum-cli: 12 s
def test_gemma4_with_more_kv_shared_layers_than_layers_exports_and_validates(tmp_path):
    """`num_kv_shared_layers` 5 of 4 layers, which PyTorch runs with every layer's own cache: the export (optimum-cli
    in a subprocess) declares and traces a key and a value per layer, and validates (optimum-intel's config declared
    none: 'list index out of range' at its conversion)."""
    import openvino as ov

    from optimum_shared_graph.testing import build_tiny_model

    path, out = tmp_path / "gemma4", tmp_path / "out"
    build_tiny_model("gemma4_text", path, num_kv_shared_layers=5)
    proc = run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validation: passed" in proc.stderr.strip().splitlines()[-1]
    graph = ov.Core().read_model(out / "openvino_model.xml")
    states = [op for op in graph.get_ops() if op.get_type_name() == "ReadValue"]
    assert len(states) == 2 * json.loads((path / "config.json").read_text())["num_hidden_layers"] == 8


def _exports_one_graph_with_parity(model_type, path, tmp_path) -> None:
    """`model_type`'s export: one validated graph (with the fix of architectures/ that applies, if any), greedy
    parity through OVModelForCausalLM and GenAI (and GenAI's NPU pipeline for `NPU_PARITY`), then a static export
    with parity through runtime() for a pure KV cache, or its one-line refusal for other state."""
    import openvino as ov
    import openvino_genai as ov_genai
    from optimum.intel import OVModelForCausalLM

    out = tmp_path / "shared"
    run_cli_in_process("export", "openvino", "-m", str(path), "--task", "text-generation-shared", str(out))
    graphs = sorted(p.name for p in out.glob("*.xml") if "tokenizer" not in p.name)
    assert graphs == ["openvino_model.xml"]
    manifest = read_manifest(out)
    assert manifest.partitioning == "shared" and manifest.stateful
    assert manifest.validation["status"] == "passed" and manifest.validation["decode_steps"] >= 3
    fix = architectures.fix_module(model_type)
    fixes = [fix.__name__] if fix is not None else []
    assert [f["fix"] for f in manifest.model.get("fixes") or []] == fixes
    if fix is not None:
        assert manifest.model["fixes"][0]["summary"] == fix.SUMMARY

    # OVModelForCausalLM: each prompt alone, then the prompts left-padded in one batch
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    _assert_greedy_parity(ov_model, path)
    enc, ref = _pytorch_greedy(str(path), tuple(PROMPTS[:2]))
    assert (enc["attention_mask"] == 0).any()  # really left-padded
    if model_type not in PADDED_BATCH_THROUGH_GENAI_ONLY:
        ours = ov_model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                 pad_token_id=0)
        assert torch.equal(ours, ref)
    del ov_model

    # OpenVINO GenAI's LLMPipeline, as shipped (its default attention backend): exact in f32, judged by the margins
    # with reduced precision forced; and its NPU pipeline, judged by the margins
    backend = {"ATTENTION_BACKEND": "SDPA"} if model_type in GENAI_SDPA_ONLY else {}
    pipe = ov_genai.LLMPipeline(str(out), "CPU", **EXACT, **backend)
    reduced = ov_genai.LLMPipeline(str(out), "CPU", **sixteen_bit(), **backend)
    npu = ov_genai.LLMPipeline(str(out), "NPU", **NPUW) if model_type in NPU_PARITY else None
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    references = []
    for prompt in PROMPTS:
        enc, ref = _pytorch_greedy(str(path), (prompt,))
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        assert list(pipe.generate(inputs, config).tokens[0]) == ref[0, enc["input_ids"].shape[1]:].tolist(), prompt
        references.append(_pytorch_reference(str(path), enc))
        why = judged_greedy(reduced, references[-1], sixteen_bit())
        assert why is None, f"{prompt}: {why}"
        if npu is not None:
            why = judged_greedy(npu, references[-1], NPU_PRECISION)
            assert why is None, f"{prompt}: {why}"
    del npu, reduced
    if model_type in NPU_PARITY:  # the same check fails a graph whose decode is broken
        broken = break_decode(out, tmp_path / "broken")
        npu = ov_genai.LLMPipeline(str(broken), "NPU", **NPUW)
        whys = [judged_greedy(npu, reference) for reference in references]
        assert any(why and "above the tolerance" in why for why in whys), whys
        del npu
    if model_type in PADDED_BATCH_THROUGH_GENAI_ONLY:
        enc, ref = _pytorch_greedy(str(path), tuple(PROMPTS[:2]))
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        result = pipe.generate(inputs, config)
        assert [list(t) for t in result.tokens] == ref[:, enc["input_ids"].shape[1]:].tolist()
    del pipe

    if model_type in KV_CACHE_ONLY:  # a static export (C = 4), run through runtime()
        static = tmp_path / "static"
        run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", "--shape-mode", "static",
                "--static-query-len", "4", "--max-cache-len", "128", str(static), check=True)
        assert [f["fix"] for f in read_manifest(static).model.get("fixes") or []] == fixes
        model = osg.runtime(static, ov_config=EXACT)
        _assert_greedy_parity(model, path)
    else:  # state other than a KV cache has no static form: refused with one line, nothing written
        static = tmp_path / "static"
        proc = run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", "--shape-mode",
                       "static", "--max-cache-len", "128", str(static))
        assert proc.returncode != 0 and "--shape-mode dynamic" in proc.stderr.strip().splitlines()[-1]
        assert not static.exists()


@needs_fix
def test_data_aware_quantization_of_a_hybrid_is_refused_in_one_line(tiny_model, tmp_path):
    """Both-stage calibration feeds a KV cache; a graph whose state is convolution / linear-attention state is
    refused with what to do instead, and nothing is written."""
    data = tmp_path / "calibration.txt"
    data.write_text("def add(a, b):\n    return a + b\nprint(add(1, 2))\n", encoding="utf-8")
    out = tmp_path / "out"
    proc = run_cli("export", "openvino", "-m", str(tiny_model("qwen3_next")), "--task", "text-generation-shared",
                   "--quant-mode", "int8", "--dataset", str(data), "--num-samples", "1", str(out))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "cache_params.past.conv.0" in last and "quantize without a data-aware mode" in last, last
    assert not out.exists() and not list(tmp_path.glob(".out*"))


@needs_fix
def test_optimum_intel_own_task_does_not_get_the_fix(tiny_model, tmp_path):
    """optimum-intel's own `text-generation-with-past` export of a repaired type runs its own config, as
    before: the fix is ours, for our task only."""
    model_type = "qwen3_next"
    proc = run_cli("export", "openvino", "-m", str(tiny_model(model_type)), "--task", "text-generation-with-past",
                   str(tmp_path / "theirs"))
    assert proc.returncode != 0
    # its own config's cap (4.57.6), which our export lifts only with the fix in place and validation on
    assert "does not allow for the export of the model. Maximum required is 4.57.6" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "theirs" / "openvino_model.xml").exists()


# afmoe (Arcee's Trinity) needs no fix to export: optimum-intel's own AfmoeOpenVINOConfig exports it under transformers
# 5.5 (its only fix is `moe_experts`, for the memory). transformers' own random init cannot be checked as it is: AfmoePreTrainedModel._init_weights zeroes every router gate,
# so every expert scores sigmoid(0) = 0.5 for every token and the top-k is an exact tie, which PyTorch's topk and
# OpenVINO's TopK break differently (the 0.54 / 0.77 logits differences the coverage sweep refused). A checkpoint's
# trained router has no such tie, and neither has `testing.build_tiny_model`'s afmoe (its router gates drawn from
# N(0, initializer_range), `testing._DRAWN`); `_afmoe_as_transformers_inits_it` keeps the tie, for the tests
# that show it.


def _afmoe_as_transformers_inits_it(path=None):
    """The tiny afmoe with transformers' own init (router gates zero), saved with a tokenizer at `path` if given."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    from optimum_shared_graph.testing import build_tokenizer, tiny_config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("afmoe"), dtype=torch.float32).eval()
    if path is not None:
        model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model.save_pretrained(path)
        build_tokenizer(path)
    return model


# A routing margin (sigmoid scores, k-th minus (k+1)-th) no fp32 rounding of the scores (~1e-7) can reverse.
ROUTING_MARGIN = 1e-5


def _router_margins(model, input_ids) -> list[float]:
    """PyTorch's own routing margins: per MoE layer, the smallest (k-th - (k+1)-th) expert score over the tokens."""
    margins = []

    def hook(module, args, out):
        scores = torch.sigmoid(out[0]) + module._afmoe_bias
        ranked = torch.sort(scores, dim=1, descending=True).values
        margins.append(float((ranked[:, module.top_k - 1] - ranked[:, module.top_k]).min()))

    handles = []
    for layer in model.model.layers:
        if layer.moe_enabled:
            layer.mlp.router._afmoe_bias = layer.mlp.expert_bias
            handles.append(layer.mlp.router.register_forward_hook(hook))
    with torch.no_grad():
        model(input_ids=input_ids)
    for handle in handles:
        handle.remove()
    return margins


@contextlib.contextmanager
def _ties_broken_by_lowest_expert():
    """PyTorch's afmoe router with equal scores ranked by expert index (a stable sort), not by topk's own order."""
    from transformers.models.afmoe import modeling_afmoe

    def forward(self, hidden_states, expert_bias):
        flat = hidden_states.view(-1, hidden_states.shape[-1])
        router_logits = self.gate(flat).to(torch.float32)
        scores = torch.sigmoid(router_logits)
        selected = torch.sort(scores + expert_bias, dim=1, descending=True, stable=True).indices[:, :self.top_k]
        top = scores.gather(1, selected)
        top = top / (top.sum(dim=-1, keepdim=True) + 1e-20) * self.route_scale
        return router_logits, top, selected

    original = modeling_afmoe.AfmoeTokenChoiceRouter.forward
    modeling_afmoe.AfmoeTokenChoiceRouter.forward = forward
    try:
        yield
    finally:
        modeling_afmoe.AfmoeTokenChoiceRouter.forward = original


def test_random_init_afmoe_routes_on_an_exact_tie(tiny_model):
    """transformers' random-init afmoe routes on an exact tie at every token (margin 0.0), and PyTorch's logits
    depend on how the tie is broken: the refusal of its export is the check's (an undefined top-k), not the graph's.
    The tiny builder's afmoe (router gates drawn like a trained router's) has no tie."""
    from transformers import AutoModelForCausalLM

    model = _afmoe_as_transformers_inits_it()
    assert model.config.num_experts == 16 and model.config.layer_types[-1] == "full_attention"
    ids = torch.arange(3, 33).unsqueeze(0)
    assert _router_margins(model, ids) == [0.0] * (model.config.num_hidden_layers - model.config.num_dense_layers)
    routed = AutoModelForCausalLM.from_pretrained(tiny_model("afmoe"), dtype=torch.float32).eval()
    # no tie: the smallest k-th vs (k+1)-th score gap over 30 tokens and 3 MoE layers is 9.2e-05, far above the fp32
    # rounding of the sigmoid scores (~1e-7) that could make the graph rank two experts the other way
    assert min(_router_margins(routed, ids)) > ROUTING_MARGIN
    with torch.no_grad():
        own = model(input_ids=ids).logits
        with _ties_broken_by_lowest_expert():
            stable = model(input_ids=ids).logits
    assert float((own - stable).abs().max()) > 0.1  # the same model, two valid tie-breaks, different outputs


@pytest.mark.coverage
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_afmoe_graph_is_pytorch_with_the_tie_broken_alike(tmp_path):
    """transformers' random-init afmoe exported unchecked: its graph gives PyTorch's logits once PyTorch breaks the
    routing tie as OpenVINO's TopK does (lowest expert index first), at prefill and at a decode step."""
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM

    path = tmp_path / "afmoe-tied"
    _afmoe_as_transformers_inits_it(path)
    out = tmp_path / "unchecked"
    run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", "--skip-validation",
            "--disable-convert-tokenizer", str(out), check=True)
    pt = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    ids = torch.arange(3, 33).unsqueeze(0)
    with torch.no_grad(), _ties_broken_by_lowest_expert():
        ref = pt(input_ids=ids, use_cache=True)
        ref_next = pt(input_ids=ids[:, -1:] + 1, past_key_values=ref.past_key_values).logits[:, -1]
    ours = ov_model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert float((torch.as_tensor(ours.logits)[:, -1] - ref.logits[:, -1]).abs().max()) < 1e-4
    ours_next = ov_model(input_ids=ids[:, -1:] + 1, attention_mask=torch.ones(1, 31, dtype=torch.long),
                         past_key_values=ours.past_key_values).logits
    assert float((torch.as_tensor(ours_next)[:, -1] - ref_next).abs().max()) < 1e-4


@pytest.mark.coverage
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_routed_afmoe_exports_with_optimum_intel_config_and_parity(tiny_model, tmp_path):
    """With a router that routes (the tiny builder's), afmoe (sliding and full attention, muP, route_scale, a shared
    expert) exports with optimum-intel's own config, validation passed, and greedy parity through OVModelForCausalLM
    and GenAI."""
    import openvino as ov
    import openvino_genai as ov_genai
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM

    path = tiny_model("afmoe")
    pt = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert min(_router_margins(pt, torch.arange(3, 33).unsqueeze(0))) > ROUTING_MARGIN  # no tie left
    assert architectures.fix_module("afmoe") is None
    out = tmp_path / "shared"
    run_cli("export", "openvino", "-m", str(path), "--task", "text-generation-shared", str(out), check=True)
    manifest = read_manifest(out)
    assert manifest.partitioning == "shared" and manifest.validation["status"] == "passed"
    assert manifest.validation["prompt_tokens"] > 8 and not manifest.model.get("fixes")  # past the window, no fix

    ov_model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
    _assert_greedy_parity(ov_model, path)
    enc, ref = _pytorch_greedy(str(path), tuple(PROMPTS[:2]))
    assert (enc["attention_mask"] == 0).any()
    ours = ov_model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                             pad_token_id=0)
    assert torch.equal(ours, ref)
    del ov_model

    pipe = ov_genai.LLMPipeline(str(out), "CPU", **EXACT)
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    for prompt in PROMPTS:
        enc, ref = _pytorch_greedy(str(path), (prompt,))
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        assert list(pipe.generate(inputs, config).tokens[0]) == ref[0, enc["input_ids"].shape[1]:].tolist(), prompt
