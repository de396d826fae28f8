"""Stage 2 beside stage 3: the capture of `generate()` in a process of its own, while optimum-intel converts.

optimum-intel's conversion (its trace, the conversion and the save of the graph) runs on one core most of the
time, and the capture (`decompose.py`: PyTorch's `generate()` with float32 compute) needs the model but nothing
the conversion makes. Where asked (`OPTIMUM_SHARED_GRAPH_OVERLAP=on`, `memory.overlap`), the export starts a child
process when optimum-intel starts loading the model: the child loads it
with the same arguments optimum-intel's load was given (`TasksManager.get_model_from_task`; the weights are
memory-mapped from the same files), runs the same capture and hands it back, while optimum-intel converts in the
export's process. The capture is the same as in the export's process, value for value.

The conversion goes ahead on the assumption that the model gets its shared graph. Where the capture says otherwise
(a fallback, an inner causal LM to export instead), `pipeline/export.py` converts again as it would have; where the
child fails for any other reason (killed, a bug), the capture runs in the export's process on the model
optimum-intel loaded, as without this module. A `SharedGraphError` the child raised is raised in the export.

Measured on 2 cores (docs/export-cost.md), it made the export no faster: the child's start and its compute slow the
conversion down by about what they save. So it runs only when asked, for a machine with cores to spare.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

from ..errors import SharedGraphError


class CaptureBeside:
    """The child process capturing `generate()` on its own load of the model (`start`, then `result`)."""

    def __init__(self, proc: subprocess.Popen, result: Path, log: Path):
        self.proc, self.result_path, self.log = proc, result, log

    @classmethod
    def start(cls, load_args: tuple, load_kwargs: dict, *, model: str, opts, config, staging: Path) -> "CaptureBeside | None":
        """Start the child with optimum-intel's load arguments; None when they cannot be handed over (then the
        capture runs in the export's process)."""
        job, result, log = staging / "capture-job.pickle", staging / "capture.pickle", staging / "capture.log"
        try:
            job.write_bytes(pickle.dumps({"args": load_args, "kwargs": load_kwargs, "model": model, "opts": opts,
                                          "config": config, "inner": str(staging / "inner")}))
        except (pickle.PicklingError, TypeError, AttributeError):
            return None
        env = dict(os.environ, TQDM_DISABLE="1", TOKENIZERS_PARALLELISM="false")
        with open(log, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", __name__, str(job), str(result)], stdin=subprocess.DEVNULL,
                                    stdout=err, stderr=err, env=env)
        return cls(proc, result, log)

    def result(self):
        """Wait for the child; return `(capture, fallback reason, inner model directory)`, or None when it
        failed (the caller captures in its own process). A `SharedGraphError` of the capture is raised."""
        self.proc.wait()
        if self.proc.returncode != 0 or not self.result_path.is_file():
            return None
        answer = pickle.loads(self.result_path.read_bytes())
        if "error" in answer:
            raise answer["error"]
        return answer["capture"], answer["reason"], answer["inner"]

    def close(self) -> None:
        """Stop the child if it still runs (the export failed or finished without it)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _child(job_path: str, result_path: str) -> int:
    """The child: optimum-intel's load of the model, the capture (`decompose.decompose_model`), the answer pickled
    into `result_path` (written whole, then renamed)."""
    from optimum.exporters.tasks import TasksManager

    from .decompose import decompose_model, release_pytorch, save_exported_model

    # torch's own thread count, as in the export's process: the same count gives the same logits, bit for bit
    job = pickle.loads(Path(job_path).read_bytes())
    pt_model = TasksManager.get_model_from_task(*job["args"], **job["kwargs"])
    pt_model.eval()
    opts = job["opts"]
    try:
        capture, reason = decompose_model(pt_model, job["model"], opts, job["config"])
        inner = None
        if capture is not None and capture.module is not None:  # generate() drives an inner causal LM: save it
            inner = str(save_exported_model(capture, job["model"], Path(job["inner"]),
                                            trust_remote_code=opts.trust_remote_code))
        release_pytorch(capture)
        if capture is not None:
            capture.beside = True
        answer = {"capture": capture, "reason": reason, "inner": inner}
    except SharedGraphError as err:
        answer = {"error": err}
    partial = Path(result_path + ".partial")
    partial.write_bytes(pickle.dumps(answer))
    os.replace(partial, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(_child(*sys.argv[1:3]))
