"""Graph files already verified on this machine: their sha256 remembered by file identity, so loading an
artifact does not hash gigabytes of weights again at every load (see docs/runtime.md).

A file's identity is its device and inode number with its size, modification time and change time
(`st_ctime`, which a write, a truncation, a rename or `touch` set to the current time and which user space
cannot set back). A remembered digest is used only while all five are unchanged, so a graph file rewritten
after it was verified, in place or replaced, is hashed again and refused if it no longer matches.

The cache is one small JSON file per user, `$XDG_CACHE_HOME/optimum_shared_graph/verified-files.json`
(`~/.cache/...` without it), or in the directory named by `OPTIMUM_SHARED_GRAPH_CACHE_DIR`. It is written
atomically, read only when the current user owns it and nobody else can write it, and never fails a load: a
missing, corrupt or unwritable cache means the files are hashed. On Windows, whose timestamps do not record
every change, nothing is remembered.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_DIR_ENV = "OPTIMUM_SHARED_GRAPH_CACHE_DIR"
CACHE_FILE = "verified-files.json"
FORMAT = 1
# At most this many files are remembered; the least recently used go first.
MAX_ENTRIES = 256
# A load remembers a file only when its last change is this much older than the start of its hash: a change
# made after the hash began then carries a later timestamp, even on a filesystem with 1-2 s timestamps.
SETTLED_NS = 2_000_000_000
# A remembered file's last use is written back at most this often (it orders the eviction).
TOUCH_NS = 24 * 3600 * 1_000_000_000
# An entry whose path no longer names a file is kept this long after its last use (the artifact may have
# been moved: the identity, not the path, is what matches).
MISSING_GRACE_NS = 7 * 24 * 3600 * 1_000_000_000


@dataclass(frozen=True)
class FileIdentity:
    """What must be unchanged for a remembered digest to hold."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> "FileIdentity":
        """The identity of the file at `path` (following symlinks). Raises OSError when it cannot be stat'ed."""
        st = os.stat(path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    @property
    def key(self) -> str:
        return f"{self.dev}:{self.ino}"

    def matches(self, entry: dict[str, Any]) -> bool:
        return (entry["size"], entry["mtime_ns"], entry["ctime_ns"]) == (self.size, self.mtime_ns, self.ctime_ns)


def supported() -> bool:
    """Whether this platform's file timestamps record every change (POSIX `st_ctime`)."""
    return os.name == "posix"


def cache_dir() -> Path | None:
    """Where the cache lives: `$OPTIMUM_SHARED_GRAPH_CACHE_DIR`, else `$XDG_CACHE_HOME/optimum_shared_graph`,
    else `~/.cache/optimum_shared_graph`; None when there is no home directory to put it in."""
    chosen = os.environ.get(CACHE_DIR_ENV)
    if chosen:
        return Path(chosen)
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "optimum_shared_graph"
    home = os.path.expanduser("~")
    return Path(home) / ".cache" / "optimum_shared_graph" if os.path.isabs(home) else None


def _valid_entry(entry: Any) -> bool:
    if not isinstance(entry, dict):
        return False
    digest = entry.get("sha256")
    numbers = [entry.get(k) for k in ("size", "mtime_ns", "ctime_ns", "used_ns")]
    return (isinstance(digest, str) and len(digest) == 64 and isinstance(entry.get("path"), str)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in numbers))


def _read(path: Path) -> dict[str, dict[str, Any]]:
    """The entries of the cache file at `path`; none when it is missing, unreadable, corrupt or not private."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_uid != os.getuid() or st.st_mode & 0o022:
                return {}  # another user could have written it
            data = json.loads(fh.read())
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), dict):
        return {}
    return {k: v for k, v in data["files"].items() if isinstance(k, str) and _valid_entry(v)}


class VerifiedFiles:
    """The digests remembered on this machine: look one up by identity, remember new ones, save.

    Args:
        directory: the cache directory; `cache_dir()` when None.
    """

    def __init__(self, directory: Path | None = None):
        directory = directory if directory is not None else cache_dir()
        self.path = directory / CACHE_FILE if directory is not None and supported() else None
        self._entries = _read(self.path) if self.path is not None else {}
        self._changed: set[str] = set()

    def __len__(self) -> int:
        return len(self._entries)

    def digest(self, path: Path, identity: FileIdentity) -> str | None:
        """The sha256 remembered for the file at `path` with `identity`, or None."""
        entry = self._entries.get(identity.key)
        if entry is None or not identity.matches(entry):
            return None
        now = time.time_ns()
        if entry["path"] != str(path) or now - entry["used_ns"] > TOUCH_NS:
            self._entries[identity.key] = {**entry, "path": str(path), "used_ns": now}
            self._changed.add(identity.key)
        return entry["sha256"]

    def remember(self, path: Path, identity: FileIdentity, digest: str, *, hash_started_ns: int | None) -> bool:
        """Remember that the file at `path` with `identity` has `digest`; True when remembered.

        Args:
            path: the file (stored to drop the entry once the path names another file).
            identity: its identity, taken before the hash and unchanged after it.
            digest: its sha256.
            hash_started_ns: when the hash began (`time.time_ns()`): a file changed less than `SETTLED_NS`
                before is not remembered. None for files this process has just written itself.
        """
        if self.path is None:
            return False
        if hash_started_ns is not None and identity.ctime_ns + SETTLED_NS > hash_started_ns:
            return False
        self._entries[identity.key] = {
            "path": str(path), "sha256": digest, "size": identity.size, "mtime_ns": identity.mtime_ns,
            "ctime_ns": identity.ctime_ns, "used_ns": time.time_ns(),
        }
        self._changed.add(identity.key)
        return True

    def save(self) -> bool:
        """Write what changed, merged with what other processes saved meanwhile; True when written.

        Stale entries are dropped (the path names another file; or no file, and unused for a week), then the
        least recently used beyond `MAX_ENTRIES`. Never raises: an unwritable cache only means hashing later.
        """
        if not self._changed:
            return True
        if self.path is None:
            return False
        merged = _read(self.path)
        merged.update({k: self._entries[k] for k in self._changed})
        now = time.time_ns()
        kept = {k: v for k, v in merged.items() if not _stale(k, v, now)}
        newest = sorted(kept.items(), key=lambda item: item[1]["used_ns"], reverse=True)[:MAX_ENTRIES]
        text = json.dumps({"format": FORMAT, "files": dict(newest)}, indent=0, sort_keys=True)
        tmp = None
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{CACHE_FILE}.", dir=self.path.parent)
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.replace(tmp, self.path)
        except OSError:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return False
        self._entries = dict(newest)
        self._changed.clear()
        return True


def _stale(key: str, entry: dict[str, Any], now: int) -> bool:
    """Whether the entry's path names another file, or no file and the entry was not used for a week."""
    try:
        identity = FileIdentity.of(Path(entry["path"]))
    except OSError:
        return now - entry["used_ns"] > MISSING_GRACE_NS
    return identity.key != key or not identity.matches(entry)
