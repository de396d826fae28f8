"""The architecture coverage sweep (`scripts/coverage.py`) on a representative subset of model types.

CI runs this subset (`pytest -m coverage`); the full sweep over every supported model type writes
`docs/architectures.md` (`PYTHONPATH=. python scripts/coverage.py`, about 30 minutes).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _state_space_type() -> str:
    """A model type with convolution and SSM states that exports with full parity under the installed transformers."""
    import transformers
    from packaging.version import Version

    # optimum-intel 2.2 exports granitemoehybrid from transformers 5.5, lfm2 up to 4.57.6 (docs/architectures.md)
    return "granitemoehybrid" if Version(transformers.__version__) >= Version("5.5") else "lfm2"


# One of each kind the sweep must keep exporting as one graph with parity: a type past optimum-intel's
# transformers cap under transformers 5 (gemma2), a type that needs a per-architecture test config (phi),
# a mixture of experts (qwen3_moe), and a hybrid state-space model (conv and SSM states beside a KV cache).
SUBSET = ["gemma2", "phi", "qwen3_moe", _state_space_type()]


def _coverage_module():
    spec = importlib.util.spec_from_file_location("coverage_script", ROOT / "scripts" / "coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.coverage
@pytest.mark.timeout(600)
def test_representative_subset_exports_with_parity(tmp_path):
    table, raw = tmp_path / "architectures.md", tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "coverage.py"), "--types", *SUBSET, "--jobs", "2", "--no-static",
         "--output", str(table), "--results", str(raw)],
        capture_output=True, text=True, timeout=580, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {r["model_type"]: r for r in json.loads(raw.read_text())["results"]}
    assert set(results) == set(SUBSET)
    for model_type, result in results.items():
        assert result["status"] == "exported, parity", (model_type, result.get("reason"))
        assert result["graphs"] == ["openvino_model.xml"] and result["partitioning"] == "shared"
        assert result["ovmodel"] == "parity" and result["genai"] == "parity"
    from optimum.exporters.openvino.utils import SSM_MODELS

    assert SUBSET[-1] in SSM_MODELS and results[SUBSET[-1]]["states"] > 0  # conv and SSM states, in the one graph
    text = table.read_text()
    assert f"**{len(SUBSET)} model types exported as one graph with parity**" in text
    for model_type in SUBSET:
        assert f"| {model_type} | exported, parity |" in text


def test_table_rows_say_why_a_type_failed():
    """Each failure is one line in the table, with a reason; the counts add up."""
    cov = _coverage_module()
    results = [
        {"model_type": "llama", "status": cov.PASS, "validation": {"status": "passed", "max_abs_diff_prefill": 1e-6,
                                                                   "max_abs_diff_decode": 2e-6},
         "ovmodel": "parity", "genai": "parity", "static": "parity", "inputs": ["input_ids"]},
        {"model_type": "gemma", "status": cov.PASS, "validation": {"status": "passed", "max_abs_diff_prefill": 1e-6,
                                                                   "max_abs_diff_decode": 2e-6},
         "ovmodel": "parity", "genai": "parity", "static": "not available", "inputs": ["input_ids"],
         "version_cap": "optimum-intel's GemmaOpenVINOConfig caps transformers at 5.0"},
        {"model_type": "foo", "status": cov.REFUSED, "reason": "optimum-intel could not export foo:\nline two"},
        {"model_type": "bar", "status": cov.NOT_BUILDABLE, "reason": "transformers has no configuration class"},
    ]
    text = cov.render(results, seconds=60, versions={"transformers": "x"}, python=sys.executable)
    assert "**2 model types exported as one graph with parity**" in text
    assert "Exported despite an optimum-intel transformers version cap" in text and "gemma" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| model type")]
    assert len(rows) == 4
    assert "| foo | refused |" in text and "line two" in text and "\nline two" not in text


def test_buildable_reason():
    from optimum_shared_graph.testing import buildable_reason

    assert buildable_reason("llama") is None
    assert "configuration class" in buildable_reason("chatglm")


def test_multimodal_rows_have_their_own_section_and_update_only_it():
    """A published multimodal type's row goes to its own section (with the text model type it was exported as),
    not into the counts of optimum-intel's with-past types; `--update-multimodal` replaces only that section."""
    cov = _coverage_module()
    passed = {"status": cov.PASS, "validation": {"status": "passed", "max_abs_diff_prefill": 1e-6,
                                                 "max_abs_diff_decode": 2e-6},
              "ovmodel": "parity", "genai": "parity", "static": "parity", "npu": "parity"}
    results = [dict(passed, model_type="llama"),
               dict(passed, model_type="qwen3_5_moe", exported_model_type="qwen3_5_moe_text", left_out=["vision_config"])]
    page = cov.render(results, seconds=60, versions={"transformers": "x"}, python=sys.executable,
                      compare=[[dict(passed, model_type="llama")]])
    assert "**1 model types exported as one graph with parity**" in page
    assert "**1 of 1 published multimodal model types exported as one graph with parity.**" in page
    assert "| qwen3_5_moe | qwen3_5_moe_text | exported, parity |" in page and "left out: vision_config" in page
    assert page.index(cov.MULTIMODAL_HEADING) < page.index("## Choosing the transformers range")

    refused = {"model_type": "qwen3_5_moe", "status": cov.REFUSED, "reason": "it broke"}
    updated = cov.splice_multimodal(page, cov.render_multimodal([refused], versions={"transformers": "y"}))
    before, after = page.split(cov.MULTIMODAL_HEADING), updated.split(cov.MULTIMODAL_HEADING)
    assert after[0] == before[0]  # the other rows as they were
    assert after[1][after[1].index("## Choosing"):] == before[1][before[1].index("## Choosing"):]
    assert "| qwen3_5_moe | - | refused |" in updated and "**0 of 1 published" in updated
    assert updated.count("\n\n## Choosing the transformers range") == 1
    assert cov.splice_multimodal(updated, cov.render_multimodal([refused], versions={"transformers": "y"})) == updated
    without = page.replace(page[page.index(cov.MULTIMODAL_HEADING):page.index("## Choosing")], "")
    assert cov.splice_multimodal(without, cov.render_multimodal([refused], versions={})).count(cov.MULTIMODAL_HEADING) == 1


