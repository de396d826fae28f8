"""The benchmark script runs end to end (`--quick`: a toy model, the main layouts) and writes its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "run.py"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def test_help_lists_the_modes():
    proc = subprocess.run([sys.executable, str(RUN), "--help"], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--quick", "--suite", "--quiet", "--rounds", "--weight-format"):
        assert flag in proc.stdout


@pytest.mark.slow  # 78 s, the longest test of the default run: the benchmark's smoke test is `pytest -m slow`'s
@pytest.mark.timeout(660)  # about a minute on an idle 2-core machine; generous for a shared one
def test_quick_run_end_to_end(tmp_path):
    docs = tmp_path / "docs"
    proc = subprocess.run(
        [sys.executable, str(RUN), "--quick", "--quiet", "--workdir", str(tmp_path), "--docs-dir", str(docs)],
        capture_output=True, text=True, env=_env(), timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]

    (result_file,) = (tmp_path / "quick").glob("results-quick-*.json")
    results = json.loads(result_file.read_text())
    model = results["models"]["qwen2-toy"]
    for key in ("shared", "with-past"):
        artifact = model["artifacts"][key]
        assert artifact["bytes"] > 0 and artifact["export_wall_s"] > 0 and artifact["compile_s"] > 0
    # One graph's weights: the shared artifact is no larger than optimum-intel's (docs/design.md, the artifact's invariants).
    assert model["artifacts"]["shared"]["bytes"] <= 1.02 * model["artifacts"]["with-past"]["bytes"]
    generation = model["generation"]
    for key in ("shared-optimum", "withpast-optimum", "shared-genai"):
        row = generation[key]
        assert row["rounds"], row.get("skipped")
        for n in ("16", "64"):
            assert row["ttft_s"][n] > 0 and row["tpot_s"][n] > 0 and row["gen_peak_mb"][n] > 0
    # The layouts compute the same thing: greedy tokens agree on the decisive toy model.
    reference = generation["withpast-optimum"]["rounds"][0]["tokens"]
    assert generation["shared-optimum"]["rounds"][0]["tokens"] == reference
    assert generation["shared-genai"]["rounds"][0]["tokens"] == reference
    assert results["bandwidth"]["read_gb_s"] > 0

    text = (docs / "benchmarks.md").read_text()
    assert "text-generation-shared against text-generation-with-past" in text
    assert "time to first token" in text and "Memory-bandwidth bound" in text
    assert (docs / "benchmarks.png").stat().st_size > 0


@pytest.mark.slow  # 44 s; the default run keeps the memory read under a real cgroup limit (test_memory.py) and validation in parts (test_bad_input.py, test_validate.py)
@pytest.mark.timeout(660)
def test_memory_suite_on_the_toy_model(tmp_path):
    """`benchmarks/memory.py`: exports under a cgroup memory limit, which completes, the page."""
    if not Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() or os.geteuid() != 0:
        pytest.skip("a cgroup v1 memory limit cannot be set here (needs its controller and root)")
    docs = tmp_path / "docs"
    docs.mkdir()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "memory.py"), "--model", "qwen2-toy", "--formats", "fp16",
         "--limits", "2", "--workdir", str(tmp_path), "--docs-dir", str(docs)],
        capture_output=True, text=True, env=_env(), timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (result_file,) = tmp_path.glob("results-memory-qwen2-toy-*.json")
    rows = json.loads(result_file.read_text())["rows"]
    assert [(r["task"], r["limit_gib"], r["completed"]) for r in rows] == [
        ("text-generation-with-past", 2, True), ("text-generation-shared", 3, True)]
    assert rows[1]["validation"]["status"] == "passed" and rows[1]["validation"]["run"]["mode"] == "whole"
    page = (docs / "benchmarks-memory.md").read_text()
    assert "| text-generation-shared | fp16 | 3 GiB | yes |" in page


@pytest.mark.slow  # builds a released-width llama (1.2 GB) and exports it twice: 93 s here
def test_fp16_positions_measures_both_artifacts(tmp_path):
    """`benchmarks/fp16_positions.py` on one short length writes its page with both artifacts' differences."""
    page = tmp_path / "page.md"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "fp16_positions.py"), "--types", "llama",
                           "--lengths", "16", "--out", str(tmp_path / "out"), "--page", str(page)],
                          capture_output=True, text=True, env=_env(), timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "results.json").read_text())["results"][0]
    ours, theirs = data["shared"]["max_abs_diff"][0], data["with-past"]["max_abs_diff"][0]
    assert ours < 1e-3 * max(data["max_abs_logit"][0], 1.0) and theirs > ours
    assert "| 16 |" in page.read_text()


