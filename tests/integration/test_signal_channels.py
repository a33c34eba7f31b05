"""The file and Kafka signal channels on real servers (the file on PostgreSQL and MariaDB,
Kafka on PostgreSQL): `snapshotter signal` appends the signal to `[signals] file` or sends it
to the signal topic (nothing inserted into the signal table); `run` snapshots the table from
it while a writer changes it, converges, and acts on that signal once across a second run; a
signal inserted into the table with the table channel off acts on nothing."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration

ROWS = 500


Setup = tuple[Capture, str, Path, str]


@pytest.fixture(
    params=[("postgres", "file"), ("mysql", "file"), ("postgres", "kafka")],
    ids=["postgres-file", "mysql-file", "postgres-kafka"],
)
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Setup:
    kind, channel = request.param
    postgres = kind == "postgres"
    factory: Callable[..., Capture] = request.getfixturevalue(
        "capture" if postgres else "mysql_capture"
    )
    schema: str = request.getfixturevalue("pg_schema" if postgres else "mysql_db")
    path = tmp_path / "signals.jsonl"
    if channel == "file":
        settings = f'channels = ["file"]\nfile = "{path}"'
        where = str(path)
    else:
        bootstrap = os.environ.get("SNAPSHOTTER_KAFKA_BOOTSTRAP", "127.0.0.1:29092")
        topic = f"signals-{uuid.uuid4().hex[:10]}"  # a topic per test: no earlier signals
        settings = (
            f'channels = ["kafka"]\nkafka_topic = "{topic}"\n'
            f'kafka_bootstrap_servers = "{bootstrap}"'
        )
        where = f"topic {topic}"
    cap = factory(
        tables=[f"{schema}.items"], extra_config=f"\n[signals]\n{settings}\n", chunk_size=64
    )
    q = '"' if postgres else "`"
    name = f"{q}{schema}{q}.{q}items{q}"
    cap.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, name varchar(50))")
    if postgres:
        cap.sql(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    cap.sql(f"INSERT INTO {name} VALUES " + ", ".join(f"({n}, 'n{n}')" for n in range(ROWS)))
    return cap, name, path, where


def _signal_rows(cap: Capture, schema_table: str) -> int:
    return int(cap.sql(f"SELECT count(*) FROM {schema_table}")[0][0])


def test_a_snapshot_signalled_by_the_channel_converges_and_acts_once(
    setup: Setup, capsys: pytest.CaptureFixture[str]
) -> None:
    cap, name, path, where = setup
    cap.init()
    signal_table = name.replace("items", "debezium_signal")
    capsys.readouterr()
    cap.execute(f"{cap.schema}.items")
    printed = capsys.readouterr().out
    assert f"sent to {where}" in printed
    if path.exists():
        (line,) = path.read_text().splitlines()
        sent: dict[str, Any] = json.loads(line)
        assert sent["type"] == "execute-snapshot"
        assert sent["data"]["data-collections"] == [f"{cap.schema}.items"]
    else:  # the topic: the id is the one printed
        sent = {"id": printed.split(" signal ")[1].split()[0]}
    assert _signal_rows(cap, signal_table) == 0  # nothing inserted: the file is the channel
    engine = cap.start(until_caught_up=True)
    for n in range(0, ROWS, 7):  # changes while it reads: the window rules still hold
        cap.sql(f"UPDATE {name} SET name = 'changed' WHERE id = {n}")
    cap.sql(f"DELETE FROM {name} WHERE id = 3")
    assert engine.join(300) == 0
    reads = [e for e in cap.events("items") if e["value"]["op"] == "r"]
    assert 0 < len(reads) <= ROWS
    # A second run streams what the writer committed after the first caught up, and does
    # not act on the line again: no READ row more.
    assert cap.run() == 0
    assert len([e for e in cap.events("items") if e["value"]["op"] == "r"]) == len(reads)
    verdict = cap.verify("items")
    assert verdict.ok, verdict
    (snapshot,) = cap.status()["snapshots"]
    assert snapshot["signal_id"] == sent["id"] and snapshot["state"] == "done"


def test_with_the_table_channel_off_a_row_in_the_signal_table_acts_on_nothing(
    setup: Setup,
) -> None:
    cap, name, _, _ = setup
    cap.init()
    signal_table = name.replace("items", "debezium_signal")
    data = json.dumps({"data-collections": [f"{cap.schema}.items"]})
    cap.sql(
        f"INSERT INTO {signal_table} (id, type, data) VALUES ('from-table', 'execute-snapshot', "
        f"'{data}')"
    )
    assert cap.run() == 0
    assert cap.status()["snapshots"] == []
    assert not [e for e in cap.events("items") if e["value"]["op"] == "r"]
