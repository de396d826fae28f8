"""Every example in the README and docs runs as written.

Each page's code blocks run in order in a fresh directory holding `./my-model` (a tiny random-init
llama with a local tokenizer) and `./calibration.txt` (a few lines of text, the local calibration
dataset the quantization examples name): ```python blocks in one Python process per page, and the
`optimum-cli export` and `optimum-cli shared-graph` commands of ```bash blocks (with their `\\`-continued lines) as commands. Blocks that install packages or use
upper-case placeholders (MODEL, OUT, ARTIFACT) are not runnable as written and are skipped.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

from conftest import run_command


ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(r"```(python|bash)\n(.*?)```", re.S)
_PLACEHOLDER = re.compile(r"\b(MODEL|OUT|MODEL_ID_OR_PATH|ARTIFACT)\b")


def _runnable(page: Path):
    blocks = []
    for lang, code in _BLOCK.findall(page.read_text()):
        if _PLACEHOLDER.search(code) or "pip install" in code or "[FLAGS]" in code:
            continue
        if lang == "bash":
            code = re.sub(r"\\\n\s*", " ", code)  # a command continued over several lines is one command
            lines = [line for line in code.splitlines() if line.startswith(("optimum-cli export", "optimum-cli shared-graph"))]
            blocks += [("bash", line) for line in lines]
        else:
            blocks.append(("python", code))
    return blocks


RUNNABLE = [p for p in PAGES if _runnable(p)]

CALIBRATION_TEXT = "\n".join([
    "The quick brown fox jumps over the lazy dog.",
    "OpenVINO runs the exported graph on the CPU.",
    "A prompt is prefilled once, then tokens are decoded one by one.",
    "Calibration texts are read one per line from a local file.",
]) + "\n"


# pages whose examples export several artifacts (17 to 29 s each on a 2-core host): under `-m slow`, for the suite's
# budget; the README's, and the pages each showing one feature, run by default
SLOW_PAGES = {"deploy.md", "static.md", "index.md", "quantization.md"}


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p
                                  for p in RUNNABLE], ids=[p.name for p in RUNNABLE])
def test_page_examples(page, quantizable_model, tmp_path):  # int4 examples: group size 128
    shutil.copytree(quantizable_model, tmp_path / "my-model")
    (tmp_path / "calibration.txt").write_text(CALIBRATION_TEXT)
    python_code = []
    for lang, code in _runnable(page):
        if lang == "bash":
            args = code.split()[1:]
            proc = run_command([Path(sys.executable).parent / "optimum-cli", *args], cwd=tmp_path, timeout=600)
            assert proc.returncode == 0, f"{code}\n{proc.stderr[-3000:]}"
        else:
            python_code.append(code)
    if python_code:
        script = tmp_path / "examples.py"
        script.write_text("\n\n".join(python_code))
        proc = run_command([sys.executable, script], cwd=tmp_path, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]


def test_some_pages_have_examples():
    assert {p.name for p in RUNNABLE} >= {"README.md", "index.md"}


def test_continued_commands_run_whole():
    """A `\\`-continued command is one command: its flags after the first line are not lost."""
    commands = [code for _, code in _runnable(ROOT / "docs" / "quantization.md") if code.startswith("optimum-cli")]
    assert commands and all("\\" not in c for c in commands)
    assert any("--quant-mode int8 --dataset ./calibration.txt ./my-model-int8" in c for c in commands)
