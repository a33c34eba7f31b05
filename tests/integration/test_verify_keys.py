"""``snapshotter verify`` on tables whose keys trip it up: a table without a primary key
snapshotted by a surrogate key (its output is keyed by that key, so the table side must be
too), and column names holding ``%`` (pymysql's pyformat placeholders); and which tables
``verify`` checks when none are named (one rule for every sink)."""

from __future__ import annotations

import json
import time

import pytest

from snapshotter.app import cli
from tests.integration.engine_harness import Capture
from tests.integration.test_convergence import (
    Source,
    catch_up,
    progress,
    qualified,
    source_named,
    state_of,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("db", ["postgres", "mysql"])
def test_verify_keys_a_surrogate_key_snapshot_by_its_surrogate_key(
    request: pytest.FixtureRequest, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Changes streamed before the signal are keyed by the whole row, those after by the
    surrogate key: verify replays and compares by the surrogate key, and converges."""
    source: Source = source_named(request, db)
    rows = 1_500
    cap = source.capture(chunk_size=200)
    table = source.create(cap, "nopk", rows)
    cap.init()
    with source.writer(cap, table, rows, changes=None, rate=200, seed=3) as writer:
        engine = cap.start()
        wait_for(lambda: writer.total >= 50, "the writer to get going", engine=engine)
        time.sleep(0.5)  # some of the table's changes are streamed before the signal
        cap.execute(qualified(cap, "nopk"), surrogate="uid")
        wait_for(
            lambda: state_of(cap, "nopk") not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=120,
            engine=engine,
        )
    assert engine.stop() == 0
    assert catch_up(cap) == 0
    assert progress(cap, "nopk")["state"] == "done"
    verdict = cap.verify("nopk")
    assert verdict.ok, verdict.render()
    assert verdict.table_rows == len(source.sql(cap, "SELECT uid FROM {s}.nopk"))
    # The command, with no table named: every table source.tables selects (only nopk).
    capsys.readouterr()
    assert cli.main(["verify", "-c", str(cap.config_path)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"{qualified(cap, 'nopk')}: converged"), said


def _percent_table(source: Source, cap: Capture) -> None:
    q = source.quote
    source.sql(
        cap,
        f"CREATE TABLE {{s}}.pct (id int PRIMARY KEY, {q('50%')} int, {q('a%%b %s')} varchar(20))",
    )
    if source.name == "postgres":
        source.sql(cap, "ALTER TABLE {s}.pct REPLICA IDENTITY FULL")
    conn = source.connect(cap)
    try:
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {q(cap.schema)}.pct VALUES (%s, %s, %s)",
                [(i, i * 2, f"v{i}") for i in range(1, 301)],
            )
    finally:
        conn.close()


@pytest.mark.parametrize("db", ["mysql", "postgres"])
def test_verify_a_table_with_percent_signs_in_column_names(
    request: pytest.FixtureRequest, db: str
) -> None:
    source: Source = source_named(request, db)
    cap = source.capture(chunk_size=100)
    _percent_table(source, cap)
    cap.init()
    cap.execute(qualified(cap, "pct"))
    assert catch_up(cap) == 0
    q = source.quote
    source.sql(cap, f"UPDATE {{s}}.pct SET {q('50%')} = -1 WHERE id = 7")
    assert catch_up(cap) == 0
    verdict = cap.verify("pct")
    assert verdict.ok and verdict.table_rows == 300, verdict.render()
    source.sql(cap, f"UPDATE {{s}}.pct SET {q('a%%b %s')} = 'behind' WHERE id = 8")
    verdict = cap.verify("pct")  # not streamed yet: the difference is named, not a crash
    assert not verdict.ok and verdict.differing == 1, verdict.render()


def test_spark_verify_a_percent_column_and_a_surrogate_key(
    request: pytest.FixtureRequest,
) -> None:
    """The Spark sink's verify (key-range chunks of the source, hashed against the landed
    state) on MariaDB: ``%`` in column names, and a table landed by its surrogate key."""
    source: Source = source_named(request, "mysql")
    cap = source.capture(chunk_size=100, sink="spark")
    _percent_table(source, cap)
    source.create(cap, "nopk", 400)
    cap.init()
    cap.execute(qualified(cap, "pct"))
    cap.execute(qualified(cap, "nopk"), surrogate="uid")
    assert catch_up(cap) == 0
    for name, count in (("pct", 300), ("nopk", 400)):
        verdict = cap.verify_landed(name)
        assert verdict.ok and verdict.verdict.table_rows == count, verdict.render()


def test_verify_without_names_is_every_selected_table_for_the_jsonl_sink(
    request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """No names: every table source.tables selects at the source (here two, one never
    snapshotted: its rows are missing from the output, and verify says so); names narrow."""
    source: Source = source_named(request, "postgres")
    cap = source.capture()
    source.create(cap, "items", 20)
    source.sql(cap, "CREATE TABLE {s}.other (id int PRIMARY KEY)")
    source.sql(cap, "INSERT INTO {s}.other VALUES (1), (2)")
    cap.init()
    cap.execute(qualified(cap, "items"))
    assert catch_up(cap) == 0
    config = str(cap.config_path)
    capsys.readouterr()
    assert cli.main(["verify", "-c", config, "--json"]) == 1
    results = {r["table"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(results) == {qualified(cap, "items"), qualified(cap, "other")}
    assert results[qualified(cap, "items")]["ok"]
    assert results[qualified(cap, "other")]["missing"] == 2
    assert cli.main(["verify", "-c", config, qualified(cap, "items")]) == 0  # named: that one


def test_verify_names_a_missing_sink_file(
    capture: object, capsys: pytest.CaptureFixture[str]
) -> None:
    cap: Capture = capture()  # type: ignore[operator]
    cap.sql(f'CREATE TABLE "{cap.schema}".t (id int PRIMARY KEY)')
    capsys.readouterr()
    assert cli.main(["verify", "-c", str(cap.config_path), f"{cap.schema}.t"]) == 1
    said = capsys.readouterr().out
    assert f"{cap.schema}.t: error: cannot read the sink file {cap.sink_path}" in said, said
