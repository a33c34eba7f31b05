"""The probe the engine asks what the source's log lacks (app.coverage.CoverageProbe): which
tables it asks about, and that a check still running when the engine closes releases its
connections itself, after (close never waits for a slow source). A connector of its own
stands in for a database."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from signals.names import TableId
from snapshotter.app.coverage import CoverageProbe
from snapshotter.config import parse_config

CONFIG = parse_config(
    """
[source]
kind = "mysql"
url = "mysql://u@h:3306/shop"
tables = ["public.orders", "public.gone", "sales.*"]
""",
    base_dir=Path("/tmp"),
    environ={},
)
LISTED = [
    TableId("public", "orders"),
    TableId("public", "debezium_signal"),
    TableId("public", "other"),
    TableId("sales", "a"),
]


class _Dialect:
    def __init__(self, opened: list[str]) -> None:
        self.opened = opened
        opened.append("dialect")

    def list_tables(self) -> list[TableId]:
        return LISTED

    def close(self) -> None:
        self.opened.remove("dialect")


class _Connector:
    errors = (OSError,)

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.asked: list[list[TableId]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def open_dialect(self) -> _Dialect:
        return _Dialect(self.opened)

    def connect(self, timeout_s: float | None = None) -> str:
        self.opened.append("handle")
        return "handle"

    def dispose(self, handle: Any) -> None:
        self.opened.remove(handle)

    def log_coverage_problems(self, handle: Any, tables: Sequence[TableId]) -> list[str]:
        self.entered.set()
        self.release.wait(10)
        self.asked.append(list(tables))
        return []


def test_it_asks_about_the_tables_selected_now_without_the_signal_table(tmp_path: Path) -> None:
    connector = _Connector()
    probe = CoverageProbe(CONFIG, tmp_path / "state.json", connector)
    assert probe.problems() == []
    assert probe.problems() == []  # the connections are kept for the run
    # A configured name that does not exist has no changes to miss; patterns match now.
    assert connector.asked[0] == [TableId("public", "orders"), TableId("sales", "a")]
    assert sorted(connector.opened) == ["dialect", "handle"]
    probe.close()
    assert connector.opened == []
    assert probe.problems() == [] and connector.opened == []  # closed: asks nothing more


def test_a_check_running_at_close_releases_its_connections_when_it_ends(tmp_path: Path) -> None:
    connector = _Connector()
    connector.release.clear()
    probe = CoverageProbe(CONFIG, tmp_path / "state.json", connector)
    check = threading.Thread(target=probe.problems)
    check.start()
    assert connector.entered.wait(10)
    probe.close()  # returns at once, the check still running
    assert sorted(connector.opened) == ["dialect", "handle"]
    connector.release.set()
    check.join(10)
    assert connector.opened == []
