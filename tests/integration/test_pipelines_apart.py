"""Several pipelines on one database, and the engine's own tables (issue 26), on PostgreSQL
and MariaDB/MySQL.

* Two pipelines share Debezium's default signal table, each snapshotting its own table: each
  acts only on the tables it captures (the other's are skipped with a note, never failed
  snapshots), both converge and exit 0; one's teardown keeps the shared signal table and
  the other still receives signals.
* A signal table dropped and created again leaves the publication: `status` and `signal`
  warn, `run` puts it back (the publication is its own).
* `teardown` never drops a table `init` did not create (one that was there: a user's, a
  Debezium connector's); `init` never adopts a table of another layout as signal or
  notification table, and `run` refuses it too.
* The notification table is never a snapshot target, nor a captured table.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from snapshotter.sources.setup_common import SetupError
from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration

ROWS = 300


class Db:
    """The test's schema (PostgreSQL) or database (MySQL) and how to write SQL for it."""

    def __init__(self, request: pytest.FixtureRequest, kind: str) -> None:
        self.kind = kind
        postgres = kind == "postgres"
        self.factory: Callable[..., Capture] = request.getfixturevalue(
            "capture" if postgres else "mysql_capture"
        )
        self.schema: str = request.getfixturevalue("pg_schema" if postgres else "mysql_db")
        self.q = '"' if postgres else "`"

    def name(self, table: str) -> str:
        return f"{self.q}{self.schema}{self.q}.{self.q}{table}{self.q}"

    def capture(self, *tables: str, notifications: str = "", **kwargs: Any) -> Capture:
        section = ""
        if notifications:
            section = (
                f'[notifications]\nchannels = ["table"]\ntable = "{self.schema}.{notifications}"\n'
            )
        selected = [f"{self.schema}.{t}" for t in tables] or [f"{self.schema}.*"]
        return self.factory(tables=selected, extra_config=section, chunk_size=100, **kwargs)

    def table(self, cap: Capture, table: str, rows: int = ROWS) -> None:
        cap.sql(f"CREATE TABLE {self.name(table)} (id int PRIMARY KEY, name varchar(50))")
        if self.kind == "postgres":
            cap.sql(f"ALTER TABLE {self.name(table)} REPLICA IDENTITY FULL")
        values = ", ".join(f"({n}, '{table} {n}')" for n in range(1, rows + 1))
        cap.sql(f"INSERT INTO {self.name(table)} VALUES {values}")

    def exists(self, cap: Capture, table: str) -> bool:
        found = cap.sql(
            "SELECT count(*) FROM information_schema.tables "
            "WHERE table_schema = %s AND table_name = %s",
            (self.schema, table),
        )
        return bool(found[0][0])

    def signal_table_ddl(self) -> str:
        """Debezium's documented signal table (data varchar(2048))."""
        return (
            f"CREATE TABLE {self.name('debezium_signal')} (id varchar(42) PRIMARY KEY, "
            "type varchar(32) NOT NULL, data varchar(2048) NULL)"
        )


@pytest.fixture(params=["postgres", "mysql"])
def db(request: pytest.FixtureRequest) -> Db:
    return Db(request, request.param)


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Db:
    return Db(request, "postgres")


