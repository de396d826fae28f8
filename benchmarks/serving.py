"""Serving benchmark: concurrent requests, GenAI's continuous batching and NPU pipeline, a long run of calls.

    python benchmarks/serving.py --workdir DIR        # writes docs/benchmarks-serving.md (~25 min a round on 2 cores)
    python benchmarks/serving.py --quick --workdir DIR --docs-dir /tmp   # toy model, one round, short soak

Qwen2-0.5B shape, random init, fp16 weights; the `text-generation-shared` artifact, and optimum-intel's
`text-generation-with-past` export of the same checkpoint where GenAI's pipelines compare the two.
Every measurement runs in a fresh process; measurements are interleaved over rounds (order rotated)
and medians reported. The serving workload is the same 8 requests everywhere: prompts of 32 to 256
tokens (random ids, seeded), 16 new tokens each, greedy, EOS ignored.

- Concurrent callers through `runtime()`: 1, 2 and 4 threads calling `generate()` on one loaded model,
  with the shipped compile options and with `PERFORMANCE_HINT=THROUGHPUT`.
- `ContinuousBatchingPipeline` (the engine of OpenVINO Model Server): 1, 2, 4 and 8 requests submitted
  together, shared against with-past.
- The NPU pipeline, `LLMPipeline(path, "NPU", NPU_USE_NPUW="YES", NPUW_DEVICES="CPU")`: GenAI reshapes
  the artifact into its own static prefill and generate models, run on the CPU here (the code path an
  Intel NPU takes; CPU emulation shows it works and what it costs, not NPU speed). TTFT and TPOT from
  GenAI's own perf metrics at a 256-token prompt, and `LLMPipeline` on the CPU for reference.
- Soak: `--calls` consecutive `generate()` calls on one model loaded by `runtime()` (mixed prompt and
  answer lengths), resident memory after every 50th.

Requests/s and generated tokens/s are the 8 requests over the wall time from the first submission to
the last answer; peak memory is the process's VmHWM (load and serving).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import children  # noqa: E402
import context  # noqa: E402
import models  # noqa: E402

PROMPT_LENS = (32, 64, 128, 256)
REQUESTS = 8
NEW_TOKENS = 16
CALLERS = (1, 2, 4)
CB_REQUESTS = (1, 2, 4, 8)
NPU_PROMPT = 256
NPU_PROPS = {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU", "MAX_PROMPT_LEN": 512, "MIN_RESPONSE_LEN": 64}
LAYOUTS = ("shared", "with-past")


def plan() -> list[tuple[str, str, int]]:
    """Every measurement: (kind, layout, concurrency)."""
    rows = [(kind, "shared", n) for kind in ("runtime", "runtime-tput") for n in CALLERS]
    rows += [("cb", layout, n) for layout in LAYOUTS for n in CB_REQUESTS]
    rows += [(kind, layout, 1) for kind in ("npuw", "cpu") for layout in LAYOUTS]
    return rows


def key(kind: str, layout: str, n: int) -> str:
    return f"{kind}-{layout}-{n}"


# ---- in the child ---------------------------------------------------------------------------------

def _vocab(artifact: Path) -> int:
    return json.loads((artifact / "config.json").read_text())["vocab_size"]


def serve_runtime(artifact: Path, callers: int, throughput: bool) -> dict:
    """The 8 requests answered by `callers` threads calling generate() on one model loaded by runtime()."""
    import torch

    import optimum_shared_graph as osg

    prompts = context.random_prompts(_vocab(artifact), PROMPT_LENS, REQUESTS)
    start = time.perf_counter()
    model = osg.runtime(artifact, ov_config={"PERFORMANCE_HINT": "THROUGHPUT"} if throughput else None)
    kwargs = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)

    def answer(p):
        ids = torch.from_numpy(p)
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)[0, p.shape[1]:].tolist()

    answer(prompts[0])  # warm-up
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(callers) as pool:
        tokens = list(pool.map(answer, prompts))
    return _served(load_s, time.perf_counter() - start, tokens)


def serve_continuous_batching(artifact: Path, together: int) -> dict:
    """The 8 requests submitted to a ContinuousBatchingPipeline `together` at a time."""
    import openvino as ov
    import openvino_genai as genai

    prompts = context.random_prompts(_vocab(artifact), PROMPT_LENS, REQUESTS)
    start = time.perf_counter()
    scheduler = genai.SchedulerConfig()
    scheduler.cache_size = 1  # GB of KV blocks: far more than 8 requests of 288 tokens need
    pipe = genai.ContinuousBatchingPipeline(str(artifact), scheduler, "CPU")
    config = genai.GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)

    def answer_all(batch):
        return [list(r.m_generation_ids[0]) for r in pipe.generate([ov.Tensor(p) for p in batch], [config] * len(batch))]

    answer_all(prompts[:1])  # warm-up
    load_s = time.perf_counter() - start
    start, tokens = time.perf_counter(), []
    for i in range(0, REQUESTS, together):
        tokens += answer_all(prompts[i : i + together])
    return _served(load_s, time.perf_counter() - start, tokens)


def _served(load_s: float, wall: float, tokens: list) -> dict:
    return {"load_s": load_s, "wall_s": wall, "requests_per_s": REQUESTS / wall,
            "tokens_per_s": REQUESTS * NEW_TOKENS / wall, "peak_mb": children.status_mb("VmHWM"), "tokens": tokens}


def latency(artifact: Path, npu: bool, prompts: int = 3) -> dict:
    """TTFT and TPOT of LLMPipeline (the NPU pipeline on the CPU when `npu`), from GenAI's perf metrics."""
    import openvino as ov
    import openvino_genai as genai

    start = time.perf_counter()
    pipe = genai.LLMPipeline(str(artifact), "NPU", **NPU_PROPS) if npu else genai.LLMPipeline(str(artifact), "CPU")
    load_s = time.perf_counter() - start
    config = genai.GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    ttft, tpot, tokens = [], [], []
    for i, ids in enumerate(context.random_prompts(_vocab(artifact), (NPU_PROMPT,), prompts + 1, seed=2)):
        result = pipe.generate(genai.TokenizedInputs(ov.Tensor(ids), ov.Tensor(ids * 0 + 1)), config)
        if i == 0:
            continue  # warm-up
        ttft.append(result.perf_metrics.get_ttft().mean / 1000)
        tpot.append(result.perf_metrics.get_tpot().mean / 1000)
        tokens.append(list(result.tokens[0]))
    return {"load_s": load_s, "ttft_s": statistics.median(ttft), "tpot_s": statistics.median(tpot), "tokens": tokens,
            "peak_mb": children.status_mb("VmHWM")}


