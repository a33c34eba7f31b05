"""Imports run one way: app -> verify -> engine -> sources | sinks -> config -> common -> core
-> signals. A module may import its own layer (within its own package) and any layer below it,
never one above; sources and sinks, side by side, do not import each other, except that sinks
read a table's columns through ``snapshotter.sources.base`` (the schema types every source
describes). Every import counts, also those inside functions (a lazy import is still a
dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import snapshotter

ROOT = Path(snapshotter.__file__).parent

# Layers, lowest first; a module belongs to the first entry whose prefix it starts with.
LAYERS: list[tuple[str, int]] = [
    ("signals", 0),  # the signal protocol: pure, imports nothing of snapshotter
    ("snapshotter.core", 1),  # pure: events, positions, keys, window, visibility, state
    ("snapshotter.common", 2),  # errors, redaction, failpoints, librdkafka's settings
    ("snapshotter.config", 3),  # the typed configuration every layer reads
    ("snapshotter.sources", 4),  # dialects, log readers, connectors (postgres/, mysql/)
    ("snapshotter.sinks", 4),  # jsonl, kafka/, spark/
    ("snapshotter.engine", 5),  # the loop and its collaborators, chunk workers, state store
    ("snapshotter.verify", 6),  # the output against the table, per sink
    ("snapshotter.app", 7),  # cli, runner, status, progress, stream position checks
    ("snapshotter", 0),  # the package's own __init__ (version only)
]
# Same layer, other package: allowed edges (importer prefix, imported prefix).
SIDEWAYS = {("snapshotter.sinks", "snapshotter.sources.base")}


def layer_of(module: str) -> tuple[str, int]:
    for prefix, level in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return prefix, level
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # ``from snapshotter.sinks import kafka`` imports the module snapshotter.sinks.kafka
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return [
        (line, name) for line, name in found if name.split(".")[0] in ("snapshotter", "signals")
    ]


def _existing(name: str) -> bool:
    """Whether ``name`` is a module or package of the project (not a name inside one)."""
    parts = name.split(".")
    base = ROOT.parent.joinpath(*parts)
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


FILES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_imports_run_one_way(path: Path) -> None:
    importer = module_name(path)
    own_prefix, own_level = layer_of(importer)
    wrong = []
    for line, imported in imports_of(path):
        if not _existing(imported):
            continue
        prefix, level = layer_of(imported)
        if level < own_level or prefix == own_prefix:
            continue
        if level == own_level and any(
            importer.startswith(a) and (imported == b or imported.startswith(b + "."))
            for a, b in SIDEWAYS
        ):
            continue
        wrong.append(f"line {line}: {imported} ({prefix}, layer {level})")
    assert not wrong, f"{importer} (layer {own_level}) imports against the direction: {wrong}"


def test_every_module_has_a_layer() -> None:
    for path in FILES:
        layer_of(module_name(path))
