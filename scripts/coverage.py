"""Architecture coverage of `--task text-generation-shared`: one row per model type, written to docs/architectures.md.

For every model type optimum-intel exports as `text-generation-with-past`
(`optimum_shared_graph.supported_model_types()`) that transformers can build from a configuration,
and every multimodal model type published as a `*ForConditionalGeneration` only (`testing.MULTIMODAL`, exported as
its language model, in a section of its own), this builds a tiny decisive random-init model
(`optimum_shared_graph.testing`), exports it with
`optimum-cli export openvino --task text-generation-shared` (dynamic, and static with C = 1 when
the installed version has `--shape-mode static`), and checks greedy generation against PyTorch
through `OVModelForCausalLM` and OpenVINO GenAI's `LLMPipeline`.

Each model type runs in its own subprocess (`nice -n 10`, with a timeout), so one crash or hang
costs one row, not the sweep. Nothing is downloaded.

Usage (from the repository root):

    PYTHONPATH=. python scripts/coverage.py                      # every type -> docs/architectures.md
    PYTHONPATH=. python scripts/coverage.py --types llama gemma2 --output /tmp/cov.md
    PYTHONPATH=. /tmp/venv457/bin/python scripts/coverage.py --output /tmp/cov-457.md
    PYTHONPATH=. python scripts/coverage.py --update-multimodal   # only the multimodal section of docs/architectures.md

The NPU column at released width (GenAI's NPU pipeline partitions by size and by repeated blocks, kept from 5
repeats: the tiny 2-layer models' NPU result does not predict a released checkpoint's): `--npu-only` builds each type with its released
checkpoint's widths and 6 layers (`optimum_shared_graph/released.py`), exports it as `text-generation-shared` and as
optimum-intel's `text-generation-with-past` (fp16 weights), runs both through the NPU pipeline and merges the
results into a JSON file (the types run replace their rows, so it can be filled in several runs); the sweep and
`--render-only` with `--npu-results FILE` take the NPU column from it (and skip the tiny models' NPU check):

    PYTHONPATH=. python scripts/coverage.py --npu-only --jobs 2 --npu-results docs/npu-real-width.json --types qwen3 llama
    PYTHONPATH=. python scripts/coverage.py --npu-results docs/npu-real-width.json
    PYTHONPATH=. python scripts/coverage.py --render-only results.json --npu-results docs/npu-real-width.json
    PYTHONPATH=. python scripts/coverage.py --splice-npu --npu-results docs/npu-real-width.json   # NPU cells only

The vision-language section (`--task image-text-to-text-shared`, every type `architectures.supported_vlm_types()`
returns, `--types` to choose): `--vlm` builds each tiny checkpoint with its processor, exports it, runs `validate`
through `optimum-vlm` and `genai-vlm` under f32 and default properties and `genai-vlm` on GenAI's NPU pipeline
(NPUW, its partitions on the CPU), and optimum-intel's own `image-text-to-text` export beside it, each a command of its own, merges the rows into `--vlm-results` (default docs/vlm-coverage.json)
and replaces only that section of the page (a full sweep keeps the section it finds); `--render-only FILE`
re-renders it from the JSON:

    PYTHONPATH=. python scripts/coverage.py --vlm --jobs 1
    PYTHONPATH=. python scripts/coverage.py --vlm --render-only docs/vlm-coverage.json

`--vlm --npu-only` adds the NPU column at released widths: each type of `released.RELEASED_MULTIMODAL` (Gemma 3 4B,
Qwen3.5-4B) built with its vision tower and processor whole and 6 text layers (`--npu-layers N` for more), exported
with `--weight-format fp16` and run through GenAI's NPU pipeline, one type at a time, into the same results file:

    PYTHONPATH=. python scripts/coverage.py --vlm --npu-only

`--jobs` runs that many model types at once (default 2), `--timeout` bounds each one (seconds),
`--no-static` skips the static export (for quick comparisons, e.g. between transformers versions).
The representative subset CI runs is `tests/test_coverage.py` (`pytest -m coverage`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from optimum_shared_graph.testing import NPU_ON_CPU

ROOT = Path(__file__).resolve().parent.parent
NEW_TOKENS = 12
PROMPTS = ["hello", "The quick brown fox jumps over the lazy dog"]
EXACT = {"KV_CACHE_PRECISION": "f32", "INFERENCE_PRECISION_HINT": "f32"}
# GenAI's NPU pipeline (NPUW) with its partitions run on the CPU: the code path an NPU takes, runnable anywhere.
NO_COMPARISON = "no optimum-intel artifact to compare (its export fails here)"
RUNS_ALONE = "runs where optimum-intel's artifact fails"  # a cell where NPUW runs ours, with a difference, and not theirs
# A cell where NPUW runs both artifacts and both differ from PyTorch, at different steps: not worse than optimum-intel's.
BOTH_DIFFER = "both artifacts differ from PyTorch, at different steps"
NPUW = {**NPU_ON_CPU, "MAX_PROMPT_LEN": 64, "MIN_RESPONSE_LEN": 64}  # f16 compute, as an NPU
# Where NPUW fails on this package's artifact, it is run again without its function folding (repeated blocks compiled
# once), a property a user can pass: a cell where that runs ours and optimum-intel's runs in neither way.
UNFOLDED = {"NPUW_FOLD": "NO"}
RUNS_UNFOLDED = "runs with NPUW_FOLD=NO where optimum-intel's artifact fails"

# GenAI's cell when only its default PagedAttention rewrite differs: the graph as exported, run by GenAI's SDPA
# backend, has parity (counted as parity, and the headline says how many).
SDPA_PARITY = "parity with ATTENTION_BACKEND=SDPA (the graph as exported)"

# Sorted by what a reader wants first: exported with full parity, then partial, then refused.
PASS, PARTIAL, REFUSED, NOT_BUILDABLE = "exported, parity", "exported, partial", "refused", "not buildable"


# ----------------------------------------------------------------------------------------------
# One model type (runs in its own subprocess)
# ----------------------------------------------------------------------------------------------


def _first_line(text: str) -> str:
    text = str(text).strip()
    return text.splitlines()[0][:300] if text else ""


def _ov_reason(err: BaseException) -> str:
    """An OpenVINO exception's own message: its lines after the `Exception from <source file>` ones."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(("Exception from ", "Check '")) and not ln.endswith(":")]
    return f"{type(err).__name__}: {(said or lines or [''])[0][:300]}"


def _cli(args: list[str]) -> tuple[int, str]:
    """Run `optimum-cli ARGS` in this process (same code path as the command) -> (exit code, stderr)."""
    from optimum.commands.optimum_cli import main

    buf = io.StringIO()

    class Tee(io.TextIOBase):
        def write(self, s):
            buf.write(s)
            return sys.__stderr__.write(s)

        def flush(self):
            sys.__stderr__.flush()

    saved = sys.argv
    sys.argv = ["optimum-cli", *args]
    code = 0
    try:
        with contextlib.redirect_stderr(Tee()):
            main()
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    except BaseException as err:  # noqa: BLE001 - a crash is a row in the table
        from optimum_shared_graph import SharedGraphError

        text = str(err) if isinstance(err, SharedGraphError) else f"{type(err).__name__}: {_first_line(err)}"
        buf.write(f"error: {text}{_root_cause(err)}\n")
        code = 1
    finally:
        sys.argv = saved
    return code, buf.getvalue()


def _root_cause(err: BaseException) -> str:
    """What a vague tracing error hides: the message of the exception TorchScript tracing hit."""
    cause = err.__cause__
    while cause is not None:
        text = str(cause)
        if "Exception:" in text:
            detail = text.split("Exception:", 1)[1].strip().splitlines()
            return f" (tracing: {detail[0][:200]})" if detail else ""
        cause = cause.__cause__
    return ""


def _error_line(stderr: str) -> str:
    lines = [line[len("error: "):] for line in stderr.splitlines() if line.startswith("error: ")]
    if lines:
        return lines[-1]
    tail = [line for line in stderr.splitlines() if line.strip()]
    return tail[-1][:300] if tail else "failed without a message"


def _near_tie(scores, step: int) -> str:
    """PyTorch's own top-2 margin at a generation step: the evidence that a flip is a rounding near-tie."""
    import torch

    logits = scores[step][0].float()
    top = torch.topk(logits, 2).values
    margin = float(top[0] - top[1])
    scale = float(logits[torch.isfinite(logits)].abs().max())  # processors mask some tokens with -inf
    return f"PyTorch top-2 margin {margin:.2e} at step {step} (max |logit| {scale:.2f}, relative {margin / max(scale, 1):.1e})"


def _pt_greedy(model, enc):
    out = model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                         pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    return out.sequences, out.scores


def _compare(name: str, ref, scores, ours, prompt_len: int) -> str | None:
    """None if equal, else one line naming the first differing step and PyTorch's margin there."""
    ref_new = [int(t) for t in ref[0, prompt_len:]]
    ours_new = [int(t) for t in ours][: len(ref_new)]
    if ref_new == ours_new:
        return None
    step = next((i for i, (a, b) in enumerate(zip(ref_new, ours_new)) if a != b), min(len(ref_new), len(ours_new)))
    return f"{name}: token {step} differs (PyTorch {ref_new[step]}, OpenVINO {ours_new[step] if step < len(ours_new) else '-'}); {_near_tie(scores, step)}"


def _check_runtimes(model_dir: Path, out: Path, result: dict, *, multimodal: bool = False) -> list:
    """Greedy parity of the dynamic artifact through OVModelForCausalLM and GenAI; returns PyTorch's references
    (for a multimodal checkpoint, its own `generate()` on the text prompts)."""
    import torch
    from optimum.intel import OVModelForCausalLM
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    auto = AutoModelForImageTextToText if multimodal else AutoModelForCausalLM
    pt = auto.from_pretrained(model_dir, dtype=torch.float32).eval()
    refs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            enc = tok([prompt], return_tensors="pt")
            refs.append((enc, *_pt_greedy(pt, enc)))

    try:
        model = OVModelForCausalLM.from_pretrained(out, ov_config=EXACT)
        problems = []
        for enc, ref, scores in refs:
            seq = model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
            problem = _compare("OVModelForCausalLM", ref, scores, seq[0, enc["input_ids"].shape[1]:], enc["input_ids"].shape[1])
            if problem:
                problems.append(problem)
        result["ovmodel"] = "parity" if not problems else problems[0]
        del model
    except Exception as err:  # noqa: BLE001
        result["ovmodel"] = f"OVModelForCausalLM failed: {type(err).__name__}: {_first_line(err)}"

    try:
        problem = _genai_problem(out, refs, "GenAI")
        result["genai"] = problem or "parity"
        if problem:  # tell GenAI's default PagedAttention backend apart from the graph as exported:
            # ATTENTION_BACKEND="SDPA" runs the stateful graph as exported, without GenAI's rewrite
            sdpa = _genai_problem(out, refs, "GenAI (SDPA backend)", ATTENTION_BACKEND="SDPA")
            result["genai_sdpa_parity"] = sdpa is None
            result["genai"] = (f"{SDPA_PARITY}; default PagedAttention backend: {problem}" if sdpa is None
                               else f"{problem}; {sdpa}")
    except Exception as err:  # noqa: BLE001
        result["genai"] = f"GenAI failed: {type(err).__name__}: {_first_line(err)}"
    return refs


