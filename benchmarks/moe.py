"""Mixture-of-experts exports at released widths: memory, wall and decode against optimum-intel's own export.

    python benchmarks/moe.py                                  # every type at 2 and 4 layers: the page (~2 h)
    python benchmarks/moe.py --types mixtral phimoe --layers 2
    python benchmarks/moe.py --types qwen3_moe --weight-format int4 --group-size 128 --append
    python benchmarks/moe.py --report-only docs/benchmarks-moe.json

For each MoE type and depth, a random-init checkpoint of the released checkpoint's widths and expert count (fp16,
each expert's projections saved as their own tensors, as the published checkpoints are) is exported by
optimum-intel (`text-generation-with-past`) and by this task, one fresh process each, one after the other, while the
process tree's RSS, anonymous memory (`Pss_Anon`: a forked child's shared pages counted once) and PSS are sampled
every 0.1 s. This task's export runs under a hard memory limit below the checkpoint's size (a cgroup v1 limit, as
root: `memory.Limit`): that run is its row, and only where the limit kills it does it run again without one. GenAI's
`LLMPipeline` on the CPU then decodes from both artifacts in alternating fresh processes (greedy, `ignore_eos`).
Writes `docs/benchmarks-moe.json` and `docs/benchmarks-moe.md`; while it runs, `moe-partial.json` in the workdir
holds the rows so far (`--report-only` renders it, the types not reached named).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import children  # noqa: E402
import context  # noqa: E402
from memory import Limit, cgroup_available  # noqa: E402

# the released checkpoints' expert counts (the released-width configs of `released.py` keep fewer, for coverage)
EXPERTS = {"qwen3_moe": ("num_experts", 128), "qwen2_moe": ("num_experts", 60), "mixtral": ("num_local_experts", 8),
           "phimoe": ("num_local_experts", 16), "deepseek_v2": ("n_routed_experts", 64),
           "deepseek_v3": ("n_routed_experts", 64), "lfm2_moe": ("num_experts", 32), "qwen3_next": ("num_experts", 512),
           "qwen3_5_moe_text": ("num_experts", 256), "gpt_oss": ("num_local_experts", 32),
           "granitemoe": ("num_local_experts", 40), "granitemoehybrid": ("num_local_experts", 64),
           "afmoe": ("num_experts", 128), "llama4_text": ("num_local_experts", 16)}
# the mixture-of-experts types the page has no row for, and why
NOT_MEASURED = {"dbrx": "no export of it can be validated at its widths: transformers 5.5's DBRX experts read "
                        "`ffn_config.ffn_hidden_size` where they mean the hidden size, so at DBRX's (experts of "
                        "10,752 over 6,144) PyTorch itself fails (\"mat1 and mat2 shapes cannot be multiplied\"; "
                        "transformers PR #47671)",
                "olmoe": "not exported by either task: optimum-intel 2.2 has no export config for it"}
# types whose layers are of two kinds, here alternating so that 2 layers hold one of each: the hybrids' released
# layers repeat 3 gated-delta-net layers and 1 attention layer, gpt-oss's alternate sliding-window and full attention,
# afmoe's repeat 3 sliding-window layers and 1 global one
ALTERNATING = {"qwen3_next": ("linear_attention", "full_attention"),
               "qwen3_5_moe_text": ("linear_attention", "full_attention"),
               "gpt_oss": ("sliding_attention", "full_attention"),
               "granitemoehybrid": ("mamba", "attention"), "lfm2_moe": ("conv", "full_attention"),
               "afmoe": ("sliding_attention", "full_attention")}
# config keys set apart from the released widths, and why (the page says so): LFM2-8B-A1B's first 2 layers are dense,
# so 2 of its layers would hold no experts
OVERRIDES = {"lfm2_moe": ({"num_dense_layers": 0}, "every layer has experts (the release's first 2 are dense)"),
             "afmoe": ({"num_dense_layers": 0}, "every layer has experts (the release's first 2 are dense)"),
             "llama4_text": ({"no_rope_layer_interval": 2}, "every 2nd layer is a global one without RoPE (the "
                                                           "release's every 4th)")}
PROMPT_TOKENS, NEW_TOKENS, ROUNDS = 32, 32, 3
BOUND = 0.35  # peak anonymous memory per checkpoint byte the export is held to; a row above it is step-timed


def build(model_type: str, layers: int, out: Path) -> dict:
    """The checkpoint, in a child process (its memory is gone after)."""
    if not (out / "config.json").is_file():
        key, experts = EXPERTS[model_type]
        extra = {key: experts, **OVERRIDES.get(model_type, ({}, ""))[0]}
        if model_type in ALTERNATING:
            extra["layer_types"] = list(ALTERNATING[model_type]) * (layers // 2)
        code = ("import sys; from optimum_shared_graph import released; "
                f"released.build_released_width_model({model_type!r}, sys.argv[1], num_hidden_layers={layers}, "
                f"**{extra!r})")
        proc = subprocess.run([sys.executable, "-c", code, str(out)], env=children.child_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            shutil.rmtree(out, ignore_errors=True)
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            raise RuntimeError(f"its checkpoint did not build: {lines[-1][:200] if lines else proc.returncode}")
    config = json.loads((out / "config.json").read_text())
    return {"model_type": model_type, "layers": layers, "released": _released(model_type),
            "hidden_size": config["hidden_size"], "experts": config.get("num_experts") or config.get("num_local_experts") or config.get("n_routed_experts"),
            "expert_intermediate": config.get("moe_intermediate_size") or config["intermediate_size"],
            "vocab_size": config["vocab_size"],
            "checkpoint_bytes": sum(p.stat().st_size for p in out.glob("*.safetensors"))}


def _released(model_type: str) -> str:
    from optimum_shared_graph import released

    return released.RELEASED[model_type][0]


WEIGHTS = {"--weight-format": "fp16"}  # the flags every export is given (`--weight-format` / `--group-size`: main())


def _label(weights: dict[str, str]) -> str:
    """`fp16`, `int4, group size 128`: a row's weights as the page names them."""
    size = weights.get("--group-size")
    return weights["--weight-format"] + (f", group size {size}" if size else "")


