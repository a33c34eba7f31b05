"""Claims the README and docs/ make that can be checked mechanically: the commands they name
exist, every configuration section's environment variables are listed, and the ports they
give are the ones scripts/services starts the servers on."""

from __future__ import annotations

import re
from pathlib import Path

from snapshotter.app.cli.parser import build_parser
from snapshotter.config.model import SECTION_MODELS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# `snapshotter <word>` in inline code, or a line of a code block that runs snapshotter.
INLINE = re.compile(r"`snapshotter (-{0,2}[a-z][a-z-]*)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
IN_FENCE = re.compile(r"^\s*(?:\$\s*)?snapshotter (-{0,2}[a-z][a-z-]*)", re.MULTILINE)


def _commands(text: str) -> list[str]:
    fenced = [w for block in FENCE.findall(text) for w in IN_FENCE.findall(block)]
    return [*INLINE.findall(text), *fenced]


def _subcommands() -> set[str]:
    parser = build_parser()
    names: set[str] = set()
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        names.update(getattr(action, "choices", {}) or {})
    return names


def test_every_snapshotter_command_the_docs_name_exists() -> None:
    known = _subcommands()
    assert {"init", "run", "resume", "status", "verify", "teardown"} <= known
    unknown = sorted(
        f"{page.relative_to(ROOT)}: snapshotter {word}"
        for page in PAGES
        for word in _commands(page.read_text(encoding="utf-8"))
        if not word.startswith("-") and word not in known
    )
    assert not unknown, f"commands the docs name that the CLI does not have: {unknown}"


def test_every_configuration_section_has_its_environment_variables_listed() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [
        f"SNAPSHOTTER_{section.upper()}_*"
        for section in SECTION_MODELS
        if f"SNAPSHOTTER_{section.upper()}_*" not in text
    ]
    assert not missing, f"docs/configuration.md does not list {missing}"


def _default_ports() -> dict[str, int]:
    """The port each server starts on by default, as scripts/services and its Spark part set
    them (``X_PORT=${SNAPSHOTTER_..._PORT:-N}``, the last number of the default)."""
    ports = {}
    for script in ("services", "services-spark.sh"):
        text = (ROOT / "scripts" / script).read_text(encoding="utf-8")
        for variable, default in re.findall(
            r"^\w+_PORT=\$\{(SNAPSHOTTER_\w+_PORT):-(.*)\}$", text, re.MULTILINE
        ):
            ports[variable] = int(re.findall(r"\d{4,5}", default)[-1])
    return ports


def test_the_ports_the_docs_give_are_the_ones_the_servers_start_on() -> None:
    ports = _default_ports()
    assert ports["SNAPSHOTTER_PG_PORT"] == 25432 and len(ports) >= 6, ports
    # A five-digit number 2xxxx (or an old 5xxxx) beside a host or a server's name is a port.
    given = re.compile(r"(?:127\.0\.0\.1:|localhost:|port |\()([25]\d{4})\b")
    wrong = sorted(
        f"{page.relative_to(ROOT)}: {port}"
        for page in PAGES
        for port in given.findall(page.read_text(encoding="utf-8"))
        if int(port) not in ports.values()
    )
    assert not wrong, f"ports the servers do not start on by default: {wrong}"


def test_the_default_ports_are_below_linuxs_ephemeral_range() -> None:
    # Linux hands out 32768-60999 to bind(0) and outgoing connections (Spark's driver, block
    # manager and workers listen there): a server started late in a run, the version matrix's
    # PostgreSQL 18 on 55418 once, can find its fixed port taken.
    ports = _default_ports()
    assert ports and all(port < 32768 for port in ports.values()), ports
