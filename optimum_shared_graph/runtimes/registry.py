"""`runtime()`: read and check an artifact, then hand it to a runtime provider that can run it (see docs/runtime.md).

Providers are found through the entry-point group `optimum_shared_graph.runtimes`. The package's
own providers (OpenVINO for text-generation artifacts, `openvino-vlm` for image-text-to-text ones) are registered
there by its `setup.cfg`, like any third-party one. An
entry point names an object (a class is instantiated without arguments) with:

- `capabilities`: the capabilities it offers, a subset of `CAPABILITIES` (and any future names);
- `load(path, manifest, *, device, **options)`: returns the runnable model.

An artifact's manifest lists what it `requires`; a provider is chosen only when its capabilities
cover all of it. So a provider that does not flag `generation` is never given a generation artifact.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidOptionsError, RuntimeSelectionError
from ..manifest import Manifest, read_manifest, verify_files, verify_mode

GROUP = "optimum_shared_graph.runtimes"

# What a provider can declare. `generation`: runs the decoder graph token by token for generate();
# `static`: static-shape graphs; `stateless`: KV cache as graph inputs/outputs; `logits-all`:
# graphs with logits for every position (assisted decoding); `concurrent`: its model's generate() may
# be called from several threads at once (without it, runtime() makes the calls take turns);
# `image-text-to-text`: optimum-intel's vision-language layout (`--task image-text-to-text-shared`).
CAPABILITIES = ("generation", "static", "stateless", "logits-all", "concurrent", "image-text-to-text")


@dataclass(frozen=True)
class Provider:
    """A registered runtime provider.

    Args:
        name: the entry point's name.
        plugin: the loaded provider object.
        capabilities: what it declared.
        distribution: `"name version"` of the distribution that provided it (for messages), or None.
    """

    name: str
    plugin: Any
    capabilities: frozenset[str]
    distribution: str | None = None

    def describe(self) -> str:
        where = f" from {self.distribution}" if self.distribution else ""
        return f"{self.name}{where} [{', '.join(sorted(self.capabilities)) or 'no capabilities'}]"


class ProviderRegistry:
    """The providers found through entry points, loaded lazily and once (pluggy-style)."""

    def __init__(self, group: str = GROUP):
        self.group = group
        self._providers: dict[str, Provider] = {}
        self._scanned = False
        self._lock = threading.RLock()

    def load_entry_points(self) -> list[Provider]:
        """Load the group's entry points (once: the installed distributions are scanned on the first call
        only, which takes tens of milliseconds); return every registered provider."""
        with self._lock:
            if not self._scanned:
                for ep in importlib.metadata.entry_points(group=self.group):
                    if ep.name not in self._providers:
                        self.register(ep.name, ep.load(), distribution=_distribution(ep))
                self._scanned = True
            return list(self._providers.values())

    def clear(self) -> None:
        """Forget every registered provider: the entry points are scanned and loaded again on next use."""
        with self._lock:
            self._providers.clear()
            self._scanned = False

    def register(self, name: str, plugin: Any, *, distribution: str | None = None) -> Provider:
        """Register a provider object (or a class, instantiated without arguments) under `name`.

        Raises:
            RuntimeSelectionError: it declares no `capabilities` or has no `load()`.
        """
        where = f" (from {distribution})" if distribution else ""
        if isinstance(plugin, type):
            plugin = plugin()
        capabilities = getattr(plugin, "capabilities", None)
        if isinstance(capabilities, str) or not all(isinstance(c, str) for c in capabilities or [None]):
            raise RuntimeSelectionError(
                f"runtime provider {name!r}{where} must declare `capabilities` as a set of strings "
                f"(from {', '.join(CAPABILITIES)}): fix or uninstall it"
            )
        if not callable(getattr(plugin, "load", None)):
            raise RuntimeSelectionError(f"runtime provider {name!r}{where} has no load() method: fix or uninstall it")
        provider = Provider(name=name, plugin=plugin, capabilities=frozenset(capabilities), distribution=distribution)
        with self._lock:
            self._providers.setdefault(name, provider)
            return self._providers[name]

    def select(self, manifest: Manifest, *, name: str | None = None) -> Provider:
        """The first provider (by name) whose capabilities cover `manifest.requires`.

        Raises:
            RuntimeSelectionError: none does; the message names the missing capability and the providers.
        """
        providers = sorted(self.load_entry_points(), key=lambda p: p.name)
        requires = set(manifest.requires)
        where = manifest.path.parent if manifest.path else "the artifact"
        installed = "; ".join(p.describe() for p in providers) or "none"
        if name is not None:
            chosen = [p for p in providers if p.name == name]
            if not chosen:
                raise RuntimeSelectionError(
                    f"no runtime provider named {name!r} is installed (installed: {installed}): "
                    f"install it, or leave `provider` unset"
                )
            providers = chosen
        for provider in providers:
            if requires <= provider.capabilities:
                return provider
        if not providers:
            raise RuntimeSelectionError(
                f"no runtime provider is installed (entry-point group {self.group}): reinstall optimum-shared-graph"
            )
        # Name what no provider offers; when each piece is offered somewhere, what the closest one lacks.
        nobody = sorted(c for c in requires if not any(c in p.capabilities for p in providers))
        missing = nobody or sorted(min((requires - p.capabilities for p in providers), key=len))
        raise RuntimeSelectionError(
            f"no runtime provider can run {where}: it requires {', '.join(sorted(requires))} and none offers "
            f"{', '.join(missing)} (installed: {installed}); install a provider with {', '.join(missing)}"
        )


def _distribution(ep) -> str | None:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None
    try:
        return f"{dist.metadata['Name']} {dist.version}"
    except Exception:  # a distribution without readable metadata
        return getattr(dist, "name", None)


# The process's providers: entry points load into it on first use.
REGISTRY = ProviderRegistry()


def runtime(path: str | os.PathLike, device: str = "CPU", *, provider: str | None = None, verify: bool | str = True,
            **options: Any) -> Any:
    """Load an artifact with a runtime provider that can run it.

    Args:
        path: the artifact directory (the `OUT` of an export).
        device: the device to compile for (`"CPU"`, `"GPU"`, ...).
        provider: the name of the provider to use; `None` picks one that covers the artifact's `requires`.
        verify: how the graph files' sha256 is checked (as in `read_manifest`): `True`/`"cached"` (a file
            verified before on this machine and unchanged since is not hashed again) or `"full"`.
        **options: passed to the provider's `load()` (for the OpenVINO provider: `ov_config`, the
            OpenVINO compile properties, and `torch_threads`, the PyTorch threads `generate()` runs
            its loop on, default 1).

    Returns:
        What the provider returns; the built-in OpenVINO provider returns a model with transformers'
        `generate()` API, which several threads may call at once (one compiled model; each calling
        thread has its own inference request and KV state). A provider that does not declare the
        `concurrent` capability gets its model's `generate()` calls made one at a time.

    Raises:
        ManifestError: the manifest is missing, corrupt, from a newer schema, names a file outside the
            directory, or a graph file's sha256 changed.
        RuntimeSelectionError: no installed provider covers what the artifact requires.

    Example:
        >>> import optimum_shared_graph as osg
        >>> model = osg.runtime("./tiny-llama-ov")  # doctest: +SKIP
        >>> model.generate(**tokenizer("Hello", return_tensors="pt"), max_new_tokens=8)  # doctest: +SKIP
    """
    path = Path(path)
    if verify is False:
        raise InvalidOptionsError("runtime() always checks the graph files: pass verify='cached' or 'full'")
    mode = verify_mode(verify)
    manifest = read_manifest(path, verify=False)
    chosen = REGISTRY.select(manifest, name=provider)
    # the graph files are checked while the provider reads and compiles them (a second core hashes while OpenVINO
    # compiles), and the model is handed out only once they match: a changed file is refused before any inference
    with ThreadPoolExecutor(1, thread_name_prefix="optimum-shared-graph-verify") as pool:
        check = pool.submit(verify_files, path, manifest, mode=mode)
        try:
            model = chosen.plugin.load(path, manifest, device=device, **options)
        finally:
            check.result()  # raises ManifestError if a file does not match, in place of whatever load() did
    if "concurrent" not in chosen.capabilities:
        model = _one_call_at_a_time(model)
    return model


def _one_call_at_a_time(model: Any) -> Any:
    """`model` with its `generate()` calls serialised (for a provider that does not declare `concurrent`)."""
    generate = getattr(model, "generate", None)
    if not callable(generate):
        return model
    lock = threading.Lock()

    @functools.wraps(generate)
    def serialised(*args, **kwargs):
        with lock:
            return generate(*args, **kwargs)

    try:
        model.generate = serialised
    except (AttributeError, TypeError):  # an object that takes no attributes: wrap it instead
        return _Serialised(model, serialised)
    return model


class _Serialised:
    """A model whose `generate()` is serialised; every other attribute is the model's own."""

    def __init__(self, model: Any, generate: Any):
        self.__dict__.update(_model=model, generate=generate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def installed_providers() -> list[Provider]:
    """The runtime providers installed (loading their entry points if not done yet)."""
    return sorted(REGISTRY.load_entry_points(), key=lambda p: p.name)
