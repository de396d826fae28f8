"""The artifact's manifest, `shared_graph.json`: write, read, verify."""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from . import verified
from .errors import InvalidOptionsError, ManifestError
from .tasks import TASK, VLM_SHARED_TASK, VLM_TASK

MANIFEST_NAME = "shared_graph.json"
SCHEMA_VERSION = 1
GRAPH_XML = "openvino_model.xml"
GRAPH_BIN = "openvino_model.bin"
# A static graph has its own name, which optimum-intel and OpenVINO GenAI do not load (they cannot run it).
STATIC_GRAPH_XML = "openvino_static_model.xml"
STATIC_GRAPH_BIN = "openvino_static_model.bin"
# An image-text-to-text-shared artifact's shared graph: its language model, in optimum-intel's VLM layout.
LANGUAGE_XML = "openvino_language_model.xml"
RT_INFO_KEY = "shared_graph"
# `full` makes every default check (`read_manifest()`, `runtime()`) hash every graph file.
VERIFY_ENV = "OPTIMUM_SHARED_GRAPH_VERIFY"
VERIFY_MODES = ("cached", "full")

_VERSIONED = ("optimum-shared-graph", "optimum-intel", "optimum", "transformers", "torch", "openvino", "nncf")


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in _VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


# The digest a load checks (the sha256 stays in `files` for users and tools) is XXH3-128: about 7 GB/s on one
# core here against sha256's 0.8-1.3, so the check of an 8 GB graph costs a second, not ten. It guards against a
# file changed or damaged after the export (a copy cut short, a file rewritten), not against an adversary who
# could rewrite the manifest as well.
_BLOCK = 64 << 20


def _hash(path: Path, *digests, mapped: bool = True):
    """Feed the file's contents to each of `digests`, in blocks of `_BLOCK` bytes read through a memory map (no
    copy into Python), or with `mapped=False` read into one reused buffer (the pages are not mapped into the
    process, so its RSS does not count them: for a file the process maps elsewhere, the graph being validated);
    return their hex digests."""
    import mmap

    if not mapped:
        buffer = bytearray(_BLOCK)
        with open(path, "rb", buffering=0) as fh, memoryview(buffer) as view:
            while n := fh.readinto(buffer):
                for digest in digests:
                    digest.update(view[:n])
        return [digest.hexdigest() for digest in digests]
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size:
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                for start in range(0, size, _BLOCK):
                    with memoryview(mapped)[start:start + _BLOCK] as block:
                        for digest in digests:
                            digest.update(block)
    return [digest.hexdigest() for digest in digests]


def sha256_file(path: Path) -> str:
    return _hash(path, hashlib.sha256())[0]


def fast_digest_file(path: Path) -> str:
    """The file's XXH3-128 digest (hex), read once."""
    import xxhash

    return _hash(path, xxhash.xxh3_128())[0]


def digest_file(path: Path, *, mapped: bool = True) -> tuple[str, str]:
    """The file's sha256 and XXH3-128 digests, from one read (see `_hash` for `mapped`)."""
    import xxhash

    slow, fast = _hash(path, hashlib.sha256(), xxhash.xxh3_128(), mapped=mapped)
    return slow, fast


def describe_ports(ports) -> list[dict[str, str]]:
    """Name, element type and (partial) shape of graph inputs or outputs."""
    return [
        {"name": p.get_any_name(), "type": p.get_element_type().get_type_name(), "shape": str(p.get_partial_shape())}
        for p in ports
    ]


def _is_str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


