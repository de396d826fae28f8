"""How validation fits in memory (pipeline/memory.py): the limit found, whole or in parts, the captured calls."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from optimum_shared_graph.options import ExportOptions
from optimum_shared_graph.pipeline import memory

CGROUP = Path("/sys/fs/cgroup/memory")


def _cgroup_skip_reason() -> str | None:
    if not (CGROUP / "memory.limit_in_bytes").exists():
        return "no cgroup v1 memory controller here: a memory limit cannot be set"
    if os.geteuid() != 0:
        return "setting a cgroup memory limit needs root"
    return None


@pytest.fixture
def memory_limit():
    """A cgroup with a memory limit (GiB); `enter` moves a child process into it before it runs."""
    why = _cgroup_skip_reason()
    if why:
        pytest.skip(why)
    group = CGROUP / f"osg-test-{os.getpid()}"
    group.mkdir()

    class Limit:
        def __init__(self):
            self.path = group

        def set(self, gib: float):
            (group / "memory.limit_in_bytes").write_text(str(int(gib * 2**30)))
            return self

        def enter(self):
            (group / "cgroup.procs").write_text(str(os.getpid()))

    yield Limit()
    group.rmdir()


def test_a_cgroup_limit_is_what_is_available(memory_limit):
    limit = memory_limit.set(3)
    code = "from optimum_shared_graph.pipeline.memory import available_memory as a; m = a(); print(m.available, m.source)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=limit.enter, env={k: v for k, v in os.environ.items() if k != memory.MEMORY_ENV})
    available, source = out.stdout.split(maxsplit=1)
    assert source.strip() == "cgroup limit 3.0 GiB"
    assert 2 * 2**30 < int(available) < 3 * 2**30  # the limit less the anonymous memory the child already holds


def test_without_a_limit_it_is_memavailable(monkeypatch):
    monkeypatch.delenv(memory.MEMORY_ENV, raising=False)
    found = memory.available_memory()
    meminfo = {line.split()[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}
    if found.source == "MemAvailable":
        assert abs(found.available - meminfo["MemAvailable:"] * 1024) < 2**30
    else:  # this process runs under a cgroup limit tighter than the system's free memory
        assert found.source.startswith("cgroup limit") and found.available <= meminfo["MemAvailable:"] * 1024


def test_the_environment_variable_replaces_the_figure(monkeypatch):
    monkeypatch.setenv(memory.MEMORY_ENV, str(5 * 2**30))
    assert memory.available_memory() == memory.Memory(5 * 2**30, memory.MEMORY_ENV)


@pytest.mark.parametrize("room, given, chosen", [
    (1e6, None, 16),   # the checkpoint stays in the page cache: 16 tokens cost compute only
    (0.5, None, 4),    # the weights are reread from disk at each call: the prefill and 3 decode steps
    (0.5, 8, 8),       # what the options ask for
])
def test_captured_tokens_follow_the_memory(tiny_model, monkeypatch, room, given, chosen):
    """`room`: the memory available beside RESERVE, in checkpoints."""
    from transformers import AutoConfig

    model = tiny_model("llama")
    size = memory.checkpoint_bytes(str(model))
    assert size == sum(p.stat().st_size for p in model.glob("*.safetensors"))
    monkeypatch.setenv(memory.MEMORY_ENV, str(int(memory.RESERVE + room * size)))
    config = AutoConfig.from_pretrained(model)
    opts = memory.plan_validation(str(model), config, ExportOptions(validation_new_tokens=given), "fp32",
                                 memory.available_memory())
    assert opts.validation_new_tokens == chosen


def test_skip_validation_needs_no_memory_check(tiny_model, monkeypatch):
    """No graph is compiled, so nothing is refused; the capture (decomposition) still runs, with the fewest calls
    when the checkpoint does not fit in memory (each call would read it from disk again)."""
    from transformers import AutoConfig

    model = tiny_model("llama")
    monkeypatch.setenv(memory.MEMORY_ENV, "1")
    opts = memory.plan_validation(str(model), AutoConfig.from_pretrained(model), ExportOptions(skip_validation=True), None,
                                 memory.available_memory())
    assert opts.validation_new_tokens == memory.MIN_TOKENS
    monkeypatch.delenv(memory.MEMORY_ENV)
    opts = memory.plan_validation(str(model), AutoConfig.from_pretrained(model), ExportOptions(skip_validation=True), None,
                                 memory.available_memory())
    assert opts.validation_new_tokens == memory.MAX_TOKENS  # a tiny model in plenty of memory


def test_smallest_part_is_lm_head_or_one_layer():
    from transformers import AutoConfig

    config = AutoConfig.for_model("qwen3", hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936)
    fp16 = memory.smallest_part_bytes(config, "fp16")
    assert fp16 == int(memory.COMPILED_PER_BYTE * 151936 * 2560 * 2)  # lm_head is larger than a layer here
    assert memory.smallest_part_bytes(config, "int4") < fp16


def test_a_refusal_never_reads_as_if_the_memory_were_enough():
    """Where the need and what is available round to the same tenth of a GiB, the refusal gives hundredths."""
    from transformers import AutoConfig

    from optimum_shared_graph.errors import NotEnoughMemoryError

    config = AutoConfig.for_model("qwen3", hidden_size=2560, intermediate_size=9728, num_hidden_layers=2,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936)
    need = memory.smallest_part_bytes(config, "fp16") + memory.RESERVE
    short = memory.Memory(need - 2**20, "cgroup limit 3.0 GiB")
    with pytest.raises(NotEnoughMemoryError) as refused:
        memory.check_fits(config, "fp16", short)
    said = str(refused.value)
    assert f"needs at least {need / 2**30:.2f} GiB" in said and f"{short.available / 2**30:.2f} GiB available" in said
    far = memory.Memory(need // 2, "MemAvailable")
    with pytest.raises(NotEnoughMemoryError, match=rf"needs at least {need / 2**30:.1f} GiB .* {far.available / 2**30:.1f} GiB available"):
        memory.check_fits(config, "fp16", far)


@pytest.mark.parametrize("checkpoint_gb, tokens", [(0.2, 16), (0.49, 8), (0.99, 4), (8.04, 4)])
def test_captured_tokens_keep_the_capture_reads_near_4_gb(checkpoint_gb, tokens):
    plenty = memory.Memory(2**40, "test")
    assert memory.captured_tokens(int(checkpoint_gb * 1e9), plenty) == tokens
    tight = memory.Memory(int(checkpoint_gb * 1e9) // 2 + memory.RESERVE, "test")
    assert memory.captured_tokens(int(checkpoint_gb * 1e9), tight) == 4


def test_per_layer_sizes_take_the_largest():
    """Gemma 3n gives `intermediate_size` per layer: the largest layer is the smallest part."""
    from optimum_shared_graph.testing import tiny_config

    config = tiny_config("gemma3n_text")
    assert isinstance(config.intermediate_size, list)
    hidden, inter = config.hidden_size, max(config.intermediate_size)
    layer = (4 * hidden * hidden + 3 * hidden * inter) * 2
    assert memory.smallest_part_bytes(config, "fp16") == int(memory.COMPILED_PER_BYTE * max(config.vocab_size * hidden * 2, layer))


def test_a_graph_over_the_part_cap_runs_in_parts_even_with_room(tiny_model, tmp_path, monkeypatch):
    import openvino as ov

    import optimum_shared_graph as osg

    out = tmp_path / "ov"
    osg.export(str(tiny_model("llama")), out, quiet=True)
    graph = ov.Core().read_model(out / "openvino_model.xml")
    plenty = memory.Memory(2**40, "test")
    assert memory.validation_parts(graph, plenty).count == 1
    monkeypatch.setattr(memory, "MAX_PART_BYTES", 200_000)  # the cap scaled to the tiny graph (~0.5 MB)
    plan = memory.validation_parts(graph, plenty)
    assert plan.count >= 2 and max(plan.part_bytes) <= plan.total_bytes


def test_a_mixture_of_experts_smallest_part_is_one_layers_attention():
    """Its graph is cut inside layers and `lm_head`'s rows: the vocabulary does not bound the smallest part
    (Moonlight's 163,840 x 2,048 `lm_head` alone would ask for 0.9 GiB compiled)."""
    from transformers import AutoConfig

    config = AutoConfig.for_model("deepseek_v3", hidden_size=2048, intermediate_size=11264, n_routed_experts=64,
                                  vocab_size=163840, num_hidden_layers=2)
    assert memory.smallest_part_bytes(config, "fp16") == int(memory.COMPILED_PER_BYTE * 4 * 2048 * 2048 * 2)
    lm_head = int(memory.COMPILED_PER_BYTE * 163840 * 2048 * 2)
    dense = AutoConfig.for_model("qwen3", hidden_size=2048, intermediate_size=11264, vocab_size=163840)
    assert memory.smallest_part_bytes(dense, "fp16") == lm_head
    # AFMoE's experts are traced stacked too (moe_experts); DBRX's are not in a form graph/experts.py cuts: its
    # lm_head is still one piece
    afmoe = AutoConfig.for_model("afmoe", hidden_size=2048, num_experts=64, vocab_size=163840)
    assert memory.smallest_part_bytes(afmoe, "fp16") == int(memory.COMPILED_PER_BYTE * 4 * 2048 * 2048 * 2)
    dbrx = AutoConfig.for_model("dbrx", d_model=2048, n_heads=16, vocab_size=163840)
    assert memory.smallest_part_bytes(dbrx, "fp16") == lm_head
