"""docs/FAMILIES.md is the table the registries make (runtime/models/catalog.py)."""

from __future__ import annotations

from pathlib import Path

from ftw.families import FAMILIES
from runtime.models import FAMILY_MODULES
from runtime.models.catalog import KINDS, markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "FAMILIES.md"


def test_every_family_the_runtime_runs_is_described_and_converted() -> None:
    assert set(KINDS) == set(FAMILY_MODULES) and set(FAMILY_MODULES) <= set(FAMILIES)


def test_the_family_table_in_docs_is_the_one_the_registries_make() -> None:
    text = DOC.read_text()
    assert text.endswith(markdown()), "docs/FAMILIES.md is stale: regenerate its table with python -m runtime.models.catalog"
    assert text.count("\n| `") == len(FAMILY_MODULES)