def _genai_tokens(artifact: Path, refs: list, device: str, **properties) -> list[list[int]]:
    """Greedy tokens of each reference prompt through GenAI's `LLMPipeline` on `device` with `properties`."""
    import openvino as ov
    import openvino_genai as ov_genai

    pipe = ov_genai.LLMPipeline(str(artifact), device, **properties)
    config = ov_genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, ignore_eos=True)
    tokens = []
    for enc, _, _ in refs:
        inputs = ov_genai.TokenizedInputs(ov.Tensor(enc["input_ids"].numpy()), ov.Tensor(enc["attention_mask"].numpy()))
        tokens.append(list(pipe.generate(inputs, config).tokens[0]))
    return tokens


def _differences(label: str, refs: list, tokens: list[list[int]]) -> list[str]:
    """Where each prompt's `tokens` differ from PyTorch's reference (with PyTorch's margin), in order."""
    found = (_compare(label, ref, scores, toks, enc["input_ids"].shape[1]) for (enc, ref, scores), toks in zip(refs, tokens))
    return [problem for problem in found if problem]


def _genai_problem(out: Path, refs: list, label: str, **properties) -> str | None:
    """Greedy generation through GenAI's `LLMPipeline` (f32, plus `properties`) against PyTorch's
    references: the first difference, or None."""
    return next(iter(_differences(label, refs, _genai_tokens(out, refs, "CPU", **EXACT, **properties))), None)


