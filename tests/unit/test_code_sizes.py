"""The layers stay readable: no module in snapshotter/ over 600 lines, no class over 400
(the project's standards; split along the seams first)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "snapshotter"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 400


def test_no_module_over_600_lines_and_no_class_over_400() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 100  # the package, not an empty directory
    too_long = []
    for module in modules:
        text = module.read_text(encoding="utf-8")
        where = module.relative_to(PACKAGE.parent)
        if text.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{where}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_CLASS_LINES:
                    too_long.append(f"{where}: class {node.name}, {lines} lines")
    assert not too_long, f"over the size limits: {too_long}"
