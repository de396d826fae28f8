"""The cache of verified graph files: a load after an export hashes nothing, a changed file is still refused,
and a corrupt, unwritable or oversized cache never fails a load. Real files on disk; which files a load
hashes is seen through Python's `open` audit event (nothing in the package is replaced)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

import optimum_shared_graph as osg
from optimum_shared_graph import InvalidOptionsError, ManifestError, read_manifest
from optimum_shared_graph.manifest import VERIFY_ENV, hash_graph_files
from optimum_shared_graph.verified import (
    CACHE_DIR_ENV, CACHE_FILE, MAX_ENTRIES, MISSING_GRACE_NS, SETTLED_NS, FileIdentity, VerifiedFiles,
)

GRAPH_FILES = ("openvino_model.xml", "openvino_model.bin")

# --------------------------------------------------------------------------- what a load opens

_OPENED: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        name = os.path.basename(os.fsdecode(args[0]))
        if name in GRAPH_FILES:
            _OPENED.append(name)


sys.addaudithook(_audit)  # audit hooks cannot be removed: it records only inside `opened_graph_files()`


def opened_graph_files(call) -> list[str]:
    """The graph files (`openvino_model.xml`/`.bin`) that Python code opened while `call()` ran."""
    global _OPENED
    _OPENED = []
    try:
        call()
        return sorted(_OPENED)
    finally:
        _OPENED = None


# --------------------------------------------------------------------------------- artifacts


@pytest.fixture(scope="module")
def exported(tiny_model, tmp_path_factory):
    """(artifact, cache directory its export recorded into): a llama exported once for the module."""
    cache = tmp_path_factory.mktemp("export-cache")
    out = tmp_path_factory.mktemp("verify-cache") / "llama"
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(cache)
    try:
        osg.export(str(tiny_model("llama")), out)
    finally:
        if previous is None:
            os.environ.pop(CACHE_DIR_ENV)
        else:
            os.environ[CACHE_DIR_ENV] = previous
    return out, cache


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache directory of the test's own, in use."""
    path = tmp_path / "cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(path))
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    return path


@pytest.fixture
def cached_copy(exported, cache, tmp_path) -> Path:
    """A copy of the artifact whose graph files are in the test's cache (recorded as the export records them)."""
    copy = tmp_path / "copy"
    shutil.copytree(exported[0], copy)
    hash_graph_files(copy, list(GRAPH_FILES), remember=True)
    return copy


def _flip_byte(path: Path, offset: int = 100) -> None:
    """Rewrite one byte in place: same inode, same size."""
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


# ------------------------------------------------------------------------------------- tests


def test_load_after_export_hashes_nothing(exported, monkeypatch):
    out, export_cache = exported
    monkeypatch.setenv(CACHE_DIR_ENV, str(export_cache))
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    assert opened_graph_files(lambda: read_manifest(out)) == []
    assert opened_graph_files(lambda: osg.runtime(out)) == []
    # the control: a full check opens (hashes) both files, so the audit hook sees what hashing does
    assert opened_graph_files(lambda: read_manifest(out, verify="full")) == sorted(GRAPH_FILES)


def test_full_check_on_request(cached_copy, monkeypatch):
    assert opened_graph_files(lambda: read_manifest(cached_copy)) == []
    assert opened_graph_files(lambda: read_manifest(cached_copy, verify="full")) == sorted(GRAPH_FILES)
    monkeypatch.setenv(VERIFY_ENV, "full")
    assert opened_graph_files(lambda: read_manifest(cached_copy)) == sorted(GRAPH_FILES)
    assert opened_graph_files(lambda: read_manifest(cached_copy, verify=False)) == []
    monkeypatch.setenv(VERIFY_ENV, "sometimes")
    with pytest.raises(InvalidOptionsError, match=f"{VERIFY_ENV}='sometimes' is not one of cached, full"):
        read_manifest(cached_copy)
    with pytest.raises(InvalidOptionsError, match="verify='quick' is not True, False, 'cached' or 'full'"):
        read_manifest(cached_copy, verify="quick")


def test_rewritten_bin_is_refused_even_when_cached(cached_copy):
    bin_path = cached_copy / "openvino_model.bin"
    before = os.stat(bin_path)
    _flip_byte(bin_path)
    os.utime(bin_path, ns=(before.st_atime_ns, before.st_mtime_ns))  # size and mtime as they were
    after = os.stat(bin_path)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)
    with pytest.raises(ManifestError, match="openvino_model.bin does not match its digest in .*re-export the model"):
        osg.runtime(cached_copy)


def test_replaced_bin_is_refused_even_when_cached(cached_copy, tmp_path):
    bin_path = cached_copy / "openvino_model.bin"
    before = os.stat(bin_path)
    other = tmp_path / "other.bin"
    shutil.copyfile(bin_path, other)
    _flip_byte(other)
    os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(other, bin_path)
    with pytest.raises(ManifestError, match="openvino_model.bin does not match its digest"):
        read_manifest(cached_copy)


