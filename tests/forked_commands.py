"""Commands as processes of their own, forked from a Python process that has already imported the heavy libraries.

A fresh `optimum-cli` pays for importing PyTorch, transformers, optimum-intel, OpenVINO and NNCF before it reads its
first argument: 10 to 16 s of CPU on the project's 2-core hosts, most of a bad-input test. `ForkedCommands` starts one
server process per test process that imports PyTorch, transformers and optimum-intel's exporter (nothing of this
package, so the command's own start-up, the `optimum-cli` hook and the task's registration, runs in every command),
then forks a child per command. The child is a process of its own: its argv, environment, working directory, stdin
from /dev/null, stdout and stderr to files, its exit code (negative for a signal, as `subprocess` reports it),
and the interpreter's exit (an uncaught exception prints its traceback and exits 1, `SystemExit` as the interpreter
reads it, non-daemon threads joined, `atexit` handlers run) without the teardown of every module, the 2.5 s a
process that has imported PyTorch spends after its command here.

Run as a script, this module is the server: one JSON request per line on stdin, one JSON reply per line on stdout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# what a fresh `optimum-cli export openvino` spends most of its start-up importing (13 of its 15 s here), nothing of
# this package: the command's own start-up (the `optimum-cli` hook, this package's registration) runs in every child.
# OpenVINO's telemetry starts a thread of a `ThreadPoolExecutor` as it is imported; a forked child has no copy of it
# (CPython marks it stopped at the fork), so the telemetry events a child submits are queued and dropped.
PRELOADED = ("torch", "transformers.modeling_utils", "optimum.exporters.openvino", "optimum.intel.openvino")


class ForkedCommands:
    """The test process's side: `run(argv, cwd=..., timeout=...)` -> `subprocess.CompletedProcess`."""

    def __init__(self):
        self._lock = threading.Lock()
        self._server = None

    def run(self, argv: list[str], *, cwd: str | os.PathLike | None = None, env: dict | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
        import tempfile

        with self._lock, tempfile.TemporaryDirectory() as tmp:
            server = self._started()
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": [str(a) for a in argv], "cwd": str(cwd or os.getcwd()),
                       "env": dict(os.environ if env is None else env), "stdout": str(out), "stderr": str(err),
                       "timeout": timeout}
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            line = server.stdout.readline()
            if not line:
                self._server = None
                raise RuntimeError(f"the forking server stopped (exit code {server.wait()})")
            reply = json.loads(line)
            stdout, stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
            if reply.get("timeout"):
                raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
            return subprocess.CompletedProcess(argv, reply["returncode"], stdout, stderr)

    def _started(self):
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True)
        return self._server

    def close(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.stdin.close()
            self._server.wait(timeout=30)


def _child(request: dict) -> None:
    """In the forked child: become the command, run it, and exit as the interpreter does."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                            (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
        opened = os.open(path, flags)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)
    try:
        _command(request["argv"])
        code = 0
    except SystemExit as exit_:  # as the interpreter reads it: None is 0, a message is printed and exits 1
        code = 0 if exit_.code is None else exit_.code
        if not isinstance(code, int):
            print(code, file=sys.stderr)
            code = 1
    except BaseException:  # an uncaught exception: its traceback, exit code 1
        sys.excepthook(*sys.exc_info())
        code = 1
    # the interpreter's exit (non-daemon threads joined, `atexit` handlers, streams flushed) without its teardown of
    # every module, which costs a process that has imported PyTorch 2.3 to 2.7 s here after every command
    threading._shutdown()
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _command(argv: list[str]) -> None:
    """`optimum-cli ARGS`, `python -m MODULE ARGS` or `python SCRIPT ARGS`, with sys.argv and sys.path[0] as the
    interpreter sets them (the script's directory, or the working directory for `-m`)."""
    import runpy

    if Path(argv[0]).name == "optimum-cli":  # the console script: `sys.exit(main())`
        from optimum.commands.optimum_cli import main

        sys.path[0], sys.argv = str(Path(argv[0]).parent), argv
        sys.exit(main())
    if argv[1:2] == ["-m"]:
        sys.path[0], sys.argv = os.getcwd(), [argv[2], *argv[3:]]
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.path[0], sys.argv = str(Path(argv[1]).resolve().parent), argv[1:]
        runpy.run_path(argv[1], run_name="__main__")


def _serve() -> None:
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        replies.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request)  # never returns
        deadline, status = time.monotonic() + request["timeout"], None
        while status is None:
            done, code = os.waitpid(pid, os.WNOHANG)
            if done:
                status = {"returncode": os.waitstatus_to_exitcode(code)}
            elif time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                status = {"timeout": True}
            else:
                time.sleep(0.05)
        replies.write(json.dumps(status) + "\n")
        replies.flush()


if __name__ == "__main__":
    _serve()
