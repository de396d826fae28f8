"""`--shape-mode static`: one fully static graph, C query slots per call, a fixed KV capacity written in place."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import EXACT, MainCalls, error_line, remote_code_llama, run_cli, tree_snapshot, unloadable_copy

import optimum_shared_graph as osg
from optimum_shared_graph import DecompositionError, InvalidOptionsError, RuntimeSelectionError, read_manifest

NEW_TOKENS = 12
CAPACITY = 64
# (C, stateful): the anchors C = 1 and C = 8, each with the KV cache as state and as graph inputs.
VARIANTS = [(1, True), (1, False), (8, True), (8, False)]
# Token counts shorter than C, equal to C and longer than C (for C = 8), plus a prompt of several chunks.
PROMPT_LENGTHS = [3, 8, 13, 21]


@pytest.fixture(scope="module")
def static_artifact(tiny_model, tmp_path_factory):
    """`static_artifact(C, stateful)` -> a llama static artifact with batch 2 (exported once per module)."""
    done = {}
    root = tmp_path_factory.mktemp("static")

    def get(query_len: int, stateful: bool):
        key = (query_len, stateful)
        if key not in done:
            out = root / f"c{query_len}-{'stateful' if stateful else 'stateless'}"
            osg.export(str(tiny_model("llama")), out, shape_mode="static", max_cache_len=CAPACITY,
                       static_batch_size=2, static_query_len=query_len, stateful=stateful)
            done[key] = out
        return done[key]

    return get


@pytest.fixture(scope="module")
def reference(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model("llama")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _prompt(length: int, offset: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(length + 100 * offset)
    return torch.randint(3, 500, (1, length), generator=generator)


def _greedy(model, input_ids, attention_mask, new_tokens=NEW_TOKENS):
    return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize("query_len,stateful", VARIANTS)
def test_static_graph_and_greedy_parity(query_len, stateful, static_artifact, reference):
    import openvino as ov

    out = static_artifact(query_len, stateful)
    manifest = read_manifest(out)
    assert manifest.shape_mode == "static" and manifest.partitioning == "shared"
    assert manifest.static == {"batch_size": 2, "query_len": query_len, "cache_len": CAPACITY}
    assert "static" in manifest.requires and "generation" in manifest.requires
    assert ("stateless" in manifest.requires) == (not stateful) and manifest.stateful == stateful
    assert manifest.validation["status"] == "passed" and manifest.validation["greedy_match"]
    graph = ov.Core().read_model(out / "openvino_static_model.xml")
    assert not graph.is_dynamic()
    assert graph.input("input_ids").get_partial_shape().to_shape() == [2, query_len]
    assert graph.output("logits").get_partial_shape().to_shape() == [2, 1, 512]
    assert len(graph.get_sinks()) == (4 if stateful else 0)
    assert sorted(p.name for p in out.glob("*.xml") if "tokenizer" not in p.name) == ["openvino_static_model.xml"]

    pt, _ = reference
    model = osg.runtime(out, ov_config=EXACT)
    for length in PROMPT_LENGTHS:  # batch 1 (the unused row of the static batch repeats row 0)
        ids = _prompt(length)
        mask = torch.ones_like(ids)
        assert torch.equal(_greedy(pt, ids, mask), _greedy(model, ids, mask)), length
    # a left-padded batch of 2
    ids = torch.cat([torch.cat([torch.zeros(1, 6, dtype=torch.long), _prompt(5, 1)], 1), _prompt(11, 2)])
    mask = (torch.arange(11) >= torch.tensor([[6], [0]])).long()
    assert torch.equal(_greedy(pt, ids, mask), _greedy(model, ids, mask))


@pytest.mark.parametrize("model_type", ["qwen2", "gpt2", "opt"])
def test_static_parity_across_architectures(model_type, tiny_model, tmp_path):
    """Other families (opt builds boolean masks: left-pad slots must not turn into NaN)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / model_type
    osg.export(str(tiny_model(model_type)), out, shape_mode="static", max_cache_len=CAPACITY, static_batch_size=2,
               static_query_len=8)
    pt = AutoModelForCausalLM.from_pretrained(tiny_model(model_type)).eval()
    model = osg.runtime(out, ov_config=EXACT)
    for length in (3, 13):
        ids = _prompt(length)
        assert torch.equal(_greedy(pt, ids, torch.ones_like(ids)), _greedy(model, ids, torch.ones_like(ids)))
    ids = torch.cat([torch.cat([torch.zeros(1, 6, dtype=torch.long), _prompt(5, 1)], 1), _prompt(11, 2)])
    mask = (torch.arange(11) >= torch.tensor([[6], [0]])).long()
    assert torch.equal(_greedy(pt, ids, mask), _greedy(model, ids, mask))



