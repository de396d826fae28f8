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
