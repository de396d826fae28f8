"""What every benchmark page states about its run, and the inputs the serving benchmarks share.

- `machine()`, `versions()`: the CPU, memory and package versions a page quotes;
- `random_prompts()`: seeded random token-id prompts (identical across runtimes and processes);
- `model_and_artifacts()`: a benchmark model built once and exported once per layout, reused by later runs.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import children

HERE = Path(__file__).resolve().parent
TASKS = {"shared": "text-generation-shared", "with-past": "text-generation-with-past"}


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo), or what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_isa() -> str:
    """What the CPU offers int8 MatMuls: "AVX-512 VNNI", "AVX-VNNI" or "AVX2 without VNNI" (where u8 x s8 products
    saturate unless the weights keep 7 bits: NNCF's overflow fix), or the ISA that `ONEDNN_MAX_CPU_ISA` caps the CPU
    plugin at (`ONEDNN_MAX_CPU_ISA=AVX2` runs this CPU as one without VNNI)."""
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA")
    if capped:
        return f"{capped} (ONEDNN_MAX_CPU_ISA)"
    from optimum_shared_graph.testing import cpu_flags

    flags = cpu_flags()
    if "avx512_vnni" in flags:
        return "AVX-512 VNNI"
    if "avx_vnni" in flags:
        return "AVX-VNNI"
    return "AVX2 without VNNI" if "avx2" in flags else platform.machine()


def machine() -> dict:
    info: dict = {"nproc": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in lscpu.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("Model name", "CPU(s)", "Thread(s) per core", "L3 cache", "Hypervisor vendor"):
                info[key.strip()] = value.strip()
        flags = next((ln for ln in lscpu.splitlines() if ln.startswith("Flags")), "")
        info["isa"] = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni") if f in flags.split()]
    except OSError:
        pass
    mem = Path("/proc/meminfo").read_text().splitlines()[0].split()
    info["ram_gb"] = round(int(mem[1]) / 2**20, 1)
    info["load_avg"] = list(os.getloadavg())
    return info


def write_results_and_page(results: list[dict], render, results_path: Path, page: Path) -> dict:
    """Stamp `results` with the run's date, machine and versions, write them as JSON to `results_path` and
    `render(results, info)` to `page`; return the info. `rerender(results_path, page, render)` redoes the page."""
    import datetime
    import json

    info = {"date": datetime.date.today().isoformat(), "machine": machine(), "versions": versions()}
    Path(results_path).write_text(json.dumps({"results": results, "info": info}, indent=2))
    Path(page).write_text(render(results, info) + "\n")
    return info


def rerender(results_path: Path, page: Path, render) -> None:
    """The page again from a results JSON `write_results_and_page` wrote (`--report-only`)."""
    import json

    data = json.loads(Path(results_path).read_text())
    Path(page).write_text(render(data["results"], data["info"]) + "\n")


def run_line(info: dict) -> str:
    """A page's "Run DATE: machine; versions; commit." line, from `{"date", "machine", "versions"}`."""
    return (f"Run {info['date']}: {describe_machine(info['machine'])}; "
            + ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v and k != "optimum-shared-graph commit")
            + f"; commit {info['versions'].get('optimum-shared-graph commit')}.")


def describe_machine(info: dict) -> str:
    """One sentence for a page: CPU, cores, memory, load average when taken."""
    load = ", ".join(f"{x:.1f}" for x in info.get("load_avg", []))
    return (f"{info.get('Model name', 'unknown CPU')}, {info['nproc']} cores, {info['ram_gb']} GB"
            + (f" (load average {load} at the end)" if load else ""))


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("openvino", "openvino-genai", "openvino-tokenizers", "optimum-intel", "optimum", "transformers",
                 "torch", "nncf", "numpy", "optimum-shared-graph"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    git = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out["optimum-shared-graph commit"] = git.stdout.strip() or None
    return out


def random_prompts(vocab: int, lengths, count: int, seed: int = 0) -> list:
    """`count` prompts of token ids in [10, vocab - 1), `[1, length]` each, lengths cycling through `lengths`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.integers(10, vocab - 1, size=(1, lengths[i % len(lengths)]), dtype=np.int64) for i in range(count)]


def model_and_artifacts(work: Path, name: str, layouts=("shared",), weight_format: str = "fp16") -> dict[str, Path]:
    """Build `name` under `work/models` (once) and export each layout under `work/artifacts/name` (once).

    Raises:
        SystemExit: a build or an export failed (the log under `work/logs` has the details).
    """
    model_dir = work / "models" / name
    built = children.run_child(children.python("models.py", name, str(model_dir)), log=work / "logs" / f"build-{name}.log")
    if built.returncode:
        raise SystemExit(f"error: building {name} failed: {built.error_line()}")
    artifacts = {}
    for layout in layouts:
        out = artifacts[layout] = work / "artifacts" / name / layout
        if (out / "openvino_model.xml").is_file():
            continue
        cli = shutil.which("optimum-cli") or "optimum-cli"
        result = children.run_child([cli, "export", "openvino", "-m", str(model_dir), "--task", TASKS[layout],
                                     "--weight-format", weight_format, str(out)],
                                    log=work / "logs" / f"export-{name}-{layout}.log")
        if result.returncode:
            raise SystemExit(f"error: exporting {name} ({layout}) failed: {result.error_line()}")
    return artifacts
