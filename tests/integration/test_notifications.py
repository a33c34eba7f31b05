"""Debezium's snapshot notifications from a real engine, on PostgreSQL and MariaDB/MySQL:
the log, table and sink (JSONL) channels carry the same records; pause, resume and stop
give PAUSED, RESUMED and ABORTED; the notification table's rows never reach the stream."""

from __future__ import annotations

import json
import logging
import re
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from snapshotter.engine.workers import PhaseHooks
from snapshotter.sinks.jsonl import notifications_path
from tests.integration.test_stream_position import cli

ROWS = 3000
CHUNK = 500


@pytest.fixture(params=["postgres", "mysql"])
def make(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """A capture on either database (each test runs on both) with these notification
    channels, the notification table in the test's schema."""
    postgres = request.param == "postgres"
    factory: Callable[..., Any] = request.getfixturevalue(
        "capture" if postgres else "mysql_capture"
    )
    schema = request.getfixturevalue("pg_schema" if postgres else "mysql_db")

    def with_channels(*channels: str, topic: str = "", **kwargs: Any) -> Any:
        section = (
            f"[notifications]\nchannels = {list(channels)!r}\n"
            f'table = "{schema}.debezium_notification"\n'
            + (f'topic = "{topic}"\n' if topic else "")
        )
        return factory(extra_config=section, **kwargs)

    return with_channels


def _items(cap: Any, rows: int) -> None:
    if cap.kind == "mysql":
        cap.sql(f"CREATE TABLE `{cap.schema}`.items (id int PRIMARY KEY, name text NOT NULL)")
        values = ", ".join(f"({n}, 'item {n}')" for n in range(1, rows + 1))
        cap.sql(f"INSERT INTO `{cap.schema}`.items VALUES {values}")
        return
    name = f'"{cap.schema}".items'
    cap.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, name text NOT NULL)")
    cap.sql(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    cap.sql(f"INSERT INTO {name} SELECT g, 'item ' || g FROM generate_series(1, %s) g", (rows,))


def _table_rows(cap: Any) -> list[dict[str, Any]]:
    q = "`" if cap.kind == "mysql" else '"'
    rows = cap.sql(
        f"SELECT {q}id{q}, aggregate_type, {q}type{q}, additional_data, {q}timestamp{q} "
        f"FROM {q}{cap.schema}{q}.debezium_notification ORDER BY seq"
    )
    return [
        {
            "id": r[0],
            "aggregate_type": r[1],
            "type": r[2],
            "additional_data": json.loads(r[3]),
            "timestamp": int(r[4]),
        }
        for r in rows
    ]


def _types(records: list[dict[str, Any]]) -> list[str]:
    return [r["type"] for r in records]


def test_a_snapshot_is_reported_on_every_channel(
    make: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    cap = make("log", "table", "sink", chunk_size=CHUNK)
    _items(cap, ROWS)
    cap.init()
    cap.execute(f"{cap.schema}.items")
    caplog.set_level(logging.INFO, logger="snapshotter.notifications")
    assert cap.run() == 0

    logged = [
        json.loads(r.getMessage()) for r in caplog.records if r.name == "snapshotter.notifications"
    ]
    table = f"{cap.schema}.items"
    chunks = cap.status()["snapshots"][0]["chunks"]
    # One IN_PROGRESS per chunk recorded, or per several recorded at once (parallel reads
    # record chunks in key order: an earlier window closing last records both).
    types = _types(logged)
    assert types[0] == "STARTED" and types[-2:] == ["TABLE_SCAN_COMPLETED", "COMPLETED"]
    assert set(types[1:-2]) == {"IN_PROGRESS"} and 1 <= len(types) - 3 <= chunks
    (signal_id,) = {r["id"] for r in logged}  # the execute-snapshot signal's id, as Debezium
    sent = cap.sql(
        f"SELECT id FROM {_quoted(cap, 'debezium_signal')} WHERE type = 'execute-snapshot'"
    )
    assert [r[0] for r in sent] == [signal_id]
    started, *progress, scanned, completed = logged
    assert started["aggregate_type"] == "Incremental Snapshot"
    assert started["additional_data"] == {"data_collections": table, "connector_name": "test"}
    keys = [int(p["additional_data"]["last_processed_key"]) for p in progress]
    assert keys == sorted(keys) and keys[-1] == ROWS
    assert {p["additional_data"]["maximum_key"] for p in progress} == {str(ROWS)}
    assert {p["additional_data"]["current_collection_in_progress"] for p in progress} == {table}
    assert scanned["additional_data"] == {
        "data_collections": table,
        "scanned_collection": table,
        "total_rows_scanned": str(ROWS),
        "status": "SUCCEEDED",
        "connector_name": "test",
    }
    assert completed["additional_data"] == {"connector_name": "test"}
    assert all(abs(r["timestamp"] - time.time() * 1000) < 600_000 for r in logged)

    # The same records in the notification table and in the sink's notification file.
    assert _table_rows(cap) == logged
    lines = notifications_path(cap.sink_path).read_text(encoding="utf-8").splitlines()
    in_sink = [json.loads(line) for line in lines]
    assert [m["value"] for m in in_sink] == logged
    assert {m["topic"] for m in in_sink} == {"test.notifications"}
    assert all(m["key"] == {"id": signal_id} for m in in_sink)

    # The notification table is the engine's own output, never captured.
    assert cap.events("debezium_notification") == []
    if cap.kind == "postgres":
        published = cap.sql(
            "SELECT tablename FROM pg_publication_tables WHERE pubname = %s",
            (cap.publication,),
        )
        assert ("debezium_notification",) not in published
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()


def _quoted(cap: Any, table: str) -> str:
    q = "`" if cap.kind == "mysql" else '"'
    return f"{q}{cap.schema}{q}.{q}{table}{q}"


def _wait_for(cap: Any, kind: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _table_rows(cap)
        if kind in _types(rows):
            return rows
        time.sleep(0.05)
    raise AssertionError(f"no {kind} notification within {timeout} s: {_types(_table_rows(cap))}")


def test_pause_resume_and_stop_are_reported(make: Callable[..., Any]) -> None:
    # Notifications follow the saved state: checkpoints every 100 ms keep them close.
    cap = make("table", chunk_size=50, state_config="checkpoint_interval_ms = 100")
    _items(cap, 2000)  # 40 chunks, slowed below: the signals land while it runs
    cap.init()
    engine = cap.start(hooks=PhaseHooks(after_open=lambda task: time.sleep(0.05)))
    try:
        cap.execute(f"{cap.schema}.items")
        _wait_for(cap, "IN_PROGRESS")
        cap.cli("signal", "pause-snapshot")
        _wait_for(cap, "PAUSED")
        cap.cli("signal", "resume-snapshot")
        _wait_for(cap, "RESUMED")
        cap.cli("signal", "stop-snapshot", f"{cap.schema}.items")
        rows = _wait_for(cap, "ABORTED")
    finally:
        engine.stop()
    types = _types(rows)
    assert types[0] == "STARTED"
    assert types.index("PAUSED") < types.index("RESUMED") < types.index("ABORTED")
    assert types[-1] == "ABORTED"  # stopped: not completed, no table scan completed
    assert "COMPLETED" not in types and "TABLE_SCAN_COMPLETED" not in types
    aborted = rows[-1]["additional_data"]
    assert aborted == {"data_collections": f"{cap.schema}.items", "connector_name": "test"}
    assert len({r["id"] for r in rows}) == 1
    assert cap.status()["snapshots"][0]["state"] == "stopped"
    # teardown drops the notification table with what else init made.
    assert cap.cli("teardown", "--yes") == 0
    left = cap.sql(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
        (cap.schema,),
    )
    assert [r for r in left if str(r[0]).lower() == "debezium_notification"] == []


def test_the_kafka_sink_channel(capture: Any, pg_schema: str, kafka_bootstrap: str) -> None:
    """Debezium's sink channel: the records on a topic of their own, keyed by id, with
    Debezium's Connect schemas when the sink writes schemas (PostgreSQL only: the channel
    is the sink's, not the source's)."""
    from tests.integration.test_convergence import consume_all

    topic = f"test.notifications.{pg_schema}"
    section = f'[notifications]\nchannels = ["sink"]\ntopic = "{topic}"\n'
    cap = capture(
        chunk_size=CHUNK,
        extra_config=section,
        sink="kafka",
        kafka_bootstrap=kafka_bootstrap,
        kafka_schemas=True,
    )
    _items(cap, 1000)
    cap.init()
    cap.execute(f"{cap.schema}.items")
    assert cap.run() == 0
    messages = consume_all(kafka_bootstrap, topic)
    keys = [json.loads(k or b"null") for _, _, k, _ in messages]
    values = [json.loads(v or b"null") for _, _, _, v in messages]
    assert {k["schema"]["name"] for k in keys} == {"io.debezium.connector.common.NotificationKey"}
    assert {v["schema"]["name"] for v in values} == {"io.debezium.connector.common.Notification"}
    records = [v["payload"] for v in values]
    types = _types(records)  # 2 chunks: 1 or 2 IN_PROGRESS (see above)
    assert types in (
        ["STARTED", "IN_PROGRESS", "TABLE_SCAN_COMPLETED", "COMPLETED"],
        ["STARTED", "IN_PROGRESS", "IN_PROGRESS", "TABLE_SCAN_COMPLETED", "COMPLETED"],
    )
    assert [k["payload"] for k in keys] == [{"id": r["id"]} for r in records]
    assert records[-2]["additional_data"]["total_rows_scanned"] == "1000"


NOTIFIED = re.compile(r" INFO snapshotter\.notifications: (\{.*\})$", re.MULTILINE)


def test_after_a_crash_and_resume_progress_never_goes_back(make: Callable[..., Any]) -> None:
    """Issue 26: SIGKILLed mid-snapshot, then resumed, the engine sent IN_PROGRESS again with
    ``last_processed_key`` going back (7607 -> 2027): it had notified chunks the sink had not
    acknowledged, and the resumed run read them again. Checkpoints every 2 s keep the saved
    state well behind the chunks read when the kill comes. On the log channel (stderr of
    both runs) and the table channel alike: one STARTED, keys that only grow, one
    TABLE_SCAN_COMPLETED and COMPLETED at the end."""
    rows, chunk = 20_000, 100
    cap = make("log", "table", chunk_size=chunk, state_config="checkpoint_interval_ms = 2000")
    _items(cap, rows)
    cap.init()
    cap.execute(f"{cap.schema}.items")
    killed = cli(cap, "run", "--until-caught-up", env={"SNAPSHOTTER_FAULTS": "window.close@150"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = cli(cap, "resume", "--until-caught-up")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    logged = [json.loads(m) for m in NOTIFIED.findall(killed.stderr + resumed.stderr)]
    for records in (logged, _table_rows(cap)):
        types = _types(records)
        keys = [
            int(r["additional_data"]["last_processed_key"])
            for r in records
            if r["type"] == "IN_PROGRESS"
        ]
        assert keys == sorted(keys), f"last_processed_key went back: {keys}"
        assert keys and keys[-1] == rows
        assert types.count("STARTED") == 1 and types[0] == "STARTED"
        assert types[-2:] == ["TABLE_SCAN_COMPLETED", "COMPLETED"]
        assert types.count("COMPLETED") == types.count("TABLE_SCAN_COMPLETED") == 1
    assert _table_rows(cap) == logged
    verdict = cap.verify("items")
    assert verdict.ok, verdict.render()
