"""Progress of the export: tqdm bars on stderr when it is a terminal, none with `--quiet` or off a terminal."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import pytest

from conftest import _optimum_cli, run_cli

import optimum_shared_graph as osg

# What our bars print: the stage bar, and the step bars of the decomposition and the validation.
STAGES = ["loading", "decomposing generate()", "converting (optimum-intel)", "validating", "writing"]
STAGE_BAR = "text-generation-shared: "
DECOMPOSITION_BAR = "decomposition: LlamaForCausalLM.forward()"
VALIDATION_BAR = "validation: prefill + decode calls"
CALIBRATION_BAR = "calibration: prefill + 2 decode calls per text"


class Terminal(io.StringIO):
    """A stderr that says it is a terminal and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


def _bar_lines(text: str) -> list[str]:
    """The progress bar renderings in `text` (tqdm redraws a bar with a carriage return)."""
    return [part for line in text.splitlines() for part in line.split("\r") if "%|" in part]


def test_quiet_is_listed_in_help():
    proc = run_cli("export", "openvino", "--help", check=True)
    assert "--quiet" in proc.stdout


def test_quiet_flag_sets_the_option():
    import argparse

    from optimum.commands.export.openvino import parse_args_openvino

    from optimum_shared_graph import cli as _cli

    parser = argparse.ArgumentParser()
    parse_args_openvino(parser)
    _cli.add_arguments(parser)
    base = ["-m", "x", "out", "--task", "text-generation-shared"]
    assert _cli.options_from_args(parser.parse_args(base + ["--quiet"])).quiet is True
    assert _cli.options_from_args(parser.parse_args(base)).quiet is False
    assert osg.ExportOptions().quiet is False


def test_terminal_shows_the_stages_and_steps(tiny_model, tmp_path, monkeypatch):
    stderr = Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    manifest = osg.export(tiny_model("llama"), tmp_path / "out")
    assert manifest.validation["status"] == "passed"
    shown = stderr.getvalue()
    bars = _bar_lines(shown)
    stage_bars = [line for line in bars if line.startswith(STAGE_BAR)]
    for name in STAGES:
        assert any(line.rstrip().endswith(f", {name}]") for line in stage_bars), (name, stage_bars)
    assert any(DECOMPOSITION_BAR in line and "/16 " in line for line in bars), shown[-3000:]
    assert any(VALIDATION_BAR in line and "/16 " in line for line in bars), shown[-3000:]


@pytest.mark.parametrize("terminal, quiet", [(True, True), (False, False)], ids=["quiet", "not-a-terminal"])
def test_quiet_or_no_terminal_shows_none_of_our_bars(terminal, quiet, tiny_model, tmp_path, monkeypatch):
    from transformers.utils import logging as hf_logging

    enabled_before = hf_logging.is_progress_bar_enabled()
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    manifest = osg.export(tiny_model("llama"), tmp_path / "out", quiet=quiet)
    assert manifest.validation["status"] == "passed"
    shown = stderr.getvalue()
    for ours in (STAGE_BAR.strip(), DECOMPOSITION_BAR, VALIDATION_BAR):
        assert ours not in shown, shown[-3000:]
    if quiet:  # transformers' own bars (weights loading) are off too, and back on afterwards
        assert _bar_lines(shown) == [], shown[-3000:]
    assert hf_logging.is_progress_bar_enabled() == enabled_before


def test_calibration_shows_its_texts(tiny_model, tmp_path, monkeypatch):
    """Data-aware quantization on a terminal: a bar over the calibration texts."""
    from optimum.intel.openvino.configuration import OVQuantizationConfig

    from optimum_shared_graph.testing import CORPUS

    texts = [line for text in CORPUS for line in text.splitlines() if line.strip()][:4]
    stderr = Terminal()
    monkeypatch.setattr(sys, "stderr", stderr)
    config = OVQuantizationConfig(dataset=texts, num_samples=len(texts))
    manifest = osg.export(tiny_model("llama"), tmp_path / "out", quantization_config=config, calibration_decode_steps=2)
    assert manifest.quantization["calibration_samples"] == {"prefill": len(texts), "decode": 2 * len(texts)}
    bars = _bar_lines(stderr.getvalue())
    assert any(CALIBRATION_BAR in line and f"/{len(texts)} " in line for line in bars), stderr.getvalue()[-3000:]


def _run_on_terminal(*args: str, timeout: int = 600) -> tuple[int, str]:
    """Run `optimum-cli` with stderr on a pseudo-terminal (100 columns); return its status and stderr."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = dict(os.environ)
    env.pop("OPTIMUM_SHARED_GRAPH_DEBUG", None)
    proc = subprocess.Popen([_optimum_cli(), *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=slave, env=env)
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        status = proc.wait(timeout=timeout)
    finally:
        proc.kill()
        reader.join(timeout=10)
        os.close(master)
    return status, b"".join(chunks).decode("utf-8", errors="replace")


@pytest.mark.parametrize("quiet", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["progress", "quiet"])
def test_cli_on_a_terminal(quiet, tiny_model, tmp_path):
    """On a real (pseudo-)terminal: the stage and step bars, or with `--quiet` no progress bar at all;
    the summary line either way."""
    out = tmp_path / "out"
    status, shown = _run_on_terminal("export", "openvino", "-m", str(tiny_model("llama")),
                                     "--task", "text-generation-shared", *(["--quiet"] if quiet else []), str(out))
    assert status == 0, shown[-3000:]
    assert f"text-generation-shared: wrote {out} (shared;" in shown
    bars = _bar_lines(shown)
    if quiet:
        assert bars == [], shown[-3000:]
    else:
        assert any(line.startswith(STAGE_BAR) and line.rstrip().endswith(", writing]") for line in bars), shown[-3000:]
        assert any(DECOMPOSITION_BAR in line for line in bars), shown[-3000:]
