"""`runtime()`: provider discovery and the generation guard, artifact checks, and the OpenVINO provider's `generate()`."""

from __future__ import annotations

import importlib.metadata
import json
import shutil

import pytest
import torch

from conftest import DRAFT_SETTINGS, EXACT, PROMPTS, MainCalls

import optimum_shared_graph as osg
from optimum_shared_graph import InvalidOptionsError, ManifestError, RuntimeSelectionError, read_manifest
from optimum_shared_graph.runtimes import registry as _runtime
from optimum_shared_graph.runtimes.openvino import OpenVINOProvider

NEW_TOKENS = 12


# ------------------------------------------------------------------------ providers (fake entry points)


class _EntryPoint:
    """Stands in for `importlib.metadata.EntryPoint`, counting loads (as pluggy's tests do)."""

    def __init__(self, name, plugin, dist_name="fake-provider", version="1.0"):
        self.name, self.group, self.plugin, self.loads = name, _runtime.GROUP, plugin, 0
        self.dist = type("Dist", (), {"metadata": {"Name": dist_name}, "version": version})()

    def load(self):
        self.loads += 1
        return self.plugin


class _Recorder:
    def __init__(self, *capabilities):
        self.capabilities = frozenset(capabilities)
        self.loaded = []

    def load(self, path, manifest, *, device, **options):
        self.loaded.append((path, device, options))
        return ("loaded by", self)


@pytest.fixture
def fake_providers(monkeypatch):
    """Replace the entry points of our group with the given fakes (pluggy-style, through importlib.metadata),
    starting from an empty registry and leaving one behind."""
    _runtime.REGISTRY.clear()
    request_cleanup = _runtime.REGISTRY.clear
    eps: list[_EntryPoint] = []
    real = importlib.metadata.entry_points

    def entry_points(**kwargs):
        if kwargs.get("group") == _runtime.GROUP:
            return list(eps)
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    yield eps
    request_cleanup()


def test_builtin_provider_is_registered_by_the_package_entry_point():
    eps = importlib.metadata.entry_points(group=_runtime.GROUP)
    assert "openvino" in {ep.name for ep in eps}
    provider = {p.name: p for p in _runtime.installed_providers()}["openvino"]
    assert isinstance(provider.plugin, OpenVINOProvider)
    assert {"generation", "static", "stateless", "logits-all"} <= provider.capabilities
    assert provider.distribution and provider.distribution.startswith("optimum-shared-graph")


def test_builtin_vlm_provider_is_declared_by_the_package_entry_point(runtime_providers_declared):
    """setup.cfg declares the image-text-to-text provider in the same group as the text one; it offers what an
    image-text-to-text-shared artifact requires (and concurrency), which the text provider does not."""
    from conftest import declared_runtime_providers

    from optimum_shared_graph.runtimes.visual import VisualProvider

    declared = declared_runtime_providers()
    assert declared == {"openvino": "optimum_shared_graph.runtimes.openvino:OpenVINOProvider",
                        "openvino-vlm": "optimum_shared_graph.runtimes.visual:VisualProvider"}
    provider = runtime_providers_declared["openvino-vlm"]
    assert isinstance(provider.plugin, VisualProvider)
    assert {"generation", "image-text-to-text", "concurrent"} <= provider.capabilities
    assert "image-text-to-text" not in runtime_providers_declared["openvino"].capabilities


def test_vlm_provider_refuses_a_text_artifact_in_one_line(runtime_providers_declared, dynamic_artifact):
    with pytest.raises(RuntimeSelectionError) as info:
        osg.runtime(dynamic_artifact(), provider="openvino-vlm")
    message = str(info.value)
    assert "\n" not in message
    assert "runs image-text-to-text artifacts" in message and "text-generation-shared artifact" in message
    assert type(osg.runtime(dynamic_artifact())).__name__.startswith("SharedGraph")  # the text provider still runs it


def test_provider_without_generation_is_refused(fake_providers, dynamic_artifact):
    not_generating = _Recorder("static", "stateless", "logits-all")
    fake_providers.append(_EntryPoint("embedder", not_generating, dist_name="embed-only"))
    with pytest.raises(RuntimeSelectionError) as info:
        osg.runtime(dynamic_artifact())
    message = str(info.value)
    assert "\n" not in message
    assert "none offers generation" in message
    assert "embedder from embed-only 1.0" in message  # the installed providers are listed, with their distribution
    assert not_generating.loaded == []


