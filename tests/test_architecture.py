"""The dependency direction of DESIGN.md §2: ftpull -> runtime, ftw, registry; runtime -> ftw,
registry; ftw and registry import nothing of ours. Checked on the source, imports inside
functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"ftpull", "ftw", "registry", "runtime", "Modelfiles"}
ALLOWED = {
    "ftpull": {"ftpull", "runtime", "ftw", "registry", "Modelfiles"},
    "runtime": {"runtime", "ftw", "registry"},
    "ftw": {"ftw"},
    "registry": {"registry"},
}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependency_direction(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in sorted((ROOT / package).rglob("*.py"))
        if (bad := imported_packages(path) - ALLOWED[package])
    }
    assert offenders == {}, f"{package} may import only {sorted(ALLOWED[package])}"
