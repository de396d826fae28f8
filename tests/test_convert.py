"""The convert stage's staging directory: beside the output, removed after the export, and what a killed
export leaves behind removed by the next export into the same directory (never a live export's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from conftest import _optimum_cli

from optimum_shared_graph.pipeline.convert import remove_dead_staging


def _hold_lock(path):
    """A process that holds the lock of a staging directory, as a live export does."""
    code = ("import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\ntime.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_dead_staging_is_removed_and_a_live_one_is_kept(tmp_path):
    out = tmp_path / "out"
    dead, live, other = tmp_path / ".out.dead1.partial", tmp_path / ".out.live1.partial", tmp_path / ".other.x.partial"
    for directory in (dead, live, other):
        (directory / "raw").mkdir(parents=True)
        (directory / ".lock").touch()
    holder = _hold_lock(live / ".lock")
    try:
        assert remove_dead_staging(out) == [dead]
        assert not dead.exists() and live.is_dir() and other.is_dir()  # another output's staging is not ours
    finally:
        holder.kill()
        holder.wait()
    assert remove_dead_staging(out) == [live]  # its export died: now it is litter


def test_export_killed_during_conversion_leaves_litter_the_next_export_removes(tiny_model, tmp_path):
    out = tmp_path / "out"
    args = [_optimum_cli(), "export", "openvino", "-m", str(tiny_model("llama")), "--task", "text-generation-shared",
            "--quiet", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob(".out.*.partial/raw")):  # optimum-intel's conversion has started
        assert proc.poll() is None and time.monotonic() < deadline, "the export ended before its conversion was seen"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    litter = list(tmp_path.glob(".out.*.partial"))
    assert len(litter) == 1 and not out.exists()

    subprocess.run(args, check=True, capture_output=True, timeout=600)
    assert (out / "shared_graph.json").is_file()
    assert not list(tmp_path.glob(".out.*")), list(tmp_path.iterdir())


def test_a_staging_directory_that_cannot_be_locked_leaves_nothing(tmp_path, monkeypatch):
    """A filesystem without `flock` (some network mounts): one clear error, and no `.starting` directory left."""
    import errno
    import fcntl

    import pytest

    from optimum_shared_graph.errors import SharedGraphError
    from optimum_shared_graph.pipeline.convert import staging

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(SharedGraphError) as info:
        with staging(tmp_path / "out"):
            pass
    assert "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_export_terminated_during_conversion_writes_nothing(tiny_model, tmp_path):
    """SIGTERM during optimum-intel's conversion: one line, exit status 143, no traceback, no staging directory left
    (`cli._interrupts_fail_in_one_line`; tests/test_bad_input.py checks the vision-language task)."""
    out = tmp_path / "out"
    args = [_optimum_cli(), "export", "openvino", "-m", str(tiny_model("llama")), "--task", "text-generation-shared",
            str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob(".out.*.partial/raw")):  # optimum-intel's conversion has started
        assert proc.poll() is None and time.monotonic() < deadline, "the export ended before its conversion was seen"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    stderr = proc.communicate(timeout=300)[1]
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "Traceback" not in stderr
    assert [line for line in stderr.splitlines() if line.startswith("error: ")] == [
        f"error: interrupted by SIGTERM: the export stopped and wrote nothing ({out} is as it was); run the command "
        "again to export"]
    assert list(tmp_path.iterdir()) == []


def test_a_signal_re_raised_as_another_error_still_ends_as_an_interruption(tmp_path):
    """A SIGTERM that arrives inside `torch.jit.trace` reaches the CLI as optimum-intel's RuntimeError ("Couldn't
    get TorchScript module by tracing"): still one interrupted line and exit status 143, not "could not export".
    In a process of its own, as the CLI runs: the signal is the test's, not the test runner's (a pytest-xdist
    worker that received it crashed)."""
    import textwrap

    code = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        from optimum_shared_graph import cli

        before = signal.getsignal(signal.SIGTERM)
        try:
            with cli._interrupts_fail_in_one_line(Path({str(tmp_path / "out")!r})):
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(5)  # the handler raises at the next bytecode
                except BaseException as err:  # what optimum-intel does with what the trace raised
                    raise RuntimeError("Couldn't get TorchScript module by tracing") from err
        except SystemExit as ended:
            assert signal.getsignal(signal.SIGTERM) == before, "the handler is not the caller's again"
            sys.exit(ended.code)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: interrupted by SIGTERM: the export stopped and wrote nothing"), proc.stderr
