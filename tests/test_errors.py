"""calltape.errors is the one home of calltape's exceptions: every public exception class of the package is
defined there, and the tree drawn in its docstring is the real hierarchy."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re

import calltape
from calltape import errors
from calltape.errors import CalltapeError
from tests.test_layers import PACKAGE, package_modules


def _all_subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    stack = [cls]
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                stack.append(sub)
    return found


def test_every_calltape_error_of_the_package_lives_in_calltape_errors() -> None:
    for info in pkgutil.walk_packages(calltape.__path__, "calltape."):
        if info.name.startswith("calltape.migrations."):
            continue  # alembic's env and revision scripts only load under alembic
        importlib.import_module(info.name)
    defined_elsewhere = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in _all_subclasses(CalltapeError)
        if cls.__module__.startswith("calltape") and cls.__module__ != "calltape.errors"
    )
    assert defined_elsewhere == []


def _exception_names() -> set[str]:
    return {
        name for name, value in vars(errors).items() if isinstance(value, type) and issubclass(value, BaseException)
    }


def test_no_public_exception_class_is_defined_outside_calltape_errors() -> None:
    # Read from the source: also the exceptions not derived from CalltapeError (RecordedToolError), and
    # modules the previous test could not reach. A private (underscore) class is control flow of its module.
    known = _exception_names()
    outside = []
    for module, path in package_modules().items():
        if module == "calltape.errors":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
            if bases & known or any(b.endswith(("Error", "Exception")) for b in bases):
                outside.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}")
    assert outside == []


def test_the_tree_in_the_docstring_is_the_hierarchy() -> None:
    # Each "├── Name" / "└── Name" line of the drawing: its column says its depth; its parent is the last
    # name drawn one level up. Every exception class of the module is drawn, under its first base.
    assert errors.__doc__
    drawn: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in errors.__doc__.splitlines():
        m = re.match(r"^(\s*)(?:([│ ]*)[├└]── )?([A-Z]\w+)\b", line)
        if m is None or not line.strip() or ("──" not in line and m.group(3) != "Exception"):
            continue
        depth = len(line) - len(line.lstrip()) + (len(m.group(2) or "") + 4 if "──" in line else 0)
        name = m.group(3)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if stack:
            drawn[name] = stack[-1][1]
        stack.append((depth, name))
    actual = {
        name: getattr(errors, name).__bases__[0].__name__
        for name in _exception_names()
        if getattr(errors, name).__module__ == "calltape.errors"
    }
    assert drawn == actual
    assert set(errors.__all__) == set(actual)


def test_the_old_homes_still_offer_their_errors() -> None:
    # Public before the move, so still importable from there (the same class, not a copy).
    from calltape import checks, projections, runtime
    from calltape.eventstore import bulk, fork, recorder
    from calltape.testing import replay

    assert runtime.Interrupted is errors.Interrupted and runtime.AlreadyResumed is errors.AlreadyResumed
    assert projections.SnapshotMismatch is errors.SnapshotMismatch
    assert projections.InvalidInstant is errors.InvalidInstant and projections.UnknownFormat is errors.UnknownFormat
    assert checks.CheckInputError is errors.CheckInputError
    assert recorder.RecorderFull is errors.RecorderFull and recorder.RecorderSpilled is errors.RecorderSpilled
    assert recorder.RecorderClosed is errors.RecorderClosed
    assert recorder.DurableAppendTimeout is errors.DurableAppendTimeout
    assert bulk.ImportRefused is errors.ImportRefused and fork.ForkRefused is errors.ForkRefused
    assert replay.UnrecordedCall is errors.UnrecordedCall and replay.RecordedToolError is errors.RecordedToolError
    assert calltape.redaction.RedactionError is errors.RedactionError
