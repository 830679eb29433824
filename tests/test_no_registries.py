"""No module-global registry attaches state to other objects (issue 27 item 4): per-call state lives
in an object the call owns (:meth:`calltape.runtime.CallSession.part`), or on the framework object it
belongs to, so it goes when they go and two calls never share it through a module."""

from __future__ import annotations

import ast
from pathlib import Path

import calltape

PACKAGE = Path(calltape.__file__).parent

_WEAK = {"WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}


def _registries(path: Path) -> list[str]:
    """Module-level names bound to a weak mapping or to a mutable dict keyed by other objects (``id``)."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        value = node.value
        called = value.func if isinstance(value, ast.Call) else None
        name = getattr(called, "attr", None) or getattr(called, "id", None)
        annotation = ast.unparse(node.annotation) if isinstance(node, ast.AnnAssign) else ""
        if name in _WEAK or "dict[int," in annotation.replace(" ", ""):
            found.extend(names)
    return found


def test_no_module_global_registry_attaches_state_to_other_objects() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        names = _registries(path)
        if names:
            found[path.relative_to(PACKAGE.parent).as_posix()] = names
    assert found == {}  # none left: not even one allowed with a reason


def test_the_scan_sees_a_registry(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import weakref\n_A = weakref.WeakKeyDictionary()\n_B: dict[int, object] = {}\n_C = {'x': 1}\n",
        encoding="utf-8",
    )
    assert _registries(module) == ["_A", "_B"]
