"""Run a measured step in a child process: its wall time, its own peak memory, its JSON answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent


def child_env() -> dict[str, str]:
    """The environment of every child: the project root first on the path (its optimum-cli hook
    imports from there), no telemetry, no progress bars in the children."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), env.get("PYTHONPATH", "")) if p)
    env.setdefault("OPENVINO_TELEMETRY_OPTOUT", "1")
    env["TQDM_DISABLE"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


@dataclass
class ChildResult:
    returncode: int
    wall_s: float
    peak_rss_mb: float
    stdout: str
    stderr: str
    peak_anon_mb: float = float("nan")  # anonymous memory (RssAnon, sampled every 50 ms): not file pages
    peak_pss_mb: float = float("nan")  # the tree's PSS (shared pages counted once), sampled every 250 ms

    def json(self) -> dict:
        """The last line of stdout that parses as JSON."""
        for line in reversed(self.stdout.strip().splitlines()):
            if line.startswith("{"):
                return json.loads(line)
        raise ValueError(f"no JSON answer from the child; stderr tail:\n{self.stderr[-2000:]}")

    def error_line(self) -> str:
        for line in reversed(self.stderr.strip().splitlines()):
            if line.strip() and not line.startswith((" ", "\t")) and "Warning" not in line:
                return line.strip()[:300]
        return f"exit code {self.returncode}"


def run_child(args: list[str], *, timeout: float = 3600, log: Path | None = None) -> ChildResult:
    """Run `args` and reap it with `os.wait4`, which gives this child's own peak RSS (ru_maxrss)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(args, stdout=out, stderr=err, text=True, env=child_env())
        deadline = start + timeout
        peak_anon = peak_pss = float("nan")
        tick = 0
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            anon = _rss_anon_mb(proc.pid)
            if anon == anon:
                peak_anon = anon if peak_anon != peak_anon else max(peak_anon, anon)
            if tick % 5 == 0 and (pss := pss_mb(proc.pid)) == pss:
                peak_pss = pss if peak_pss != peak_pss else max(peak_pss, pss)
            tick += 1
            if time.perf_counter() > deadline:
                proc.kill()
            time.sleep(0.05)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not wait for it again
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(args)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
    return ChildResult(proc.returncode, wall, rusage.ru_maxrss / 1024, stdout, stderr, peak_anon, peak_pss)


def tree(pid: int) -> list[int]:
    """`pid` and every process below it (an export's capture beside its conversion, optimum-cli's children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # exited meanwhile
            pass
    return found


def status_of(pid: int, field: str) -> float:
    """A memory field (`VmRSS`, `RssAnon`, ...) of a running process's /proc/PID/status, in MB (NaN once it exited)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def _rss_anon_mb(pid: int) -> float:
    """A running process's anonymous resident memory (heap, copies of weights): what file pages are not. (Summed
    over a tree it would count a forked child's copy-on-write pages twice: `pss_anon_mb` is the tree's figure.)"""
    return status_of(pid, "RssAnon")


def pss_anon_mb(pid: int) -> float:
    """A running process's share of anonymous memory (`Pss_Anon`): summed over a tree, a forked child's
    copy-on-write pages count once (optimum-cli forks)."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss_Anon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return float("nan")
    return _rss_anon_mb(pid)


def pss_mb(pid: int) -> float:
    """The proportional set size of a running process and every process below it, summed: resident memory with
    each page shared between them (the memory-mapped weights two processes read) counted once."""
    total, seen = 0.0, False
    for p in tree(pid):
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total, seen = total + int(line.split()[1]) / 1024, True
        except OSError:
            pass
    return total if seen else float("nan")


def status_mb(field: str) -> float:
    """A memory field of this process's /proc/self/status (`VmRSS`, `VmHWM`, `RssAnon`, ...), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(f"{field} is not in /proc/self/status")


def own_rss_mb() -> float:
    """This process's resident memory now: the floor of every child's ru_maxrss (it is counted before exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def python(script: str, *args: str) -> list[str]:
    return [sys.executable, str(HERE / script), *args]
