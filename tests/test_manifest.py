"""The manifest: written by the export, read back and checked."""

from __future__ import annotations

import json

import pytest

from optimum_shared_graph import ManifestError, read_manifest
from optimum_shared_graph.manifest import MANIFEST_NAME, SCHEMA_VERSION, Manifest, hash_graph_files


@pytest.fixture
def artifact(tmp_path):
    (tmp_path / "openvino_model.xml").write_text("<net/>")
    (tmp_path / "openvino_model.bin").write_bytes(b"\0" * 64)
    manifest = Manifest(task="text-generation-shared", partitioning="shared", shape_mode="dynamic", logits="last",
                        stateful=True, requires=["generation"])
    manifest.files = hash_graph_files(tmp_path, ["openvino_model.xml", "openvino_model.bin"])
    manifest.write(tmp_path)
    return tmp_path


def _edit(artifact, **changes):
    data = json.loads((artifact / MANIFEST_NAME).read_text())
    data.update(changes)
    (artifact / MANIFEST_NAME).write_text(json.dumps(data))


def test_round_trip(artifact):
    manifest = read_manifest(artifact)
    assert manifest.schema_version == SCHEMA_VERSION and manifest.requires == ["generation"]
    assert Manifest.from_dict(manifest.to_dict()).to_dict() == manifest.to_dict()


def test_missing(tmp_path):
    with pytest.raises(ManifestError, match="no shared_graph.json in .*--task text-generation-shared"):
        read_manifest(tmp_path)


def test_missing_directory(tmp_path):
    with pytest.raises(ManifestError, match="does not exist"):
        read_manifest(tmp_path / "nope")


def test_corrupt(artifact):
    (artifact / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(ManifestError, match="is not valid JSON"):
        read_manifest(artifact)


def test_newer_schema(artifact):
    _edit(artifact, schema_version=SCHEMA_VERSION + 1)
    with pytest.raises(ManifestError, match="newer than .*upgrade optimum-shared-graph"):
        read_manifest(artifact)


def test_tampered_bin(artifact):
    (artifact / "openvino_model.bin").write_bytes(b"\1" * 64)
    with pytest.raises(ManifestError, match="openvino_model.bin does not match its digest"):
        read_manifest(artifact)


def test_file_outside_the_directory(artifact):
    _edit(artifact, files={"../x.xml": "0" * 64})
    with pytest.raises(ManifestError, match="outside the artifact directory"):
        read_manifest(artifact)


def test_missing_graph_file(artifact):
    (artifact / "openvino_model.bin").unlink()
    with pytest.raises(ManifestError, match="is missing"):
        read_manifest(artifact)


def test_messages_are_one_line(artifact):
    _edit(artifact, schema_version="one")
    with pytest.raises(ManifestError) as info:
        read_manifest(artifact)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("field,value,expected", [
    ("shape_mode", "quantum", "shape_mode is not 'dynamic' or 'static'"),
    ("requires", "generation", "requires is not a list of strings"),
    ("logits", 1, "logits is not 'last' or 'all'"),
    ("stateful", "yes", "stateful is not true or false"),
    ("partitioning", "both", "partitioning is not 'shared' or 'fallback'"),
    ("task", "text-generation", "task is not 'text-generation-shared'"),
    ("static", {"batch_size": 1, "query_len": 0, "cache_len": 8}, "static is not null or positive"),
    ("files", ["openvino_model.xml"], "files is not an object"),
])
def test_fields_are_checked_for_type_and_value(artifact, field, value, expected):
    _edit(artifact, **{field: value})
    with pytest.raises(ManifestError) as info:
        read_manifest(artifact)
    assert expected in str(info.value) and "re-export the model" in str(info.value) and "\n" not in str(info.value)
