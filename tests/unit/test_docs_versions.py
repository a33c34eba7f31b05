"""docs/sources.md's version table is the matrix's own (tests/matrix.py), not a copy by hand."""

from __future__ import annotations

from pathlib import Path

from tests.matrix import (
    SERVERS,
    SLICES,
    ci_suite_selection,
    readme_table,
    sliced_elsewhere,
    table,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "sources.md"


def test_the_docs_version_table_is_the_matrix_table() -> None:
    text = DOCS.read_text()
    begin, end = "<!-- versions: begin -->\n", "\n<!-- versions: end -->"
    assert begin in text and end in text, "docs/sources.md lost its version table markers"
    documented = text[text.index(begin) + len(begin) : text.index(end)]
    assert documented == table(), "run scripts/matrix --table and paste it into docs/sources.md"


def test_the_matrix_names_the_pinned_builds_and_ci_has_the_oldest_and_newest_postgres() -> None:
    postgres = [s for s in SERVERS if s.kind == "postgres"]
    assert [s.version for s in postgres] == ["14", "15", "16", "17", "18"]
    assert postgres[0].ci and postgres[-1].ci
    assert all(s.label.split()[-1].startswith(s.version) for s in postgres)
    assert any(s.kind == "mysql" and not s.default and s.ci for s in SERVERS)
    # Each slice's selection is limited to its own files (a -k applies to every file).
    for piece in SLICES:
        assert all(Path(f).stem in piece.selection("postgres") for f in piece.files)


def test_the_readme_version_table_is_the_matrix_table() -> None:
    readme = (DOCS.parents[1] / "README.md").read_text()
    assert readme_table() in readme, "run scripts/matrix --readme and paste it into README"


def test_ci_leaves_only_the_default_postgres_slices_to_14_and_18() -> None:
    """CI's suite on PostgreSQL 15 drops the version slices (14 and 18 run them); MariaDB
    10.11, the oldest MariaDB, keeps its own, and every slice still runs on a CI version."""
    assert sliced_elsewhere("postgres") and not sliced_elsewhere("mysql")
    selection = ci_suite_selection()
    assert selection.startswith("not (") and "mysql" not in selection
    for kind in ("postgres", "mysql"):
        ci_versions = [s for s in SERVERS if s.kind == kind and s.ci and not s.default]
        assert ci_versions, kind