def export(model: Path, out: Path, task: str, limit_gib: float | None, log: Path,
           command: list[str] | None = None) -> dict:
    """One `optimum-cli export openvino` (`WEIGHTS`) under `limit_gib`, or `command` (named `task` in the row):
    completed, wall, peak RSS / anonymous / PSS of the process tree. The artifact is kept (decode reads it)."""
    shutil.rmtree(out, ignore_errors=True)
    args = command or ["optimum-cli", "export", "openvino", "-m", str(model), "--task", task,
                       *(part for flag in WEIGHTS.items() for part in flag), str(out)]
    # without a limit of its own an export still runs in a group capped below the machine's memory, so that one
    # needing more than the machine has (optimum-intel's at Mixtral's widths) is killed there, not a bystander
    group_gib = limit_gib if limit_gib is not None else (_machine_cap_gib() if cgroup_available() is None else None)
    limit = Limit(group_gib, f"osg-moe-{os.getpid()}")
    peaks = {"rss": 0.0, "anon": 0.0, "pss": 0.0}
    start = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(args, stdout=err, stderr=err, env=children.child_env(), preexec_fn=limit.enter)
        while proc.poll() is None:
            pids = children.tree(proc.pid)
            figures = {"rss": _total(children.status_of(p, "VmRSS") for p in pids),
                       "anon": _total(children.pss_anon_mb(p) for p in pids), "pss": children.pss_mb(proc.pid)}
            for k, v in figures.items():
                if v == v:
                    peaks[k] = max(peaks[k], v)
            time.sleep(0.1)
    wall = time.perf_counter() - start
    kills = limit.oom_kills()
    limit.close()
    row = {"task": task, "limit_gib": limit_gib, "completed": proc.returncode == 0, "wall_s": round(wall, 1),
           **{f"peak_{k}_mb": round(v) for k, v in peaks.items()}, "oom_kills": kills}
    if (out / "shared_graph.json").is_file():
        v = json.loads((out / "shared_graph.json").read_text())["validation"]
        row["validation"] = {k: v.get(k) for k in ("status", "run", "greedy_tokens", "greedy_match")}
    if not row["completed"]:
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        row["error"] = ((f"killed (out of memory at {group_gib:g} GiB)" if group_gib else "killed (out of memory)")
                        if proc.returncode == -9 else (lines[-1][:200] if lines else "?"))
    print(json.dumps(row), flush=True)
    return row