# The static forms of modules whose optimum-intel form does not fit a static graph
# (architectures/_static_forms.py): optimum-intel's SDPA `_attn` of codegen, gptj and gpt_neo drops the attention mask for a batch of
# 1 (right over a dynamic cache, wrong over a static one, whose keys include slots not yet written), GPT-Neo's own
# `_attn` takes its causal / local-window rows as the last keys (gpt_neo with a window of 8, shorter than the
# prompts + new tokens), and optimum-intel's granitemoe experts split the tokens by data-dependent sizes
@pytest.mark.parametrize("model_type,query_len,overrides", [("codegen", 1, {}),
                                                            pytest.param("gptj", 1, {}, marks=pytest.mark.slow),  # codegen's form
                                                            ("gpt_neo", 4, {"window_size": 8}), ("granitemoe", 4, {})])
def test_static_parity_at_batch_one_with_static_forms(model_type, query_len, overrides, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    path = tiny_model(model_type, **overrides)
    out = tmp_path / model_type
    manifest = osg.export(str(path), out, shape_mode="static", max_cache_len=CAPACITY, static_query_len=query_len)
    assert manifest.static["batch_size"] == 1 and manifest.validation["status"] == "passed"
    pt = AutoModelForCausalLM.from_pretrained(path).eval()
    model = osg.runtime(out, ov_config=EXACT)
    for length in (3, 13):
        ids = _prompt(length)
        assert torch.equal(_greedy(pt, ids, torch.ones_like(ids)), _greedy(model, ids, torch.ones_like(ids))), length


# optimum-intel's Gemma2ModelPatcher (Gemma 2, Gemma 3 text) wraps past_key_values in a DynamicCache; the static
# trace's Cache passes through to the model (a window of 8, shorter than the prompts + new tokens). Gemma 3n's text
# decoder (optimum-intel's Gemma3nTextOpenVINOConfig, on its Gemma 4 config: per-layer inputs, AltUp, LAuReL), refused
# statically by the sweep before ("'Cache' object is not iterable"), runs under `-m coverage`.
@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text",
                                        pytest.param("gemma3n_text", marks=(pytest.mark.slow, pytest.mark.coverage))])
def test_static_parity_with_a_sliding_window(model_type, tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM

    path = tiny_model(model_type, sliding_window=8)
    out = tmp_path / model_type
    manifest = osg.export(str(path), out, shape_mode="static", max_cache_len=CAPACITY, static_query_len=4)
    assert manifest.validation["status"] == "passed"
    pt = AutoModelForCausalLM.from_pretrained(path).eval()
    model = osg.runtime(out, ov_config=EXACT)
    for length in (3, 13):
        ids = _prompt(length)
        assert torch.equal(_greedy(pt, ids, torch.ones_like(ids)), _greedy(model, ids, torch.ones_like(ids))), length


def test_grouped_query_attention_does_not_repeat_the_kv_buffers(static_artifact, tiny_model):
    """The tiny llama has 4 query heads over 2 KV heads: no op of the static graph may produce the KV
    buffers repeated per query head ([B, 4, capacity, head_dim]), which transformers' `repeat_kv` would."""
    import openvino as ov
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model("llama"))
    assert config.num_attention_heads > config.num_key_value_heads  # the case this guards
    graph = ov.Core().read_model(static_artifact(1, True) / "openvino_static_model.xml")
    repeated = [2, config.num_attention_heads, CAPACITY, config.head_dim]
    offenders = [op.get_friendly_name() for op in graph.get_ops()
                 if any(list(out.get_partial_shape().to_shape()) == repeated for out in op.outputs())]
    assert offenders == []
    kv_shaped = [op for op in graph.get_ops() if op.get_type_name() == "ReadValue"]
    assert kv_shaped and list(kv_shaped[0].get_output_partial_shape(0).to_shape()) == [2, config.num_key_value_heads,
                                                                                      CAPACITY, config.head_dim]