def test_moved_artifact_stays_verified(cached_copy, tmp_path):
    moved = tmp_path / "moved"
    os.rename(cached_copy, moved)
    assert opened_graph_files(lambda: read_manifest(moved)) == []
    entries = json.loads((tmp_path / "cache" / CACHE_FILE).read_text())["files"]
    assert {Path(e["path"]).parent for e in entries.values()} == {moved.resolve()}  # the new path is recorded


def test_copied_artifact_is_hashed_until_remembered(exported, cache, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(exported[0], copy)
    # just written: hashed, but not remembered (a change in the same timestamp tick could go unseen)
    assert opened_graph_files(lambda: read_manifest(copy)) == sorted(GRAPH_FILES)
    assert opened_graph_files(lambda: read_manifest(copy)) == sorted(GRAPH_FILES)
    time.sleep(SETTLED_NS / 1e9 + 0.1)
    assert opened_graph_files(lambda: read_manifest(copy)) == sorted(GRAPH_FILES)  # hashed once more, remembered
    assert opened_graph_files(lambda: read_manifest(copy)) == []


@pytest.mark.parametrize("content", [
    b"{not json", b"\xff\xfe\x00garbage", b"[]", b'{"format": 99, "files": {}}', b'{"format": 1, "files": []}',
    b'{"format": 1, "files": {"1:2": {"sha256": 5}}}', b"[" * 100_000,
])
def test_corrupt_cache_is_ignored(cached_copy, cache, content):
    (cache / CACHE_FILE).write_bytes(content)
    assert len(VerifiedFiles()) == 0
    assert opened_graph_files(lambda: read_manifest(cached_copy)) == sorted(GRAPH_FILES)


def test_cache_others_can_write_is_ignored(cached_copy, cache):
    os.chmod(cache / CACHE_FILE, 0o666)
    assert opened_graph_files(lambda: read_manifest(cached_copy)) == sorted(GRAPH_FILES)


def test_poisoned_entry_does_not_pass_a_changed_file(cached_copy, cache):
    """An entry matching the file's old identity cannot vouch for it once it changed (its ctime moved)."""
    _flip_byte(cached_copy / "openvino_model.bin")
    with pytest.raises(ManifestError, match="does not match its digest"):
        read_manifest(cached_copy)


def test_unwritable_cache_dir_does_not_fail_the_load(exported, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(CACHE_DIR_ENV, str(blocker / "cache"))  # cannot be created, even by root
    monkeypatch.delenv(VERIFY_ENV, raising=False)
    assert opened_graph_files(lambda: osg.runtime(exported[0])) == sorted(GRAPH_FILES)
    assert not (blocker / "cache").exists()


def test_unwritable_cache_file_does_not_fail_the_load(exported, cache):
    cache.mkdir()
    (cache / CACHE_FILE).mkdir()  # a directory where the file should be: neither readable nor replaceable
    assert opened_graph_files(lambda: read_manifest(exported[0])) == sorted(GRAPH_FILES)


def test_cache_is_bounded_and_drops_stale_entries(cache, tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    for i in range(MAX_ENTRIES + 40):
        (files / f"f{i}").write_bytes(b"x")
    known = VerifiedFiles()
    for i in range(MAX_ENTRIES + 40):
        path = files / f"f{i}"
        assert known.remember(path, FileIdentity.of(path), "0" * 64, hash_started_ns=None)
    assert known.save()
    assert len(VerifiedFiles()) == MAX_ENTRIES
    newest = files / f"f{MAX_ENTRIES + 39}"
    assert VerifiedFiles().digest(newest, FileIdentity.of(newest)) == "0" * 64

    # rewritten (new inode at the same path), deleted long ago, deleted just now (perhaps moved): only the last stays
    replaced, gone_old, gone_new = (files / "f290", files / "f280", files / "f270")
    data = json.loads((cache / CACHE_FILE).read_text())
    old_key = FileIdentity.of(gone_old).key
    data["files"][old_key]["used_ns"] -= MISSING_GRACE_NS + 1
    (cache / CACHE_FILE).write_text(json.dumps(data))
    keys = {p: FileIdentity.of(p).key for p in (replaced, gone_old, gone_new)}
    replaced.unlink()
    replaced.write_bytes(b"yy")
    gone_old.unlink()
    gone_new.unlink()
    fresh = files / "fresh"
    fresh.write_bytes(b"z")
    known = VerifiedFiles()
    known.remember(fresh, FileIdentity.of(fresh), "1" * 64, hash_started_ns=None)
    assert known.save()
    left = json.loads((cache / CACHE_FILE).read_text())["files"]
    assert keys[gone_new] in left and keys[gone_old] not in left and keys[replaced] not in left
    assert FileIdentity.of(fresh).key in left and len(left) <= MAX_ENTRIES


def test_a_file_changed_just_before_its_hash_is_not_remembered(cache, tmp_path):
    path = tmp_path / "fresh.bin"
    path.write_bytes(b"weights")
    identity = FileIdentity.of(path)
    known = VerifiedFiles()
    assert not known.remember(path, identity, "0" * 64, hash_started_ns=time.time_ns())
    assert known.remember(path, identity, "0" * 64, hash_started_ns=identity.ctime_ns + SETTLED_NS)


# ------------------------------------------------------------------------- the fast check of a copy


@pytest.fixture
def cold_copy(exported, cache, tmp_path) -> Path:
    """A copy of the artifact this machine never verified: the first load of a copied artifact."""
    copy = tmp_path / "cold"
    shutil.copytree(exported[0], copy)
    return copy


def test_the_manifest_records_sha256_and_xxh3(exported):
    import hashlib

    import xxhash

    artifact, _ = exported
    manifest = read_manifest(artifact, verify=False)
    assert sorted(manifest.files) == sorted(manifest.files_xxh3_128) == sorted(GRAPH_FILES)
    for name in GRAPH_FILES:
        data = (artifact / name).read_bytes()
        assert manifest.files[name] == hashlib.sha256(data).hexdigest()
        assert manifest.files_xxh3_128[name] == xxhash.xxh3_128(data).hexdigest()


def test_a_changed_file_is_refused_on_the_cold_path(cold_copy):
    _flip_byte(cold_copy / "openvino_model.bin")
    with pytest.raises(ManifestError, match="openvino_model.bin does not match its digest in .*re-export the model"):
        osg.runtime(cold_copy)


def test_a_truncated_bin_is_refused(cold_copy):
    bin_path = cold_copy / "openvino_model.bin"
    os.truncate(bin_path, bin_path.stat().st_size - 1)
    with pytest.raises(ManifestError, match="openvino_model.bin does not match its digest"):
        osg.runtime(cold_copy)


def test_a_manifest_without_the_fast_digest_is_checked_with_sha256(cold_copy):
    """An artifact exported before the XXH3-128 digest was recorded: its sha256 is what is checked."""
    path = cold_copy / "shared_graph.json"
    data = json.loads(path.read_text())
    del data["files_xxh3_128"]
    path.write_text(json.dumps(data))
    assert read_manifest(cold_copy, verify="full").files_xxh3_128 == {}
    _flip_byte(cold_copy / "openvino_model.bin")
    with pytest.raises(ManifestError, match="openvino_model.bin does not match its digest"):
        read_manifest(cold_copy, verify="full")


def test_the_check_reads_each_graph_file_once(cold_copy):
    """From disk, with the page cache of the copy dropped: the check's reads are the graph files' size."""
    import subprocess

    sizes = sum((cold_copy / name).stat().st_size for name in GRAPH_FILES)
    os.sync()
    for name in GRAPH_FILES:
        fd = os.open(cold_copy / name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    code = ("import sys; from optimum_shared_graph import read_manifest as r; r(sys.argv[1], verify='full'); "
            "print([int(l.split()[1]) for l in open('/proc/self/io') if l.startswith('read_bytes')][0])")
    out = subprocess.run([sys.executable, "-c", code, str(cold_copy)], capture_output=True, text=True, check=True)
    read = int(out.stdout.split()[-1])
    if read == 0:
        pytest.skip("this filesystem kept the files in memory (nothing was read from a disk)")
    assert read <= sizes * 1.05 + 512 * 1024, (read, sizes)  # the files once, and the interpreter's own few reads


def _mount_tmpfs(where: Path) -> None:
    import subprocess

    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


def test_a_read_only_artifact_with_an_unwritable_cache_loads_checked_without_warnings(exported, tmp_path, monkeypatch):
    import subprocess
    import warnings

    artifact, cache_dir = tmp_path / "ro-artifact", tmp_path / "ro-cache"
    _mount_tmpfs(artifact)
    _mount_tmpfs(cache_dir)
    try:
        shutil.copytree(exported[0], artifact, dirs_exist_ok=True)
        for where in (artifact, cache_dir):
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        monkeypatch.setenv(CACHE_DIR_ENV, str(cache_dir))
        monkeypatch.delenv(VERIFY_ENV, raising=False)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model = osg.runtime(artifact)
            assert model.generate(input_ids=__import__("torch").tensor([[5, 6, 7]]), max_new_tokens=2).shape == (1, 5)
        assert not (cache_dir / CACHE_FILE).exists()  # nothing could be remembered, and nothing failed
        subprocess.run(["mount", "-o", "remount,rw", str(artifact)], check=True)
        _flip_byte(artifact / "openvino_model.bin")
        subprocess.run(["mount", "-o", "remount,ro", str(artifact)], check=True)
        with pytest.raises(ManifestError, match="does not match its digest"):
            osg.runtime(artifact)  # checked again at every load: nothing was remembered
    finally:
        for where in (artifact, cache_dir):
            subprocess.run(["umount", "--lazy", str(where)], check=False)
