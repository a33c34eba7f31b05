"""The signal table on a real PostgreSQL: DDL, the insert helper, reading back, the CLI, and
the server being ready for logical decoding (the next issue's log reader depends on it)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from signals import (
    AdditionalCondition,
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    SignalError,
    StopSnapshot,
    TableId,
    TablePattern,
    Watermark,
    WatermarkKind,
    parse_table_selector,
)
from signals.table import create_signal_table, insert_signal, new_signal_id
from tests.integration.signal_table import read_signals

pytestmark = pytest.mark.integration


def test_server_is_configured_for_logical_decoding(pg_engine: sa.Engine) -> None:
    with pg_engine.connect() as conn:
        assert conn.execute(sa.text("show wal_level")).scalar() == "logical"
        assert int(conn.execute(sa.text("show max_replication_slots")).scalar() or 0) >= 8
        assert int(conn.execute(sa.text("show max_wal_senders")).scalar() or 0) >= 8


def test_signal_table_ddl_matches_debezium(pg_engine: sa.Engine, pg_schema: str) -> None:
    table = TableId(pg_schema, "debezium_signal")
    with pg_engine.begin() as conn:
        assert create_signal_table(conn, table) is True
        assert create_signal_table(conn, table) is False  # idempotent
    columns = {c["name"]: c for c in sa.inspect(pg_engine).get_columns(table.table, pg_schema)}
    assert str(columns["id"]["type"]) == "VARCHAR(42)"
    assert str(columns["type"]["type"]) == "VARCHAR(32)" and not columns["type"]["nullable"]
    assert str(columns["data"]["type"]) == "TEXT" and columns["data"]["nullable"]
    pk = sa.inspect(pg_engine).get_pk_constraint(table.table, pg_schema)
    assert pk["constrained_columns"] == ["id"]


def test_a_table_name_that_needs_quoting(pg_engine: sa.Engine, pg_schema: str) -> None:
    table = TableId(pg_schema, 'My.Signals "v2"')
    with pg_engine.begin() as conn:
        create_signal_table(conn, table)
        sid = insert_signal(conn, table, LogSignal(new_signal_id(), "hello"))
    with pg_engine.connect() as conn:
        assert read_signals(conn, table) == [LogSignal(sid, "hello")]


def test_insert_signals_read_back_and_parse(pg_engine: sa.Engine, pg_schema: str) -> None:
    table = TableId(pg_schema, "debezium_signal")
    orders = TableId("public", "orders")
    window = str(uuid.uuid4())
    sent = [
        ExecuteSnapshot(
            new_signal_id(),
            (orders, TableId("public", "My.Table"), parse_table_selector(r"inventory\..*")),
            additional_conditions=(AdditionalCondition(orders, "status = 'open' OR id < 5"),),
        ),
        ExecuteSnapshot(new_signal_id(), (TableId(None, "events"),), surrogate_key="event_id"),
        StopSnapshot(new_signal_id(), (orders,)),
        StopSnapshot(new_signal_id()),
        PauseSnapshot(new_signal_id()),
        ResumeSnapshot(new_signal_id()),
        LogSignal(new_signal_id(), "checkpoint: ünïcode ✓"),
        Watermark(window, WatermarkKind.OPEN),
        Watermark(window, WatermarkKind.CLOSE),
    ]
    with pg_engine.begin() as conn:
        create_signal_table(conn, table)
        ids = [insert_signal(conn, table, s) for s in sent]
    assert max(len(i) for i in ids) <= 42
    with pg_engine.connect() as conn:
        back = read_signals(conn, table, ids)
    assert sorted(back, key=lambda s: s.id) == sorted(sent, key=lambda s: s.id)  # type: ignore[union-attr]
    pattern = next(
        s for s in back if isinstance(s, ExecuteSnapshot) and len(s.data_collections) == 3
    )
    assert isinstance(pattern.data_collections[2], TablePattern)


def test_bad_rows_become_error_values_and_the_rest_still_parse(
    pg_engine: sa.Engine, pg_schema: str
) -> None:
    table = TableId(pg_schema, "debezium_signal")
    with pg_engine.begin() as conn:
        create_signal_table(conn, table)
        good = insert_signal(conn, table, LogSignal(new_signal_id(), "fine"))
        conn.execute(
            sa.text(
                f'insert into "{pg_schema}".debezium_signal (id, type, data) values '
                "('bad-json', 'execute-snapshot', '{\"data-collections\": [}'), "
                "('bad-type', 'snapshot-everything', null), "
                "('bad-field', 'execute-snapshot', '{\"data-collections\": \"t\"}')"
            )
        )
    with pg_engine.connect() as conn:
        parsed = {
            s.signal_id if isinstance(s, SignalError) else s.id: s
            for s in read_signals(conn, table)
        }
    assert parsed[good] == LogSignal(good, "fine")
    for sid, words in {
        "bad-json": "not valid JSON",
        "bad-type": "unknown signal type",
        "bad-field": "data-collections",
    }.items():
        error = parsed[sid]
        assert isinstance(error, SignalError), error
        assert error.signal_id == sid and words in error.problem


def test_signal_rows_reach_the_logical_decoding_stream(
    pg_url: str, pg_engine: sa.Engine, pg_schema: str
) -> None:
    """A pgoutput slot on a publication for the signal table sees an inserted signal."""
    table = TableId(pg_schema, "debezium_signal")
    slot, publication = f"{pg_schema}_slot", f"{pg_schema}_pub"
    with pg_engine.begin() as conn:
        create_signal_table(conn, table)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'create publication {publication} for table "{pg_schema}".debezium_signal')
        conn.execute("select pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        try:
            with pg_engine.begin() as sconn:
                sid = insert_signal(sconn, table, LogSignal(new_signal_id(), "through the WAL"))
            rows = conn.execute(
                "select data from pg_logical_slot_peek_binary_changes(%s, NULL, NULL, "
                "'proto_version', '1', 'publication_names', %s)",
                (slot, publication),
            ).fetchall()
        finally:
            conn.execute("select pg_drop_replication_slot(%s)", (slot,))
            conn.execute(f"drop publication {publication}")
    messages = [bytes(r[0]) for r in rows]
    assert [m[:1] for m in messages] == [b"B", b"R", b"I", b"C"]  # begin, relation, insert, commit
    assert sid.encode() in messages[2]


def test_cli_init_signal_and_list(pg_url: str, pg_schema: str, tmp_path: Path) -> None:
    config = tmp_path / "snapshotter.toml"
    config.write_text(
        '[source]\nkind = "postgres"\nname = "cli-test"\nurl = "${TEST_PG_URL}"\n'
        f'signal_table = "{pg_schema}.debezium_signal"\n'
    )
    env = {"TEST_PG_URL": pg_url, "PATH": "/usr/bin:/bin"}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "snapshotter.app.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )

    first, second = cli("init", "-c", str(config)), cli("init", "-c", str(config))
    assert first.returncode == 0 and "created" in first.stdout
    assert second.returncode == 0 and "already there" in second.stdout
    sent = cli(
        "signal",
        "-c",
        str(config),
        "execute-snapshot",
        "public.orders",
        "--filter",
        "public.orders=amount > 10",
        # public.orders is neither captured nor there: the check against the source would
        # refuse it (test_signal_hostile); this test is about the row the CLI inserts.
        "--no-check",
    )
    assert sent.returncode == 0, sent.stderr
    refused = cli("signal", "-c", str(config), "execute-snapshot", "a.b.c")
    assert refused.returncode == 2 and "3 parts" in refused.stderr
    listed = cli("signals", "-c", str(config), "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["type"] == "execute-snapshot"
    assert row["data"]["additional-conditions"] == [
        {"data-collection": "public.orders", "filter": "amount > 10"}
    ]
