"""The import rules of DESIGN.md that import-linter cannot express (it sees `iree` only whole)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

# (source folder, forbidden module prefix)
RULES = [
    ("runtime", "iree.compiler"),
    ("compiler", "iree.runtime"),
    ("zinc/engine", "iree"),
    ("zinc/server", "iree"),
    ("zinc/server", "zinc.runtime"),
    ("zinc/server", "zinc.compiler"),
    ("zinc/engine", "zinc.compiler"),
    ("runtime", "zinc.compiler"),
]


def imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_import_rules() -> None:
    broken = []
    for folder, forbidden in RULES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for mod in imported_modules(path):
                if mod == forbidden or mod.startswith(forbidden + "."):
                    broken.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not broken, broken


def test_rules_see_real_imports() -> None:
    # the checker itself must find what is there, or the rule test would pass vacuously
    assert "iree.runtime" in imported_modules(ROOT / "runtime" / "module.py")
    assert "iree.compiler" in imported_modules(ROOT / "compiler" / "targets.py")