def test_capable_provider_is_chosen(fake_providers, dynamic_artifact):
    weak = _Recorder("static")
    strong = _Recorder("generation", "static", "stateless", "logits-all")
    fake_providers += [_EntryPoint("a-weak", weak), _EntryPoint("b-strong", strong)]
    result = osg.runtime(dynamic_artifact(), device="GPU", ov_config={"X": "1"})
    assert result == ("loaded by", strong)
    assert strong.loaded[0][1:] == ("GPU", {"ov_config": {"X": "1"}})
    assert weak.loaded == []


def test_missing_capability_is_named(fake_providers, dynamic_artifact):
    fake_providers.append(_EntryPoint("plain", _Recorder("generation")))
    with pytest.raises(RuntimeSelectionError, match=r"none offers logits-all \(installed: plain"):
        osg.runtime(dynamic_artifact("all"))
    fake_providers.clear()
    _runtime.REGISTRY.clear()  # as in a fresh process: nothing registered yet
    with pytest.raises(RuntimeSelectionError, match="no runtime provider is installed"):
        osg.runtime(dynamic_artifact())


def test_entry_points_load_lazily_and_once(fake_providers, dynamic_artifact):
    ep = _EntryPoint("only", _Recorder("generation"))
    fake_providers.append(ep)
    assert ep.loads == 0  # nothing is loaded before the first runtime() call
    osg.runtime(dynamic_artifact())
    osg.runtime(dynamic_artifact())
    _runtime.REGISTRY.load_entry_points()
    assert ep.loads == 1
    late = _EntryPoint("late", _Recorder("generation"))
    fake_providers.append(late)
    osg.runtime(dynamic_artifact())
    assert late.loads == 0  # the installed distributions are scanned once per process (or after clear())


def test_provider_by_name_and_invalid_providers(fake_providers, dynamic_artifact):
    fake_providers += [_EntryPoint("one", _Recorder("generation")), _EntryPoint("two", _Recorder("generation"))]
    assert osg.runtime(dynamic_artifact(), provider="two")[1] is fake_providers[1].plugin
    with pytest.raises(RuntimeSelectionError, match="no runtime provider named 'three'"):
        osg.runtime(dynamic_artifact(), provider="three")
    fake_providers.append(_EntryPoint("broken", object(), dist_name="broken-dist"))
    _runtime.REGISTRY.clear()  # installed after the first scan: found in a fresh process
    with pytest.raises(RuntimeSelectionError, match=r"'broken' \(from broken-dist 1.0\) must declare `capabilities`"):
        osg.runtime(dynamic_artifact())


# ------------------------------------------------------------------------------------- artifacts


@pytest.fixture(scope="module")
def dynamic_artifact(tiny_model, tmp_path_factory):
    """`dynamic_artifact(logits, stateful)` -> a llama dynamic artifact (exported once per module)."""
    done = {}
    root = tmp_path_factory.mktemp("runtime-artifacts")

    def get(logits: str = "last", stateful: bool = True):
        if (logits, stateful) not in done:
            out = root / f"llama-{logits}-{'stateful' if stateful else 'stateless'}"
            osg.export(str(tiny_model("llama")), out, logits=logits, stateful=stateful)
            done[(logits, stateful)] = out
        return done[(logits, stateful)]

    return get


