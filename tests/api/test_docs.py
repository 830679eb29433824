"""The documentation keeps up with the code: the architecture page names every module of the package,
and the site's navigation lists every page under docs/ (pages other branches add are listed when merged)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "calltape"


def test_the_architecture_names_every_module() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for module in sorted(PACKAGE.rglob("*.py")):
        relative = module.relative_to(PACKAGE)
        name = f"{relative.parent.name}/" if module.name == "__init__.py" else module.name
        if module.name == "__init__.py" and relative.parent == Path("."):
            name = "calltape/__init__.py"
        if f"{name}`" not in text and f"{name} " not in text:
            missing.append(str(relative))
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_the_navigation_lists_every_page() -> None:
    nav = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    listed = set(re.findall(r":\s+(\S+\.md)\s*$", nav, re.MULTILINE))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == listed, f"not in the nav: {sorted(pages - listed)}; not a page: {sorted(listed - pages)}"