# What each field read from a manifest must be: a check returning True, and what to say otherwise.
_FIELD_CHECKS: dict[str, tuple[Any, str]] = {
    "task": (lambda v: v in (TASK, VLM_SHARED_TASK), f"is not {TASK!r} or {VLM_SHARED_TASK!r}"),
    "partitioning": (lambda v: v in ("shared", "fallback"), "is not 'shared' or 'fallback'"),
    "shape_mode": (lambda v: v in ("dynamic", "static"), "is not 'dynamic' or 'static'"),
    "logits": (lambda v: v in ("last", "all"), "is not 'last' or 'all'"),
    "stateful": (lambda v: isinstance(v, bool), "is not true or false"),
    "requires": (_is_str_list, "is not a list of strings"),
    "fallback_reason": (lambda v: v is None or isinstance(v, str), "is not a string or null"),
    "static": (lambda v: v is None or (isinstance(v, dict) and all(
        isinstance(v.get(k), int) and not isinstance(v.get(k), bool) and v.get(k) > 0
        for k in ("batch_size", "query_len", "cache_len"))), "is not null or positive batch_size, query_len and cache_len"),
    "files": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(h, str) for k, h in v.items()),
              "is not an object of file names and sha256 strings"),
    "files_xxh3_128": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(h, str) and len(h) == 32
                                                             for k, h in v.items()),
                       "is not an object of file names and XXH3-128 strings"),
    "model": (lambda v: isinstance(v, dict), "is not an object"),
    "graph": (lambda v: isinstance(v, dict) and _is_str_list(v.get("files", [])), "is not an object with a list of files"),
    "quantization": (lambda v: isinstance(v, dict), "is not an object"),
    "validation": (lambda v: isinstance(v, dict), "is not an object"),
    "versions": (lambda v: isinstance(v, dict), "is not an object"),
}


def _field_problem(key: str, value: Any) -> str | None:
    check = _FIELD_CHECKS.get(key)
    if check is None or check[0](value):
        return None
    return f"{check[1]} (got {json.dumps(value)[:60]})"


@dataclass
class Manifest:
    """What `shared_graph.json` says about an artifact. See `docs/artifact.md` for every field."""

    task: str
    partitioning: str
    shape_mode: str
    logits: str
    stateful: bool
    requires: list[str]
    model: dict[str, Any] = field(default_factory=dict)
    fallback_reason: str | None = None
    static: dict[str, int] | None = None
    graph: dict[str, Any] = field(default_factory=dict)
    quantization: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=package_versions)
    files: dict[str, str] = field(default_factory=dict)
    files_xxh3_128: dict[str, str] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    path: Path | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "task": self.task,
            "model": self.model,
            "partitioning": self.partitioning,
            "fallback_reason": self.fallback_reason,
            "shape_mode": self.shape_mode,
            "static": self.static,
            "logits": self.logits,
            "stateful": self.stateful,
            "graph": self.graph,
            "quantization": self.quantization,
            "validation": self.validation,
            "versions": self.versions,
            "files": self.files,
            "files_xxh3_128": self.files_xxh3_128,
            "requires": self.requires,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], path: Path | None = None) -> "Manifest":
        where = f" in {path}" if path else ""
        version = data.get("schema_version")
        if not isinstance(version, int):
            raise ManifestError(f"manifest{where} has no integer schema_version: re-export the model")
        if version > SCHEMA_VERSION:
            raise ManifestError(
                f"manifest{where} has schema_version {version}, newer than the {SCHEMA_VERSION} this "
                "optimum-shared-graph reads: upgrade optimum-shared-graph"
            )
        required = ("task", "partitioning", "shape_mode", "logits", "stateful", "requires", "files")
        missing = [k for k in required if k not in data]
        if missing:
            raise ManifestError(f"manifest{where} lacks {', '.join(missing)}: re-export the model")
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "path"}
        for key, value in known.items():
            problem = _field_problem(key, value)
            if problem is not None:
                raise ManifestError(f"manifest{where}: {key} {problem}: re-export the model")
        return cls(**known, path=path)

    def write(self, directory: Path) -> Path:
        target = Path(directory) / MANIFEST_NAME
        target.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n")
        return target

    def judged_weight_format(self) -> str:
        """The weight format the validation's rules judge by: the artifact's (`weight_format_of`; `fp32` when none
        is recorded)."""
        return weight_format_of(self.quantization) or "fp32"

    def rt_info(self) -> dict[str, str]:
        """The facts stored under `shared_graph` in the IR's rt_info (all but the file hashes)."""
        data = self.to_dict()
        data.pop("files")
        data.pop("files_xxh3_128")
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in data.items()}

    def summary(self) -> str:
        v = self.validation or {}
        check = v.get("status", "skipped")
        if v.get("status") in {"passed", "recorded"}:
            ties = [d for d in v.get("differing_steps") or [] if d.get("near_tie")]
            greedy = "identical" if v["greedy_match"] else (
                f"identical but for {len(ties)} near-tie{'s' if len(ties) > 1 else ''}" if v["status"] == "passed"
                else "not identical")
            check += (
                f" (greedy {v['greedy_tokens']} tokens {greedy}, "
                f"max |dlogits| prefill {v['max_abs_diff_prefill']:.2e}, decode {v['max_abs_diff_decode']:.2e}"
            )
            if v["status"] == "recorded" and "kl_prefill" in v:  # quantized: how far from PyTorch, not a pass/fail
                check += (f", KL from PyTorch prefill {v['kl_prefill']:.2g}, decode {v['kl_decode']:.2g}, "
                          f"top-1 agreement {v.get('top1_agreement', 0):.2f}")
            check += ")"
        where = self.path.parent if self.path else "?"
        head = f"{self.task}: wrote {where} ({self.partitioning}"
        if self.fallback_reason:
            head += f": {self.fallback_reason}"
        line = f"{head}; {self.shape_mode}, logits={self.logits}, stateful={self.stateful}); validation: {check}"
        left_out = (self.model or {}).get("left_out")
        if left_out:  # a multimodal checkpoint's language model (pipeline/multimodal.py)
            line += (f"; the language model only ({self.model.get('exported_model_type')}): "
                     f"{', '.join(left_out)} left out, {next(iter(left_out.values())).split(': ', 1)[1]}")
        return line