def soak(artifact: Path, calls: int) -> dict:
    """`calls` consecutive generate() calls on one loaded model; resident memory after every 50th."""
    import gc

    import torch

    import optimum_shared_graph as osg

    prompts = context.random_prompts(_vocab(artifact), (8, 24, 48, 16, 64, 32, 12), calls, seed=1)
    model = osg.runtime(artifact)
    rss, start = {}, time.perf_counter()
    for i, p in enumerate(prompts, 1):
        ids = torch.from_numpy(p)
        new = 1 + (i * 5) % 8  # 1 to 8 new tokens
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                       do_sample=False, eos_token_id=None, pad_token_id=0)
        if i % 50 == 0 or i == calls:
            gc.collect()
            rss[i] = children.status_mb("VmRSS")
    return {"calls": calls, "rss_mb": rss, "wall_s": time.perf_counter() - start}


def child(kind: str, artifact: Path, n: int) -> dict:
    if kind in ("runtime", "runtime-tput"):
        return serve_runtime(artifact, n, throughput=kind == "runtime-tput")
    if kind == "cb":
        return serve_continuous_batching(artifact, n)
    if kind in ("npuw", "cpu"):
        return latency(artifact, npu=kind == "npuw")
    return soak(artifact, n)


# ---- in the parent --------------------------------------------------------------------------------

def kv_bytes_per_token(artifact: Path) -> int:
    """KV cache bytes per token of one sequence at the shipped f16 KV precision."""
    c = json.loads((artifact / "config.json").read_text())
    head = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return c["num_hidden_layers"] * 2 * c.get("num_key_value_heads", c["num_attention_heads"]) * head * 2


def run(args) -> dict:
    work = args.workdir
    name = "qwen2-toy" if args.quick else "qwen2-0.5b"
    artifacts = context.model_and_artifacts(work, name, LAYOUTS)
    steps = plan()
    rows: dict[str, list[dict]] = {key(*step): [] for step in steps}

    def measure(kind, layout, n, label):
        print(label, flush=True)
        result = children.run_child([sys.executable, __file__, "--child", kind, str(artifacts[layout]), str(n)],
                                    log=work / "logs" / f"serving-{name}-{label.replace(' ', '-')}.log")
        if result.returncode:
            raise SystemExit(f"error: {label} failed: {result.error_line()}")
        return result.json()

    for r in range(args.rounds):
        for step in steps[r * 5 % len(steps):] + steps[: r * 5 % len(steps)]:  # rotated: no row always runs first
            rows[key(*step)].append(measure(*step, f"round {r + 1} {key(*step)}"))
    soaked = measure("soak", "shared", args.calls, f"soak {args.calls} calls")
    return {"model": name, "shape": models.describe(name), "rounds": args.rounds, "rows": rows, "soak": soaked,
            "kv_bytes_per_token": kv_bytes_per_token(artifacts["shared"]), "machine": context.machine(),
            "versions": context.versions(), "date": time.strftime("%Y-%m-%d %H:%M")}


