"""The package's architecture: imports point one way, from the public face down to the leaves, and no
import cycle exists, counting the imports inside functions (read from the source, not from sys.modules)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "optimum_shared_graph"

# Each layer may import its own layer and the ones below, never one above (docs/design.md draws it).
LAYERS = [
    {"host"},  # every patch of optimum-intel, Optimum and transformers; imports nothing of the package
    {"errors", "tasks", "options", "manifest", "verified", "registration", "progress"},  # leaves
    {"graph"},  # transforms of OpenVINO graphs
    {"architectures"},  # fixes of optimum-intel's export configs, one module per architecture family
    {"runtimes"},  # runtime(), providers, the sessions that feed a graph
    {"proof"},  # the stored reference, the rules that judge against it, validate() of a deployed artifact
    {"quantization"},  # calibration on both stages and on static graphs
    {"pipeline"},  # the export, stage by stage
    {"api", "cli", "validate_cli", "__main__", "_cli_hook", "__init__", "testing", "released"},  # the public face
]


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, names in enumerate(LAYERS) if top in names)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports, anywhere in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name and candidate.startswith("optimum_shared_graph"):
                found.add(candidate)
    return found


def _graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    modules.discard("optimum_shared_graph")  # the package's own __init__ is reached only through its lazy names
    return {_module_name(f): _imports(f, modules) for f in files}


def test_every_module_belongs_to_a_layer():
    for module in _graph():
        _layer(module)  # StopIteration names a module no layer holds


def test_imports_point_down():
    wrong = [f"{m} -> {d}" for m, deps in _graph().items() for d in deps if _layer(d) > _layer(m)]
    assert not wrong, "imports against the declared direction:\n" + "\n".join(wrong)


def test_no_import_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        stack.pop()
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_checks_see_function_level_imports(tmp_path):
    """The graph counts an import inside a function (the kind that used to hide cycles)."""
    assert "optimum_shared_graph.pipeline.static" in _graph()["optimum_shared_graph.pipeline.export"]


def test_host_imports_nothing_of_the_package():
    """host/, the patches of the libraries the package does not own, is the bottom layer: it imports only
    its own modules, so every stage (and the CLI, and registration) can use it."""
    graph = _graph()
    outside = {f"{m} -> {d}" for m, deps in graph.items() if m.startswith("optimum_shared_graph.host")
               for d in deps if not d.startswith("optimum_shared_graph.host")}
    assert not outside, outside


def test_every_subpackage_is_installed():
    """setup.cfg lists the packages by name: a new subpackage missing there is absent from an installed copy
    (the tests that run optimum-cli in a subprocess use the installed package)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(PACKAGE.parent / "setup.cfg")
    listed = {line.strip() for line in config["options"]["packages"].splitlines() if line.strip()}
    found = {".".join(path.parent.relative_to(PACKAGE.parent).parts) for path in PACKAGE.rglob("__init__.py")}
    assert found - listed == set(), f"subpackages missing from setup.cfg's packages: {sorted(found - listed)}"