def weight_format_of(quantization: dict | None, asked: str | None = None) -> str | None:
    """The format of an export's graph weights, by the one rule both tasks decide it with (their plan, stage 1:
    `pipeline/plan.py`) and a stored manifest's `quantization` is read with (`Manifest.judged_weight_format`): `int8`
    for an activation-quantized graph (`quant_mode`), whose weights are int8 too; else the weight format the
    quantization flags asked for, else `asked` (the options'); None where nothing was asked."""
    quantization = quantization or {}
    return "int8" if quantization.get("quant_mode") else (quantization.get("weight_format") or asked)


def build_manifest(
    *,
    partitioning: str,
    config: Any,
    source: str,
    opts: Any,
    decoder: Any,
    files: list[str],
    quantization: dict[str, Any] | None,
    calibration: Any = None,
    fallback_reason: str | None = None,
    graph_task: str | None = None,
    static: dict[str, int] | None = None,
    model_extra: dict[str, Any] | None = None,
) -> Manifest:
    """The one place an artifact's manifest is made, for shared and fallback exports alike.

    Args:
        partitioning: `"shared"` (one graph) or `"fallback"` (optimum-intel's own partitioning).
        config: the model's transformers config.
        source: the model id or directory, as given.
        opts: the `ExportOptions`.
        decoder: the decoder `openvino.Model` as it will be written (its ports and states are described).
        files: the graph files (`.xml`), the decoder first.
        quantization: what the quantization flags asked for (`weight_format`, `quant_mode`, `dataset`).
        calibration: the `CalibrationReport` of a data-aware quantization, if any.
        fallback_reason: why decomposition failed (fallback only).
        graph_task: optimum-intel's task, for a fallback (with-past, or image-text-to-text for a VLM).
        static: the static shapes of a static graph.
        model_extra: more facts about the model (the exported inner module, notes).
    """
    quantization = quantization or {}
    stateful = not any(p.get_any_name().startswith("past_key_values") for p in decoder.inputs)
    requires = ["generation"] + ([] if stateful else ["stateless"]) + (["logits-all"] if opts.logits == "all" else [])
    requires += (["static"] if static else []) + ([graph_task] if graph_task == VLM_TASK else [])
    samples = calibration.counts() if calibration is not None else {"prefill": 0, "decode": 0}
    return Manifest(
        task=TASK,
        partitioning=partitioning,
        fallback_reason=fallback_reason,
        shape_mode="static" if static else "dynamic",
        logits=opts.logits,
        stateful=stateful,
        requires=requires,
        static=static,
        model={"source": str(source), "model_type": config.model_type,
               "architecture": (getattr(config, "architectures", None) or [None])[0], **(model_extra or {})},
        graph={
            **({"task": graph_task} if graph_task else {}),
            "files": list(files),
            **({"decoder": files[0]} if partitioning == "fallback" else {}),
            "inputs": describe_ports(decoder.inputs),
            "outputs": describe_ports(decoder.outputs),
            "states": len(decoder.get_sinks()),
        },
        quantization={
            "weight_format": quantization.get("weight_format") or opts.weight_format or "fp32",
            "quant_mode": quantization.get("quant_mode"),
            "dataset": quantization.get("dataset"),
            "calibration_samples": samples,
            **({"calibration_decode_steps": calibration.decode_steps, "calibration_graph": calibration.graph}
               if calibration is not None and calibration.graph else {}),
            **({"calibration_decode_steps_reason": calibration.reason}
               if calibration is not None and calibration.graph and calibration.reason else {}),
            **({"float_matmuls": calibration.float_matmuls}
               if calibration is not None and calibration.float_matmuls is not None else {}),
            **({"overflow_fix": calibration.overflow_fix}
               if calibration is not None and calibration.overflow_fix is not None else {}),
        },
    )


