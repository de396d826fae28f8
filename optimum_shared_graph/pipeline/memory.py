"""How the export's validation fits in the memory it has: the whole graph compiled once, or in parts.

optimum-intel's export keeps the weights memory-mapped (file pages the kernel reclaims under pressure), so it
runs in far less memory than the model's size. Validation compiles the graph, and OpenVINO's CPU plugin then
holds the compiled weights in anonymous memory (about the `.bin`; an embedding table in float32). Where that
does not fit, the graph is run in consecutive parts (`graph/parts.py`), one part's weights compiled at a time,
with the same results. The facts decided here, once:

* `available_memory()`: what the process may still take: the cgroup's memory limit less its anonymous memory
  (where a limit is set), else the system's `MemAvailable`;
* `validation_parts()`: whole or in parts, and how large a part may be, from the memory available when the
  graph is compiled (and at most `MAX_PART_BYTES`, which costs no time);
* `plan_validation()`, at stage 1: `check_fits()`, and how many calls the capture records;
* `check_fits()`: before the conversion, whether even the smallest part (the largest single weight, or one
  decoder layer) can fit; if not, the export stops with one line instead of being killed halfway;
* `overlap()`: what runs side by side: the digests beside the validation, the capture in a process of its own
  beside optimum-intel's conversion (`capture_beside.py`, on request).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidOptionsError, NotEnoughMemoryError

# Kept free beside a compiled part: activations, the inference request's buffers, the values kept between parts,
# and the allocator's slack. Measured: 4 B model, 1 GB parts, ~0.6 GB above the part's weights at the peak.
RESERVE = 768 * 2**20
# The CPU plugin's compiled weights per byte of the IR's weights (measured, 4 B model in fp16: 1.02x for decoder
# layers, 1.42x for lm_head; an embedding lookup reads the memory-mapped table in place).
COMPILED_PER_BYTE = 1.5
# The largest part validation compiles even with memory to spare (IR weight bytes). Compiling a graph in parts
# gives the same results and is no slower: on the Qwen3-4B graph (7.7 GB of fp16 weights), 4 calls run in 9 parts
# of at most 1 GB took 20 s against 45 s compiled whole, at 1.7 GB of anonymous memory against 8.2 GB.
MAX_PART_BYTES = 2 * 2**30
# The largest compiled part of a mixture-of-experts graph (cut inside its layers and its `lm_head`,
# `graph/experts.py`): expert weights compile to several times their bytes, and small parts cost no time
# (Qwen3-30B-A3B's widths, 2 layers, 3 calls: 31 parts of at most 0.1 GB of experts ran in 11.6 s, 12 of 0.4 GB in
# 10.5 s, 2 parts of 1.9 GB in 12.6 s).
MAX_EXPERTS_PART_BYTES = 384 * 2**20
_NO_LIMIT = 2**60

_CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMORY_ENV = "OPTIMUM_SHARED_GRAPH_MEMORY"
OVERLAP_ENV = "OPTIMUM_SHARED_GRAPH_OVERLAP"


@dataclass(frozen=True)
class Memory:
    """Memory the export may still use (bytes), and where the figure comes from."""

    available: int
    source: str  # "cgroup limit 3.0 GiB" or "MemAvailable"

    def describe(self, digits: int = 1) -> str:
        return f"{_gib(self.available, digits)} available ({self.source})"


def _gib(n: int, digits: int = 1) -> str:
    return f"{n / 2**30:.{digits}f} GiB"


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _stat(path: Path, key: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == key:
                return int(fields[1])
    except OSError:
        return None
    return None


def _cgroup_limits() -> list[tuple[int, int]]:
    """(limit, anonymous bytes in use) for the memory cgroup of this process and each of its ancestors."""
    found = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (_CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2
            base, limit_file, anon_key = _CGROUP_ROOT, "memory.max", "anon"
        elif "memory" in controllers.split(","):  # cgroup v1
            base, limit_file, anon_key = _CGROUP_ROOT / "memory", "memory.limit_in_bytes", "total_rss"
        else:
            continue
        group = base / path.lstrip("/")
        while True:
            limit = _read_int(group / limit_file)
            if limit is not None and limit < _NO_LIMIT:
                found.append((limit, _stat(group / "memory.stat", anon_key) or 0))
            if group == base or base not in group.parents:
                break
            group = group.parent
    return found


def available_memory() -> Memory:
    """What this process may still take: the tightest cgroup memory limit less the anonymous memory already
    charged to it (page cache is reclaimable), or the system's `MemAvailable`, whichever is smaller. The
    environment variable `OPTIMUM_SHARED_GRAPH_MEMORY` (bytes) replaces the figure: plan for less than is free
    (a machine shared with other work), or make a small model validate in parts."""
    given = os.environ.get(MEMORY_ENV)
    if given:
        try:
            return Memory(int(given), MEMORY_ENV)
        except ValueError:
            raise InvalidOptionsError(f"{MEMORY_ENV}={given!r} is not a number of bytes: set it to an integer or unset it") from None
    meminfo = _stat(Path("/proc/meminfo"), "MemAvailable:")
    best = Memory(meminfo * 1024, "MemAvailable") if meminfo is not None else Memory(_NO_LIMIT, "no limit found")
    for limit, anon in _cgroup_limits():
        if limit - anon < best.available:
            best = Memory(max(0, limit - anon), f"cgroup limit {_gib(limit)}")
    return best


def validation_parts(ov_model, memory: Memory | None = None):
    """The `PartPlan` validation runs `ov_model` in: one part when its weights fit beside `RESERVE` and under
    `MAX_PART_BYTES`, else parts as large as fit. A stateless graph is always compiled whole (None)."""
    from ..graph import experts
    from ..graph.parts import plan_parts

    if not _stateful(ov_model):
        return None
    memory = memory or available_memory()
    budget = int(max(memory.available - RESERVE, 0) / COMPILED_PER_BYTE)
    if not experts.blocks(ov_model):
        return plan_parts(ov_model, min(budget, MAX_PART_BYTES))
    # a MoE graph: its expert weights compile to EXPERTS_COMPILED_PER_BYTE, its parts end inside a layer where
    # one layer's experts exceed the bound (expert ranges), and they stay under MAX_EXPERTS_PART_BYTES compiled
    budget = min(budget, int(MAX_EXPERTS_PART_BYTES / COMPILED_PER_BYTE))
    ratio = experts.EXPERTS_COMPILED_PER_BYTE / COMPILED_PER_BYTE
    return plan_parts(ov_model.clone(), budget, experts_range_bytes=max(1, int(budget / ratio)), rows_range_bytes=budget,
                      cost=lambda c: c.get_byte_size() * (ratio if experts.is_expert_weight(c) else 1))


def _stateful(ov_model) -> bool:
    return bool(ov_model.get_sinks()) and not any(p.get_any_name().startswith("past_key_values") for p in ov_model.inputs)


def check_fits(config, weight_format: str | None, memory: Memory | None = None) -> None:
    """Stop before any export work when validation cannot fit even one part: the largest single piece a part
    must hold (`lm_head`, one decoder layer) beside `RESERVE`."""
    need = smallest_part_bytes(config, weight_format)
    if need is None:
        return
    memory = memory or available_memory()
    if memory.available >= need + RESERVE:
        return
    # as many digits as it takes for the need and what is available to read differently
    digits = 1 if _gib(need + RESERVE) != _gib(memory.available) else 2
    raise NotEnoughMemoryError(
        f"validating this export needs at least {_gib(need + RESERVE, digits)} of memory (its largest piece, "
        f"{_gib(need, digits)}, compiled, plus {_gib(RESERVE, digits)} to run it) and {memory.describe(digits)}: raise "
        "the memory limit, or pass --skip-validation to keep an unchecked artifact (nothing was written)"
    )


_BYTES = {"fp32": 4, "fp16": 2, "int8": 1, "int4": 0.5, "mxfp4": 0.5, "nf4": 0.5, "cb4": 0.5}


def _size(config, name: str) -> int | None:
    """A size from the config: an int, or the largest of a per-layer list (Gemma 3n's `intermediate_size`)."""
    value = getattr(config, name, None)
    if isinstance(value, (list, tuple)):
        value = max((v for v in value if isinstance(v, int)), default=None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def smallest_part_bytes(config, weight_format: str | None) -> int | None:
    """The smallest part validation can run, compiled: `lm_head` or one decoder layer's weights at the export's
    format, whichever is larger, times `COMPILED_PER_BYTE`. A mixture-of-experts graph that validation cuts inside
    its layers and inside every MatMul's rows, `lm_head` included (`validation_parts`,
    `architectures.experts_graph`), has one layer's attention projections as its smallest part. None when the
    config does not say."""
    from ..architectures import experts_graph

    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, vocab = _size(text, "hidden_size"), _size(text, "vocab_size")
    if not (hidden and vocab):
        return None
    per_weight = _BYTES.get(weight_format or "fp16", 2)
    attention = 4 * hidden * hidden
    if experts_graph(getattr(text, "model_type", None)):
        return int(COMPILED_PER_BYTE * attention * per_weight)
    inter = _size(text, "intermediate_size") or 4 * hidden
    layer = int((attention + 3 * hidden * inter) * per_weight)
    return int(COMPILED_PER_BYTE * max(vocab * hidden * per_weight, layer))


def checkpoint_bytes(model: str) -> int | None:
    """The size of a local checkpoint's weight files (None for a hub id not downloaded here)."""
    path = Path(model)
    if not path.is_dir():
        return None
    files = [p for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file()]
    return sum(p.stat().st_size for p in files) or None


def plan_validation(model: str, config, opts, weight_format: str | None, memory: Memory):
    """Stage 1's memory facts, decided once from `memory` (the plan's one `available_memory()` reading): stop now
    if validation cannot fit (`check_fits`), and choose how many greedy tokens are captured when the options leave
    it open. Returns the options with `validation_new_tokens` set."""
    import dataclasses

    if not opts.skip_validation:  # an unchecked export still captures generate() (to decompose it), never compiles
        check_fits(config, weight_format, memory)
    if opts.validation_new_tokens is not None:
        return opts
    return dataclasses.replace(opts, validation_new_tokens=captured_tokens(checkpoint_bytes(model), memory))


# The weights the capture reads in all, when they stay in the page cache: each recorded call reads (and, for a
# 16-bit checkpoint, upcasts to float32) every weight once.
CAPTURE_TRAFFIC = 4 * 10**9
MIN_TOKENS, MAX_TOKENS = 4, 16


def captured_tokens(checkpoint: int | None, memory: Memory) -> int:
    """How many greedy tokens the capture records (one call each): `MIN_TOKENS` (the prefill and 3 decode steps
    at growing cache lengths, what shows one graph serves both stages) when the checkpoint does not fit in
    memory beside `RESERVE` (each call then reads it from disk again); else as many as keep the capture's reads
    near `CAPTURE_TRAFFIC`, up to `MAX_TOKENS` (16 for a model under 0.25 GB, 8 at 0.5 GB, 4 from 1 GB)."""
    if checkpoint is None:
        return MAX_TOKENS
    if checkpoint + RESERVE > memory.available:
        return MIN_TOKENS
    return max(MIN_TOKENS, min(MAX_TOKENS, CAPTURE_TRAFFIC // max(checkpoint, 1)))


OVERLAPS = ("off", "digests", "on")


@dataclass(frozen=True)
class Overlap:
    """What the export runs side by side (`overlap()`)."""

    digests: bool = False  # the graph's `.bin` hashed in a thread while the validation runs (`manifest.DigestsBeside`)
    capture: bool = False  # the capture in a process of its own while optimum-intel converts (`capture_beside.py`)


def overlap(model: str, memory: Memory) -> Overlap:
    """What the export runs side by side, from `OPTIMUM_SHARED_GRAPH_OVERLAP`: `off` (one step at a time),
    `digests` (the `.bin` hashed while the validation runs), `on` (that, and the capture of `generate()` in a
    process of its own while optimum-intel converts), or unset: the digests with two cores or more (the hash reads
    the `.bin` once, into a reused buffer, as it would after the validation: no memory but that). The capture beside
    the conversion is asked for, never chosen: on 2 cores it made the export no faster (the capture process's
    start and compute slow optimum-intel's conversion down by about what they save; docs/export-cost.md). A
    capture beside needs memory for a second process (`BESIDE_CHILD`) beside the page cache's one copy of the
    checkpoint and `RESERVE`; where that is short it runs in the export's process.

    Raises:
        InvalidOptionsError: `OPTIMUM_SHARED_GRAPH_OVERLAP` is set to anything else.
    """
    choice = os.environ.get(OVERLAP_ENV, "").strip().lower()
    if choice not in ("", *OVERLAPS):
        raise InvalidOptionsError(f"{OVERLAP_ENV}={os.environ[OVERLAP_ENV]!r} is not one of {', '.join(OVERLAPS)}: "
                                  "set it to one of them or unset it")
    if choice:
        size = checkpoint_bytes(model) or 0
        return Overlap(digests=choice != "off",
                       capture=choice == "on" and memory.available >= size + BESIDE_CHILD + RESERVE)
    return Overlap(digests=(os.cpu_count() or 1) >= 2)


# A capture in its own process holds its own anonymous memory: the imports, one decoder layer's float32 weights, the
# activations (the weights are memory-mapped from the checkpoint's files, which the page cache holds once).
BESIDE_CHILD = 2 * 2**30