def test_capacity_is_used_to_the_last_slot(static_artifact, reference):
    """A prompt plus new tokens exactly at the capacity works (the window slides back near the end)."""
    pt, _ = reference
    model = osg.runtime(static_artifact(8, True), ov_config=EXACT)
    ids = _prompt(CAPACITY - 9, 3)
    mask = torch.ones_like(ids)
    assert torch.equal(_greedy(pt, ids, mask, 9), _greedy(model, ids, mask, 9))


def test_prompt_too_long_is_refused_before_inference(static_artifact):
    model = osg.runtime(static_artifact(8, True), ov_config=EXACT)
    session = model.static_session
    session.reset()
    ids = _prompt(60)
    with pytest.raises(RuntimeSelectionError, match=r"exceed this static artifact's KV capacity of 64") as info:
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5)
    assert "\n" not in str(info.value) and "--max-cache-len 65" in str(info.value)
    assert session.filled == 0  # nothing ran
    with pytest.raises(RuntimeSelectionError, match="batch of 3 sequences"):
        ids = _prompt(4).repeat(3, 1)
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5)


def test_sampling_and_beam_search_on_a_static_artifact(static_artifact, reference):
    """Beam search with 2 beams fills the static batch of 2; sampling with top_k=1 is greedy."""
    pt, _ = reference
    model = osg.runtime(static_artifact(8, False), ov_config=EXACT)
    ids = _prompt(10, 4)
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0)
    assert torch.equal(pt.generate(input_ids=ids, attention_mask=mask, num_beams=2, do_sample=False, **kwargs),
                       model.generate(input_ids=ids, attention_mask=mask, num_beams=2, do_sample=False, **kwargs))
    sampled = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=1, **kwargs)
    assert torch.equal(sampled, _greedy(pt, ids, mask))


def test_assisted_decoding_on_a_static_logits_all_artifact(tiny_model, tmp_path, reference):
    """C = 4, logits=all: candidates are verified 4 slots per call and rejected ones dropped from the cache."""
    from transformers import AutoModelForCausalLM

    pt, _ = reference
    out = tmp_path / "static-all"
    osg.export(str(tiny_model("llama")), out, shape_mode="static", max_cache_len=CAPACITY, static_query_len=4,
               logits="all")
    assert "logits-all" in read_manifest(out).requires
    model = osg.runtime(out, ov_config=EXACT)
    draft = AutoModelForCausalLM.from_pretrained(tiny_model("llama", num_hidden_layers=1)).eval()
    ids = _prompt(9, 5)
    mask = torch.ones_like(ids)
    ref = _greedy(pt, ids, mask)
    assert torch.equal(_greedy(model, ids, mask), ref)
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, **kwargs), ref)
    assert torch.equal(model.generate(input_ids=ids, attention_mask=mask, assistant_model=pt, **kwargs), ref)


def test_static_artifact_as_draft_proposes_what_its_pytorch_model_does(near_draft, tmp_path, reference):
    """C = 4, logits=last: a static draft's fill is cropped back to the accepted tokens after each round, so it proposes the
    PyTorch draft's candidates (seen as the main model's calls), and the tokens are plain greedy's."""
    from transformers import AutoModelForCausalLM

    pt, _ = reference
    out = tmp_path / "static-draft"
    osg.export(str(near_draft), out, shape_mode="static", max_cache_len=CAPACITY, static_query_len=4)
    draft = osg.runtime(out, ov_config=EXACT)
    pt_draft = AutoModelForCausalLM.from_pretrained(near_draft).eval()
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    for length in (3, 13):
        ids = _prompt(length, 7)
        mask = torch.ones_like(ids)
        greedy = _greedy(pt, ids, mask)
        with MainCalls(pt) as expected:
            assert torch.equal(pt.generate(input_ids=ids, attention_mask=mask, assistant_model=pt_draft, **kwargs), greedy)
        with MainCalls(pt) as calls:
            assert torch.equal(pt.generate(input_ids=ids, attention_mask=mask, assistant_model=draft, **kwargs), greedy)
        assert calls == expected and 1 + NEW_TOKENS // 5 < len(calls) < NEW_TOKENS, (length, len(calls))