def test_vision_language_section_renders_after_the_multimodal_one_and_splices_only_itself(tmp_path):
    """`--vlm`'s section (`render_vlm`, from its results JSON) goes after the multimodal checkpoints' section; splicing
    it in (and `--vlm --render-only`) leaves the rest of the page byte-identical, and replaces only itself."""
    cov = _coverage_module()
    passed = {"status": cov.PASS, "validation": {"status": "passed", "max_abs_diff_prefill": 1e-6,
                                                 "max_abs_diff_decode": 2e-6},
              "ovmodel": "parity", "genai": "parity", "static": "parity", "npu": "parity"}
    page = cov.render([dict(passed, model_type="llama"), dict(passed, model_type="gemma3",
                                                              exported_model_type="gemma3_text")],
                      seconds=60, versions={"transformers": "x"}, python=sys.executable,
                      compare=[[dict(passed, model_type="llama")]])
    data = {"versions": {"transformers": "x", "openvino-genai": "y"}, "machine": "a CPU, 2 CPUs", "commit": "abc1234",
            "results": [
                {"model_type": "qwen3_5", "export": "passed",
                 "validation": {"status": "passed", "max_abs_diff_prefill": 1e-5, "max_abs_diff_decode": 3e-5},
                 "optimum-vlm f32": "passed, max |dlogits| 3.0e-05 (tolerance 0.0031)",
                 "genai-vlm f32": "passed, 8 of 8 tokens", "optimum-vlm default": "failed: greedy token 1 differs",
                 "genai-vlm default": "passed, 8 of 8 tokens, 2 near-ties",
                 "genai-vlm NPU": "passed, 8 of 8 tokens compared",
                 "image-text-to-text": "fails: ValueError: transformers 5.5.4 is installed", "seconds": {"total": 200}},
                {"model_type": "mistral3", "export": "refused: it broke", "image-text-to-text": "exported",
                 "seconds": {"total": 40}}]}
    section = cov.render_vlm(data)
    text = "\n".join(section)
    assert section[0] == cov.VLM_HEADING and "commit abc1234" in text and "4.0 minutes in all" in text
    assert ("**1 of 2 vision-language model types exported with validation passed; 1 pass both consumers under f32 "
            "properties, 0 under the default properties, 1 through GenAI's NPU pipeline; optimum-intel's "
            "image-text-to-text exports 1 of 2.**") in text
    assert ("| qwen3_5 | passed, max \\|dlogits\\| 3.0e-05 | passed, max \\|dlogits\\| 3.0e-05 (tolerance 0.0031) | "
            "passed, 8 of 8 tokens | failed: greedy token 1 differs | passed, 8 of 8 tokens, 2 near-ties | "
            "passed, 8 of 8 tokens compared | fails: ValueError: transformers 5.5.4 is installed |") in text
    assert "| mistral3 | refused: it broke | - | - | - | - | - | exported |" in text

    spliced = cov.splice_vlm(page, section)
    assert spliced.index(cov.MULTIMODAL_HEADING) < spliced.index(cov.VLM_HEADING) < spliced.index("## Choosing")
    assert spliced.replace(text + "\n", "", 1) == page  # the rest of the page byte-identical
    assert cov.splice_vlm(spliced, section) == spliced and cov.vlm_section_of(spliced) == section
    fewer = cov.render_vlm(dict(data, results=data["results"][1:]))
    again = cov.splice_vlm(spliced, fewer)
    assert again.count(cov.VLM_HEADING) == 1 and "| qwen3_5 |" not in again
    assert again.replace("\n".join(fewer) + "\n", "", 1) == page
    assert cov.splice_vlm("# Coverage\n", section) == "# Coverage\n\n" + text  # no multimodal section: at the end

    # a passing report's cell: its figures, near-ties and the calls it could not compare
    assert cov._validate_cell({"max_abs_diff_prefill": 1e-5, "max_abs_diff_decode": 3e-5, "tolerance": 0.0031}) == \
        "passed, max |dlogits| 3.0e-05 (tolerance 0.0031)"
    assert cov._validate_cell({"greedy_tokens": 8, "compared_tokens": [2], "differing_steps": [
        {"step": 1, "margin": 0.0021, "near_tie": True}], "not_compared": [{"from_step": 2, "reason": "no text"}]}) == \
        "passed, 2 of 8 tokens compared, 1 near-tie (token 1: PyTorch's margin 0.0021); from token 2 not compared: no text"

    # a recorded line as the table shows it: the run's temporary artifact as OUT, no source locations
    assert cov._vlm_cell("failed: genai-vlm on CPU could not run /tmp/osg-cov-mistral3-ab_c/shared: RuntimeError: "
                         "Exception from /a/b/vlm_config.cpp:45: Unsupported 'mistral3' VLM model type") == \
        "failed: genai-vlm on CPU could not run OUT: RuntimeError: Unsupported 'mistral3' VLM model type"

    # `--vlm --npu-only`'s results at released widths: a column of their own, `-` for a type without them
    released = dict(data, released_npu={
        "qwen3_5": {"model_type": "qwen3_5", "layers": 6, "npu": "passed, 8 of 8 tokens compared",
                    "machine": "a CPU, 2 CPUs", "commit": "def5678"},
        "gemma3": {"model_type": "gemma3", "layers": 6, "npu": "failed: NPUW could not compile it",
                   "machine": "a CPU, 2 CPUs", "commit": "def5678"}})
    wide = "\n".join(cov.render_vlm(released))
    assert "1 through GenAI's NPU pipeline (1 of 2 at released widths);" in wide
    assert "| genai-vlm (NPU pipeline) | genai-vlm (NPU pipeline, released widths) | optimum-intel" in wide
    assert ("| passed, 8 of 8 tokens compared | passed, 8 of 8 tokens compared | fails: ValueError: transformers "
            "5.5.4 is installed |") in wide
    assert "| mistral3 | refused: it broke | - | - | - | - | - | - | exported |" in wide
    assert "qwen3_5: Qwen/Qwen3.5-4B, 6 of its 32 text layers" in wide and "a CPU, 2 CPUs, commit def5678" in wide
    with pytest.raises(SystemExit, match="no released-width vision-language configuration for llava"):
        cov.main(["--vlm", "--npu-only", "--types", "llava", "--vlm-results", str(tmp_path / "none.json")])
    assert not (tmp_path / "none.json").exists()

    # `--vlm --render-only FILE`: the page re-rendered from the JSON, nothing run
    (tmp_path / "vlm.json").write_text(json.dumps(data))
    (tmp_path / "page.md").write_text(spliced.replace("| qwen3_5 | passed", "| qwen3_5 | stale"))
    assert cov.main(["--vlm", "--render-only", str(tmp_path / "vlm.json"), "--output", str(tmp_path / "page.md")]) == 0
    assert (tmp_path / "page.md").read_text() == spliced

