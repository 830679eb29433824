"""The package's layering, read from the source: no module imports a higher layer, the package has no
import cycle, no module imports its own package's ``__init__``, and every runtime module imports on its
own in a fresh interpreter.

Imports are read with :mod:`ast`, all of them: module level, inside functions (lazy imports) and under
``if TYPE_CHECKING:`` (a typing-only cycle is still a cycle: the two modules cannot be understood, or
moved, one without the other).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import calltape

PACKAGE = Path(calltape.__file__).parent

LAYERS: dict[str, int] = {
    "calltape.errors": 0,
    "calltape.events": 0,
    "calltape.gcpause": 0,
    "calltape.eventstore": 1,
    "calltape.migrations": 1,
    "calltape.projections": 2,
    "calltape.runtime": 3,
    "calltape.checks": 3,  # the check rules: events and the fold, nothing of the runtime
    "calltape.picture": 3,  # the timeline picture: the fold drawn as HTML (for the CLI and serve)
    "calltape.adapters": 4,
    "calltape.server": 4,
    "calltape.demo": 4,
    "calltape.cli": 5,
    "calltape.testing": 6,  # the test harness: drives the runtime, prints timelines as the CLI does
    "calltape.client": 4,  # calltape.connect(): wires store, recorder and calls; adapters may build on it
    "calltape": 6,  # the root re-exports everything (lazily): importing it from inside is importing the top
}
"""Lower layers never import higher ones: errors/events < eventstore < projections < runtime <
adapters/server < cli. A new single-file module directly under ``calltape/`` is a base utility (layer 0)
unless listed here; a new sub-package must be listed."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        layer = LAYERS.get(".".join(parts[:n]))
        if layer is not None:
            return layer
    if module == "calltape":
        return LAYERS[module]
    if len(parts) == 2 and (PACKAGE / f"{parts[1]}.py").exists():
        return 0  # a base utility
    raise AssertionError(f"add the sub-package calltape.{parts[1]} to LAYERS in {__file__}")


def imports_of(path: Path, module: str) -> set[str]:
    """Every calltape module ``path`` imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            # ``from calltape.runtime import tools`` imports the module calltape.runtime.tools (the package's
            # ``__init__`` runs for any submodule anyway); a name that is no module comes from the package
            modules = package_modules()
            named = [f"{target}.{alias.name}" for alias in node.names]
            if any(name not in modules for name in named):
                found.add(target)
            found.update(name for name in named if name in modules)
    modules = package_modules()
    return {name for name in found if name in modules and name != module}


def test_every_module_has_a_layer() -> None:
    for module in package_modules():
        layer_of(module)


def test_no_module_imports_a_higher_layer() -> None:
    upward = []
    for module, path in package_modules().items():
        if module == "calltape":
            continue
        own = layer_of(module)
        for target in sorted(imports_of(path, module)):
            if layer_of(target) > own:
                upward.append(f"{module} (layer {own}) imports {target} (layer {layer_of(target)})")
    assert not upward, "\n".join(upward)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def package_graph() -> dict[str, set[str]]:
    """Imports between the package's modules, the root's lazy re-exports left out (it is the top)."""
    modules = package_modules()
    return {m: {t for t in imports_of(modules[m], m) if t != "calltape"} for m in modules if m != "calltape"}


def test_no_module_imports_its_own_packages_init() -> None:
    modules = package_modules()
    own = [
        f"{module} imports {target}"
        for module, targets in package_graph().items()
        for target in sorted(targets)
        if module.startswith(f"{target}.") and modules[module].name != "__init__.py"
    ]
    assert own == []


def test_the_package_has_no_import_cycle() -> None:
    assert _cycle(package_graph()) is None


def test_the_cycle_check_finds_a_cycle() -> None:
    # The checker itself: a graph with a typing-only cycle like the old session <-> tools one.
    graph = {"session": {"tools", "waits"}, "tools": {"session"}, "waits": set()}
    assert _cycle(graph) == ["session", "tools", "session"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_each_runtime_module_imports_alone_in_a_fresh_interpreter() -> None:
    modules = sorted(m for m in package_modules() if m.startswith("calltape.runtime"))
    runs = {
        m: subprocess.Popen([sys.executable, "-c", f"import {m}"], stderr=subprocess.PIPE, text=True) for m in modules
    }
    failed = {}
    for module, proc in runs.items():
        _, err = proc.communicate(timeout=120)
        if proc.returncode:
            failed[module] = err.strip().splitlines()[-1:]
    assert failed == {}