def test_moe_page_is_its_results_rendered(tmp_path):
    """`benchmarks/moe.py --report-only`: docs/benchmarks-moe.md is what its JSON renders to, and a row of other
    weights than fp16 is named with them, its slope apart from the fp16 rows'."""
    moe = ROOT / "benchmarks" / "moe.py"
    results = ROOT / "docs" / "benchmarks-moe.json"
    proc = subprocess.run([sys.executable, str(moe), "--report-only", str(results), "--docs-dir", str(tmp_path)],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "benchmarks-moe.md").read_text() == (ROOT / "docs" / "benchmarks-moe.md").read_text()

    data = json.loads(results.read_text())
    fp16 = [r for r in data["rows"] if r["model_type"] == "qwen3_moe" and r.get("weights", "fp16") == "fp16"]
    int4 = [{**r, "weights": "int4, group size 128"} for r in fp16]
    (tmp_path / "mixed.json").write_text(json.dumps({**data, "rows": fp16 + int4}))
    proc = subprocess.run([sys.executable, str(moe), "--report-only", str(tmp_path / "mixed.json"), "--docs-dir",
                           str(tmp_path)], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "benchmarks-moe.md").read_text()
    assert page.count("| qwen3_moe, int4, group size 128 (") == len(fp16) and page.count("| qwen3_moe (") == len(fp16)
    assert "qwen3_moe (int4, group size 128): " in page and "qwen3_moe: " in page


