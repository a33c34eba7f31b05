"""docs/configuration.md documents every configuration key exactly once, and no other.

The keys come from the pydantic model (``Config`` and the section models it is composed of,
walked through ``model_fields``, aliases included), so a key added to the model without a row
in the docs, a row left behind for a removed key, or a default that drifted fails here.
A key's row is a table row whose first cell is the dotted key in backticks:
``| `source.chunk_size` | ... |``.
"""

from __future__ import annotations

import importlib
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

# Where Config lives: snapshotter/config/ (a package: one module per section).
CONFIG_MODULES = ("snapshotter.app.config", "snapshotter.config")

# The first cell of a key's row: `section.key` (nested models: `section.sub.key`).
ROW = re.compile(r"^\|\s*`([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)+)`\s*\|", re.MULTILINE)


def _config_model() -> type[BaseModel]:
    for name in CONFIG_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        model = getattr(module, "Config", None)
        if isinstance(model, type) and issubclass(model, BaseModel):
            return model
    raise AssertionError(f"no pydantic Config in any of {CONFIG_MODULES}")


def _submodels(field: FieldInfo) -> list[type[BaseModel]]:
    """The models a field holds: one, one inside Optional, or each of a union's (``[source]``:
    one model per kind, whose keys all count)."""
    candidates = [field.annotation, *typing.get_args(field.annotation)]
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


def _keys(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every leaf key of ``model`` as its dotted name in the file -> its field."""
    out: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        subs = _submodels(field)
        for sub in subs:
            out.update(_keys(sub, f"{key}."))
        if not subs:
            out[key] = field
    return out


def _documented() -> list[tuple[str, str]]:
    """(key, its whole row) for every key row of the page, in order."""
    text = DOC.read_text(encoding="utf-8")
    rows = []
    for match in ROW.finditer(text):
        end = text.find("\n", match.start())
        rows.append((match.group(1), text[match.start() : end if end >= 0 else len(text)]))
    return rows


MODEL_KEYS = _keys(_config_model())


def test_the_model_has_sections_and_keys() -> None:
    # Guards the walk itself: a refactor that hid the sections would make the rest vacuous.
    sections = {key.split(".", 1)[0] for key in MODEL_KEYS}
    assert {"source", "sink", "state", "spark"} <= sections
    assert len(MODEL_KEYS) > 20


def test_every_key_is_documented_exactly_once() -> None:
    counts: dict[str, int] = {}
    for key, _ in _documented():
        counts[key] = counts.get(key, 0) + 1
    missing = sorted(set(MODEL_KEYS) - set(counts))
    repeated = sorted(key for key, n in counts.items() if n > 1)
    assert not missing, f"config keys without a row in {DOC.name}: {missing}"
    assert not repeated, f"config keys with more than one row in {DOC.name}: {repeated}"


def test_no_documented_key_is_unknown_to_the_model() -> None:
    unknown = sorted({key for key, _ in _documented()} - set(MODEL_KEYS))
    assert not unknown, f"{DOC.name} documents keys the model does not have: {unknown}"


def _toml_literals(value: Any) -> list[str] | None:
    """How a simple default is written in the docs' default cell (None: not checked, e.g. a
    default computed elsewhere, such as an empty path or None)."""
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, int):
        return [str(value)]
    if isinstance(value, float):
        return [repr(value), str(int(value))] if value.is_integer() else [repr(value)]
    if isinstance(value, Path):
        return [f'"{value}"']
    if isinstance(value, str):
        return [f'"{value}"'] if value else None
    if isinstance(value, list | tuple | dict) and not value:
        return ["{}" if isinstance(value, dict) else "[]"]
    return None


@pytest.mark.parametrize("key", sorted(MODEL_KEYS))
def test_documented_default_matches_the_model(key: str) -> None:
    field = MODEL_KEYS[key]
    if field.is_required():
        expected: list[str] | None = ["required"]
    else:
        expected = _toml_literals(field.get_default(call_default_factory=True))
    if expected is None:
        pytest.skip("default not a simple literal (computed, or None)")
    rows = [row for k, row in _documented() if k == key]
    if not rows:
        pytest.skip("missing row: reported by test_every_key_is_documented_exactly_once")
    cells = [cell.strip() for cell in rows[0].strip().strip("|").split("|")]
    # Columns: key | type | default | meaning.
    assert len(cells) >= 4, f"row of {key} does not have four columns: {rows[0]}"
    default = cells[2]
    assert any(f"`{literal}`" == default or literal == default for literal in expected), (
        f"{key}: the model's default is {' or '.join(expected)}, the docs say {default!r}"
    )