def report(results: dict, docs: Path) -> Path:
    rows = results["rows"]
    med = lambda k, field: statistics.median(r[field] for r in rows[k])  # noqa: E731

    def same(a: str, b: str) -> str:
        pairs = list(zip(rows[a][0]["tokens"], rows[b][0]["tokens"]))
        return f"{sum(x == y for x, y in pairs)} of {len(pairs)}"

    lines = [
        "# Serving benchmark: concurrent requests, continuous batching, the NPU pipeline, long runs",
        "",
        f"Generated by `python benchmarks/serving.py` on {results['date']}: "
        f"{context.describe_machine(results['machine'])}; the machine is shared, so compare ratios. Versions: "
        f"{', '.join(f'{k} {v}' for k, v in results['versions'].items() if v)}.",
        "",
        f"Model: {results['model']} shape ({', '.join(f'{k}={v}' for k, v in results['shape'].items())}), random "
        "init, fp16 weights. Each measurement runs in a fresh process and serves the same "
        f"{REQUESTS} requests (prompts of {', '.join(map(str, PROMPT_LENS))} tokens, {NEW_TOKENS} new tokens each, "
        f"greedy, EOS ignored); "
        + (f"median of {results['rounds']} interleaved rounds." if results["rounds"] > 1 else "one round (one process per row).")
        + (f" Conditions: {results['note']}" if results.get("note") else ""),
        "",
        "## Concurrent callers through `runtime()`",
        "",
        "Threads calling `generate()` on one model loaded by `runtime()`; `ContinuousBatchingPipeline` on the "
        "same artifact with the requests submitted N at a time for comparison.",
        "",
        "| server | concurrent | requests/s | generated tokens/s | vs 1 | peak memory (MB) | same tokens as at 1 |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    servers = (("runtime", "`runtime()`, shipped compile options"),
               ("runtime-tput", "`runtime()`, `PERFORMANCE_HINT=THROUGHPUT`"),
               ("cb", "GenAI `ContinuousBatchingPipeline`"))
    for kind, label in servers:
        base = key(kind, "shared", 1)
        for n in CALLERS:
            k = key(kind, "shared", n)
            lines.append(f"| {label} | {n} | {med(k, 'requests_per_s'):.2f} | {med(k, 'tokens_per_s'):.1f} | "
                         f"{med(k, 'tokens_per_s') / med(base, 'tokens_per_s'):.2f}x | {med(k, 'peak_mb'):,.0f} | "
                         f"{same(k, base)} |")
    kv_mb = results["kv_bytes_per_token"] * (max(PROMPT_LENS) + NEW_TOKENS) / 2**20
    p1, p4 = med("runtime-shared-1", "peak_mb"), med("runtime-shared-4", "peak_mb")
    bound = 1.2 * p1 + 3 * kv_mb
    lines += [
        "",
        f"- Memory at 4 callers: {p4:,.0f} MB against {p1:,.0f} MB at one ({p4 / p1:.2f}x); the bound, 1.2x one "
        f"caller's plus three more KV caches ({kv_mb:.1f} MB each at {max(PROMPT_LENS) + NEW_TOKENS} tokens, f16), "
        f"is {bound:,.0f} MB: {'met' if p4 <= bound else 'NOT met'}. One compiled model holds the weights; each "
        "calling thread has its own inference request.",
        f"- Throughput at 4 callers: `runtime()` {med('runtime-shared-4', 'tokens_per_s'):.1f} tokens/s, "
        f"{med('runtime-shared-4', 'tokens_per_s') / med('cb-shared-4', 'tokens_per_s'):.2f}x "
        "`ContinuousBatchingPipeline`, which batches the requests' tokens into one inference per step; `runtime()` "
        "runs one inference per caller per token, on the same cores, so its callers mostly take turns.",
        "- 'same tokens' compares the greedy tokens of the first round with the same server at one request: a "
        "`runtime()` call runs alone in its own inference request, so concurrency cannot change its answer.",
        "",
        "## Continuous batching: shared against with-past",
        "",
        "`ContinuousBatchingPipeline(path, SchedulerConfig(cache_size=1 GB), \"CPU\")` on each artifact, the "
        "requests submitted N at a time.",
        "",
        "| requests together | shared tokens/s | with-past tokens/s | shared / with-past | same tokens |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in CB_REQUESTS:
        s, w = key("cb", "shared", n), key("cb", "with-past", n)
        lines.append(f"| {n} | {med(s, 'tokens_per_s'):.1f} | {med(w, 'tokens_per_s'):.1f} | "
                     f"{med(s, 'tokens_per_s') / med(w, 'tokens_per_s'):.2f}x | {same(s, w)} |")
    lines += [
        "",
        "## The NPU pipeline, run on the CPU",
        "",
        f"`LLMPipeline(path, \"NPU\", {', '.join(f'{k}={v!r}' for k, v in NPU_PROPS.items())})`: GenAI's NPU "
        "pipeline reshapes the dynamic artifact into its own static prefill and generate models and, with "
        "`NPUW_DEVICES=\"CPU\"`, runs their partitions on the CPU. That shows the path works and what the "
        "artifact costs on it, not NPU speed. TTFT and TPOT are GenAI's perf metrics at a "
        f"{NPU_PROMPT}-token prompt and {NEW_TOKENS} new tokens (median of 3 prompts per process, then of the "
        "rounds); `LLMPipeline` on the CPU for reference.",
        "",
        "| pipeline | layout | load (s) | TTFT (ms) | TPOT (ms) | peak memory (MB) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for kind, label in (("npuw", "NPU (NPUW on CPU)"), ("cpu", "CPU")):
        for layout in LAYOUTS:
            k = key(kind, layout, 1)
            lines.append(f"| {label} | {layout} | {med(k, 'load_s'):.1f} | {med(k, 'ttft_s') * 1000:.0f} | "
                         f"{med(k, 'tpot_s') * 1000:.1f} | {med(k, 'peak_mb'):,.0f} |")
    ratio = lambda kind, field: med(key(kind, "shared", 1), field) / med(key(kind, "with-past", 1), field)  # noqa: E731
    lines += [
        "",
        f"Shared against with-past through the NPU pipeline: TTFT {ratio('npuw', 'ttft_s'):.2f}x, TPOT "
        f"{ratio('npuw', 'tpot_s'):.2f}x, load {ratio('npuw', 'load_s'):.2f}x; on the CPU: TTFT "
        f"{ratio('cpu', 'ttft_s'):.2f}x, TPOT {ratio('cpu', 'tpot_s'):.2f}x. Greedy tokens equal between the two "
        f"artifacts through the NPU pipeline: {same('npuw-shared-1', 'npuw-with-past-1')} prompts.",
        "",
        "## Soak",
        "",
    ]
    rss = {int(k): v for k, v in results["soak"]["rss_mb"].items()}
    first, last = min(k for k in rss if k >= 50), max(rss)
    growth = rss[last] / rss[first] - 1
    lines += [
        f"{results['soak']['calls']} consecutive `generate()` calls on one model loaded by `runtime()` (prompts of "
        f"8 to 64 tokens, 1 to 8 new tokens, shipped compile options) in {results['soak']['wall_s']:.0f} s. "
        f"Resident memory after call {last}: {rss[last]:,.0f} MB against {rss[first]:,.0f} MB after call {first} "
        f"({growth:+.2%}; the bound is +2%: {'met' if growth <= 0.02 else 'NOT met'}).",
        "",
        "| after call | " + " | ".join(str(k) for k in sorted(rss)) + " |",
        "|---|" + "---:|" * len(rss),
        "| resident MB | " + " | ".join(f"{rss[k]:,.0f}" for k in sorted(rss)) + " |",
        "",
        "Rerun: `pip install \".[benchmarks]\" && python benchmarks/serving.py --workdir DIR`. The raw results go "
        "to `DIR/results-serving-*.json`; `--report-only FILE` rewrites this page from one.",
        "",
    ]
    out = docs / "benchmarks-serving.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(child(argv[1], Path(argv[2]), int(argv[3]))))
        return 0
    parser = argparse.ArgumentParser(description="Serving benchmark: concurrent requests, continuous batching, "
                                                 "the NPU pipeline, a long run of calls.")
    parser.add_argument("--workdir", type=Path, default=HERE / "results")
    parser.add_argument("--docs-dir", type=Path, default=HERE.parent / "docs")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3; 1 with --quick)")
    parser.add_argument("--calls", type=int, default=None, help="soak length (default 500; 60 with --quick)")
    parser.add_argument("--quick", action="store_true", help="toy model, one round, short soak")
    parser.add_argument("--report-only", type=Path, default=None, help="rewrite the page from a results JSON")
    parser.add_argument("--note", default=None, help="the run's conditions, printed on the page (what else ran)")
    args = parser.parse_args(argv)
    if args.report_only is not None:
        results = json.loads(args.report_only.read_text())
        if args.note:
            results["note"] = args.note
        print(report(results, args.docs_dir))
        return 0
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.calls = args.calls or (60 if args.quick else 500)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results = {**run(args), "note": args.note}
    (args.workdir / f"results-serving-{time.strftime('%Y%m%d-%H%M%S')}.json").write_text(json.dumps(results, indent=1))
    print(report(results, args.docs_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
