"""The file channel on real servers (PostgreSQL, MariaDB): `snapshotter signal` appends the
signal to `[signals] file` (nothing inserted into the signal table); `run` snapshots the table
from it while a writer changes it, converges, and acts on that line once across a second run;
a signal inserted into the table with the table channel off acts on nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration

ROWS = 500


@pytest.fixture(params=["postgres", "mysql"])
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Capture, str, Path]:
    postgres = request.param == "postgres"
    factory: Callable[..., Capture] = request.getfixturevalue(
        "capture" if postgres else "mysql_capture"
    )
    schema: str = request.getfixturevalue("pg_schema" if postgres else "mysql_db")
    path = tmp_path / "signals.jsonl"
    cap = factory(
        tables=[f"{schema}.items"],
        extra_config=f'\n[signals]\nchannels = ["file"]\nfile = "{path}"\n',
        chunk_size=64,
    )
    q = '"' if postgres else "`"
    name = f"{q}{schema}{q}.{q}items{q}"
    cap.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, name varchar(50))")
    if postgres:
        cap.sql(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    cap.sql(f"INSERT INTO {name} VALUES " + ", ".join(f"({n}, 'n{n}')" for n in range(ROWS)))
    return cap, name, path


def _signal_rows(cap: Capture, schema_table: str) -> int:
    return int(cap.sql(f"SELECT count(*) FROM {schema_table}")[0][0])


def test_a_snapshot_signalled_by_file_converges_and_acts_once(
    setup: tuple[Capture, str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    cap, name, path = setup
    cap.init()
    signal_table = name.replace("items", "debezium_signal")
    capsys.readouterr()
    cap.execute(f"{cap.schema}.items")
    assert "appended to" in capsys.readouterr().out
    (line,) = path.read_text().splitlines()
    sent: dict[str, Any] = json.loads(line)
    assert sent["type"] == "execute-snapshot"
    assert sent["data"]["data-collections"] == [f"{cap.schema}.items"]
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
    setup: tuple[Capture, str, Path],
) -> None:
    cap, name, _ = setup
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