def test_moe_append_replaces_what_it_measured_again_and_keeps_what_is_still_missing():
    """`benchmarks/moe.py --append`: a depth measured again replaces the earlier run's row (each row keeps its run's
    date), a depth the earlier run could not build stays listed until a run measures it, the page in `EXPERTS`'
    order."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("moe_bench", ROOT / "benchmarks" / "moe.py")
    moe = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(moe)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    data = json.loads((ROOT / "docs" / "benchmarks-moe.json").read_text())
    rows = {(r["model_type"], r["layers"]): {k: v for k, v in r.items() if k != "run"}  # undated: as a run writes
            for r in data["rows"] if r.get("weights", "fp16") == "fp16"}
    q2, q4, g2 = rows["qwen3_moe", 2], rows["qwen3_moe", 4], rows["gpt_oss", 2]
    earlier = {**data, "date": "2026-01-01", "rows": [g2, q2, q4],
               "not_reached": {"mixtral at 4 layers": "its checkpoint did not build", "dbrx": "stopped"}}
    now = {**data, "date": "2026-01-02", "rows": [{**q4, "checkpoint_bytes": 1}],
           "not_reached": {"qwen3_next at 4 layers": "its checkpoint did not build"}}
    merged = moe._merged(earlier, now)
    assert [(r["model_type"], r["layers"], r["run"]["date"]) for r in moe._ordered(merged["rows"])] == [
        ("qwen3_moe", 2, "2026-01-01"), ("qwen3_moe", 4, "2026-01-02"), ("gpt_oss", 2, "2026-01-01")]
    assert set(merged["not_reached"]) == {"mixtral at 4 layers", "dbrx", "qwen3_next at 4 layers"}
    page = moe.render(merged)
    assert "mixtral at 4 layers (not reached: its checkpoint did not build)" in page
    again = moe._merged(merged, {**now, "rows": [{**rows["qwen3_moe", 2], "model_type": "mixtral", "layers": 4}],
                                 "not_reached": {}})
    assert "mixtral at 4 layers" not in again["not_reached"] and "qwen3_next at 4 layers" in again["not_reached"]


def _export_row(task, wall, anon, rss, *, completed=True, limit=None, status="passed"):
    row = {"task": task, "limit_gib": limit, "completed": completed, "wall_s": wall, "peak_rss_mb": rss,
           "peak_anon_mb": anon, "peak_pss_mb": rss, "oom_kills": 0}
    if completed and task == "image-text-to-text-shared":
        row["validation"] = {"status": status, "run": {"mode": "whole"}, "greedy_tokens": 4, "greedy_match": True}
    if not completed:
        row["error"] = "killed (out of memory)" if limit else "ValueError: Maximum required is 5.2.*, got: 5.5.4"
    return row


def test_vlm_page_renders_targets_limits_parity_and_slope(tmp_path):
    """`benchmarks/vlm.py --report-only` on a small results file: the shapes, each ratio against its bound (a missed
    one in bold, with the step table of that export), the smallest completed limit of the tries, the VLMPipeline
    parity, the Qwen3.5 comparison said for what it is, the slope per layer; nothing exported."""
    shape = {"released_layers": 34, "released": "google/gemma-3-4b-it",
             "text": {"hidden_size": 2560, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                      "intermediate_size": 10240, "vocab_size": 262208},
             "vision": {"layers": 27, "hidden_size": 1152, "intermediate_size": 4304, "heads": 16, "patch_size": 14,
                        "image_size": 896}}
    parity = {"status": "passed", "rule": "fp32", "greedy_match": True, "greedy_tokens": 4, "compared_tokens": [4]}
    shared = "image-text-to-text-shared"
    rows = [
        {**shape, "model_type": "gemma3", "layers": 2, "checkpoint_bytes": 2_559_739_680,
         "text": {**shape["text"], "layer_types": ["sliding_attention", "full_attention"]},
         "baseline": _export_row("image-text-to-text", 100.0, 3000, 6000),
         "shared": _export_row(shared, 120.0, 3300, 6100), "parity": parity,
         "limits": [_export_row(shared, 125.0, 2000, 2500, limit=2.0),
                    _export_row(shared, 20.0, 1400, 1500, limit=1.5, completed=False)]},
        {**shape, "model_type": "gemma3", "layers": 4, "checkpoint_bytes": 2_937_000_000,
         "text": {**shape["text"], "layer_types": ["sliding_attention"] * 3 + ["full_attention"]},
         "baseline": _export_row("image-text-to-text", 110.0, 3400, 6500),
         "shared": _export_row(shared, 160.0, 3500, 6600), "parity": parity,
         "limits": [_export_row(shared, 30.0, 1800, 1900, limit=2.0, completed=False),
                    _export_row(shared, 170.0, 2300, 2600, limit=2.5)],
         "stages": {"completed": True, "wall_s": 150.0, "peak_anon_mb": 3400, "peak_rss_mb": 6500,
                    "steps": [{"step": "capture", "start_s": 10.0, "seconds": 60.0, "peak_anon_mb": 3400,
                               "peak_rss_mb": 6500}]}},
        {**shape, "model_type": "qwen3_5", "layers": 2, "released": "Qwen/Qwen3.5-4B", "released_layers": 32,
         "checkpoint_bytes": 2_610_000_000,
         "text": {**shape["text"], "layer_types": ["linear_attention", "full_attention"]},
         "optimum_intel": _export_row("image-text-to-text", 9.0, 500, 600, completed=False),
         "baseline": _export_row("text-generation-shared", 60.0, 1200, 4000),
         "shared": _export_row(shared, 90.0, 2800, 5000),
         "parity": {"status": "failed", "error": "genai-vlm on CPU does not reproduce PyTorch"}, "limits": []},
        {**shape, "model_type": "qwen3_5", "layers": 4, "released": "Qwen/Qwen3.5-4B", "released_layers": 32,
         "checkpoint_bytes": 3_060_000_000,
         "text": {**shape["text"], "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
         "baseline": _export_row("text-generation-shared", 60.0, 3000, 6000),
         "vision_graphs": _export_row("vision graphs (optimum-intel)", 40.0, 1000, 2500),
         "shared": _export_row(shared, 120.0, 3100, 6200), "parity": parity, "limits": []},
    ]
    results = {"rows": rows, "date": "2026-12-04", "note": "a test", "versions": {"openvino": "2026.4.1"},
               "machine": {"nproc": 2, "Model name": "AMD EPYC", "isa": ["avx2"], "ram_gb": 23.5, "load_avg": [1.0] * 3}}
    data = tmp_path / "vlm.json"
    data.write_text(json.dumps(results))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vlm.py"), "--report-only", str(data),
                           "--docs-dir", str(tmp_path)], capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "benchmarks-vlm.md").read_text()
    assert 'CPU "AMD EPYC"' in page and "Conditions: a test" in page
    assert "| gemma3 | google/gemma-3-4b-it | 2560, 8 / 4 x 256, 10240, 262,208 | 2 (34): sliding_attention, " \
           "full_attention | 27 x 1152 (16 heads, MLP 4304) | 896 px, patches of 14 | 2.56 GB |" in page
    assert ("| gemma3 | 2 | optimum-intel `image-text-to-text` | 100 s, 3,000 MB anonymous, 6,000 MB RSS | "
            "120 s, 3,300 MB anonymous, 6,100 MB RSS | 1.20x | 1.10x | 1.02x | **2 GiB** (1.5 GiB failed (killed (out "
            "of memory)), 2 GiB validated) | passed, 4 of 4 greedy tokens compared, identical | passed, 4 tokens |") in page
    assert "| gemma3 | 4 | wall | 1.45x | <= 1.3x | **missed** |" in page
    assert "| gemma3 | 4 | peak anonymous memory | 1.03x | <= 1.2x | met |" in page
    assert "| 1.45x (**missed**) |" in page and "| **2.5 GiB** (2 GiB failed" in page
    assert "### Where gemma3 at 4 layers spends its time and memory" in page and "| capture | 10 s | 60.0 |" in page
    assert "| qwen3_5 | 2 | `text-generation-shared` (language model only) |" in page
    assert "**failed**: genai-vlm on CPU does not reproduce PyTorch" in page
    # the language model's export and the vision graphs' conversion: walls added, each peak the larger
    assert ("| qwen3_5 | 4 | `text-generation-shared` (language model) + optimum-intel's vision graphs (60 s, 3,000 MB "
            "anonymous, 6,000 MB RSS; 40 s, 1,000 MB anonymous, 2,500 MB RSS) | 100 s, 3,000 MB anonymous, 6,000 MB "
            "RSS | 120 s, 3,100 MB anonymous, 6,200 MB RSS | 1.20x | 1.03x | 1.03x |") in page
    assert "| qwen3_5 | 4 | wall | 1.20x | <= 1.3x | met |" in page
    assert "qwen3_5 at 2 layers: failed: ValueError: Maximum required is 5.2.*, got: 5.5.4" in page
    assert ("gemma3: this task +100 MB of peak anonymous memory and +20.0 s per text layer between 2 and 4 layers; "
            "the baseline +200 MB and +5.0 s per layer") in page


def test_calibration_section_is_its_one_run_rendered():
    """docs/quality.md's calibration section is what its one run (docs/calibration-designs.json, two trained models)
    renders to, the export's default for each mode marked as `decode_steps_for` picks it today, and that default
    measured against prefill only for every mode on every model."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import calibration_design

    run = json.loads((ROOT / "docs" / "calibration-designs.json").read_text())
    assert calibration_design.render(run) in (ROOT / "docs" / "quality.md").read_text()
    assert len(run["runs"]) >= 2
    for model in run["runs"]:
        modes = {row["mode"] for row in model["rows"]}
        assert {"int4-awq-se", "int8"} <= modes
        for mode in modes:
            designs = {r["design"] for r in model["rows"] if r["mode"] == mode}
            default = calibration_design.default_design(mode, ["a calibration text"], 1)
            assert {"prefill", default} <= designs and any(calibration_design.DESIGNS[d][0] for d in designs), mode
