"""The examples in the README and docs run as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quickstart(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "quickstart.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "validation passed" in proc.stdout
    assert "greedy tokens identical to PyTorch: True" in proc.stdout
    assert "OpenVINO GenAI LLMPipeline loads it" in proc.stdout
    assert "reproduces PyTorch through continuous-batching on CPU" in proc.stdout