def _npu_attempt(artifact: Path, refs: list, **extra):
    """Greedy tokens of `artifact` through the NPU pipeline (`NPUW`, then `extra`), or None and the error's own message.

    The pipeline runs in a process of its own: where NPUW reads a size it never set (granitemoe's folded graph), it
    raises, or allocates until the kernel kills the process, which then ends this attempt, not the type's run."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(_genai_tokens, artifact, refs, "NPU", **{**NPUW, **extra}).result(), None
        except BrokenProcessPool:
            return None, "the NPU pipeline's process died (killed by the kernel: out of memory, or crashed)"
        except Exception as err:  # noqa: BLE001
            return None, re.sub(r"_\d+", "_N", _ov_reason(err))


def _npu_problem(refs: list, tokens, error: str | None) -> str | None:
    """An NPU attempt's problem: its error, else the first greedy difference from PyTorch's `refs`, else None."""
    return error or next(iter(_differences("NPUW", refs, tokens)), None)


def npu_verdict(refs: list, ours, our_error: str | None, theirs=None, their_error: str | None = None, *,
                theirs_exported: bool = True, their_export_error: str = "", unfolded=None) -> str:
    """The NPU pipeline's cell: the shared artifact's greedy tokens (`ours`, or `our_error`) against PyTorch's,
    judged against optimum-intel's own artifact of the same model (`theirs` / `their_error`; NPUW computes in
    f16: a difference both artifacts share is NPUW's). `unfolded`: where both failed, the (tokens, error) of each
    artifact run again with `UNFOLDED`, as `((ours, our_error), (theirs, their_error))`."""
    if our_error and their_error and unfolded is not None:
        (ours_u, our_error_u), (theirs_u, their_error_u) = unfolded
        if our_error_u is None and their_error_u is not None:
            return (f"{RUNS_UNFOLDED} ({their_error_u}): {_npu_problem(refs, ours_u, None) or 'parity'}; with NPUW's default "
                    f"folding: {our_error}")
    problem = _npu_problem(refs, ours, our_error)
    if not theirs_exported:
        detail = f" ({their_export_error})" if their_export_error else ""
        return "parity" if problem is None else f"{NO_COMPARISON}{detail}: {problem}"
    their_problem = _npu_problem(refs, theirs, their_error)
    if problem is None:
        return "parity" if their_problem is None else f"parity (optimum-intel's artifact: {their_problem})"
    if our_error:
        if their_error == our_error:
            return f"NPUW runs neither artifact (optimum-intel's fails the same way): {our_error}"
        if their_error:
            return f"NPUW runs neither artifact (optimum-intel's fails otherwise: {their_error}): {our_error}"
        return f"failed: {our_error}" + (f" (optimum-intel's artifact: {their_problem or 'parity'})")
    if their_error:
        return f"{RUNS_ALONE} ({their_error}): {problem}"
    if theirs == ours:
        return f"as optimum-intel's artifact, token for token (NPUW's f16): {problem}"
    if their_problem is not None:
        return f"{BOTH_DIFFER}: this package's: {problem}; optimum-intel's: {their_problem}"
    return f"differs from optimum-intel's artifact: {problem}"


def _npu(model_dir: Path, workdir: Path, out: Path, refs: list) -> str:
    """The shared artifact through the NPU pipeline, judged against optimum-intel's own artifact of the same
    model in the same run (NPUW computes in f16: a difference both artifacts share is NPUW's)."""
    ours, our_error = _npu_attempt(out, refs)
    if our_error is None and not _differences("NPUW", refs, ours):
        return "parity"  # nothing to judge: optimum-intel's artifact is exported only when ours falls short
    theirs_dir = workdir / "with-past"
    code, _ = _cli(["export", "openvino", "-m", str(model_dir), "--task", "text-generation-with-past", str(theirs_dir)])
    if code != 0:  # optimum-intel cannot export it here (e.g. its transformers version cap): nothing to compare
        return npu_verdict(refs, ours, our_error, theirs_exported=False)
    theirs, their_error = _npu_attempt(theirs_dir, refs)
    return npu_verdict(refs, ours, our_error, theirs, their_error)


# ----------------------------------------------------------------------------------------------
# The NPU pipeline at released width (`--npu-only`): one model type, in its own subprocess
# ----------------------------------------------------------------------------------------------

# Both artifacts are exported with fp16 weights (the released checkpoints' own precision; optimum-intel
# would otherwise compress a model over 1 B parameters to int8 by default).
NPU_WEIGHT_FORMAT = "fp16"
NOT_AT_REAL_WIDTH = "not measured at real width"


def _pt_refs(model_dir: Path) -> list:
    """PyTorch's greedy references (f32 compute on the saved fp16 weights) for the prompts, the model freed."""
    import gc

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    pt = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    refs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            enc = tok([prompt], return_tensors="pt")
            refs.append((enc, *_pt_greedy(pt, enc)))
    del pt
    gc.collect()
    return refs


# Measured: NPUW's compile (on the CPU) of qwen3_moe at released width (6 layers, 16 experts of 768, 1.2 B
# parameters) reached 17.8 GB of anonymous memory before the kernel's OOM killer stopped it: about 15 bytes per
# parameter for a mixture of experts. Dense models of 1.6 B parameters ran on the same machine.
MOE_BYTES_PER_PARAMETER = 15


def _npu_memory_refusal(model_type: str, layers: int | None) -> str | None:
    """Why a mixture of experts is not run here (its estimated NPUW peak above the memory available), or None."""
    import torch
    from transformers import AutoModelForCausalLM

    from optimum_shared_graph.pipeline.memory import available_memory
    from optimum_shared_graph.released import released_width_config, widths

    config = released_width_config(model_type, **({"num_hidden_layers": layers} if layers else {}))
    if not widths(config).get("experts"):
        return None
    with torch.device("meta"):
        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    need, have = parameters * MOE_BYTES_PER_PARAMETER, available_memory().available
    if need < have:
        return None
    return (f"not run here: a mixture of experts of {parameters / 1e9:.1f} B parameters would need about "
            f"{need / 2**30:.0f} GiB to compile through NPUW ({MOE_BYTES_PER_PARAMETER} bytes per parameter, measured on "
            f"qwen3_moe), {have / 2**30:.0f} GiB available")


def run_npu_one(model_type: str, workdir: Path, layers: int | None = None) -> dict:
    """Build `model_type` at its released checkpoint's widths (few layers), export it twice (this task's
    `text-generation-shared` and optimum-intel's `text-generation-with-past`, fp16 weights), run the greedy
    check through the NPU pipeline on both and judge ours against theirs: one result of the NPU column."""
    import shutil

    from optimum_shared_graph.released import build_released_width_model, released_checkpoint, widths

    result: dict = {"model_type": model_type, "checkpoint": released_checkpoint(model_type),
                    "weight_format": NPU_WEIGHT_FORMAT, "commit": _commit(), "npuw": NPUW}
    started = time.monotonic()
    seconds = result["seconds"] = {}

    def lap(name: str, t0: float) -> None:
        seconds[name] = round(time.monotonic() - t0, 1)

    too_big = _npu_memory_refusal(model_type, layers)
    if too_big:
        result["npu"] = too_big
        return result
    model_dir = workdir / "model"
    t0 = time.monotonic()
    try:
        config = build_released_width_model(model_type, model_dir, **({"num_hidden_layers": layers} if layers else {}))
    except Exception as err:  # noqa: BLE001
        result["npu"] = f"released-width model build failed: {type(err).__name__}: {_first_line(err)}"
        return result
    result["widths"] = widths(config)
    lap("build", t0)
    t0 = time.monotonic()
    refs = _pt_refs(model_dir)
    lap("pytorch", t0)

    ours_dir, theirs_dir = workdir / "shared", workdir / "with-past"
    os.environ["OPTIMUM_SHARED_GRAPH_DEBUG"] = "1"
    t0 = time.monotonic()
    code, stderr = _cli(["export", "openvino", "-m", str(model_dir), "--task", "text-generation-shared",
                         "--weight-format", NPU_WEIGHT_FORMAT, str(ours_dir)])
    lap("export_shared", t0)
    if code != 0:
        result["npu"] = f"{EXPORT_REFUSED_AT_REAL_WIDTH}: {_error_line(stderr)}"
        result["seconds"]["total"] = round(time.monotonic() - started, 1)
        return result
    validation = json.loads((ours_dir / "shared_graph.json").read_text()).get("validation", {})
    result["validation"] = {k: validation.get(k) for k in ("status", "max_abs_diff_prefill", "max_abs_diff_decode")}
    t0 = time.monotonic()
    ours, our_error = _npu_attempt(ours_dir, refs)
    lap("npu_shared", t0)
    ours_unfolded = _npu_attempt(ours_dir, refs, **UNFOLDED) if our_error else None
    shutil.rmtree(ours_dir, ignore_errors=True)

    t0 = time.monotonic()
    code, stderr = _cli(["export", "openvino", "-m", str(model_dir), "--task", "text-generation-with-past",
                         "--weight-format", NPU_WEIGHT_FORMAT, str(theirs_dir)])
    lap("export_with_past", t0)
    theirs = their_error = theirs_unfolded = None
    if code == 0:
        t0 = time.monotonic()
        theirs, their_error = _npu_attempt(theirs_dir, refs)
        lap("npu_with_past", t0)
        theirs_unfolded = _npu_attempt(theirs_dir, refs, **UNFOLDED) if their_error and ours_unfolded else None
        shutil.rmtree(theirs_dir, ignore_errors=True)
    result["npu_shared"] = _npu_problem(refs, ours, our_error) or "parity"
    result["npu_with_past"] = (_npu_problem(refs, theirs, their_error) or "parity"
                               ) if code == 0 else f"export failed: {_error_line(stderr)}"
    unfolded = (ours_unfolded, theirs_unfolded) if ours_unfolded and theirs_unfolded else None
    if unfolded:
        result["npu_unfolded"] = {"shared": _npu_problem(refs, *ours_unfolded) or "parity",
                                  "with_past": _npu_problem(refs, *theirs_unfolded) or "parity"}
    result["npu"] = npu_verdict(refs, ours, our_error, theirs, their_error, theirs_exported=code == 0, unfolded=unfolded)
    seconds["total"] = round(time.monotonic() - started, 1)
    return result


# ----------------------------------------------------------------------------------------------
# Vision-language models (`--vlm`): `--task image-text-to-text-shared`, one model type in its own subprocess
# ----------------------------------------------------------------------------------------------

VLM_HEADING = "## Vision-language models: image-text-to-text-shared"
# (consumer, label of the properties, the properties): what `validate` is run with on each artifact, on the CPU but for
# the labels of `VLM_DEVICES`: "NPU" is GenAI's VLMPipeline on its NPU pipeline (NPUW) with its partitions compiled for
# the CPU (`testing.NPU_ON_CPU`), the code path an NPU takes, runnable anywhere
VLM_VALIDATIONS = [("optimum-vlm", "f32", EXACT), ("genai-vlm", "f32", EXACT),
                   ("optimum-vlm", "default", {}), ("genai-vlm", "default", {}), ("genai-vlm", "NPU", NPU_ON_CPU)]
VLM_DEVICES = {"NPU": "NPU"}
VLM_STEP_TIMEOUT = 900  # seconds for each command of a type (export, validate), within the type's own --timeout


def _optimum_cli() -> str:
    beside = Path(sys.executable).parent / "optimum-cli"
    return str(beside) if beside.exists() else "optimum-cli"


def _exception_line(stderr: str) -> str:
    """A failed command's first error line: its `error: ` line, else the exception a traceback ends with."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line[len("error: "):] for line in lines if line.startswith("error: ")]
    if said:
        return said[0][:300]
    raised = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b:?", line)]
    if raised:
        return raised[-1][:300]
    return lines[-1][:300] if lines else "failed without a message"


def _command(cmd: list[str], timeout: int = VLM_STEP_TIMEOUT) -> tuple[int, str, str, float]:
    """Run `cmd` (this process's environment) -> (exit code, stdout, stderr, seconds); a timeout is exit code -1."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "", f"error: timed out after {timeout} s", round(time.monotonic() - t0, 1)
    return proc.returncode, proc.stdout, proc.stderr, round(time.monotonic() - t0, 1)


VLM_REPORT_KEYS = ("consumer", "rule", "terms", "tolerance", "max_abs_diff_prefill", "max_abs_diff_decode",
                   "top1_agreement", "greedy_tokens", "compared_tokens", "restarts", "differing_steps", "not_compared",
                   "error")


def _validate_cell(report: dict) -> str:
    """A passing `validate --json` report in a few words: its figures, its near-ties, the calls it did not compare."""
    if "max_abs_diff_prefill" in report:
        text = (f"passed, max |dlogits| {max(report['max_abs_diff_prefill'], report['max_abs_diff_decode']):.1e} "
                f"(tolerance {report['tolerance']:.2g})")
    else:
        compared = report.get("compared_tokens") or []
        text = f"passed, {sum(compared)} of {report.get('greedy_tokens')} tokens compared"
    ties = [d for d in report.get("differing_steps") or [] if d.get("near_tie")]
    if ties:
        text += (f", {len(ties)} near-tie{'s' if len(ties) > 1 else ''} (token "
                 + ", ".join(f"{d['step']}: PyTorch's margin {d['margin']:.2g}" for d in ties[:3]) + ")")
    for skipped in (report.get("not_compared") or [])[:1]:
        text += f"; from token {skipped['from_step']} not compared: {skipped['reason']}"
    return text


def _vlm_built_and_exported(build, model_dir: Path, out: Path, seconds: dict, *flags: str) -> str | None:
    """`build()` the checkpoint into `model_dir`, then `optimum-cli export openvino --task image-text-to-text-shared
    [flags] out`, each timed into `seconds` -> None, or why there is no artifact (a line for the table)."""
    t0 = time.monotonic()
    try:
        build()
    except Exception as err:  # noqa: BLE001
        return f"checkpoint build failed: {type(err).__name__}: {_first_line(err)}"
    seconds["build"] = round(time.monotonic() - t0, 1)
    code, _, stderr, seconds["export"] = _command(
        [_optimum_cli(), "export", "openvino", "-m", str(model_dir), "--task", "image-text-to-text-shared", *flags,
         str(out)])
    return None if code == 0 else f"refused: {_exception_line(stderr)}"


def _vlm_validate(out: Path, consumer: str, device: str, properties: dict) -> tuple[str, dict, float]:
    """`validate OUT --consumer C --device D --json -p K=V ...` as a user runs it -> (its cell, the report's
    `VLM_REPORT_KEYS`, seconds)."""
    cmd = [sys.executable, "-m", "optimum_shared_graph", "validate", str(out), "--consumer", consumer, "--json",
           "--device", device] + [a for k, v in properties.items() for a in ("-p", f"{k}={v}")]
    code, stdout, stderr, took = _command(cmd)
    try:  # `--json`: the report on stdout, a failure's too when it has one
        report = json.loads(stdout)
    except ValueError:
        report = {}
    if code != 0:
        cell = f"failed: {_exception_line(stderr)}"
    else:
        try:
            cell = _validate_cell(report)
        except (KeyError, TypeError):
            cell = "passed"
    return cell, {k: report[k] for k in VLM_REPORT_KEYS if k in report}, took


def run_vlm_one(model_type: str, workdir: Path) -> dict:
    """Build `model_type`'s tiny checkpoint with its processor, export it with `--task image-text-to-text-shared`,
    run `validate` through both VLM consumers (f32 and default properties), and export it with optimum-intel's own
    `--task image-text-to-text`: each a command of its own, as a user runs it. One row of the VLM section."""
    import shutil

    import transformers

    from optimum_shared_graph.testing import build_tiny_multimodal

    result: dict = {"model_type": model_type, "transformers": transformers.__version__}
    started = time.monotonic()
    seconds = result["seconds"] = {}
    model_dir, out, theirs = workdir / "model", workdir / "shared", workdir / "image-text-to-text"
    why = _vlm_built_and_exported(lambda: build_tiny_multimodal(model_type, model_dir, processor=True), model_dir, out,
                                  seconds)
    if why:
        result["export"] = why
        if "build" not in seconds:  # no checkpoint: nothing for optimum-intel to export either
            return result
    else:
        manifest = json.loads((out / "shared_graph.json").read_text())
        validation = manifest.get("validation") or {}
        result["validation"] = {k: validation.get(k) for k in ("status", "greedy_match", "max_abs_diff_prefill",
                                                               "max_abs_diff_decode", "tolerance")}
        result["validation"]["max_abs_diff_image_embeds"] = (validation.get("vision") or {}).get("max_abs_diff_image_embeds")
        result["graphs"] = sorted(p.name for p in out.glob("openvino_*.xml") if "tokenizer" not in p.name)
        result["fixes"] = [f["fix"] for f in (manifest.get("model") or {}).get("fixes", [])]
        result["export"] = "passed" if validation.get("status") == "passed" else f"validation {validation.get('status')}"
        for consumer, label, properties in VLM_VALIDATIONS:
            name = f"{consumer} {label}"
            result[name], result.setdefault("reports", {})[name], seconds[name] = _vlm_validate(
                out, consumer, VLM_DEVICES.get(label, "CPU"), properties)

    code, _, stderr, seconds["image-text-to-text"] = _command(
        [_optimum_cli(), "export", "openvino", "-m", str(model_dir), "--task", "image-text-to-text", str(theirs)])
    result["image-text-to-text"] = "exported" if code == 0 else f"fails: {_exception_line(stderr)}"
    shutil.rmtree(theirs, ignore_errors=True)
    seconds["total"] = round(time.monotonic() - started, 1)
    return result


VLM_NPU_LAYERS = 6  # text layers at released widths: NPUW keeps a repeated block from 5 repeats


def run_vlm_npu_one(model_type: str, workdir: Path, layers: int | None = None) -> dict:
    """Build `model_type`'s checkpoint at its released widths (`released.RELEASED_MULTIMODAL`: the vision tower and
    processor whole, `layers` text layers), export it with `--task image-text-to-text-shared --weight-format fp16`
    and run `validate --consumer genai-vlm --device NPU` on GenAI's NPU pipeline, its partitions on the CPU: the
    released-width cell of the VLM section's NPU column."""
    import transformers

    from optimum_shared_graph.released import build_released_multimodal

    layers = layers or VLM_NPU_LAYERS
    result: dict = {"model_type": model_type, "transformers": transformers.__version__, "layers": layers}
    seconds = result["seconds"] = {}
    started = time.monotonic()
    model_dir, out = workdir / "model", workdir / "shared"
    why = _vlm_built_and_exported(lambda: build_released_multimodal(model_type, model_dir, layers=layers), model_dir,
                                  out, seconds, "--weight-format", NPU_WEIGHT_FORMAT)
    if why:
        result["npu"] = f"at released widths: {why}"
    else:
        result["npu"], result["report"], seconds["genai-vlm NPU"] = _vlm_validate(out, "genai-vlm", "NPU", NPU_ON_CPU)
    seconds["total"] = round(time.monotonic() - started, 1)
    return result


def _validation_flip_evidence(model_dir: Path, reason: str) -> str:
    """For an export refused on a greedy flip: PyTorch's top-2 margin at that step of the validation prompt."""
    match = re.search(r"greedy token (\d+) differs", reason)
    if not match:
        return ""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_shared_graph.pipeline.decompose import DEFAULT_PROMPT

    step = int(match.group(1))
    tok = AutoTokenizer.from_pretrained(model_dir)
    pt = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = tok(DEFAULT_PROMPT, return_tensors="pt")["input_ids"][:, :48]
    with torch.no_grad():
        out = pt.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=step + 1,
                          min_new_tokens=step + 1, do_sample=False, pad_token_id=0, output_scores=True,
                          return_dict_in_generate=True)
    return _near_tie(out.scores, step)


def run_one(model_type: str, workdir: Path, *, static: bool = True, npu: bool = True) -> dict:
    """Build, export and check one model type; return its result row as a dict."""
    import transformers

    result: dict = {"model_type": model_type, "transformers": transformers.__version__}
    started = time.monotonic()
    from optimum_shared_graph.testing import MULTIMODAL, build_tiny_model, build_tiny_multimodal, buildable_reason

    multimodal = model_type in MULTIMODAL
    why = None if multimodal else buildable_reason(model_type)
    if why:
        result.update(status=NOT_BUILDABLE, reason=why)
        return result
    model_dir = workdir / "model"
    try:
        (build_tiny_multimodal if multimodal else build_tiny_model)(model_type, model_dir)
    except Exception as err:  # noqa: BLE001
        result.update(status=NOT_BUILDABLE, reason=f"tiny model build failed: {type(err).__name__}: {_first_line(err)}")
        return result

    out = workdir / "dynamic"
    os.environ["OPTIMUM_SHARED_GRAPH_DEBUG"] = "1"  # errors propagate here, with their causes
    t0 = time.monotonic()
    code, stderr = _cli(["export", "openvino", "-m", str(model_dir), "--task", "text-generation-shared", str(out)])
    result["export_seconds"] = round(time.monotonic() - t0, 1)
    if code != 0:
        reason = _error_line(stderr)
        try:
            evidence = _validation_flip_evidence(model_dir, reason)
        except Exception:  # noqa: BLE001
            evidence = ""
        result.update(status=REFUSED, reason=reason + (f" [{evidence}]" if evidence else ""))
        result["static"] = "not tried (dynamic export refused)"
        result["seconds"] = round(time.monotonic() - started, 1)
        return result

    manifest = json.loads((out / "shared_graph.json").read_text())
    graphs = sorted(p.name for p in out.glob("*.xml") if "tokenizer" not in p.name)
    validation = manifest.get("validation", {})
    result["partitioning"] = manifest.get("partitioning")
    result["graphs"] = graphs
    result["validation"] = {k: validation.get(k) for k in ("status", "greedy_match", "max_abs_diff_prefill", "max_abs_diff_decode")}
    result["version_cap"] = "; ".join(n for n in manifest.get("model", {}).get("notes", []) if "caps transformers" in n)
    result["states"] = manifest.get("graph", {}).get("states")
    result["fixes"] = [f["fix"] for f in manifest.get("model", {}).get("fixes", [])]
    result["inputs"] = [i["name"] for i in manifest.get("graph", {}).get("inputs", [])]
    result["exported_model_type"] = manifest.get("model", {}).get("exported_model_type")
    result["left_out"] = sorted(manifest.get("model", {}).get("left_out") or {})
    t0 = time.monotonic()
    refs = _check_runtimes(model_dir, out, result, multimodal=multimodal)
    result["runtimes_seconds"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    result["npu"] = _npu(model_dir, workdir, out, refs) if npu else "not run (--no-npu)"
    result["npu_seconds"] = round(time.monotonic() - t0, 1)
    t0 = time.monotonic()
    result["static"] = _static(model_dir, workdir, refs) if static else "not run (--no-static)"
    result["static_seconds"] = round(time.monotonic() - t0, 1)

    one_graph = manifest.get("partitioning") == "shared" and graphs == ["openvino_model.xml"]
    genai_ok = result["genai"] == "parity" or result.get("genai_sdpa_parity", False)
    ok = one_graph and validation.get("status") == "passed" and result["ovmodel"] == "parity" and genai_ok
    result["status"] = PASS if ok else PARTIAL
    if not ok:
        if not one_graph:
            result["reason"] = f"not one graph: partitioning {manifest.get('partitioning')} ({manifest.get('fallback_reason')})"
        elif validation.get("status") != "passed":
            result["reason"] = f"validation {validation.get('status')}"
        else:
            result["reason"] = result["ovmodel"] if result["ovmodel"] != "parity" else result["genai"]
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def _static(model_dir: Path, workdir: Path, refs: list) -> str:
    """Static export with C = 1: its export validation, then greedy parity through `optimum_shared_graph.runtime()`.

    'not available' when the installed version has no `--shape-mode static`.
    """
    out = workdir / "static"
    code, stderr = _cli(["export", "openvino", "-m", str(model_dir), "--task", "text-generation-shared",
                         "--shape-mode", "static", "--static-query-len", "1", "--max-cache-len", "128",
                         "--disable-convert-tokenizer", str(out)])
    if code != 0:
        line = _error_line(stderr)
        if "not implemented" in line or "invalid choice" in line or "unrecognized arguments" in line:
            return "not available"
        return f"refused: {line}"
    manifest = json.loads((out / "shared_graph.json").read_text())
    status = manifest.get("validation", {}).get("status")
    if status != "passed":
        return f"validation {status}"
    try:
        import optimum_shared_graph as osg

        model = osg.runtime(out, ov_config=EXACT)
        for enc, ref, scores in refs:
            seq = model.generate(**enc, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
            problem = _compare("runtime()", ref, scores, seq[0, enc["input_ids"].shape[1]:], enc["input_ids"].shape[1])
            if problem:
                return problem
    except Exception as err:  # noqa: BLE001
        return f"runtime() failed: {type(err).__name__}: {_first_line(err)}"
    return "parity"


# ----------------------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------------------


def _run_subprocess(model_type: str, timeout: int, python: str, static: bool, npu: bool,
                    real_width: bool = False, layers: int | None = None, vlm: bool = False) -> dict:
    """`run_one(model_type)` (or `run_npu_one` with `real_width`, `run_vlm_one` with `vlm`) in a subprocess of its
    own, bounded by `timeout`."""
    import transformers

    from optimum_shared_graph.testing import MULTIMODAL, buildable_reason

    why = None if model_type in MULTIMODAL or real_width or vlm else buildable_reason(model_type)
    if why:  # no subprocess needed to say so
        return {"model_type": model_type, "transformers": transformers.__version__, "status": NOT_BUILDABLE, "reason": why}
    with tempfile.TemporaryDirectory(prefix=f"osg-cov-{model_type}-") as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = ["nice", "-n", "10", python, str(Path(__file__).resolve()), "--one", model_type,
               "--workdir", tmp, "--result", str(result_file)] + ([] if static else ["--no-static"]) + ([] if npu else ["--no-npu"])
        cmd += (["--npu-only"] + (["--npu-layers", str(layers)] if layers else [])) if real_width else []
        cmd += ["--vlm"] if vlm else []
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
        env.pop("OPTIMUM_SHARED_GRAPH_DEBUG", None)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            if vlm and not real_width:
                return {"model_type": model_type, "export": f"timed out after {timeout} s in the coverage run",
                        "seconds": {"total": timeout}}
            if real_width:
                return {"model_type": model_type, "npu": f"timed out after {timeout} s", "seconds": {"total": timeout}}
            return {"model_type": model_type, "status": REFUSED, "reason": f"timed out after {timeout} s in the coverage run",
                    "seconds": timeout}
        if result_file.is_file():
            return json.loads(result_file.read_text())
        tail = [line for line in (proc.stderr or "").splitlines() if line.strip()]
        crashed = f"worker crashed (exit {proc.returncode}): {tail[-1][:300] if tail else 'no output'}"
        if vlm and not real_width:
            return {"model_type": model_type, "export": crashed, "seconds": {"total": round(time.monotonic() - t0, 1)}}
        if real_width:
            return {"model_type": model_type, "npu": crashed, "seconds": {"total": round(time.monotonic() - t0, 1)}}
        return {"model_type": model_type, "status": REFUSED, "seconds": round(time.monotonic() - t0, 1),
                "reason": crashed}


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def _comparison(results: list[dict], others: list[list[dict]]) -> list[str]:
    """The "choosing the transformers range" section: parity counts per transformers version."""
    runs = [results] + others
    passed = [{r["model_type"] for r in run if r["status"] == PASS} for run in runs]
    version = [next((r.get("transformers") for r in run if r.get("transformers")), "?") for run in runs]
    lines = ["", "## Choosing the transformers range", "",
             "The same sweep (dynamic export, OVModelForCausalLM and GenAI parity) under each transformers version tried:", "",
             "| transformers | exported as one graph with parity | only under this version |", "|---|---|---|"]
    for i, run in enumerate(runs):
        only = sorted(passed[i] - set().union(*(p for j, p in enumerate(passed) if j != i)))
        lines.append(f"| {version[i]}{' (this table)' if i == 0 else ''} | {len(passed[i])} of {len(run)} | "
                     f"{', '.join(only) or '-'} |")
    from packaging.requirements import Requirement

    best = max(len(p) for p in passed)
    winners = [version[i] for i, p in enumerate(passed) if len(p) == best]
    pin = _pinned_transformers()
    admitted = [v for v in winners if pin and Requirement(pin).specifier.contains(v)]
    lines += ["", f"Most model types with parity: transformers {', '.join(winners)} ({best}). `setup.cfg` requires "
              f"`{pin}`, which admits {', '.join(admitted) or 'none of them'}: pip keeps an installed transformers in "
              "that range rather than switching, and each version covers the model types listed as only under it."]
    return lines


MULTIMODAL_HEADING = "## Multimodal checkpoints"


def _is_multimodal(result: dict) -> bool:
    from optimum_shared_graph.testing import MULTIMODAL

    return result["model_type"] in MULTIMODAL


def _row(r: dict, *, exported_as: bool = False) -> str:
    val = r.get("validation") or {}
    if r["status"] in (PASS, PARTIAL):
        export = f"{val.get('status')}, max diff {max(val.get('max_abs_diff_prefill') or 0, val.get('max_abs_diff_decode') or 0):.1e}"
    else:
        export = "-"
    note = r.get("reason") or ""
    if r.get("version_cap"):
        note = (note + "; " if note else "") + r["version_cap"]
    for fix in r.get("fixes") or []:
        note = (note + "; " if note else "") + f"with this package's fix `{fix.replace('.', '/')}.py`"
    if r.get("left_out"):
        note = (note + "; " if note else "") + f"left out: {', '.join(r['left_out'])}"
    exported = f" {_cell(r.get('exported_model_type') or '-')} |" if exported_as else ""
    return (f"| {r['model_type']} |{exported} {r['status']} | {export} | {_cell(r.get('ovmodel', '-'))} | "
            f"{_cell(r.get('genai', '-'))} | {_cell(r.get('static', '-'))} | {_cell(r.get('npu', '-'))} | {_cell(note)} |")


def render_multimodal(results: list[dict], *, versions: dict) -> list[str]:
    """The multimodal checkpoints' section: one row per published multimodal model type run."""
    rows = sorted((r for r in results if _is_multimodal(r)), key=lambda r: r["model_type"])
    if not rows:
        return []
    passed = sum(r["status"] == PASS for r in rows)
    return [
        MULTIMODAL_HEADING, "",
        "Families published as multimodal checkpoints only (a `*ForConditionalGeneration`, the language model's",
        "configuration under `text_config`, a `vision_config` beside it) are exported as their language model, the",
        "vision part left out ([Multimodal checkpoints](multimodal.md)). Each tiny checkpoint is laid out like the",
        "published one (`optimum_shared_graph.testing.MULTIMODAL`: the released configuration's keys, a one-block",
        "vision tower) and gets the checks above, against the multimodal model's own `generate()` on the text prompts.",
        f"Run: transformers {versions.get('transformers')}, optimum-intel {versions.get('optimum-intel')}, "
        f"openvino {versions.get('openvino')}, openvino-genai {versions.get('openvino-genai')}.",
        "",
        f"**{passed} of {len(rows)} published multimodal model types exported as one graph with parity.**",
        "",
        "| model type | exported as | status | export | OVModelForCausalLM | GenAI | static | NPU pipeline | reason / note |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_row(r, exported_as=True) for r in rows),
        "",
    ]


def splice_multimodal(page: str, section: list[str]) -> str:
    """`page` (an earlier full run's) with its multimodal section replaced by `section` (inserted before the
    transformers range section when it had none): the rows of the other model types are kept as that run wrote them."""
    text = "\n".join(section)
    start = page.find(MULTIMODAL_HEADING)
    if start >= 0:
        end = page.find("\n## ", start + len(MULTIMODAL_HEADING))
        return page[:start] + text + ("\n" + page[end + 1:] if end >= 0 else "")
    anchor = page.find("## Choosing the transformers range")
    if anchor < 0:
        return page.rstrip("\n") + "\n\n" + text
    return page[:anchor] + text + "\n" + page[anchor:]


def _vlm_export_cell(r: dict) -> str:
    val = r.get("validation") or {}
    if not val:
        return r.get("export") or "-"
    diff = max(val.get("max_abs_diff_prefill") or 0, val.get("max_abs_diff_decode") or 0)
    return f"{val.get('status')}, max |dlogits| {diff:.1e}"


def _vlm_cell(text: str | None) -> str:
    """A recorded line as the table shows it: the run's temporary artifact path as OUT, an OpenVINO exception's
    source location and an ImportError's module path left out (their messages kept)."""
    text = re.sub(r"/tmp/osg-cov-[^/\s]+/shared\b", "OUT", text or "-")
    text = re.sub(r" \(/\S+\.py\)", "", text)  # an ImportError's path to the installed module
    return _cell(re.sub(r"Exception from \S+:\d+:\s*", "", text))


def _vlm_passed(cell: str | None) -> bool:
    return (cell or "").startswith("passed")


def _released_npu_description(released: dict) -> list[str]:
    """The bullet of the VLM section's released-width NPU column: what was built and run, and where."""
    from optimum_shared_graph.released import RELEASED_MULTIMODAL

    built = "; ".join(f"{t}: {RELEASED_MULTIMODAL[t]['checkpoint'] if t in RELEASED_MULTIMODAL else '?'}, "
                      f"{r.get('layers')} of its {(RELEASED_MULTIMODAL.get(t) or {}).get('layers', '?')} text layers"
                      for t, r in sorted(released.items()))
    runs = sorted({f"{r.get('machine')}, commit {r.get('commit')}" for r in released.values()})
    return ["- **genai-vlm (NPU pipeline, released widths)**: the same check on a random-init checkpoint with the",
            "  released model's widths, its vision tower and processor whole and fewer text layers (NPUW keeps a",
            f"  repeated block from 5 repeats) ({built}; `released.RELEASED_MULTIMODAL`), exported with",
            f"  `--weight-format {NPU_WEIGHT_FORMAT}` (`scripts/coverage.py --vlm --npu-only`; run on "
            + "; ".join(runs) + "); `-` where the package has no released-width entry for the type;"]


def render_vlm(data: dict) -> list[str]:
    """The vision-language section: one row per model type of a `--vlm` run's results (`data`: the JSON it wrote)."""
    rows = sorted(data.get("results") or [], key=lambda r: r["model_type"])
    if not rows:
        return []
    versions = data.get("versions") or {}
    columns = [f"{consumer} {label}" for consumer, label, _ in VLM_VALIDATIONS]
    exported = [r for r in rows if (r.get("validation") or {}).get("status") == "passed"]
    exact = [r for r in exported if all(_vlm_passed(r.get(c)) for c in columns[:2])]
    default = [r for r in exported if all(_vlm_passed(r.get(c)) for c in columns[2:4])]
    npu = [r for r in exported if _vlm_passed(r.get(columns[4]))]
    # the NPU pipeline's properties as the run set them (`testing.NPU_ON_CPU` depends on the host's CPU)
    npu_set = next((v.get("set") or {} for v in data.get("validations") or [] if v.get("properties") == "NPU"),
                   NPU_ON_CPU)
    theirs = [r for r in rows if r.get("image-text-to-text") == "exported"]
    released = data.get("released_npu") or {}  # `--vlm --npu-only`: type -> its released-width result
    released_passed = [t for t, r in released.items() if _vlm_passed(r.get("npu"))]
    f32 = " ".join(f"-p {k}={v}" for k, v in sorted(EXACT.items()))
    lines = [
        VLM_HEADING, "",
        "The whole vision-language model exported with `--task image-text-to-text-shared` (the language model as the",
        "one stateful shared graph, the vision parts as optimum-intel lays them out: [The whole model](multimodal.md#the-whole-model-task-image-text-to-text-shared)),",
        "for every model type it exports (`architectures.supported_vlm_types()`), on a tiny random-init checkpoint",
        "laid out like the published one, with its processor (`testing.build_tiny_multimodal(model_type, dir,",
        "processor=True)`), each step a command as a user runs it (`scripts/coverage.py --vlm`). Columns:",
        "",
        "- **export**: `optimum-cli export openvino --task image-text-to-text-shared`: its validation at export (the",
        "  parts run as OVModelForVisualCausalLM runs them, against PyTorch's greedy `generate()` on an image and a",
        "  prompt) and the largest |logits difference| over the prefill and decode calls; a refused export's one line;",
        "- **optimum-vlm**, **genai-vlm**: `validate OUT --consumer optimum-vlm|genai-vlm` (run as `python -m",
        "  optimum_shared_graph validate`, the command `optimum-cli shared-graph validate` runs; OVModelForVisualCausalLM",
        "  teacher-forced, every call's logits; GenAI's VLMPipeline, greedy tokens) on the stored image and prompt,",
        f"  under f32 properties (`{f32}`, where the judge asks for exact agreement) and under",
        "  the CPU's default properties (judged by PyTorch's margins): passed with its figures, or the command's",
        "  one-line failure;",
        "- **genai-vlm (NPU pipeline)**: `validate OUT --consumer genai-vlm --device NPU "
        + " ".join(f"-p {k}={v}" for k, v in npu_set.items()) + "`: GenAI's VLMPipeline",
        "  on its NPU pipeline (NPUW), its partitions compiled for the CPU (the code path an NPU takes, runnable",
        "  without one), greedy tokens on the stored image and prompt, judged by PyTorch's margins as under the default",
        "  properties;",
        *(_released_npu_description(released) if released else []),
        "- **optimum-intel image-text-to-text**: optimum-intel's own `optimum-cli export openvino --task",
        "  image-text-to-text` of the same checkpoint, for comparison: exported, or its first error line.",
        "",
        f"Run: transformers {versions.get('transformers')}, optimum-intel {versions.get('optimum-intel')}, "
        f"openvino {versions.get('openvino')}, openvino-genai {versions.get('openvino-genai')}, torch "
        f"{versions.get('torch')}; {data.get('machine', '?')}; commit {data.get('commit') or '?'}; "
        f"{sum((r.get('seconds') or {}).get('total') or 0 for r in rows) / 60:.1f} minutes in all. "
        f"Results: `{data.get('source') or 'docs/vlm-coverage.json'}`.",
        "",
        f"**{len(exported)} of {len(rows)} vision-language model types exported with validation passed; {len(exact)} "
        f"pass both consumers under f32 properties, {len(default)} under the default properties, {len(npu)} through "
        f"GenAI's NPU pipeline"
        + (f" ({len(released_passed)} of {len(released)} at released widths)" if released else "")
        + f"; optimum-intel's image-text-to-text exports {len(theirs)} of {len(rows)}.**",
        "",
        "| model type | export | optimum-vlm (f32) | genai-vlm (f32) | optimum-vlm (default) | genai-vlm (default) "
        "| genai-vlm (NPU pipeline) | " + ("genai-vlm (NPU pipeline, released widths) | " if released else "")
        + "optimum-intel image-text-to-text |",
        "|---|---|---|---|---|---|---|" + ("---|" if released else "") + "---|",
        *(f"| {r['model_type']} | {_vlm_cell(_vlm_export_cell(r))} | " + " | ".join(_vlm_cell(r.get(c)) for c in columns)
          + (f" | {_vlm_cell((released.get(r['model_type']) or {}).get('npu'))}" if released else "")
          + f" | {_vlm_cell(r.get('image-text-to-text'))} |" for r in rows),
        "",
    ]
    return lines


def splice_vlm(page: str, section: list[str]) -> str:
    """`page` with its vision-language section replaced by `section`, or inserted after the multimodal
    checkpoints' section when it had none (at the end without that either); the rest of the page unchanged."""
    text = "\n".join(section)
    start = page.find(VLM_HEADING)
    if start >= 0:
        end = page.find("\n## ", start + len(VLM_HEADING))
        return page[:start] + text + ("\n" + page[end + 1:] if end >= 0 else "")
    after = page.find(MULTIMODAL_HEADING)
    end = page.find("\n## ", after + len(MULTIMODAL_HEADING)) if after >= 0 else -1
    if end < 0:
        return page.rstrip("\n") + "\n\n" + text
    return page[:end + 1] + text + "\n" + page[end + 1:]


def vlm_section_of(page: str) -> list[str]:
    """The vision-language section of `page` as its lines (with its trailing blank line), or [] when it has none."""
    start = page.find(VLM_HEADING)
    if start < 0:
        return []
    end = page.find("\n## ", start + len(VLM_HEADING))
    return (page[start:end] if end >= 0 else page[start:].rstrip("\n") + "\n").split("\n")


# Why NPUW runs neither artifact, measured (graph edits on the exported IR, NPUW's options, its source): per model types
# and a piece of the error, the cause a "neither" cell names. graph/npuw_forms.py and architectures/mpt.py remove the
# causes a graph form avoids (architectures/gpt_neo.py its local window, architectures/starcoder2.py its sliding
# window); these are the ones left.
_SEQ2SEQ = ("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "pegasus")
NPUW_CAUSES = [
    (_SEQ2SEQ, "unordered_map::at",
     "NPUW's decoding feeds a `position_ids` input (looked up in a map), which this decoder has not: it computes positions "
     "from the past length, which NPUW's static cache makes the cache's capacity (measured on bart's: with an unused "
     "`position_ids` declared NPUW runs it and decodes wrongly from the second token), so no input-only form fixes it; "
     "and positions counted along the mask (what NPUW needs: its static prefill left-pads the prompt) are not "
     "PyTorch's for a left-padded row, which this decoder counts from its first pad (`arange(past, past + seq)`): "
     "no one graph has both"),
    (("granitemoehybrid",), "Shape inference input shapes",
     "with its experts dense (`architectures/granitemoe.py`; optimum-intel's own experts slice each expert's tokens by "
     "counts the router computes at run time, shapes NPUW cannot make static: `to_shape was called on a dynamic shape`), "
     "NPUW's function folding infers a shape from a size that changes from run to run (an uninitialised value, not "
     "diagnosed further); without folding (`NPUW_FOLD=NO`) both artifacts fail the same way, NPUW's lookup of the "
     "embedding it shares with the tied head (`Key opset1::MatMul ... is not found in a map`)"),
]


def npu_cause(model_type: str, cell: str) -> str:
    """`cell` with the measured cause appended when it says NPUW runs neither artifact for a known reason."""
    if not cell.startswith("NPUW runs neither"):
        return cell
    for types, error, cause in NPUW_CAUSES:
        if model_type in types and error in cell:
            return f"{cell}; cause: {cause}"
    return cell


def apply_npu_results(results: list[dict], npu_results: dict) -> list[dict]:
    """`results` with each exported row's NPU cell taken from the real-width results (`--npu-results`): its
    verdict there, else `NOT_AT_REAL_WIDTH` (with the tiny model's cell, if the sweep ran one, after it)."""
    real = {r["model_type"]: r for r in npu_results.get("results", [])}
    rows = []
    for r in results:
        r = dict(r)
        if r.get("status") in (PASS, PARTIAL):
            tiny = r.get("npu") or ""
            if r["model_type"] in real and not _is_multimodal(r):
                r["npu"] = npu_cause(r["model_type"], real[r["model_type"]].get("npu") or "no result")
                r["npu_real_width"] = True
            elif _is_multimodal(r) and r.get("exported_model_type") in real:
                # what the export writes for a multimodal checkpoint is its language model's graph
                text = real[r["exported_model_type"]]
                r["npu"] = (f"{text.get('npu') or 'no result'} (its language model, measured as "
                            f"{r['exported_model_type']} at {text.get('checkpoint', '?')}'s widths)")
                r["npu_real_width"] = True
            else:
                r["npu"] = NOT_AT_REAL_WIDTH + (f" (tiny model: {tiny})" if tiny and not tiny.startswith("not run") else "")
        rows.append(r)
    return rows


EXPORT_REFUSED_AT_REAL_WIDTH = "export refused at real width"


def _npu_measured(cell: str) -> bool:
    """Whether a real-width NPU cell is a result (not a run skipped, crashed or timed out)."""
    return not cell.startswith(("not run", "worker crashed", "timed out", "coverage worker error", "released-width model"))


def _npu_summary(cells: list[str], *, real_width: bool, not_measured: int = 0) -> str:
    unmeasured = [n for n in cells if not _npu_measured(n)]
    cells = [n for n in cells if _npu_measured(n)]
    not_measured += len(unmeasured)
    refused = sum(n.startswith(EXPORT_REFUSED_AT_REAL_WIDTH) for n in cells)
    same = sum(n.startswith("as optimum-intel's") for n in cells)
    neither = sum(n.startswith("NPUW runs neither") for n in cells)
    alone = sum(n.startswith(NO_COMPARISON) for n in cells)
    runs_alone = sum(n.startswith(RUNS_ALONE) for n in cells)
    unfolded = sum(n.startswith(RUNS_UNFOLDED) for n in cells)
    both = sum(n.startswith(BOTH_DIFFER) for n in cells)
    parity = sum(n.startswith("parity") for n in cells)
    parity_alone = sum(n.startswith("parity (optimum-intel's artifact: RuntimeError") for n in cells)
    which = (f"at released width, of the {len(cells)} exported types measured there" if real_width
             else f"of the {len(cells)} exported types")
    text = (f"NPU pipeline (NPUW on the CPU), {which}: {parity} with parity ({parity_alone} of them where NPUW runs "
            f"optimum-intel's artifact not at all), {runs_alone} that NPUW runs with a difference where it runs "
            f"optimum-intel's artifact not at all, {unfolded} that NPUW runs only with `NPUW_FOLD=NO` (its default "
            f"folding fails on it; optimum-intel's artifact runs in neither way), {same} with "
            f"a difference optimum-intel's own artifact shares token for token, {both} where both artifacts differ from "
            f"PyTorch at different steps, {neither} that NPUW runs for "
            f"neither artifact (the cell names the cause where it was measured), {alone} without parity that optimum-intel cannot export here "
            f"(nothing to compare), {len(cells) - parity - runs_alone - unfolded - same - both - neither - alone - refused} worse than optimum-intel's artifact"
            + (f", {refused} whose export this package refused at real width (its validation against PyTorch)" if refused else "")
            + ".")
    if not_measured:
        text += f" {not_measured} exported types are not measured at real width (their cells say why)."
    return text


def _verdict_label(npu: str | None) -> str:
    """The verdict of an NPU cell without the detail both artifacts' columns already show."""
    npu = npu or "-"
    for prefix in ("as optimum-intel's artifact", "NPUW runs neither artifact", "differs from optimum-intel's artifact",
                   BOTH_DIFFER, NO_COMPARISON, RUNS_UNFOLDED):
        if npu.startswith(prefix):
            return npu.split(":", 1)[0] if prefix not in (NO_COMPARISON, RUNS_UNFOLDED) else prefix
    return npu


NPU_SECTION_HEADING = "## NPU pipeline at real width"


def render_npu_real_width(npu_results: dict, *, source: str) -> list[str]:
    """The section listing, per model type, the released checkpoint, the widths built and both artifacts' results."""
    rows = sorted(npu_results.get("results", []), key=lambda r: r["model_type"])
    if not rows:
        return []
    v = npu_results.get("versions") or {}
    total = sum((r.get("seconds") or {}).get("total", 0) for r in rows)
    without = [r["model_type"] for r in rows
               if "INFERENCE_PRECISION_HINT" not in (r.get("npuw") or {}) and "widths" in r]
    lines = [
        NPU_SECTION_HEADING, "",
        "The NPU column above comes from these runs, not from the tiny models: NPUW partitions a model by size and by",
        "repeated blocks, so a tiny 2-layer model's result does not predict a released one's. Each model type is built random-init with the widths of",
        "its released checkpoint (`optimum_shared_graph/released.py`, the checkpoint named there and below: hidden size,",
        "heads, KV heads, head_dim, intermediate and expert sizes, vocabulary, rotary settings, tied or untied head) and",
        "6 layers (more for some types with layers of several kinds: the layers column; not fewer: NPUW's online partitioning keeps a",
        "repeated block from `NPUW_ONLINE_KEEP_BLOCKS` = 5 repeats, and Llama-3.2-1B's widths fail with 4 layers where its",
        "16 run; mixtures of experts may have fewer experts of the released width), `initializer_range=0.1`. It is exported twice with "
        f"`--weight-format {npu_results.get('weight_format', NPU_WEIGHT_FORMAT)}`: `text-generation-shared` (this package,",
        "its export validation included) and optimum-intel's `text-generation-with-past`; both run the greedy check",
        f"({npu_results.get('new_tokens', NEW_TOKENS)} tokens on {len(npu_results.get('prompts') or PROMPTS)} prompts against "
        "PyTorch in f32 on the same fp16 weights) through",
        f"`LLMPipeline(path, \"NPU\", {', '.join(f'{k}={v!r}' for k, v in (npu_results.get('npuw') or NPUW).items())})`"
        + (f" (the rows of {', '.join(without)} were run without `INFERENCE_PRECISION_HINT`, so NPUW's partitions computed at "
           "this CPU's default precision, bf16, not an NPU's f16)." if without else "."),
        "",
        f"Results: `{source}`, written by `PYTHONPATH=. python scripts/coverage.py --npu-only --jobs 2 --npu-results {source}` on "
        f"{npu_results.get('machine', '?')}; transformers {v.get('transformers')}, optimum-intel {v.get('optimum-intel')}, "
        f"openvino {v.get('openvino')}, openvino-genai {v.get('openvino-genai')}, torch {v.get('torch')}; "
        f"{total / 60:.0f} minutes of runs for {len(rows)} types.",
        "",
        "| model type | released checkpoint | layers | hidden | heads / KV heads | head_dim | intermediate | experts "
        "(per token) | vocab | shared artifact | optimum-intel's artifact | NPU pipeline | seconds | commit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        w = r.get("widths") or {}
        inter = w.get("intermediate", "-")
        if w.get("expert_intermediate"):
            inter = f"{inter}, experts {w['expert_intermediate']}"
        experts = f"{w['experts']} ({w.get('experts_per_token', '?')})" if w.get("experts") else "-"
        heads = f"{w.get('heads', '-')} / {w.get('kv_heads', w.get('heads', '-'))}"
        lines.append(f"| {r['model_type']} | {r.get('checkpoint') or '-'} | {w.get('layers', '-')} | {w.get('hidden', '-')} | "
                     f"{heads} | {w.get('head_dim', '-')} | {inter} | {experts} | {w.get('vocab', '-')} | "
                     f"{_cell(r.get('npu_shared', '-'))} | {_cell(r.get('npu_with_past', '-'))} | {_cell(_verdict_label(r.get('npu')))} | "
                     f"{(r.get('seconds') or {}).get('total', '-')} | {r.get('commit') or '-'} |")
    return lines + [""]


def render(results: list[dict], *, seconds: float, versions: dict, python: str,
           compare: list[list[dict]] | None = None, npu_results: dict | None = None,
           npu_source: str = "docs/npu-real-width.json") -> str:
    if npu_results is not None:
        results = apply_npu_results(results, npu_results)
    multimodal = render_multimodal(results, versions=versions)
    results = [r for r in results if not _is_multimodal(r)]
    order = {PASS: 0, PARTIAL: 1, REFUSED: 2, NOT_BUILDABLE: 3}
    rows = sorted(results, key=lambda r: (order.get(r["status"], 9), r["model_type"]))
    counts = {s: sum(r["status"] == s for r in results) for s in order}
    capped = [r["model_type"] for r in results if r["status"] == PASS and r.get("version_cap")]
    from optimum.exporters.openvino.utils import SSM_MODELS  # optimum-intel's types with conv/SSM states

    ssm = [r["model_type"] for r in results if r["status"] == PASS and r["model_type"] in SSM_MODELS]
    lines = [
        "# Architecture coverage of `text-generation-shared`",
        "",
        "Generated by `PYTHONPATH=. python scripts/coverage.py` (do not edit by hand). Every model type",
        "optimum-intel registers for `text-generation-with-past` gets one row. For each type transformers can",
        "build from a configuration, a tiny random-init model (2 layers, hidden size 64, `initializer_range=0.1`;",
        "more layers where the released checkpoint's per-layer pattern needs them; the causal LM of a sequence-to-sequence",
        "family sized by its decoder's own keys, `init_std=0.1`; a router gate transformers initialises to zero drawn",
        "like the other weights: `optimum_shared_graph/testing.py`)",
        "is exported with `optimum-cli export openvino --task text-generation-shared` and checked:",
        "",
        "- **export**: one decoder graph (`partitioning: shared`), its export validation passed (PyTorch against",
        "  the graph on the prefill and every decode step: max |logits difference| and 16 greedy tokens);",
        f"- **OVModelForCausalLM**, **GenAI**: greedy generation of {NEW_TOKENS} tokens on {len(PROMPTS)} prompts, token for",
        "  token equal to PyTorch (`LLMPipeline` and `OVModelForCausalLM` with f32 inference precision);",
        "- **static**: `--shape-mode static --static-query-len 1 --max-cache-len 128`: its export validation, then the",
        "  same greedy check through `optimum_shared_graph.runtime()`;",
        *(["- **NPU pipeline**: the same greedy check through OpenVINO GenAI's NPU pipeline with its partitions on the",
           f"  CPU (`LLMPipeline(path, \"NPU\", {', '.join(f'{k}={v!r}' for k, v in NPUW.items())})`), which",
           "  computes in f16, judged against optimum-intel's own `text-generation-with-past` artifact of the same model",
           "  in the same run: a difference or a failure both artifacts share is NPUW's, and the cell says so."]
          if npu_results is None else
          ["- **NPU pipeline**: not on the tiny model (NPUW partitions by size and repeated blocks: a 2-layer model's result does not predict a",
           "  released one's) but on a model of the type's released checkpoint's widths with 6 or more layers, exported both as",
           "  `text-generation-shared` and as optimum-intel's `text-generation-with-past`, the same greedy check through",
           "  OpenVINO GenAI's NPU pipeline with its partitions on the CPU, judged against optimum-intel's artifact: a",
           "  difference or a failure both artifacts share is NPUW's, and the cell says so. Widths, checkpoints and the",
           "  run: [NPU pipeline at real width](#npu-pipeline-at-real-width); a row without a real-width run says",
           f"  \"{NOT_AT_REAL_WIDTH}\"."]),
        "",
        "A greedy difference is reported with PyTorch's own top-2 logit margin at that step, to tell a rounding",
        "near-tie from a real error. Checks are never loosened for a model type.",
        "",
        f"Run: transformers {versions.get('transformers')}, optimum-intel {versions.get('optimum-intel')}, "
        f"openvino {versions.get('openvino')}, openvino-genai {versions.get('openvino-genai')}, torch {versions.get('torch')}; "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {seconds / 60:.1f} minutes. "
        f"The package requires `{_pinned_transformers()}` (setup.cfg), chosen from this table: see "
        "[Choosing the transformers range](#choosing-the-transformers-range).",
        "",
        f"**{counts[PASS]} model types exported as one graph with parity** (PyTorch, OVModelForCausalLM and GenAI), "
        f"{counts[PARTIAL]} exported with a runtime difference, {counts[REFUSED]} refused, "
        f"{counts[NOT_BUILDABLE]} not buildable from a configuration (remote code or no causal LM class).",
    ]
    exported = [r for r in results if r["status"] in (PASS, PARTIAL)]
    if npu_results is not None:
        npu = [r.get("npu") or "" for r in exported if r.get("npu_real_width")]
        if npu or exported:
            lines += ["", _npu_summary(npu, real_width=True, not_measured=len(exported) - len(npu))]
    else:
        npu = [r.get("npu") or "" for r in exported if not (r.get("npu") or "").startswith("not run")]
        if npu:
            lines += ["", _npu_summary(npu, real_width=False)]
    if capped:
        lines += ["", "Exported despite an optimum-intel transformers version cap (validation passed under the installed "
                  f"transformers): {', '.join(capped)}."]
    fixed = [r["model_type"] for r in results if r["status"] == PASS and r.get("fixes")]
    if fixed:
        lines += ["", "Exported with one of this package's architecture fixes (`optimum_shared_graph/architectures/`: "
                  "optimum-intel's own export config fails for them under the installed transformers, or its graph in "
                  "GenAI's default PagedAttention backend; the fix is "
                  f"recorded in the manifest's `model.fixes`): {', '.join(fixed)}."]
    sdpa_only = [r["model_type"] for r in results if r["status"] == PASS and r.get("genai_sdpa_parity")]
    if sdpa_only:
        lines += ["", "GenAI parity only with `ATTENTION_BACKEND=\"SDPA\"` (the graph as exported), counted as parity "
                  f"above; GenAI's default PagedAttention rewrite differs: {', '.join(sdpa_only)}."]
    if ssm:
        lines += ["", f"With state other than a KV cache (convolution and SSM states) in the one stateful graph: {', '.join(ssm)}."]
    lines += ["", "| model type | status | export | OVModelForCausalLM | GenAI | static | NPU pipeline | reason / note |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [_row(r) for r in rows]
    if multimodal:
        lines += [""] + multimodal[:-1]
    if npu_results is not None and npu_results.get("results"):
        lines += [""] + render_npu_real_width(npu_results, source=npu_source)[:-1]
    if compare:
        lines += _comparison(results, compare)
    lines.append("")
    return "\n".join(lines)


_PIPE = re.compile(r"(?<!\\)\|")


def _cells(line: str) -> list[str]:
    """The cells of a rendered table row (escaped pipes kept inside their cell)."""
    return [c.strip() for c in _PIPE.split(line.strip())[1:-1]]


def splice_npu(page: str, npu_results: dict, *, source: str) -> str:
    """`page` (an earlier sweep's docs/architectures.md) with the NPU cells of the model types in `npu_results`, the NPU
    summary and the real-width section rendered from `npu_results`; every other cell kept as that sweep wrote it."""
    lines = page.split("\n")
    real = {r["model_type"] for r in npu_results.get("results", [])}
    main_npu: list[tuple[str, str]] = []  # (status, NPU cell) of the main table's rows
    table = None
    for i, line in enumerate(lines):
        if line.startswith("| model type | status |"):
            table, header = "main", _cells(line)
            continue
        if line.startswith("| model type | exported as |"):
            table, header = "multimodal", _cells(line)
            continue
        if not line.startswith("| ") or table is None or line.startswith("|---"):
            if not line.startswith("|"):
                table = None
            continue
        cells = _cells(line)
        row = dict(zip(header, cells))
        r = {"model_type": row["model type"], "status": row["status"], "npu": row["NPU pipeline"],
             "exported_model_type": row.get("exported as")}
        if r["model_type"] in real or (table == "multimodal" and r["exported_model_type"] in real):
            r["npu"] = apply_npu_results([r], npu_results)[0]["npu"]
            cells[header.index("NPU pipeline")] = _cell(r["npu"])
            lines[i] = "| " + " | ".join(cells) + " |"
        if table == "main" and r["status"] in (PASS, PARTIAL):
            main_npu.append(r["npu"].replace("\\|", "|"))
    measured = [n for n in main_npu if not n.startswith(NOT_AT_REAL_WIDTH)]
    summary = _npu_summary(measured, real_width=True, not_measured=len(main_npu) - len(measured))
    lines = [summary if line.startswith("NPU pipeline (NPUW on the CPU), at released width") else line for line in lines]
    text = "\n".join(lines)
    start = text.find("## NPU pipeline at real width")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        section = "\n".join(render_npu_real_width(npu_results, source=source)[:-1])
        text = text[:start] + section + ("\n" + text[end:] if end >= 0 else "\n")
    return text


def _pinned_transformers() -> str | None:
    """The transformers requirement in setup.cfg's `install_requires`."""
    match = re.search(r"^\s+(transformers[<>=!~][^\s#]*)", (ROOT / "setup.cfg").read_text(), re.M)
    return match.group(1) if match else None


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("transformers", "optimum-intel", "openvino", "openvino-genai", "torch"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def _commit() -> str | None:
    """The checkout's commit (short), with "+" when it has uncommitted changes; None outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def _repo_relative(path: str | Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def read_npu_results(path: str | Path) -> dict:
    """The real-width NPU results file (`--npu-results`): {"versions", "machine", "results": [...]}; empty if absent."""
    path = Path(path)
    if not path.is_file():
        return {"results": []}
    return json.loads(path.read_text())


def merge_npu_results(earlier: dict, fresh: list[dict], **about) -> dict:
    """`earlier`'s rows with those of the types in `fresh` replaced (the others kept), and `about` updated."""
    by_type = {r["model_type"]: r for r in fresh}
    rows = [by_type.pop(r["model_type"], r) for r in earlier.get("results", [])] + list(by_type.values())
    return dict(earlier, **about, results=rows)


def _npu_sweep(args) -> int:
    """`--npu-only`: the NPU check at released width for each type, the results file rewritten after each one."""
    from optimum_shared_graph.released import RELEASED

    if not args.npu_results:
        raise SystemExit("--npu-only needs --npu-results FILE")
    types = args.types or list(RELEASED)
    unknown = [t for t in types if t not in RELEASED]
    if unknown:
        raise SystemExit(f"no released-width configuration for {', '.join(unknown)} (optimum_shared_graph/released.py)")
    about = dict(versions=_versions(), machine=f"{platform.machine()}, {os.cpu_count()} CPUs, no NPU (NPUW's "
                 "partitions on the CPU)", weight_format=NPU_WEIGHT_FORMAT, npuw=NPUW, new_tokens=NEW_TOKENS,
                 prompts=PROMPTS)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(_run_subprocess, t, args.timeout or 420, sys.executable, False, True, real_width=True,
                               layers=args.npu_layers)
                   for t in types]
        for future in as_completed(futures):
            result = future.result()
            data = merge_npu_results(read_npu_results(args.npu_results), [result], **about)
            Path(args.npu_results).write_text(json.dumps(data, indent=1, default=str) + "\n")
            print(f"{result['model_type']:20s} {(result.get('seconds') or {}).get('total', '')!s:>7} s  "
                  f"{result.get('npu', '')[:200]}", flush=True)
    print(f"{len(types)} types in {(time.monotonic() - t0) / 60:.1f} min -> {args.npu_results}")
    return 0


def _machine() -> str:
    """The CPU's model name (with AMX when it has it: bf16 by default in the CPU plugin) and its count."""
    model, amx = platform.processor() or platform.machine(), False
    with contextlib.suppress(OSError):
        info = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
        model = found.group(1).strip() if found else model
        amx = bool(re.search(r"^flags\s*:.*\bamx_bf16\b", info, re.M))
    return f"{model}{' with AMX' if amx else ''}, {os.cpu_count()} CPUs ({platform.machine()})"


def _vlm_sweep(args) -> int:
    """`--vlm`: each vision-language type in its own subprocess, the results file rewritten after each one (the
    types run replace their rows), then its section spliced into the page at --output."""
    from optimum_shared_graph.architectures import supported_vlm_types

    results_file = Path(args.render_only or args.vlm_results)
    if not args.render_only:
        types = args.types or supported_vlm_types()
        unknown = [t for t in types if t not in supported_vlm_types()]
        if unknown:
            raise SystemExit(f"--task image-text-to-text-shared does not export {', '.join(unknown)} "
                             f"(it exports {', '.join(supported_vlm_types())})")
        about = dict(versions=_versions(), machine=_machine(), commit=_commit(), source=_repo_relative(results_file),
                     validations=[{"consumer": c, "properties": label, "set": p, "device": VLM_DEVICES.get(label, "CPU")}
                                  for c, label, p in VLM_VALIDATIONS])
        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(_run_subprocess, t, args.timeout or 3600, sys.executable, False, False, vlm=True)
                       for t in types]
            for future in as_completed(futures):
                result = future.result()
                data = merge_npu_results(read_npu_results(results_file), [result], **about)
                results_file.parent.mkdir(parents=True, exist_ok=True)
                results_file.write_text(json.dumps(data, indent=1, default=str) + "\n")
                print(f"{result['model_type']:12s} {(result.get('seconds') or {}).get('total', '')!s:>7} s  "
                      + " | ".join(str(result.get(k, "-"))[:90] for k in ["export"] + [f"{c} {label}" for c, label, _
                                   in VLM_VALIDATIONS] + ["image-text-to-text"]), flush=True)
        print(f"{len(types)} types in {(time.monotonic() - t0) / 60:.1f} min -> {results_file}")
    page = Path(args.output).read_text() if Path(args.output).is_file() else ""
    Path(args.output).write_text(splice_vlm(page, render_vlm(read_npu_results(results_file))))
    print(f"{VLM_HEADING[3:]} -> {args.output}")
    return 0


def _vlm_npu_sweep(args) -> int:
    """`--vlm --npu-only`: each type of `released.RELEASED_MULTIMODAL` (or `--types`) at its released widths through
    GenAI's NPU pipeline, one at a time (a released-width export holds gigabytes), merged into --vlm-results'
    `released_npu` (the types run replace theirs), then the VLM section spliced into the page at --output."""
    from optimum_shared_graph.released import RELEASED_MULTIMODAL

    types = args.types or list(RELEASED_MULTIMODAL)
    unknown = [t for t in types if t not in RELEASED_MULTIMODAL]
    if unknown:
        raise SystemExit(f"no released-width vision-language configuration for {', '.join(unknown)} "
                         f"(optimum_shared_graph/released.py has {', '.join(RELEASED_MULTIMODAL)})")
    results_file = Path(args.vlm_results)
    t0 = time.monotonic()
    for model_type in types:
        result = _run_subprocess(model_type, args.timeout or 3600, sys.executable, False, True, real_width=True,
                                 layers=args.npu_layers, vlm=True)
        data = read_npu_results(results_file)
        data.setdefault("released_npu", {})[model_type] = {**result, "machine": _machine(), "commit": _commit(),
                                                          "versions": _versions()}
        results_file.write_text(json.dumps(data, indent=1, default=str) + "\n")
        print(f"{model_type:12s} {(result.get('seconds') or {}).get('total', '')!s:>7} s  {result.get('npu')}",
              flush=True)
    print(f"{len(types)} types in {(time.monotonic() - t0) / 60:.1f} min -> {results_file}")
    page = Path(args.output).read_text() if Path(args.output).is_file() else ""
    Path(args.output).write_text(splice_vlm(page, render_vlm(read_npu_results(results_file))))
    print(f"{VLM_HEADING[3:]} -> {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="*", help="model types to run (default: all supported)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "architectures.md"))
    parser.add_argument("--results", help="also write the raw results as JSON here")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=int, help="seconds per model type (default 420; with --vlm, 3600)")
    parser.add_argument("--compare", nargs="*", default=[],
                        help="results JSON of sweeps under other transformers versions, for the range section")
    parser.add_argument("--update", help="results JSON of an earlier run: rerun only --types, keep its other rows")
    parser.add_argument("--update-multimodal", action="store_true",
                        help="run only the published multimodal model types (default: all of them; --types to choose) "
                             "and replace the multimodal section of the page at --output, keeping its other rows")
    parser.add_argument("--render-only", help="render the table from this results JSON instead of running")
    parser.add_argument("--no-static", dest="static", action="store_false", help="skip the static export")
    parser.add_argument("--no-npu", dest="npu", action="store_false",
                        help="skip the NPU pipeline check (and optimum-intel's own export it compares with)")
    parser.add_argument("--npu-only", action="store_true",
                        help="run only the NPU pipeline check at released width (optimum_shared_graph/released.py; "
                             "default: every type it has, --types to choose) and merge the results into --npu-results")
    parser.add_argument("--npu-results", help="JSON of the NPU check at released width: written by --npu-only (types "
                                              "run replace their rows), read by the sweep and --render-only for the NPU "
                                              "column (the sweep then skips the tiny models' NPU check)")
    parser.add_argument("--npu-layers", type=int, help="with --npu-only: this many layers instead of released.py's "
                                                       "(with --vlm: text layers, default 6)")
    parser.add_argument("--vlm", action="store_true",
                        help="run only the vision-language check (--task image-text-to-text-shared exported and "
                             "validated through optimum-vlm and genai-vlm, optimum-intel's image-text-to-text beside it; "
                             "default: every type architectures.supported_vlm_types() returns, --types to choose), merge "
                             "the results into --vlm-results and replace that section of the page at --output; with "
                             "--render-only FILE, re-render the section from FILE without running")
    parser.add_argument("--vlm-results", default=str(ROOT / "docs" / "vlm-coverage.json"),
                        help="with --vlm: the results JSON (types run replace their rows)")
    parser.add_argument("--splice-npu", action="store_true",
                        help="re-render only the NPU cells, the NPU summary and the real-width section of --output from "
                             "--npu-results, keeping every other cell of the page as its sweep wrote it")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.one:
        try:
            if args.vlm and args.npu_only:
                result = run_vlm_npu_one(args.one, Path(args.workdir), layers=args.npu_layers)
            elif args.vlm:
                result = run_vlm_one(args.one, Path(args.workdir))
            elif args.npu_only:
                result = run_npu_one(args.one, Path(args.workdir), layers=args.npu_layers)
            else:
                result = run_one(args.one, Path(args.workdir), static=args.static, npu=args.npu)
        except Exception as err:  # noqa: BLE001
            error = f"coverage worker error: {type(err).__name__}: {_first_line(err)}"
            result = ({"model_type": args.one, "export": error} if args.vlm and not args.npu_only else
                      {"model_type": args.one, "npu": error} if args.npu_only else
                      {"model_type": args.one, "status": REFUSED, "reason": error})
        Path(args.result).write_text(json.dumps(result, indent=1, default=str))
        return 0
    if args.vlm and args.npu_only and not args.render_only:
        return _vlm_npu_sweep(args)
    if args.vlm:
        return _vlm_sweep(args)
    if args.npu_only:
        return _npu_sweep(args)
    if args.splice_npu:
        if not args.npu_results:
            raise SystemExit("--splice-npu needs --npu-results FILE")
        page = Path(args.output).read_text()
        Path(args.output).write_text(splice_npu(page, read_npu_results(args.npu_results),
                                                source=_repo_relative(args.npu_results)))
        print(f"NPU cells of {args.output} re-rendered from {args.npu_results}")
        return 0
    npu_results = read_npu_results(args.npu_results) if args.npu_results else None

    from optimum_shared_graph import supported_model_types

    compare = [json.loads(Path(f).read_text()) for f in args.compare]
    if args.render_only:
        data = json.loads(Path(args.render_only).read_text())
        if isinstance(data, list):
            data = {"results": data}
        results, seconds, versions = data["results"], data.get("seconds", 0.0), data.get("versions") or _versions()
    else:
        from optimum_shared_graph.testing import MULTIMODAL

        types = args.types or (sorted(MULTIMODAL) if args.update_multimodal else supported_model_types() + sorted(MULTIMODAL))
        t0 = time.monotonic()
        results = []
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            npu = args.npu and npu_results is None  # the NPU column comes from the real-width results
            for result in pool.map(lambda t: _run_subprocess(t, args.timeout or 420, sys.executable, args.static, npu), types):
                results.append(result)
                print(f"{result['model_type']:28s} {result['status']:18s} {result.get('seconds', '')!s:>6} "
                      f"{result.get('reason', '')[:150]}", flush=True)
        seconds, versions = time.monotonic() - t0, _versions()
        if args.update:  # the earlier run's rows, with the types just run replaced
            earlier = json.loads(Path(args.update).read_text())
            earlier = earlier if isinstance(earlier, dict) else {"results": earlier}
            fresh = {r["model_type"]: r for r in results}
            results = [fresh.pop(r["model_type"], r) for r in earlier["results"]] + list(fresh.values())
            seconds += earlier.get("seconds", 0.0)
    compare = [c["results"] if isinstance(c, dict) else c for c in compare]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    if args.update_multimodal:  # the page's other rows are an earlier full run's
        page = Path(args.output).read_text()
        Path(args.output).write_text(splice_multimodal(page, render_multimodal(results, versions=versions)))
    else:
        page = render(results, seconds=seconds, versions=versions, python=sys.executable, compare=compare,
                      npu_results=npu_results, npu_source=_repo_relative(args.npu_results) if args.npu_results else "")
        earlier = Path(args.output).read_text() if Path(args.output).is_file() else ""
        if vlm_section_of(earlier):  # the vision-language section comes from its own run (--vlm): kept as it was
            page = splice_vlm(page, vlm_section_of(earlier))
        Path(args.output).write_text(page)
    if args.results:
        Path(args.results).write_text(json.dumps({"seconds": seconds, "versions": _versions(), "results": results},
                                                 indent=1, default=str))
    print(f"{sum(r['status'] == PASS for r in results)}/{len(results)} exported with parity in {seconds / 60:.1f} min "
          f"-> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