def _machine_cap_gib() -> float:
    """The machine's memory less 3 GiB for the sampler, the system and the page cache, in half GiB."""
    total_kb = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                        if line.startswith("MemTotal:")).split()[1])
    return math.floor((total_kb / 2**20 - 3) * 2) / 2


def _total(figures) -> float:
    """The sum of a tree's figures, those of processes that exited meanwhile (NaN) left out."""
    return sum(f for f in figures if f == f)


def stages(model: Path, out: Path, weight_format: str, task: str = "text-generation-shared") -> dict:
    """`task`'s export in a child process, each step timed and its memory sampled
    (`export_stages.measure_in_process`): which step holds the memory of an export over its bound."""
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([sys.executable, str(HERE / "export_stages.py"), "--child", str(model), str(out),
                           weight_format, task], capture_output=True, text=True, env=children.child_env())
    shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        return {"completed": False, "error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return {"completed": True, **json.loads(proc.stdout.strip().splitlines()[-1])}


def _condensed(steps: list[dict]) -> list[dict]:
    """The steps, validation's per-part compile and run steps merged into one (its seconds summed, its peaks)."""
    out: list[dict] = []
    for st in steps:
        if st["step"].startswith("validation: part") and out and out[-1]["step"].startswith("validation: part"):
            last = out[-1]
            out[-1] = {**last, "step": "validation: parts compiled and run", "seconds": last["seconds"] + st["seconds"],
                       **{k: max(last[k], st[k]) for k in ("peak_anon_mb", "peak_rss_mb")}}
        else:
            out.append(dict(st))
    return out


def step_table(steps: list[dict]) -> list[str]:
    """A step-timed export's steps as a Markdown table: when each starts, its seconds, its peak memory."""
    return ["| step | starts at | seconds | peak anonymous | peak RSS |", "| --- | --- | --- | --- | --- |"] + [
        f"| {x['step']} | {x['start_s']:.0f} s | {x['seconds']:.1f} | {x['peak_anon_mb']:,} MB | {x['peak_rss_mb']:,} MB |"
        for x in steps]


def decode_child(artifact: str) -> dict:
    """In a fresh process: GenAI CPU greedy decode of `NEW_TOKENS` after a `PROMPT_TOKENS` prompt, ms per token."""
    import numpy as np
    import openvino as ov
    import openvino_genai as genai

    pipe = genai.LLMPipeline(artifact, "CPU")
    prompt = ov.Tensor(np.random.default_rng(0).integers(100, 5000, size=(1, PROMPT_TOKENS), dtype=np.int64))
    config = genai.GenerationConfig(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                                    ignore_eos=True)
    pipe.generate(prompt, config)  # warm-up
    result = pipe.generate(prompt, config)
    return {"tpot_ms": round(result.perf_metrics.get_tpot().mean, 2), "tokens": [int(t) for t in result.tokens[0]]}


def decode(artifacts: dict[str, Path], rounds: int) -> dict:
    """Each artifact decoded in `rounds` alternating fresh processes: the median ms/token, and whether the greedy
    tokens of the two artifacts agree (default properties: the CPU's own precision)."""
    runs: dict[str, list] = {name: [] for name in artifacts}
    for r in range(rounds):
        for name in (list(artifacts) if r % 2 == 0 else list(artifacts)[::-1]):
            os.sync()  # the artifact just written is on disk, not being written back while it decodes
            proc = subprocess.run([sys.executable, __file__, "--decode-child", str(artifacts[name])],
                                  capture_output=True, text=True, env=children.child_env())
            if proc.returncode == 0:
                runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    out = {}
    for name, rs in runs.items():
        times = sorted(r["tpot_ms"] for r in rs)
        out[name] = {"tpot_ms": times[len(times) // 2] if times else None, "runs": times,
                     "tokens": rs[0]["tokens"] if rs else None}
    names = list(artifacts)
    if all(out[n]["tokens"] for n in names):
        a, b = (out[n]["tokens"] for n in names)
        out["tokens_equal"] = sum(x == y for x, y in zip(a, b))
    return out


def run(args) -> dict:
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs-moe"
    logs.mkdir(exist_ok=True)
    results = {"rows": [], "machine": context.machine(), "versions": context.versions(),
               "date": time.strftime("%Y-%m-%d"), "note": args.note, "rounds": args.rounds,
               "deeper_rounds": args.deeper_rounds,
               "not_reached": {t: "the run was stopped before it" for t in args.types}}
    for model_type in args.types:
        for layers in args.layers:
            model = work / f"{model_type}-{layers}"
            try:
                shape = build(model_type, layers, model)
            except RuntimeError as err:  # this depth has no row; the type's others may
                results["not_reached"][f"{model_type} at {layers} layers"] = str(err)
                continue
            theirs = export(model, work / "moe-with-past", "text-generation-with-past", None, logs / f"{model.name}-with-past.log")
            # this task's export under a hard limit below the checkpoint: 0.8x its size, to 0.5 GiB, and at least
            # 2 GiB (the libraries an export imports hold about 1 GiB of anonymous memory before it reads a weight);
            # that run is the row's measure, and one the limit kills runs again without it
            gib = max(math.floor(shape["checkpoint_bytes"] * 0.8 / 2**30 * 2) / 2, 2.0)
            why = cgroup_available()
            ours = export(model, work / "moe-shared", "text-generation-shared", None if why else gib,
                          logs / f"{model.name}-shared-{gib:g}.log")
            row = {**shape, "weights": _label(WEIGHTS), "with_past": theirs, "shared": ours}
            if why:
                row["limited"] = {"skipped": why, "limit_gib": gib}
            elif not ours["completed"]:
                row["limited"] = ours
                row["shared"] = ours = export(model, work / "moe-shared", "text-generation-shared", None,
                                              logs / f"{model.name}-shared.log")
            if ours["completed"] and ours["peak_anon_mb"] * 2**20 > BOUND * shape["checkpoint_bytes"]:
                row["stages"] = stages(model, work / "moe-stages", WEIGHTS["--weight-format"])
            if ours["completed"] and theirs["completed"]:
                rounds = args.rounds if layers == min(args.layers) else args.deeper_rounds
                row["decode"] = decode({"shared": work / "moe-shared", "with_past": work / "moe-with-past"}, rounds)
                row["decode"]["rounds"] = rounds
            shutil.rmtree(work / "moe-with-past", ignore_errors=True)
            shutil.rmtree(work / "moe-shared", ignore_errors=True)
            if not args.keep_models:
                shutil.rmtree(model, ignore_errors=True)
            results["rows"].append(row)
            results["not_reached"].pop(model_type, None)
            (work / "moe-partial.json").write_text(json.dumps(results, indent=1) + "\n")  # what a stop leaves
    return results


def _dated(results: dict) -> list[dict]:
    """The rows of one run, each carrying its run's date, machine, decode rounds and note."""
    run_ = {"date": results["date"], "machine": results["machine"], "note": results.get("note", ""),
            "rounds": results.get("rounds", 3)}
    return [{**row, "run": row.get("run", run_)} for row in results["rows"]]


def _row_key(row: dict) -> tuple:
    return row["model_type"], row["layers"], row.get("weights", "fp16")


def _merged(earlier: dict, now: dict) -> dict:
    """`--append`: this run's rows and the earlier run's, less those this run measured again, each row dated; the
    earlier run's unreached entries this run did not reach either."""
    measured = {_row_key(r) for r in now["rows"]}
    reached = {r["model_type"] for r in now["rows"]} | {f"{r['model_type']} at {r['layers']} layers" for r in now["rows"]}
    rows = [r for r in _dated(earlier) if _row_key(r) not in measured] + _dated(now)
    missed = {k: why for k, why in earlier.get("not_reached", {}).items() if k not in reached}
    return {**now, "rows": rows, "not_reached": {**missed, **now["not_reached"]}}


def _ordered(rows: list[dict]) -> list[dict]:
    """The page's order: fp16 rows first, then each other weight format; by type as `EXPERTS` lists them, then depth."""
    order = list(EXPERTS)
    return sorted(rows, key=lambda r: (r.get("weights", "fp16") != "fp16", r.get("weights", "fp16"),
                                       order.index(r["model_type"]) if r["model_type"] in order else len(order),
                                       r["layers"]))


def _rounds(results: dict) -> str:
    """`3`, or `3 at 2 layers, 1 at 4`: the decode processes per artifact of a run's rows."""
    by_depth = {r["layers"]: r["decode"]["rounds"] for r in results["rows"] if "rounds" in r.get("decode", {})}
    if len(set(by_depth.values())) <= 1:
        return f"{next(iter(by_depth.values()), results.get('rounds', ROUNDS))}"
    return ", ".join(f"{n} at {layers} layers" for layers, n in sorted(by_depth.items()))


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.2f} GB"


def render(results: dict) -> str:
    results = {**results, "rows": _ordered(results["rows"])}
    dated = any("run" in r for r in results["rows"])
    when = ("(results in `docs/benchmarks-moe.json`; the runs and their machines below)" if dated else
            f"on {results['date']} (one run; results in `docs/benchmarks-moe.json`): "
            f"{context.describe_machine(results['machine'])}")
    lines = ["# Mixture-of-experts exports at released widths", "",
             f"Generated by `python benchmarks/moe.py` {when}. Random-init checkpoints "
             "with the released checkpoints' widths and expert counts and 2 or 4 of their layers (fp16, the experts "
             "stored as the published checkpoints store them: per expert, or fused for qwen3_5_moe_text, gpt_oss "
             "(in 16 bits, as transformers saves them: not openai's MXFP4, which optimum-intel dequantizes as it "
             "loads), granitemoe and llama4_text; layers of two kinds alternate), "
             "exported with `--weight-format fp16` (or the weights after a row's model type) by "
             "optimum-intel (`text-generation-with-past`) and by this task (validated against PyTorch), one fresh "
             + ("process each, then this task's again under a hard memory limit below the checkpoint's size. "
                if any((r.get("limited") or {}).get("completed") for r in results["rows"]) else
                "process each, this task's under a hard memory limit below the checkpoint's size (that run is its "
                "row; where the limit kills it, the row is a second run without one). ")
             + "Memory is "
             "the process tree's peak, sampled every 0.1 s: anonymous memory (`Pss_Anon`) is what cannot be reclaimed (RSS "
             "counts the memory-mapped checkpoint's pages, PSS counts a page shared by processes once). Decode: "
             f"GenAI `LLMPipeline` on the CPU, {PROMPT_TOKENS}-token prompt, {NEW_TOKENS} greedy tokens "
             "(`ignore_eos`), median of " + ("its run's" if dated else _rounds(results))
             + " alternating fresh processes per artifact, default properties."
             + "".join(f" {t}: {why}." for t, (_, why) in OVERRIDES.items()
                       if any(r["model_type"] == t for r in results["rows"])), ""]
    runs: dict[str, list[str]] = {}
    for r in results["rows"]:
        if "run" in r:
            run_ = r["run"]
            key = (f"{run_['date']}, {context.describe_machine(run_['machine'])}, decode median of {run_['rounds']}"
                   + (f"; conditions: {run_['note']}" if run_.get("note") else ""))
            runs.setdefault(key, [])
            if r["model_type"] not in runs[key]:
                runs[key].append(r["model_type"])
    if runs:
        lines += [f"The rows come from {len(runs)} runs of the script, one per set of types:", ""]
        lines += [f"- {', '.join(types)}: {key}." for key, types in runs.items()] + [""]
    elif results.get("note"):
        lines += [f"Conditions: {results['note']}", ""]
    lines += ["| model type (released) | layers | experts | checkpoint | optimum-intel: wall, peak anonymous | "
              "this task: wall, peak anonymous (/ checkpoint) | RSS, PSS | wall ratio | anonymous ratio | "
              "under a hard limit | decode ms/token: this task, optimum-intel (ratio) | validation |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        t, o = r["with_past"], r["shared"]
        ck = r["checkpoint_bytes"]
        name = r["model_type"] + (f", {r['weights']}" if r.get("weights", "fp16") != "fp16" else "")
        theirs = (f"{t['wall_s']:.0f} s, {t['peak_anon_mb']:,} MB" if t["completed"]
                  else f"failed: {t.get('error')} (peak anonymous {t['peak_anon_mb']:,} MB)")
        if not o["completed"]:
            lines.append(f"| {name} ({r['released']}) | {r['layers']} | {r['experts']} | {_gb(ck)} | {theirs} | "
                         f"failed: {o.get('error')} | | | | | | |")
            continue
        ours = f"{o['wall_s']:.0f} s, {o['peak_anon_mb']:,} MB ({o['peak_anon_mb'] * 2**20 / ck:.2f}x)"
        wall = f"{o['wall_s'] / t['wall_s']:.2f}x" if t["completed"] else "-"
        anon = f"{o['peak_anon_mb'] / t['peak_anon_mb']:.2f}x" if t["completed"] else "-"
        lim = r.get("limited") or (o if o.get("limit_gib") else {})
        limited = (f"{lim['limit_gib']:g} GiB: skipped ({lim['skipped']})" if "skipped" in lim else
                   f"{lim['limit_gib']:g} GiB: " + (f"completed, {lim['wall_s']:.0f} s, validation "
                                                    f"{(lim.get('validation') or {}).get('status')}" if lim.get("completed")
                                                    else f"failed ({lim.get('error')})")) if lim else "-"
        d = r.get("decode") or {}
        dec = "-"
        if d.get("shared", {}).get("tpot_ms") and d.get("with_past", {}).get("tpot_ms"):
            a, b = d["shared"]["tpot_ms"], d["with_past"]["tpot_ms"]
            dec = f"{a:.1f}, {b:.1f} ({a / b:.2f}x; greedy tokens equal {d.get('tokens_equal')}/{NEW_TOKENS})"
        v = o.get("validation") or {}
        run_ = v.get("run") or {}
        lines.append(f"| {name} ({r['released']}) | {r['layers']} | {r['experts']} | {_gb(ck)} | {theirs} | "
                     f"{ours} | {o['peak_rss_mb']:,} MB, {o['peak_pss_mb']:,} MB | {wall} | {anon} | {limited} | {dec} | "
                     f"{v.get('status')} ({run_.get('parts', 1)} parts) |")
    slopes = []
    by_type: dict[str, list] = {}
    for r in results["rows"]:
        if r["shared"]["completed"]:
            weights = r.get("weights", "fp16")
            by_type.setdefault(r["model_type"] + ("" if weights == "fp16" else f" ({weights})"), []).append(r)
    for model_type, rs in by_type.items():
        rs = sorted(rs, key=lambda r: r["layers"])
        if len(rs) >= 2:
            a, b = rs[0], rs[-1]
            per_layer = (b["shared"]["peak_anon_mb"] - a["shared"]["peak_anon_mb"]) / (b["layers"] - a["layers"])
            slopes.append(f"{model_type}: {per_layer:+,.0f} MB of peak anonymous memory per layer between "
                          f"{a['layers']} and {b['layers']} layers (the checkpoint grows "
                          f"{(b['checkpoint_bytes'] - a['checkpoint_bytes']) / (b['layers'] - a['layers']) / 1e6:,.0f} MB per layer)")
    if slopes:
        lines += ["", "Slope with depth: " + "; ".join(slopes) + "."]
    for r in results["rows"]:
        st = r.get("stages")
        if not st:
            continue
        lines += ["", f"### Where {r['model_type']} at {r['layers']} layers holds its memory "
                      f"({r['shared']['peak_anon_mb'] * 2**20 / r['checkpoint_bytes']:.2f}x, over {BOUND:g}x)", ""]
        if not st.get("completed"):
            lines.append(f"The step-timed export failed: {st.get('error')}.")
            continue
        steps = _condensed(st["steps"])
        top = max(steps, key=lambda x: x["peak_anon_mb"])
        lines += [f"One more export of the same checkpoint in one process (`osg.export`), each step's wall and peak "
                  f"memory sampled every 50 ms (`RssAnon` of the process): {st['wall_s']:.0f} s, peak anonymous "
                  f"{st['peak_anon_mb']:,} MB, held by the step '{top['step']}'.", ""] + step_table(steps)
    measured = {r["model_type"] for rs in by_type.values() for r in rs}  # a row at any weight format
    missing = [f"{t} ({why})" for t, why in NOT_MEASURED.items() if t not in measured]
    missing += [f"{t} (not reached: {why})" for t, why in results.get("not_reached", {}).items()]
    missing += [f"{t} (not in this run: measured by a later version of this suite)" for t in EXPERTS
                if t not in measured and t not in results.get("not_reached", {})]
    if missing:
        lines += ["", "Mixture-of-experts types and depths without a row: " + "; ".join(missing) + "."]
    v = results["versions"]
    lines += ["", "Versions: " + ", ".join(f"{k} {val}" for k, val in v.items()) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--decode-child"]:
        print(json.dumps(decode_child(sys.argv[2])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", default=list(EXPERTS), choices=list(EXPERTS))
    parser.add_argument("--layers", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--workdir", type=Path, default=HERE / "results")
    parser.add_argument("--docs-dir", type=Path, default=HERE.parent / "docs")
    parser.add_argument("--keep-models", action="store_true")
    parser.add_argument("--note", default="", help="the run's conditions, printed on the page")
    parser.add_argument("--report-only", type=Path, help="re-render docs/benchmarks-moe.md from a results JSON")
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="decode processes per artifact at the fewest layers")
    parser.add_argument("--deeper-rounds", type=int, default=1, help="decode processes per artifact at more layers")
    parser.add_argument("--weight-format", default="fp16", help="optimum-cli's --weight-format for every export")
    parser.add_argument("--group-size", type=int, help="optimum-cli's --group-size (int4)")
    parser.add_argument("--append", action="store_true",
                        help="keep the rows of docs/benchmarks-moe.json's run (of other types), each row dated")
    args = parser.parse_args(argv)
    globals()["ROUNDS"] = args.rounds  # decode() and render() read it
    globals()["WEIGHTS"] = {"--weight-format": args.weight_format,  # export() reads it
                            **({"--group-size": str(args.group_size)} if args.group_size else {})}
    results = json.loads(args.report_only.read_text()) if args.report_only else run(args)
    if args.append and not args.report_only:  # the page's earlier run's rows kept, each with its own run's facts
        results = _merged(json.loads((args.docs_dir / "benchmarks-moe.json").read_text()), results)
    if not args.report_only:
        (args.docs_dir / "benchmarks-moe.json").write_text(json.dumps(results, indent=1) + "\n")
    (args.docs_dir / "benchmarks-moe.md").write_text(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