@pytest.fixture
def artifact_copy(dynamic_artifact, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(dynamic_artifact(), target)
    return target


def _refused(path, match):
    with pytest.raises(ManifestError, match=match) as info:
        osg.runtime(path)
    assert "\n" not in str(info.value)


def test_tampered_bin_is_refused(artifact_copy):
    with open(artifact_copy / "openvino_model.bin", "r+b") as fh:
        fh.seek(100)
        byte = fh.read(1)
        fh.seek(100)
        fh.write(bytes([byte[0] ^ 0xFF]))
    _refused(artifact_copy, "openvino_model.bin does not match its digest")


def test_missing_manifest_is_refused(artifact_copy, tmp_path):
    (artifact_copy / "shared_graph.json").unlink()
    _refused(artifact_copy, "no shared_graph.json in")
    _refused(tmp_path / "nowhere", "does not exist")


def test_newer_schema_is_refused(artifact_copy):
    path = artifact_copy / "shared_graph.json"
    data = json.loads(path.read_text())
    data["schema_version"] = 99
    path.write_text(json.dumps(data))
    _refused(artifact_copy, "schema_version 99, newer than .*upgrade optimum-shared-graph")


def test_file_outside_the_artifact_is_refused(artifact_copy):
    path = artifact_copy / "shared_graph.json"
    data = json.loads(path.read_text())
    (artifact_copy.parent / "x.xml").write_text("<net/>")
    data["files"]["../x.xml"] = "0" * 64
    path.write_text(json.dumps(data))
    _refused(artifact_copy, r"names '../x.xml', outside the artifact directory")


def test_corrupt_manifest_is_refused(artifact_copy):
    (artifact_copy / "shared_graph.json").write_text("{not json")
    _refused(artifact_copy, "is not valid JSON")


# ------------------------------------------------------------------------------ generate() API


@pytest.fixture(scope="module")
def reference(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_model("llama")
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _kwargs(**extra):
    return dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, pad_token_id=0, **extra)


def test_greedy_batch_and_beam_search_match_pytorch(dynamic_artifact, reference):
    pt, tok = reference
    model = osg.runtime(dynamic_artifact(), ov_config=EXACT)
    assert model.manifest.logits == "last"
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        assert torch.equal(pt.generate(**enc, **_kwargs(do_sample=False)), model.generate(**enc, **_kwargs(do_sample=False)))
        beams = _kwargs(do_sample=False, num_beams=4)
        assert torch.equal(pt.generate(**enc, **beams), model.generate(**enc, **beams)), prompt
    enc = tok(PROMPTS[:2], return_tensors="pt", padding=True)
    assert torch.equal(pt.generate(**enc, **_kwargs(do_sample=False)), model.generate(**enc, **_kwargs(do_sample=False)))


def test_sampling_streamer_and_pipeline(dynamic_artifact, reference):
    from transformers import pipeline
    from transformers.generation.streamers import BaseStreamer

    pt, tok = reference
    model = osg.runtime(dynamic_artifact(), ov_config=EXACT)
    enc = tok([PROMPTS[1]], return_tensors="pt")
    greedy = pt.generate(**enc, **_kwargs(do_sample=False))
    torch.manual_seed(0)
    sampled = model.generate(**enc, **_kwargs(do_sample=True, temperature=0.8, top_k=20))
    assert sampled.shape == greedy.shape and int(sampled.max()) < tok.vocab_size + 3
    assert torch.equal(model.generate(**enc, **_kwargs(do_sample=True, top_k=1)), greedy)

    class Collect(BaseStreamer):
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.reshape(-1).tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Collect()
    out = model.generate(**enc, streamer=streamer, **_kwargs(do_sample=False))
    streamed = [t for chunk in streamer.chunks[1:-1] for t in chunk]
    assert streamer.chunks[-1] == "end" and streamed == out[0, enc["input_ids"].shape[1]:].tolist()

    ours = pipeline("text-generation", model=model, tokenizer=tok)(PROMPTS[1], **_kwargs(do_sample=False))
    theirs = pipeline("text-generation", model=pt, tokenizer=tok)(PROMPTS[1], **_kwargs(do_sample=False))
    assert ours[0]["generated_text"] == theirs[0]["generated_text"]


@pytest.mark.parametrize("stateful", [True, False])
def test_assisted_decoding_matches_pytorch_greedy(stateful, dynamic_artifact, reference, tiny_model):
    """A smaller draft model proposes; rejected candidates are trimmed from the KV cache."""
    from transformers import AutoModelForCausalLM

    pt, tok = reference
    draft = AutoModelForCausalLM.from_pretrained(tiny_model("llama", num_hidden_layers=1)).eval()
    model = osg.runtime(dynamic_artifact("all", stateful), ov_config=EXACT)
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        ref = pt.generate(**enc, **_kwargs(do_sample=False))
        drafted = draft.generate(**enc, **_kwargs(do_sample=False))
        assert not torch.equal(ref, drafted)  # the draft is wrong sometimes, so candidates are rejected
        assert torch.equal(model.generate(**enc, assistant_model=draft, **_kwargs(do_sample=False)), ref), prompt
        # the target as its own draft: every candidate accepted, several positions verified per call
        assert torch.equal(model.generate(**enc, assistant_model=pt, **_kwargs(do_sample=False)), ref), prompt


def test_assisted_decoding_on_logits_last_is_refused(dynamic_artifact, draft_artifact, reference, tiny_model):
    pt, tok = reference
    model = osg.runtime(dynamic_artifact(), ov_config=EXACT)
    enc = tok([PROMPTS[0]], return_tensors="pt")
    for draft in (pt, osg.runtime(draft_artifact("last", False))):
        with pytest.raises(RuntimeSelectionError, match="export it with --logits all") as info:
            model.generate(**enc, assistant_model=draft, max_new_tokens=4)
        assert "\n" not in str(info.value)


@pytest.fixture(scope="module")
def draft_artifact(near_draft, tmp_path_factory):
    """`draft_artifact(logits, stateful)` -> an artifact of the `near_draft` checkpoint (exported once per module)."""
    done = {}
    root = tmp_path_factory.mktemp("draft-artifacts")

    def get(logits: str, stateful: bool):
        if (logits, stateful) not in done:
            out = root / f"draft-{logits}-{'stateful' if stateful else 'stateless'}"
            osg.export(str(near_draft), out, logits=logits, stateful=stateful)
            done[(logits, stateful)] = out
        return done[(logits, stateful)]

    return get


# The draft artifacts proposing to a main model (both logits modes, both cache kinds): a draft reads only the last
# position, so logits=last works too.
DRAFTS = [("last", False), ("all", True)]


@pytest.mark.parametrize("logits,stateful", DRAFTS, ids=[f"{lg}-{'stateful' if s else 'stateless'}" for lg, s in DRAFTS])
def test_runtime_artifact_as_draft_proposes_what_its_pytorch_model_does(logits, stateful, draft_artifact, near_draft,
                                                                         reference):
    """A runtime() draft of a PyTorch main model: its cache is cropped back to the accepted tokens after each round,
    so every candidate it proposes (seen as the main model's calls) is the one the PyTorch draft proposes, and the
    tokens are the main model's plain greedy ones."""
    from transformers import AutoModelForCausalLM

    pt, tok = reference
    pt_draft = AutoModelForCausalLM.from_pretrained(near_draft).eval()
    draft = osg.runtime(draft_artifact(logits, stateful), ov_config=EXACT)
    assert draft.manifest.logits == logits and draft.stateful == stateful
    assert {k: getattr(draft.generation_config, k) for k in DRAFT_SETTINGS} == DRAFT_SETTINGS
    rounds = []
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        greedy = pt.generate(**enc, **_kwargs(do_sample=False))
        with MainCalls(pt) as expected:
            assert torch.equal(pt.generate(**enc, assistant_model=pt_draft, **_kwargs(do_sample=False)), greedy)
        with MainCalls(pt) as calls:
            assert torch.equal(pt.generate(**enc, assistant_model=draft, **_kwargs(do_sample=False)), greedy), prompt
        assert calls == expected, prompt
        rounds.append(len(calls))
    # some rounds accept part of the 4 candidates, others none: all accepted would take 3 calls for 12 tokens,
    # none accepted 12
    assert 3 < min(rounds) and max(rounds) < NEW_TOKENS, rounds


def test_runtime_main_with_runtime_drafts_gives_its_greedy_tokens(dynamic_artifact, draft_artifact, reference):
    """OpenVINO main, OpenVINO draft: every draft artifact, and the main's own weights loaded a second time as a
    draft (every candidate accepted), give the tokens of the main model's plain greedy decoding."""
    pt, tok = reference
    model = osg.runtime(dynamic_artifact("all"), ov_config=EXACT)
    drafts = [osg.runtime(draft_artifact(*d), ov_config=EXACT) for d in DRAFTS]
    drafts.append(osg.runtime(dynamic_artifact("last"), ov_config=EXACT))
    for prompt in PROMPTS:
        enc = tok([prompt], return_tensors="pt")
        greedy = model.generate(**enc, **_kwargs(do_sample=False))
        assert torch.equal(greedy, pt.generate(**enc, **_kwargs(do_sample=False)))
        for draft in drafts:
            assert torch.equal(model.generate(**enc, assistant_model=draft, **_kwargs(do_sample=False)), greedy), prompt


def test_a_stateful_model_as_its_own_draft_is_refused_a_stateless_one_runs(dynamic_artifact, reference):
    _, tok = reference
    model = osg.runtime(dynamic_artifact("all"), ov_config=EXACT)
    enc = tok([PROMPTS[0]], return_tensors="pt")
    with pytest.raises(RuntimeSelectionError, match="cannot be its own draft.*load the artifact again") as info:
        model.generate(**enc, assistant_model=model, max_new_tokens=4)
    assert "\n" not in str(info.value)
    # a --disable-stateful artifact's cache is held by transformers, one per role: it can be its own draft
    stateless = osg.runtime(dynamic_artifact("all", False), ov_config=EXACT)
    greedy = stateless.generate(**enc, **_kwargs(do_sample=False))
    assert torch.equal(stateless.generate(**enc, assistant_model=stateless, **_kwargs(do_sample=False)), greedy)


def test_runtime_reads_the_manifest(dynamic_artifact):
    model = osg.runtime(dynamic_artifact())
    assert model.manifest == read_manifest(dynamic_artifact())
    assert model.stateful and not model.is_static


def test_generation_loop_runs_on_one_torch_thread_and_restores_it(dynamic_artifact, reference):
    """transformers' per-token tensor work runs on `torch_threads` PyTorch threads (default 1) while
    OpenVINO runs the graph; the process's own setting is back afterwards, also after an error."""
    from transformers.generation.streamers import BaseStreamer

    pt, tok = reference
    enc = tok([PROMPTS[0]], return_tensors="pt")

    class Threads(BaseStreamer):
        def __init__(self):
            self.seen = set()

        def put(self, value):
            self.seen.add(torch.get_num_threads())

        def end(self):
            pass

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for option, expected in ((1, {1}), (None, {2}), (2, {2})):
            model = osg.runtime(dynamic_artifact(), ov_config=EXACT, torch_threads=option)
            streamer = Threads()
            out = model.generate(**enc, streamer=streamer, **_kwargs(do_sample=False))
            assert streamer.seen == expected, option
            assert torch.get_num_threads() == 2
        assert torch.equal(out, pt.generate(**enc, **_kwargs(do_sample=False)))
        with pytest.raises(ValueError, match="not used by the model"):  # raised inside transformers' generate()
            osg.runtime(dynamic_artifact(), torch_threads=1).generate(**enc, **_kwargs(do_sample=False), bogus=1)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_invalid_torch_threads_is_refused(dynamic_artifact):
    with pytest.raises(InvalidOptionsError, match="torch_threads must be 1 or more"):
        osg.runtime(dynamic_artifact(), torch_threads=0)


def test_runtime_full_check_and_no_unchecked_load(artifact_copy):
    model = osg.runtime(artifact_copy, verify="full")
    assert model.manifest.partitioning == "shared"
    with pytest.raises(InvalidOptionsError, match="runtime\\(\\) always checks the graph files"):
        osg.runtime(artifact_copy, verify=False)
    with pytest.raises(InvalidOptionsError):
        osg.runtime(artifact_copy, verify="quick")


def test_assisted_generation_with_recurrent_states_is_refused(tiny_model, tmp_path):
    """lfm2's convolution states hold no positions to drop after rejected candidates: refused with one line as the
    main model and as the draft, before any inference, and plain generation still runs."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lfm2-all"
    osg.export(str(tiny_model("lfm2")), out, logits="all")
    model = osg.runtime(out, ov_config=EXACT)
    pt = AutoModelForCausalLM.from_pretrained(tiny_model("lfm2")).eval()
    ids = torch.tensor([[5, 17, 33, 48, 90, 7]])
    for main, draft in ((model, pt), (pt, model)):
        with pytest.raises(RuntimeSelectionError, match=r"lfm2 artifact can be neither the main model nor the draft "
                                                         r"of assisted generation: its 3 convolution") as info:
            main.generate(input_ids=ids, assistant_model=draft, **_kwargs(do_sample=False))
        assert "\n" not in str(info.value)
    assert torch.equal(model.generate(input_ids=ids, **_kwargs(do_sample=False)),
                       pt.generate(input_ids=ids, **_kwargs(do_sample=False)))