def hash_graph_files(directory: Path, names: list[str], *, remember: bool = False) -> dict[str, str]:
    """The sha256 of each named file in `directory` (see `digest_graph_files`)."""
    return digest_graph_files(directory, names, remember=remember)[0]


def digest_graph_files(directory: Path, names: list[str], *, remember: bool = False,
                       digested: dict | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """The sha256 and the XXH3-128 of each named file in `directory`, from one read of each.

    Args:
        directory: the artifact directory.
        names: the graph files to hash.
        remember: record the digests in this machine's cache of verified files (the export, for the files
            it has just written), so the first load after the export does not hash them again.
        digested: digests computed earlier (`DigestsBeside.result()`: name -> (`same_content(identity)`, sha256,
            XXH3-128)), used where the file is still the one digested (moved by a rename, not rewritten).
    """
    directory = Path(directory)
    known = verified.VerifiedFiles() if remember and verified.supported() else None
    slow, fast = {}, {}
    for name in names:
        target = (directory / name).resolve()
        before = verified.FileIdentity.of(target) if known is not None or digested else None
        earlier = (digested or {}).get(name)
        if earlier is not None and earlier[0](before):
            slow[name], fast[name] = earlier[1], earlier[2]
        else:
            slow[name], fast[name] = digest_file(target)
        _remember(known, target, before, slow[name], hash_started_ns=None)
    if known is not None:
        known.save()
    return slow, fast


def _check_remembered(target: Path, known, before, digest: str, fast: str | None, *, hash_started_ns: int) -> bool:
    """Whether `target` has the exported content: its XXH3-128 against `fast` where the manifest records one (a
    read at memory speed), else its sha256 against `digest`. A match is remembered in `known` (if any) under
    the sha256, when the file's identity is still `before`."""
    same = fast_digest_file(target) == fast if fast is not None else sha256_file(target) == digest
    if same:
        _remember(known, target, before, digest, hash_started_ns=hash_started_ns)
    return same


def _remember(known, target: Path, before, digest: str, *, hash_started_ns: int | None) -> None:
    """Remember `digest` (a sha256) for `target` in `known` (if any) when the file's identity is still `before`
    once hashed (see `VerifiedFiles.remember` for `hash_started_ns`)."""
    if known is not None and verified.FileIdentity.of(target) == before:
        known.remember(target, before, digest, hash_started_ns=hash_started_ns)


def verify_mode(verify: bool | str = True) -> str | None:
    """What a `verify` argument asks for: `"cached"`, `"full"`, or None (no check of the graph files).

    `True` is `"cached"`, or `"full"` when the environment variable `OPTIMUM_SHARED_GRAPH_VERIFY` is `full`.

    Raises:
        InvalidOptionsError: an unknown value, in the argument or the environment variable.
    """
    if verify is False:
        return None
    if verify is True:
        env = os.environ.get(VERIFY_ENV, "").strip().lower()
        if env and env not in VERIFY_MODES:
            raise InvalidOptionsError(
                f"{VERIFY_ENV}={os.environ[VERIFY_ENV]!r} is not one of {', '.join(VERIFY_MODES)}: "
                "set it to full (hash every graph file at every load) or unset it"
            )
        return env or "cached"
    if verify not in VERIFY_MODES:
        raise InvalidOptionsError(f"verify={verify!r} is not True, False, 'cached' or 'full': pass one of them")
    return str(verify)


def read_manifest(directory: str | Path, *, verify: bool | str = True) -> Manifest:
    """Read `shared_graph.json` from an artifact directory and check it.

    Args:
        directory: the artifact directory.
        verify: check that every listed file stays inside the directory and matches its sha256.
            `True` (the default) or `"cached"`: a file verified before on this machine and unchanged since
            (same inode, size, modification and change times) is not hashed again; `"full"`: hash every
            file (also what `True` means when `OPTIMUM_SHARED_GRAPH_VERIFY=full`); `False`: read only.

    Raises:
        ManifestError: missing, unreadable, newer schema, a file outside the directory, a missing
            file, or a sha256 mismatch.
        InvalidOptionsError: an unknown `verify` value.
    """
    mode = verify_mode(verify)
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ManifestError(f"artifact directory {directory} does not exist: pass the OUT directory of an export")
    if not path.is_file():
        raise ManifestError(
            f"no {MANIFEST_NAME} in {directory}: it is not a text-generation-shared artifact; export it with "
            "--task text-generation-shared"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ManifestError(f"{path} is not valid JSON ({err}): re-export the model") from err
    if not isinstance(data, dict):
        raise ManifestError(f"{path} is not a JSON object: re-export the model")
    manifest = Manifest.from_dict(data, path=path)
    if mode is not None:
        verify_files(directory, manifest, mode=mode)
    return manifest


def verify_files(directory: Path, manifest: Manifest, *, mode: str = "cached") -> list[str]:
    """Check that every graph file listed in `manifest` is inside `directory` and matches its sha256.

    Args:
        directory: the artifact directory.
        manifest: its manifest.
        mode: `"cached"` skips the files this machine verified before and that are unchanged since, and
            remembers the ones it hashes; `"full"` hashes every file and leaves the cache alone.

    Returns:
        The names of the files hashed (the others matched a remembered digest).

    Raises:
        ManifestError: a file outside the directory, a missing file, or a sha256 mismatch.
    """
    root = Path(directory).resolve()
    if not isinstance(manifest.files, dict) or not manifest.files:
        raise ManifestError(f"{manifest.path} lists no graph files: re-export the model")
    known = verified.VerifiedFiles() if mode == "cached" and verified.supported() else None
    hashed = []
    for name, digest in manifest.files.items():
        target = (root / name).resolve()
        if target.parent != root and root not in target.parents:
            raise ManifestError(
                f"{manifest.path} names {name!r}, outside the artifact directory: refusing to load it; re-export the model"
            )
        if not target.is_file():
            raise ManifestError(f"{name} listed in {manifest.path} is missing: re-export the model")
        try:
            before = verified.FileIdentity.of(target) if known is not None else None
        except OSError:
            raise ManifestError(f"{name} listed in {manifest.path} is missing: re-export the model") from None
        if known is not None and known.digest(target, before) == digest:
            continue
        hashed.append(name)
        fast = (manifest.files_xxh3_128 or {}).get(name)
        if not _check_remembered(target, known, before, digest, fast, hash_started_ns=time.time_ns()):
            raise ManifestError(  # before the cache is saved: a file that does not match is never remembered
                f"{name} does not match its digest in {manifest.path}: the file changed after export; re-export the model"
            )
    if known is not None:
        known.save()
    return hashed


class DigestsBeside:
    """The sha256 and XXH3-128 of files that will not change again (the `.bin` optimum-intel wrote, which the
    artifact takes by a rename), computed in a thread while the export goes on (both hashes release the GIL);
    `result()` gives what `digest_graph_files(digested=...)` takes."""

    def __init__(self, paths: dict[str, Path]):
        import threading

        self._done: dict = {}
        self._thread = threading.Thread(target=self._run, args=(dict(paths),), daemon=True)
        self._thread.start()

    def _run(self, paths: dict[str, Path]) -> None:
        for name, path in paths.items():
            try:
                identity = verified.FileIdentity.of(path)
                slow, fast = digest_file(path, mapped=False)  # the validation maps the same file
                unchanged = verified.FileIdentity.of(path) == identity  # not written while it was read
            except OSError:  # gone (a failed export's staging removed) or unreadable: hashed again where it lands
                continue
            if unchanged:  # a rename keeps the device, inode, size and mtime (not the ctime)
                self._done[name] = (lambda now, was=identity: now is not None and (now.dev, now.ino, now.size,
                                    now.mtime_ns) == (was.dev, was.ino, was.size, was.mtime_ns), slow, fast)

    def result(self) -> dict:
        """Wait for the thread; name -> (`same_content(identity)`, sha256, XXH3-128) of each file it digested."""
        self._thread.join()
        return dict(self._done)
