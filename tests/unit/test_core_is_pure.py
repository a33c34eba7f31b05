"""The core and the signal protocol do no IO and import no driver, client or Spark."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import snapshotter.core

CORE_DIR = Path(snapshotter.core.__file__).parent
CORE_FILES = sorted(CORE_DIR.glob("*.py"))

# Top-level packages that talk to databases, brokers, Spark or the network.
FORBIDDEN_PACKAGES = {
    "sqlalchemy",
    "psycopg",
    "psycopg2",
    "pymysql",
    "pymysqlreplication",
    "kafka",
    "pyspark",
    "py4j",
    "delta",
    "urllib3",
    "requests",
    "httpx",
    "aiohttp",
}

# IO modules the core's own source must not import (some arrive indirectly through pyarrow
# and pydantic, which is fine: the check is that the core itself never uses them).
FORBIDDEN_IMPORTS = {
    "os",
    "io",
    "socket",
    "subprocess",
    "pathlib",
    "shutil",
    "tempfile",
    "select",
    "selectors",
    "ssl",
    "http",
    "urllib",
    "asyncio",
}


def test_importing_the_core_and_signals_pulls_in_no_driver_or_client() -> None:
    code = (
        "import json, sys\n"
        "import snapshotter.core\n"
        "import signals\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    modules = set(json.loads(result.stdout))
    assert "snapshotter.core" in modules and "signals" in modules
    assert "signals.table" not in modules
    loaded = sorted(m for m in modules if m.split(".")[0] in FORBIDDEN_PACKAGES)
    assert loaded == []


def test_the_core_has_source_files() -> None:
    names = {f.name for f in CORE_FILES}
    assert {"__init__.py", "events.py", "keys.py", "position.py", "state.py", "window.py"} <= names


@pytest.mark.parametrize("path", CORE_FILES, ids=[f.name for f in CORE_FILES])
def test_core_source_does_no_io(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    problems: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            problems += [
                f"import {a.name}"
                for a in node.names
                if a.name.split(".")[0] in FORBIDDEN_IMPORTS | FORBIDDEN_PACKAGES
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in FORBIDDEN_IMPORTS | FORBIDDEN_PACKAGES:
                problems.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            # The builtin open(); a method called open (ChunkWindow.open) is not IO.
            if node.func.id in {"open", "exec", "eval", "__import__", "input", "print"}:
                problems.append(f"{node.func.id}() at line {node.lineno}")
        elif isinstance(node, ast.Name) and node.id in {"os", "socket", "subprocess"}:
            problems.append(f"{node.id} at line {node.lineno}")
    assert problems == [], f"{path.name}: {problems}"


# The builtin open( (not a method call ``.open(`` nor ``def open(``, the window's method),
# and any mention of sockets, subprocesses or the os module.
TEXT_PATTERNS = {
    "builtin open()": re.compile(r"(?<![\w.])(?<!def )open\("),
    "socket": re.compile(r"\bsocket\b"),
    "subprocess": re.compile(r"\bsubprocess\b"),
    "os.": re.compile(r"(?<![\w.])os\."),
    "import os": re.compile(r"\bimport os\b"),
}


@pytest.mark.parametrize("path", CORE_FILES, ids=[f.name for f in CORE_FILES])
def test_core_source_text_mentions_no_io(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    found = {name: pattern.findall(text) for name, pattern in TEXT_PATTERNS.items()}
    assert {name: hits for name, hits in found.items() if hits} == {}, path.name


def test_the_text_patterns_catch_what_they_should() -> None:
    assert TEXT_PATTERNS["builtin open()"].search("with open(path) as f:")
    assert not TEXT_PATTERNS["builtin open()"].search("def open(self):\n    w.open(p)")
    assert TEXT_PATTERNS["os."].search("x = os.environ")
    assert not TEXT_PATTERNS["os."].search("self.pos.token, chaos.x")
    assert TEXT_PATTERNS["socket"].search("import socket")
