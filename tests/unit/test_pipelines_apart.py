"""Pipelines apart without a server (issue 26): the config refuses a captured table as the
notification table; what init created is recorded as versioned JSON; teardown's trace of
another pipeline in a shared signal table; MySQL's binlog filters judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from signals.model import to_row
from signals.names import TableId
from signals.parser import parse_signal
from snapshotter.app import created
from snapshotter.app.teardown import others_signals
from snapshotter.config import Config, ConfigError, parse_config
from snapshotter.sources.mysql.coverage import filter_problems


def config(tables: str, table: str = "debezium_notification", tmp: Path | None = None) -> Config:
    return parse_config(
        f"""
[source]
kind = "postgres"
url = "postgresql://u:p@h:5432/shop"
tables = {tables}

[notifications]
channels = ["table"]
table = "{table}"

[state]
dir = "{tmp or "/tmp/unused"}"
""",
        environ={},
    )


def test_a_captured_table_is_refused_as_the_notification_table() -> None:
    with pytest.raises(ConfigError, match="is a captured table"):
        config('["public.orders"]', "public.orders")
    with pytest.raises(ConfigError, match="is a captured table"):
        config('["orders"]', "orders")  # the default schema applied on both sides
    # A pattern may match it: the engine skips its own table (and init refuses a user's
    # table of another layout under that name).
    assert config('["public.*"]', "public.orders").own_tables == {
        TableId("public", "orders"): "the notification table ([notifications] table)"
    }


def test_what_init_created_is_recorded_per_database(tmp_path: Path) -> None:
    conf = config('["public.*"]', tmp=tmp_path)
    assert not created.was_created(conf, "signal table", "public.debezium_signal")
    created.remember(conf, "signal table", "public.debezium_signal")
    created.remember(conf, "signal table", "public.debezium_signal")  # once
    assert created.was_created(conf, "signal table", "public.debezium_signal")
    raw = json.loads((tmp_path / "created.json").read_text(encoding="utf-8"))
    assert raw == {
        "version": 1,
        "created": [
            {"kind": "signal table", "name": "public.debezium_signal", "database": "h:5432/shop"}
        ],
    }
    assert "u:p" not in (tmp_path / "created.json").read_text(encoding="utf-8")  # no secret
    other = parse_config(
        f'[source]\nkind = "postgres"\nurl = "postgresql://u:p@h:5432/other"\n'
        f'[state]\ndir = "{tmp_path}"\n',
        environ={},
    )
    assert not created.was_created(other, "signal table", "public.debezium_signal")
    created.forget(conf, "signal table", "public.debezium_signal")
    assert not created.was_created(conf, "signal table", "public.debezium_signal")
    (tmp_path / "created.json").write_text('{"version": 9, "created": []}', encoding="utf-8")
    with pytest.raises(created.RecordError, match="version 9"):
        created.was_created(conf, "signal table", "public.debezium_signal")


def _row(kind: str, data: object) -> tuple[str, str, str]:
    text = json.dumps(data)
    signal = parse_signal("s", kind, text)
    assert not hasattr(signal, "problem"), signal
    sid, stype, sdata = to_row(signal)  # type: ignore[arg-type]
    return sid, stype, sdata


def test_signals_for_tables_not_captured_are_the_trace_of_another_pipeline() -> None:
    conf = config('["public.a", "sales.*"]')
    rows = [
        _row("execute-snapshot", {"data-collections": ["public.a", "sales.x"]}),
        _row("log", {"message": "hi"}),
        ("bad", "execute-snapshot", "{not json"),
    ]
    assert others_signals(conf, rows) == []
    rows.append(_row("stop-snapshot", {"data-collections": ["b", "public.b", "other.*"]}))
    assert others_signals(conf, rows) == [TableId("public", "b")]


def test_binlog_filters_that_leave_out_the_signal_table_or_a_captured_table() -> None:
    signal = TableId("shop", "debezium_signal")
    tables = [TableId("shop", "orders"), TableId("audit", "log")]
    assert filter_problems([], [], signal, tables) == []
    assert filter_problems(["shop", "audit"], [], signal, tables) == []
    (problem,) = filter_problems(["shop"], [], signal, tables)
    assert "database audit" in problem and "audit.log" in problem
    assert "missing from the output" in problem and "binlog-do-db = audit" in problem
    (problem,) = filter_problems([], ["shop"], signal, tables)
    assert "shop.debezium_signal" in problem and "no signal" in problem
    assert "binlog-ignore-db = shop" in problem
