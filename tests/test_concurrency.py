"""`runtime()` under load: concurrent `generate()` calls on one loaded model, and no growth over many calls."""

from __future__ import annotations

import gc
import importlib.metadata
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import torch

from conftest import EXACT, at_once as _at_once

import optimum_shared_graph as osg
from optimum_shared_graph import RuntimeSelectionError
from optimum_shared_graph.runtimes import registry as _runtime

CAPACITY = 96
# Eight prompts of different lengths (1 to 50 tokens with the tiny tokenizer).
PROMPTS = ["def f(x):", "x", "import os\n" * 3, "for i in range(10):\n    print(i)", "return a + b",
           "class A:\n    pass\n" * 2, "while True:", "# " + "word " * 12]


@pytest.fixture(scope="module")
def artifacts(tiny_model, tmp_path_factory):
    """`artifacts(kind)` -> a llama artifact exported once per module: dynamic, stateless or static (C=4, batch 2 for the beams)."""
    root, done = tmp_path_factory.mktemp("concurrency"), {}
    options = {"dynamic": {}, "stateless": {"stateful": False},
               "static": {"shape_mode": "static", "max_cache_len": CAPACITY, "static_query_len": 4,
                          "static_batch_size": 2}}

    def get(kind: str):
        if kind not in done:
            done[kind] = root / kind
            osg.export(str(tiny_model("llama")), done[kind], **options[kind])
        return done[kind]

    return get


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model("llama"))


def _call(model, tokenizer, prompt, **extra):
    enc = tokenizer(prompt, return_tensors="pt")
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    return model.generate(**enc, **{**kwargs, **extra})


@pytest.mark.parametrize("kind", ["dynamic", "stateless", "static"])
def test_eight_threads_each_equal_the_call_made_alone(kind, artifacts, tokenizer):
    model = osg.runtime(artifacts(kind), ov_config=EXACT)
    configs = [{} if i % 3 else {"num_beams": 2} for i in range(len(PROMPTS))]  # beam search among them
    alone = [_call(model, tokenizer, p, **c) for p, c in zip(PROMPTS, configs)]
    compiled = model._compiled
    threads_before = torch.get_num_threads()
    together = _at_once([lambda p=p, c=c: _call(model, tokenizer, p, **c) for p, c in zip(PROMPTS, configs)])
    for prompt, got, want in zip(PROMPTS, together, alone):
        assert not isinstance(got, Exception), f"{prompt!r}: {got}"
        assert torch.equal(got, want), prompt
    assert model._compiled is compiled  # one compiled model: the weights once
    assert torch.get_num_threads() == threads_before  # the generation loop's thread setting restored


def test_a_failing_call_does_not_disturb_the_others(artifacts, tokenizer):
    model = osg.runtime(artifacts("static"), ov_config=EXACT)
    alone = [_call(model, tokenizer, p) for p in PROMPTS[:4]]
    over = lambda: _call(model, tokenizer, PROMPTS[0], max_new_tokens=CAPACITY, min_new_tokens=CAPACITY)  # noqa: E731
    together = _at_once([over] + [lambda p=p: _call(model, tokenizer, p) for p in PROMPTS[:4]] + [over])
    for got in (together[0], together[-1]):
        assert isinstance(got, RuntimeSelectionError) and "exceed this static artifact's KV capacity" in str(got)
    for got, want in zip(together[1:-1], alone):
        assert not isinstance(got, Exception), got
        assert torch.equal(got, want)


def test_compiled_once_when_first_callers_arrive_together(artifacts, tokenizer):
    model = osg.runtime(artifacts("dynamic"), ov_config=EXACT, compile=False)
    compiles = []
    real = model._compile_model

    def counting(*args, **kwargs):
        compiles.append(1)
        time.sleep(0.2)  # widen the window in which a second caller could compile too
        return real(*args, **kwargs)

    model._compile_model = counting
    results = _at_once([lambda p=p: _call(model, tokenizer, p) for p in PROMPTS[:4]])
    assert all(not isinstance(r, Exception) for r in results), results
    assert len(compiles) == 1


class _OneAtATime:
    """A provider without `concurrent`: its model records how many generate() calls overlap."""

    capabilities = frozenset({"generation", "static", "stateless", "logits-all"})

    def load(self, path, manifest, *, device, **options):
        return _Overlaps()


class _Overlaps:
    def __init__(self):
        self.active = self.most = 0
        self.lock = threading.Lock()

    def generate(self, value):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.05)
        with self.lock:
            self.active -= 1
        return value


def test_a_provider_without_concurrent_gets_its_calls_one_at_a_time(artifacts, monkeypatch):
    real = importlib.metadata.entry_points
    ep = type("EP", (), {"name": "serial", "group": _runtime.GROUP, "dist": None, "load": lambda self: _OneAtATime})()
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [ep] if kw.get("group") == _runtime.GROUP else real(**kw))
    _runtime.REGISTRY.clear()
    try:
        model = osg.runtime(artifacts("dynamic"), provider="serial")
        assert _at_once([lambda i=i: model.generate(i) for i in range(4)]) == [0, 1, 2, 3]
        assert model.most == 1
        unserialised = _Overlaps()
        _at_once([lambda i=i: unserialised.generate(i) for i in range(4)])
        assert unserialised.most > 1  # the control: without runtime()'s lock the calls overlap
    finally:
        _runtime.REGISTRY.clear()


def test_no_memory_growth_over_many_calls(artifacts, tokenizer):
    """A short soak: 150 calls of mixed lengths from a pool of 4 threads; resident memory after the
    last within 2% of after the 30th (benchmarks/serving.py runs 500)."""
    model = osg.runtime(artifacts("dynamic"))
    process = psutil.Process()

    def call(i):
        return _call(model, tokenizer, PROMPTS[i % len(PROMPTS)], max_new_tokens=8 + i % 9, min_new_tokens=0)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(call, range(30)))
        gc.collect()
        after_30 = process.memory_info().rss
        list(pool.map(call, range(30, 150)))
        gc.collect()
        after_150 = process.memory_info().rss
    assert after_150 <= after_30 * 1.02, f"resident memory grew from {after_30 >> 20} MB to {after_150 >> 20} MB"
