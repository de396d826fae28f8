"""The start-up hooks: run-after-import and the static-artifact guard."""

from __future__ import annotations

import json
import sys
import types

import _optimum_shared_graph_hooks as hooks


def test_call_after_import_runs_now_for_an_imported_module():
    seen = []
    hooks.call_after_import("json", seen.append)
    assert seen == [json]


def test_call_after_import_waits_and_is_idempotent(tmp_path, monkeypatch):
    (tmp_path / "osg_probe_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    callback = seen.append
    hooks.call_after_import("osg_probe_module", callback)
    hooks.call_after_import("osg_probe_module", callback)
    assert seen == []
    import osg_probe_module

    assert seen == [osg_probe_module]
    assert not any(isinstance(f, hooks._AfterImport) and f.fullname == "osg_probe_module" for f in sys.meta_path)


def test_static_artifact_message(tmp_path):
    assert hooks.static_artifact_message(tmp_path) is None
    (tmp_path / "shared_graph.json").write_text(json.dumps({"shape_mode": "dynamic"}))
    assert hooks.static_artifact_message(tmp_path) is None
    (tmp_path / "shared_graph.json").write_text("{broken")
    assert hooks.static_artifact_message(tmp_path) is None
    (tmp_path / "shared_graph.json").write_text(json.dumps({"shape_mode": "static"}))
    assert "optimum_shared_graph.runtime(" in hooks.static_artifact_message(tmp_path)


def test_guard_wraps_from_pretrained_once():
    calls = []

    class FakeDecoder:
        @classmethod
        def from_pretrained(cls, model_id, **kwargs):
            calls.append(model_id)
            return cls

    module = types.SimpleNamespace(OVModelForCausalLM=FakeDecoder)
    hooks._guard_decoder_models(module)
    wrapped = FakeDecoder.from_pretrained
    hooks._guard_decoder_models(module)
    assert FakeDecoder.from_pretrained == wrapped
    assert FakeDecoder.from_pretrained("not-an-artifact") is FakeDecoder and calls == ["not-an-artifact"]