def test_small_capacity_validates_on_a_prompt_that_fits(tiny_model, tmp_path):
    manifest = osg.export(str(tiny_model("llama")), tmp_path / "small", shape_mode="static", max_cache_len=12,
                          static_query_len=4)
    v = manifest.validation
    assert v["status"] == "passed" and v["prompt_tokens"] + v["greedy_tokens"] <= 12 and v["decode_steps"] >= 3


def test_runtimes_that_cannot_run_static_graphs_refuse_them_at_load(static_artifact):
    """OVModelForCausalLM and OpenVINO GenAI do not run static graphs: the graph's own file name
    (`openvino_static_model.xml`) keeps them from loading it, so they fail at load, never at generate()
    and never with wrong output. Checked in a fresh interpreter that never imports optimum_shared_graph."""
    import subprocess
    import sys

    paths = [static_artifact(8, stateful) for stateful in (True, False)]
    for path in paths:
        assert (path / "openvino_static_model.xml").is_file() and not (path / "openvino_model.xml").exists()
    for load, expected in (
        ("from optimum.intel import OVModelForCausalLM\nload = OVModelForCausalLM.from_pretrained", "openvino_model.xml"),
        ("import openvino_genai\nload = lambda path: openvino_genai.LLMPipeline(path, 'CPU')", "Could not find a model"),
    ):
        # one interpreter per consumer tries both artifacts (stateful, stateless) and prints each one's error
        program = load + (
            "\nimport sys\nfor path in sys.argv[1:]:\n"
            "    try:\n        load(path)\n    except Exception as error:\n        print('refused:', ' '.join(str(error).split()))\n"
            "    else:\n        print('loaded:', path)\n"
            "assert 'optimum_shared_graph' not in sys.modules")
        proc = subprocess.run([sys.executable, "-c", program, *map(str, paths)], capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        refusals = [line for line in proc.stdout.splitlines() if line.startswith("refused:")]
        assert len(refusals) == 2 and all(expected in line for line in refusals), proc.stdout[-2000:]


def test_cli_static_defaults(tiny_model, tmp_path):
    out = tmp_path / "static-cli"
    proc = run_cli("export", "openvino", "-m", str(tiny_model("llama")), "--task", "text-generation-shared",
                   "--shape-mode", "static", "--max-cache-len", "48", str(out), check=True)
    assert "static" in proc.stderr
    data = json.loads((out / "shared_graph.json").read_text())
    assert data["shape_mode"] == "static" and data["static"] == {"batch_size": 1, "query_len": 1, "cache_len": 48}
    assert data["requires"] == ["generation", "static"]
    assert data["validation"]["status"] == "passed"


@pytest.mark.parametrize("flags,expected", [
    (["--max-cache-len", "0"], "--max-cache-len must be at least 1"),
    (["--max-cache-len", "4096"], "exceeds the model's maximum of 512 positions"),
    (["--max-cache-len", "16", "--static-query-len", "32"], "--static-query-len (32) cannot exceed"),
    (["--static-batch-size", "0"], "--static-batch-size must be at least 1"),
    (["--static-query-len", "600"], "cannot exceed the KV capacity (512)"),
])
def test_cli_bad_static_options(flags, expected, tiny_model, tmp_path):
    out = tmp_path / "out"
    before = tree_snapshot(out)  # None: nothing there, and nothing may appear
    proc = run_cli("export", "openvino", "-m", str(tiny_model("llama")), "--task", "text-generation-shared",
                   "--shape-mode", "static", *flags, str(out))
    assert proc.returncode != 0
    assert expected in error_line(proc)
    assert tree_snapshot(out) == before


def test_static_options_checked_before_any_export_work(tiny_model, tmp_path):
    model = unloadable_copy(tiny_model("llama"), tmp_path / "unloadable")  # loading it would fail otherwise
    with pytest.raises(InvalidOptionsError, match="maximum of 512 positions"):
        osg.export(str(model), tmp_path / "x", shape_mode="static", max_cache_len=1000)
    assert not (tmp_path / "x").exists()


# ------------------------------------------- prefill inputs decode never takes: no shared graph

_PREFILL_ONLY_MODELING = '''
import torch
from transformers import LlamaForCausalLM


class PrefillPrefixForCausalLM(LlamaForCausalLM):
    """A llama whose prefill also takes `prefix_embeds` (like image features) that decode steps never take."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, use_cache=None, logits_to_keep=0, prefix_embeds=None, **kwargs):
        if prefix_embeds is not None:
            inputs_embeds = self.get_input_embeddings()(input_ids)
            inputs_embeds[:, : prefix_embeds.shape[1]] += prefix_embeds
            input_ids = None
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
                               logits_to_keep=logits_to_keep, **kwargs)

    def prepare_inputs_for_generation(self, input_ids, is_first_iteration=False, **kwargs):
        inputs = super().prepare_inputs_for_generation(input_ids, is_first_iteration=is_first_iteration, **kwargs)
        if is_first_iteration:
            inputs["prefix_embeds"] = torch.zeros(input_ids.shape[0], 1, self.config.hidden_size)
        return inputs
'''


def test_prefill_only_inputs_need_a_separate_prefill_graph(tmp_path):
    """A model whose prefill writes inputs that decode never takes is refused, nothing written."""
    path = remote_code_llama(tmp_path / "prefill-prefix", "modeling_prefill_prefix", "PrefillPrefixForCausalLM",
                             _PREFILL_ONLY_MODELING)
    out = tmp_path / "out"
    with pytest.raises(DecompositionError, match="needs a separate prefill graph: its prefill takes prefix_embeds") as info:
        osg.export(str(path), out, trust_remote_code=True)
    assert "\n" not in str(info.value)
    assert not out.exists()


def _compressed_weights(xml) -> dict[str, list[list[int]]]:
    """Shapes of the graph's compressed weight constants, by element type (u8/i8/u4/i4/nf4...)."""
    import openvino as ov

    shapes: dict[str, list[list[int]]] = {}
    for op in ov.Core().read_model(xml).get_ops():
        if op.get_type_name() == "Constant":
            kind = op.get_output_element_type(0).get_type_name()
            if kind in ("u8", "i8", "u4", "i4", "nf4"):
                shapes.setdefault(kind, []).append(list(op.get_output_shape(0)))
    return shapes


@pytest.mark.parametrize("flags,check", [
    pytest.param(["--weight-format", "int8"], lambda w: "u8" in w and not ({"u4", "i4"} & set(w)),
                 marks=pytest.mark.slow),  # the same path as int4's, 11 s
    # optimum-intel's own flags reach NNCF: a group size of 32 (default 128) and symmetric int4
    (["--weight-format", "int4", "--group-size", "32", "--sym", "--ratio", "1.0"],
     lambda w: "i4" in w and all(shape[-1] == 32 for shape in w["i4"] if len(shape) == 3)),
], ids=["int8", "int4-g32-sym"])
def test_static_data_free_weight_compression(flags, check, quantizable_model, tmp_path):
    out = tmp_path / "static-compressed"
    run_cli("export", "openvino", "-m", str(quantizable_model), "--task", "text-generation-shared",
            "--shape-mode", "static", "--max-cache-len", "48", "--static-query-len", "4", "--quiet", *flags, str(out),
            check=True)
    weights = _compressed_weights(out / "openvino_static_model.xml")
    assert check(weights), weights
    manifest = read_manifest(out)
    assert manifest.quantization["weight_format"] == flags[1]
    assert manifest.quantization["calibration_samples"] == {"prefill": 0, "decode": 0}
    model = osg.runtime(out)
    ids = _prompt(10)
    tokens = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                            do_sample=False, pad_token_id=0)
    assert tokens.shape == (1, 16)