def status_json(cap: Capture, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    assert cap.cli("status", "--json") == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def snapshots(report: dict[str, Any]) -> dict[str, str]:
    return {s["table"]: s["state"] for s in report["snapshots"]}


# --- two pipelines, one signal table ----------------------------------------------------------


def test_two_pipelines_share_the_default_signal_table(
    db: Db, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = db.capture("a"), db.capture("b")
    db.table(a, "a")
    db.table(a, "b")
    capsys.readouterr()
    a.init()
    b.init()
    err = capsys.readouterr().err
    if db.kind == "postgres":  # B's init: the signal table is in A's publication too
        assert f"also in publication {a.publication}" in err and "signal_table" in err, err
    a.execute(f"{db.schema}.a")
    b.execute(f"{db.schema}.b")
    caplog.set_level(logging.INFO, logger="snapshotter.engine")
    # Each reads both signals: the other pipeline's table is skipped, not a failed snapshot.
    assert a.run() == 0
    assert b.run() == 0
    notes = [
        r.getMessage() for r in caplog.records if "not captured by this pipeline" in r.getMessage()
    ]
    assert any(f"ignored: {db.schema}.b not captured" in n for n in notes), notes
    assert any(f"ignored: {db.schema}.a not captured" in n for n in notes), notes
    report_a, report_b = status_json(a, capsys), status_json(b, capsys)
    assert snapshots(report_a) == {f"{db.schema}.a": "done"}
    assert snapshots(report_b) == {f"{db.schema}.b": "done"}
    assert report_a["signal_problems"] == [] and report_b["signal_problems"] == []
    assert a.verify("a").ok and b.verify("b").ok

    # A's teardown keeps the signal table B still reads, and says why.
    capsys.readouterr()
    assert a.cli("teardown", "--yes") == 0
    out = capsys.readouterr().out
    assert f"signal table {db.schema}.debezium_signal: kept" in out, out
    assert db.exists(a, "debezium_signal")
    # B still receives signals.
    b.sql(f"UPDATE {db.name('b')} SET name = 'changed' WHERE id = 7")
    b.execute(f"{db.schema}.b")
    assert b.run() == 0
    assert list(snapshots(status_json(b, capsys)).values()) == ["done"]
    states = [s["state"] for s in status_json(b, capsys)["snapshots"]]
    assert states == ["done", "done"] and b.verify("b").ok


def test_a_signal_table_dropped_and_created_again_is_put_back_in_the_publication(
    pg: Db, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    cap = pg.capture("items")
    pg.table(cap, "items")
    cap.init()
    cap.execute(f"{pg.schema}.items")
    assert cap.run() == 0
    # What `scripts/demo` and an older teardown of another pipeline did to a shared table.
    cap.sql(f"DROP TABLE {pg.name('debezium_signal')}")
    cap.sql(pg.signal_table_ddl())
    warnings = status_json(cap, capsys)["warnings"]
    assert any("does not carry the signal table" in w for w in warnings), warnings
    assert cap.cli("signal", "log", "lost") == 0
    err = capsys.readouterr().err
    assert "does not carry the signal table" in err and "will not see this signal" in err, err
    caplog.set_level(logging.WARNING, logger="snapshotter.engine")
    assert cap.run() == 0  # repairs: the publication is this pipeline's
    repaired = [r.getMessage() for r in caplog.records if "repaired" in r.getMessage()]
    assert len(repaired) == 1 and "ALTER PUBLICATION" in repaired[0], repaired
    published = cap.sql(
        "SELECT tablename FROM pg_publication_tables WHERE pubname = %s", (cap.publication,)
    )
    assert ("debezium_signal",) in published
    assert not any("signal table" in w for w in status_json(cap, capsys)["warnings"])
    cap.sql(f"UPDATE {pg.name('items')} SET name = 'again' WHERE id = 3")
    cap.execute(f"{pg.schema}.items")
    assert cap.run() == 0
    assert [s["state"] for s in status_json(cap, capsys)["snapshots"]] == ["done", "done"]
    assert cap.verify("items").ok


# --- teardown keeps what init did not create ---------------------------------------------------


def test_teardown_never_drops_a_table_init_adopted(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = db.capture("items", notifications="debezium_notification")
    db.table(cap, "items", 10)
    # There before init: Debezium's signal table with a user's signal in it, and a
    # notification table of the right layout holding rows.
    cap.sql(db.signal_table_ddl())
    cap.sql(
        f"INSERT INTO {db.name('debezium_signal')} VALUES ('theirs', 'log', "
        """'{"message": "kept"}')"""
    )
    serial = "bigserial" if db.kind == "postgres" else "bigint AUTO_INCREMENT"
    q = db.q
    cap.sql(
        f"CREATE TABLE {db.name('debezium_notification')} (seq {serial} PRIMARY KEY, "
        f"id varchar(255) NOT NULL, aggregate_type varchar(64) NOT NULL, "
        f"{q}type{q} varchar(64) NOT NULL, additional_data text NOT NULL, "
        f"{q}timestamp{q} bigint NOT NULL)"
    )
    cap.sql(
        f"INSERT INTO {db.name('debezium_notification')} (id, aggregate_type, {q}type{q}, "
        f"additional_data, {q}timestamp{q}) VALUES ('x', 'y', 'z', '{{}}', 1)"
    )
    capsys.readouterr()
    cap.init()
    out = capsys.readouterr().out
    assert out.count("already there (not created by init: teardown keeps it)") == 2, out
    assert cap.cli("teardown", "--yes") == 0
    out = capsys.readouterr().out
    assert f"signal table {db.schema}.debezium_signal: kept" in out, out
    assert f"notification table {db.schema}.debezium_notification: kept" in out, out
    assert cap.sql(f"SELECT id FROM {db.name('debezium_signal')}") == [("theirs",)]
    assert len(cap.sql(f"SELECT seq FROM {db.name('debezium_notification')}")) == 1
    # What init creates, teardown drops.
    other = db.capture("items", notifications="made_here")
    other.sql(f"DROP TABLE {db.name('debezium_signal')}")
    other.init()
    assert other.cli("teardown", "--yes") == 0
    assert not db.exists(other, "debezium_signal") and not db.exists(other, "made_here")


def test_teardown_keeps_a_publication_init_did_not_create(
    pg: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = pg.capture("items")
    pg.table(cap, "items", 10)
    cap.sql(f'CREATE PUBLICATION "{cap.publication}" FOR TABLE {pg.name("items")}')
    cap.init()
    capsys.readouterr()
    assert cap.cli("teardown", "--yes") == 0
    out = capsys.readouterr().out
    assert f"publication {cap.publication}: kept" in out, out
    assert cap.sql("SELECT 1 FROM pg_publication WHERE pubname = %s", (cap.publication,))
    assert not cap.sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (cap.slot,))


# --- the engine's own tables: layouts, never targets -------------------------------------------


def test_init_and_run_refuse_a_user_table_as_notification_or_signal_table(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    # A pattern captures orders; naming it in the config outright is refused at load.
    cap = db.capture(notifications="orders")
    db.table(cap, "orders", 20)
    capsys.readouterr()
    assert cap.cli("init") == 1
    err = capsys.readouterr().err
    assert "[notifications] table names" in err and "not a notification table" in err, err
    assert "name another table in [notifications] table" in err, err
    # run refuses it too (init's refusal may have been ignored), before writing anything.
    with pytest.raises(SetupError, match=r"\[notifications\] table names"):
        cap.run()
    assert len(cap.sql(f"SELECT id FROM {db.name('orders')}")) == 20

    other = db.capture("orders")
    text = other.config_path.read_text(encoding="utf-8")
    other.config_path.write_text(
        text.replace(f'"{db.schema}.debezium_signal"', f'"{db.schema}.orders"'), encoding="utf-8"
    )
    assert other.cli("init") == 1
    err = capsys.readouterr().err
    assert "[source] signal_table names" in err and "not a signal table" in err, err
    assert len(cap.sql(f"SELECT id FROM {db.name('orders')}")) == 20


def test_a_captured_table_named_as_notification_table_is_refused_at_load(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = db.capture("items", "orders", notifications="orders")
    capsys.readouterr()
    assert cap.cli("status") == 2
    err = capsys.readouterr().err
    assert "is a captured table" in err and "debezium_notification" in err, err


def test_the_notification_table_is_never_snapshotted(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = db.capture(notifications="debezium_notification")  # schema.* matches it
    db.table(cap, "items", 50)
    cap.init()
    capsys.readouterr()
    assert cap.cli("signal", "execute-snapshot", f"{db.schema}.debezium_notification") == 2
    err = capsys.readouterr().err
    assert "notification table" in err and "never snapshotted" in err, err
    cap.execute(f"{db.schema}.*")
    assert cap.run() == 0
    assert snapshots(status_json(cap, capsys)) == {f"{db.schema}.items": "done"}
    assert cap.events("debezium_notification") == []
    # verify of every captured table leaves the engine's own table out (it is not streamed).
    capsys.readouterr()
    assert cap.cli("verify") == 0
    out = capsys.readouterr().out
    assert "items: converged" in out and "debezium_notification" not in out, out


# --- the table notification channel without its table -------------------------------------------


def test_a_missing_notification_table_is_one_line_without_psycopg_noise(
    pg: Db, tmp_path: Any
) -> None:
    cap = pg.capture("items", notifications="debezium_notification")
    pg.table(cap, "items", 50)
    cap.init()
    cap.sql(f"DROP TABLE {pg.name('debezium_notification')}")
    cap.execute(f"{pg.schema}.items")
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "snapshotter.app.cli",
            "run",
            "-c",
            str(cap.config_path),
            "--until-caught-up",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "error ignored terminating" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if "notifications: cannot write" in line]
    assert len(lines) == 1 and "run `snapshotter init` to create it" in lines[0], done.stderr


def test_the_table_channel_never_runs_a_psycopg_pipeline(
    pg: Db, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """psycopg runs executemany in pipeline mode, and a failed insert there (a missing
    table) can also print "error ignored terminating Pipeline" on stderr, depending on
    timing (psycopg issue 266): the channel writes without a pipeline, so it cannot."""
    import psycopg

    from signals.names import TableId
    from snapshotter.app.notifications import TableChannel
    from snapshotter.sources.connect import create_engine

    cap = pg.capture("items", notifications="debezium_notification")
    entered: list[object] = []
    enter = psycopg.Pipeline.__enter__

    def counting(self: psycopg.Pipeline) -> psycopg.Pipeline:
        entered.append(self)
        return enter(self)

    monkeypatch.setattr(psycopg.Pipeline, "__enter__", counting)
    record = {
        "id": "sig",
        "aggregate_type": "Incremental Snapshot",
        "type": "STARTED",
        "additional_data": {"data_collections": "x"},
        "timestamp": 1,
    }
    channel = TableChannel(
        lambda: create_engine(cap.config.source), TableId(pg.schema, "debezium_notification")
    )
    channel.send([record, record, record])
    channel.close()
    errors = [r.getMessage() for r in caplog.records if "cannot write to table" in r.getMessage()]
    assert errors and "run `snapshotter init` to create it" in errors[0], errors
    assert entered == []