# ---------------------------------------------------------------------------------------------------------------
# The NPU column at released width (`scripts/coverage.py --npu-only`); quick: configurations only, no export
# ---------------------------------------------------------------------------------------------------------------


def test_released_width_configs_have_the_checkpoints_widths_and_few_layers():
    from optimum_shared_graph import supported_model_types
    from optimum_shared_graph.released import RELEASED, released_checkpoint, released_width_config, widths

    supported = set(supported_model_types())
    for model_type, (checkpoint, _) in RELEASED.items():
        assert model_type in supported, model_type
        config = released_width_config(model_type)
        w = widths(config)
        assert config.model_type == model_type and "/" in checkpoint
        assert 6 <= w["layers"] <= 26 and w["vocab"] >= 512 and w["hidden"] >= 512, (model_type, w)
        init = getattr(config, "initializer_range", None) or config.init_std  # init_std: the seq2seq families
        assert init == 0.1 and config.eos_token_id == 2, model_type
    # the shape the tracker measured: Qwen3-4B's widths
    assert released_checkpoint("qwen3") == "Qwen/Qwen3-4B"
    assert widths(released_width_config("qwen3")) == dict(layers=6, hidden=2560, heads=32, kv_heads=8, head_dim=128,
                                                          intermediate=9728, vocab=151936, tied=True)
    # a mixture of experts keeps each expert's width and the router's top-k, with fewer experts
    moe = widths(released_width_config("qwen3_moe"))
    assert moe["expert_intermediate"] == 768 and moe["experts_per_token"] == 8 and moe["experts"] < 128
    # 6 layers (NPUW keeps a repeated block from 5 repeats), the checkpoint's per-layer pattern kept
    assert released_width_config("gemma2").layer_types == ["sliding_attention", "full_attention"] * 5
    assert released_width_config("gemma3_text").layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert released_width_config("gemma3_text").num_hidden_layers == 26  # gemma-3-1b-it's own depth
    assert released_width_config("smollm3").no_rope_layers == [1, 1, 1, 0, 1, 1]
    # a sequence-to-sequence family: the decoder sized (its causal LM), its tiny model's structure kept
    bart = released_width_config("bart")
    assert (bart.d_model, bart.decoder_layers, bart.decoder_attention_heads, bart.decoder_ffn_dim) == (1024, 6, 16, 4096)
    assert bart.normalize_embedding and not bart.scale_embedding and bart.encoder_layers == bart.decoder_layers


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_next", "afmoe", "llama"])
def test_a_checkpoint_saved_module_by_module_is_the_one_save_pretrained_writes(tmp_path, monkeypatch, model_type):
    """A released-width checkpoint larger than half the machine's memory is written one module at a time: its files
    hold the keys `save_pretrained` writes (the experts per expert where transformers fuses them as it loads: mixtral,
    qwen3_next), in shards with their index, and load back without a missing or unexpected key."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph import released
    from optimum_shared_graph.testing import tiny_config

    config = tiny_config(model_type)
    monkeypatch.setattr(released, "_SHARD_BYTES", 64 << 10)  # several shards from a tiny model
    with torch.device("meta"):
        shape = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    released._save_streamed(shape, tmp_path / "streamed")
    AutoModelForCausalLM.from_config(config, dtype=torch.float16).save_pretrained(tmp_path / "whole")

    def keys(folder):
        return {k for f in folder.glob("*.safetensors") for k in load_file(str(f))}

    streamed = keys(tmp_path / "streamed")
    assert streamed == keys(tmp_path / "whole")
    if model_type in ("mixtral", "qwen3_next"):
        assert any(".experts.0." in k for k in streamed) and not any(k.endswith("gate_up_proj") for k in streamed)
    index = json.loads((tmp_path / "streamed" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == streamed and len(set(index["weight_map"].values())) > 1
    model, info = AutoModelForCausalLM.from_pretrained(tmp_path / "streamed", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    # the tensors come back as written: saved again, the loaded model writes the same values
    model.to(torch.float16).save_pretrained(tmp_path / "again")
    written = {k: v for f in (tmp_path / "streamed").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    again = {k: v for f in (tmp_path / "again").glob("*.safetensors") for k, v in load_file(str(f)).items()}
    assert written.keys() == again.keys() and all(torch.equal(written[k], again[k]) for k in written)
    # every tensor drawn: none left as the uninitialised memory a module's own `_init_weights` does not reach
    # (qwen3_next's router weight is drawn by its mixture-of-experts block)
    assert all(torch.isfinite(t).all() and t.abs().max() < 100 for t in written.values())
    if model_type == "afmoe":  # its router drawn as `build_tiny_model` draws it (zero, every expert would tie)
        assert all(written[k].abs().max() > 0 for k in written if k.endswith("router.gate.weight"))


def _refs(*tokens):
    """PyTorch references as the coverage script keeps them: (encoding, sequence, scores) per prompt."""
    import torch

    refs = []
    for toks in tokens:
        enc = {"input_ids": torch.tensor([[5, 6]])}
        scores = [torch.nn.functional.one_hot(torch.tensor([t]), 16).float() for t in toks]
        refs.append((enc, torch.tensor([[5, 6, *toks]]), scores))
    return refs


def test_npu_verdict_judges_ours_against_optimum_intels_artifact():
    cov = _coverage_module()
    refs = _refs([7, 8], [9, 10])
    right, wrong = [[7, 8], [9, 10]], [[7, 3], [9, 10]]
    assert cov.npu_verdict(refs, right, None, right, None) == "parity"
    assert cov.npu_verdict(refs, right, None, wrong, None).startswith("parity (optimum-intel's artifact: NPUW: token 1")
    assert cov.npu_verdict(refs, wrong, None, wrong, None).startswith("as optimum-intel's artifact, token for token")
    assert cov.npu_verdict(refs, wrong, None, right, None).startswith("differs from optimum-intel's artifact")
    assert cov.npu_verdict(refs, None, "RuntimeError: x", None, "RuntimeError: x").startswith("NPUW runs neither")
    assert cov.npu_verdict(refs, None, "RuntimeError: x", right, None) == "failed: RuntimeError: x (optimum-intel's artifact: parity)"
    assert cov.npu_verdict(refs, None, "RuntimeError: x", None, "RuntimeError: z") == (
        "NPUW runs neither artifact (optimum-intel's fails otherwise: RuntimeError: z): RuntimeError: x")
    assert cov.npu_verdict(refs, wrong, None, theirs_exported=False).startswith(cov.NO_COMPARISON)
    # ours runs where optimum-intel's does not: its own category, never "worse than optimum-intel's"
    alone = cov.npu_verdict(refs, wrong, None, None, "RuntimeError: y")
    assert alone.startswith(f"{cov.RUNS_ALONE} (RuntimeError: y): NPUW: token 1")
    assert "0 worse than" in cov._npu_summary([alone], real_width=True) and "1 that NPUW runs with a difference" in \
        cov._npu_summary([alone], real_width=True)
    # both fail with NPUW's default folding; unfolded, ours runs and theirs does not: its own category, not "neither"
    unfolded = cov.npu_verdict(refs, None, "RuntimeError: x", None, "RuntimeError: z",
                               unfolded=((right, None), (None, "RuntimeError: z")))
    assert unfolded == f"{cov.RUNS_UNFOLDED} (RuntimeError: z): parity; with NPUW's default folding: RuntimeError: x"
    summary = cov._npu_summary([unfolded], real_width=True)
    assert "1 that NPUW runs only with `NPUW_FOLD=NO`" in summary and "0 that NPUW runs for neither" in summary
    assert "0 worse than" in summary
    # unfolded, both run (or neither does): the cell is judged as before, on the default runs
    assert cov.npu_verdict(refs, None, "RuntimeError: x", None, "RuntimeError: z",
                           unfolded=((right, None), (right, None))).startswith("NPUW runs neither")


def test_neither_cell_names_its_measured_cause():
    cov = _coverage_module()
    cell = "NPUW runs neither artifact (optimum-intel's fails the same way): RuntimeError: unordered_map::at"
    assert "; cause: NPUW's decoding feeds a `position_ids` input" in cov.npu_cause("bart", cell)
    assert cov.npu_cause("llama", cell) == cell  # not measured for llama: no cause claimed
    assert cov.npu_cause("bart", "parity") == "parity"
    moe = ("NPUW runs neither artifact (optimum-intel's fails otherwise: RuntimeError: to_shape was called on a dynamic "
           "shape.): RuntimeError: Shape inference input shapes {[337912616960],[4]}")
    assert "NPUW's function folding infers a shape" in cov.npu_cause("granitemoehybrid", moe)
    assert cov.npu_cause("granitemoe", moe) == moe


def test_splice_npu_rerenders_only_the_npu_cells():
    """`--splice-npu`: the NPU cells of the types measured again, the summary and the real-width section re-rendered
    from the results file; every other cell of the page as its sweep wrote it."""
    cov = _coverage_module()
    passed = {"status": cov.PASS, "validation": {"status": "passed", "max_abs_diff_prefill": 1e-6,
                                                 "max_abs_diff_decode": 2e-6},
              "ovmodel": "parity", "genai": "parity | odd", "static": "parity"}
    w = dict(layers=6, hidden=768, heads=12, vocab=50257, tied=True)
    old = {"results": [dict(model_type="gpt2", widths=w, npu="NPUW runs neither artifact (optimum-intel's fails the "
                            "same way): RuntimeError: Key", npu_shared="RuntimeError: Key", npu_with_past="RuntimeError: Key"),
                       dict(model_type="bart", widths=w, npu="parity", npu_shared="parity", npu_with_past="parity")]}
    results = [dict(passed, model_type="gpt2"), dict(passed, model_type="bart"), dict(passed, model_type="llama")]
    page = cov.render(results, seconds=60, versions={"transformers": "x"}, python=sys.executable, npu_results=old)
    new = {"results": [dict(old["results"][0], npu="parity (optimum-intel's artifact: RuntimeError: Key)",
                            npu_shared="parity", npuw=cov.NPUW), old["results"][1]], "npuw": cov.NPUW}
    spliced = cov.splice_npu(page, new, source="docs/npu-real-width.json")
    assert spliced == cov.render(results, seconds=60, versions={"transformers": "x"}, python=sys.executable,
                                 npu_results=new)
    gpt2 = next(line for line in spliced.splitlines() if line.startswith("| gpt2 | exported"))
    assert "parity (optimum-intel's artifact: RuntimeError: Key)" in gpt2 and "parity \\| odd" in gpt2
    assert "of the 2 exported types measured there: 2 with parity (1 of them where NPUW runs optimum-intel's" in spliced
    assert "the rows of bart were run without `INFERENCE_PRECISION_HINT`" in spliced


def test_npu_results_merge_and_render_the_column_from_real_width():
    """`--npu-only` merges into the results file (types run replace their rows); the page's NPU column and summary
    come from it, and a type without a real-width run says so."""
    cov = _coverage_module()
    w = dict(layers=2, hidden=2560, heads=32, kv_heads=8, head_dim=128, intermediate=9728, vocab=151936, tied=True)
    earlier = {"results": [{"model_type": "llama", "npu": "failed: old"}, {"model_type": "qwen3", "npu": "old"}]}
    fresh = [{"model_type": "llama", "checkpoint": "meta-llama/Llama-3.1-8B-Instruct", "widths": w, "npu": "parity",
              "npu_shared": "parity", "npu_with_past": "parity", "seconds": {"total": 300.0}}]
    merged = cov.merge_npu_results(earlier, fresh, machine="x86_64, 2 CPUs", weight_format="fp16")
    assert [r["model_type"] for r in merged["results"]] == ["llama", "qwen3"]
    assert merged["results"][0]["npu"] == "parity" and merged["results"][1]["npu"] == "old"
    assert merged["machine"] == "x86_64, 2 CPUs"

    passed = {"status": cov.PASS, "validation": {"status": "passed", "max_abs_diff_prefill": 1e-6,
                                                 "max_abs_diff_decode": 2e-6},
              "ovmodel": "parity", "genai": "parity", "static": "parity"}
    results = [dict(passed, model_type="llama", npu="NPUW runs neither artifact: tiny"),
               dict(passed, model_type="gemma", npu="not run (--no-npu)")]
    npu = {"results": [merged["results"][0]], "machine": "x86_64, 2 CPUs, no NPU", "weight_format": "fp16",
           "versions": {"openvino": "2026.4.1"}}
    page = cov.render(results, seconds=60, versions={"transformers": "x"}, python=sys.executable, npu_results=npu,
                      npu_source="docs/npu-real-width.json")
    llama = next(line for line in page.splitlines() if line.startswith("| llama | exported"))
    gemma = next(line for line in page.splitlines() if line.startswith("| gemma | exported"))
    assert "| parity |" in llama.split("| passed")[1] and "tiny" not in llama
    assert cov.NOT_AT_REAL_WIDTH in gemma
    assert "at released width, of the 1 exported types measured there: 1 with parity" in page
    assert "1 exported types are not measured at real width" in page
    # a run skipped or crashed is not a result; an export refused at real width is counted as such
    npu["results"] += [dict(model_type="gemma", npu="not run here: too large"),
                       dict(model_type="qwen3", npu=cov.EXPORT_REFUSED_AT_REAL_WIDTH + ": validation failed")]
    results.append(dict(passed, model_type="qwen3"))
    page = cov.render(results, seconds=60, versions={"transformers": "x"}, python=sys.executable, npu_results=npu)
    assert "of the 2 exported types measured there: 1 with parity" in page
    assert "0 worse than optimum-intel's artifact, 1 whose export this package refused at real width" in page
    assert "1 exported types are not measured at real width" in page
    assert "## NPU pipeline at real width" in page and "docs/npu-real-width.json" in page
    assert "| llama | meta-llama/Llama-3.1-8B-Instruct | 2 | 2560 | 32 / 8 | 128 | 9728 |" in page
    # a multimodal checkpoint's export is its language model's graph: its cell is that text type's real-width result
    rows = cov.apply_npu_results([dict(passed, model_type="qwen3_5", exported_model_type="qwen3_5_text"),
                                  dict(passed, model_type="gemma3", exported_model_type="gemma3_text")],
                                 {"results": [dict(model_type="qwen3_5_text", checkpoint="Qwen/Qwen3.5-27B",
                                                   npu="parity")]})
    assert rows[0]["npu"] == "parity (its language model, measured as qwen3_5_text at Qwen/Qwen3.5-27B's widths)"
    assert rows[1]["npu"].startswith(cov.NOT_AT_REAL_WIDTH)
    # without real-width results the page is as before: the tiny models' NPU cells
    plain = cov.render(results, seconds=60, versions={"transformers": "x"}, python=sys.executable)
    assert "## NPU pipeline at real width" not in plain and "NPUW runs neither artifact: tiny" in plain


def test_npu_only_skips_a_mixture_of_experts_too_large_to_compile_here(monkeypatch):
    cov = _coverage_module()
    monkeypatch.setenv("OPTIMUM_SHARED_GRAPH_MEMORY", str(8 * 2**30))
    assert cov._npu_memory_refusal("llama", None) is None  # dense: not estimated
    refusal = cov._npu_memory_refusal("mixtral", None)
    assert refusal.startswith("not run here: a mixture of experts of") and "8 GiB available" in refusal
    monkeypatch.setenv("OPTIMUM_SHARED_GRAPH_MEMORY", str(2**40))
    assert cov._npu_memory_refusal("mixtral", None) is None
