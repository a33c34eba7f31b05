"""PostgreSQL's unchanged TOAST values (issue 15): a snapshot of a table with TOAST-able columns
needs REPLICA IDENTITY FULL and is refused without it, clearly, while the stream goes on; with
FULL it converges under a writer that changes keys and other columns; and Debezium's
placeholder for a value the log did not carry is never landed or verified as data.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from signals.names import TableId
from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sources.base import TableError
from snapshotter.sources.postgres.dialect import PostgresDialect
from tests.integration.engine_harness import Capture
from tests.integration.test_convergence import Pacer, state_of, wait_for
from tests.integration.writer import RandomWriter

pytestmark = pytest.mark.integration


def _docs(cap: Capture, rows: int, *, full: bool) -> str:
    """``docs (id, n, doc jsonb, big text)``: ``big`` stored out of line (TOASTed), ``doc`` a
    small JSON object (inline, so an update carries it as an object)."""
    name = f'"{cap.schema}".docs'
    cap.sql(f"CREATE TABLE {name} (id int PRIMARY KEY, n int NOT NULL, doc jsonb, big text)")
    cap.sql(f"ALTER TABLE {name} ALTER COLUMN big SET STORAGE EXTERNAL")
    if full:
        cap.sql(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    _insert(cap, 1, rows)
    return name


def _insert(cap: Capture, first: int, last: int) -> None:
    if last >= first:
        cap.sql(
            f"INSERT INTO \"{cap.schema}\".docs SELECT g, 0, jsonb_build_object('g', g), "
            "repeat(md5(g::text), 80) FROM generate_series(%s::int, %s::int) g",
            (first, last),
        )


def _ops(cap: Capture) -> list[tuple[str, int]]:
    return [(e["value"]["op"], e["key"]["id"]) for e in cap.events("docs")]


# --- refused without FULL -------------------------------------------------------------------


def test_a_default_identity_table_with_toast_is_refused_at_signal_time_and_the_stream_flows(
    capture: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    cap: Capture = capture(chunk_size=20)
    name = _docs(cap, 50, full=False)
    cap.init()
    said = capsys.readouterr()
    assert "execute-snapshot of" in said.out + said.err and "is refused" in said.out + said.err
    cap.execute(f"{cap.schema}.docs")
    _insert(cap, 1000, 1000)  # after the signal: streamed while the snapshot is refused
    assert cap.run() == 2  # the snapshot this run worked on failed
    snapshot = cap.status()["snapshots"][0]
    assert snapshot["state"] == "failed"
    error = snapshot["error"]
    assert f"snapshot of {cap.schema}.docs refused" in error
    assert "TOAST-able columns (doc, big)" in error and "REPLICA IDENTITY DEFAULT" in error
    assert "cannot converge" in error
    assert f"ALTER TABLE {cap.schema}.docs REPLICA IDENTITY FULL;" in error
    assert "send execute-snapshot again" in error
    assert "\n" not in error
    # The stream went on: the insert is there, no chunk was read.
    assert _ops(cap) == [("c", 1000)]
    # The fix as said: FULL, then the signal again.
    cap.sql(f"ALTER TABLE {name} REPLICA IDENTITY FULL")
    cap.execute(f"{cap.schema}.docs")
    assert cap.run() == 0
    assert state_of(cap, "docs") == "done"
    verdict = cap.verify("docs")
    assert verdict.ok and verdict.table_rows == 51, verdict.render()


def test_a_partition_without_full_identity_refuses_its_partitioned_table(
    capture: Any, pg_url: str
) -> None:
    cap: Capture = capture()
    s = f'"{cap.schema}"'
    cap.sql(f"CREATE TABLE {s}.p (id int PRIMARY KEY, note text) PARTITION BY RANGE (id)")
    cap.sql(f"CREATE TABLE {s}.p1 PARTITION OF {s}.p FOR VALUES FROM (0) TO (10)")
    cap.sql(f'CREATE TABLE {s}."P2" PARTITION OF {s}.p FOR VALUES FROM (10) TO (20)')
    for table in ("p", "p1"):  # replica identity is not inherited: "P2" keeps DEFAULT
        cap.sql(f"ALTER TABLE {s}.{table} REPLICA IDENTITY FULL")
    dialect = PostgresDialect(pg_url, TableId(cap.schema, "debezium_signal"), "unused")
    try:
        schema = dialect.describe(TableId(cap.schema, "p"))
        with pytest.raises(TableError) as error:
            dialect.snapshot_key(schema, None)
        message = str(error.value)
        assert f"(partition {cap.schema}.P2)" in message and "(note)" in message
        assert f'ALTER TABLE {cap.schema}."P2" REPLICA IDENTITY FULL;' in message
        cap.sql(f'ALTER TABLE {s}."P2" REPLICA IDENTITY FULL')
        assert dialect.snapshot_key(schema, None) == ("id",)
        # No TOAST-able column: the default identity is enough.
        cap.sql(f"CREATE TABLE {s}.ints (id int PRIMARY KEY, n bigint, at timestamptz)")
        ints = dialect.describe(TableId(cap.schema, "ints"))
        assert dialect.snapshot_key(ints, None) == ("id",)
    finally:
        dialect.close()


# --- converges with FULL --------------------------------------------------------------------

ROWS = 400
CHUNK = 25
CHANGES = 600


@pytest.mark.parametrize("sink", ["jsonl", "spark"])
def test_full_identity_converges_under_key_changes_and_updates_of_other_columns(
    capture: Any, sink: str
) -> None:
    """Updates touch only ``n`` (the TOASTed value stays unchanged: under FULL the old row
    carries it), key changes move rows with their TOASTed value; spread over the snapshot."""
    cap: Capture = capture(chunk_size=CHUNK, sink=sink)
    _docs(cap, ROWS, full=True)
    cap.init()
    rng = random.Random(15)
    writer = RandomWriter(
        cap.url,
        TableId(cap.schema, "docs"),
        ("id",),
        new_key=lambda: (rng.randrange(10_000, 10**9),),
        new_row=lambda key: {"n": rng.randrange(1000)},
        changes=None,
        weights={"update": 6, "key_change": 3, "insert": 1},
        hot_keys=40,
        seed=15,
    )
    pacer = Pacer(writer, CHANGES, chunks=ROWS * 3 // (4 * CHUNK))
    with writer:
        wait_for(lambda: writer.total >= 20, "the writer to get going")
        cap.execute(f"{cap.schema}.docs")
        engine = cap.start(hooks=pacer.hooks())
        wait_for(
            lambda: state_of(cap, "docs") not in (None, "pending", "running"),
            "the snapshot to finish",
            timeout=240,
            engine=engine,
        )
    assert engine.stop(timeout=240) == 0
    assert cap.run(timeout=300) == 0
    assert state_of(cap, "docs") == "done"
    assert pacer.during >= CHANGES and writer.counts["key_change"] > 0, writer.counts
    if sink == "jsonl":
        verdict = cap.verify("docs")
        assert verdict.ok, verdict.render()
        afters = [e["value"]["after"] or {} for e in cap.events("docs")]
        assert not any(UNAVAILABLE_VALUE in row.values() for row in afters)
        assert sum(len(row.get("big") or "") > 2000 for row in afters) > ROWS
        return
    landed = cap.verify_landed("docs")
    assert landed.ok, landed.render()
    assert cap.landed_rows("docs") == cap.source_rows("docs")
    changelog = cap.lander().changelog(cap.table_id("docs"))
    assert changelog is not None
    assert changelog.where("__unavailable IS NOT NULL").count() == 0
    assert changelog.where(f"big = '{UNAVAILABLE_VALUE}'").count() == 0


# --- placeholders under the default identity (streamed, no snapshot) ------------------------


def test_verify_resolves_placeholders_beside_json_objects_and_reports_a_new_key_without_one(
    capture: Any,
) -> None:
    """An update of ``n`` carries the placeholder for ``big`` and ``doc`` as a JSON object:
    ``verify`` resolves the placeholder from the row's create (it crashed on the object:
    "unhashable type: 'dict'"). A key change creates the new key with the placeholder and
    nothing to resolve it from: the row differs, with the placeholder shown."""
    cap: Capture = capture()
    _docs(cap, 0, full=False)
    cap.init()
    _insert(cap, 1, 20)
    cap.sql(f'UPDATE "{cap.schema}".docs SET n = n + 1 WHERE id <= 10')
    assert cap.run() == 0
    updates = [e["value"]["after"] for e in cap.events("docs") if e["value"]["op"] == "u"]
    assert len(updates) == 10
    assert all(u["big"] == UNAVAILABLE_VALUE and isinstance(u["doc"], dict) for u in updates)
    verdict = cap.verify("docs")
    assert verdict.ok, verdict.render()
    cap.sql(f'UPDATE "{cap.schema}".docs SET id = 1001 WHERE id = 1')
    assert cap.run() == 0
    verdict = cap.verify("docs")
    assert (verdict.missing, verdict.extra, verdict.differing) == (0, 0, 1), verdict.render()
    (diff,) = verdict.differing_examples
    assert dict(diff.key) == {"id": 1001}
    assert [(c.column, c.output) for c in diff.columns] == [("big", UNAVAILABLE_VALUE)]


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_the_landing_never_lands_a_placeholder_as_data(capture: Any, fmt: str) -> None:
    """Under the default identity: an update's placeholder resolves from the key's previous
    row; a key change's create has none (a new key, or one deleted before: never the deleted
    row's value), so the column lands NULL and listed in ``__unavailable``, and stays so
    through later updates that do not carry it, until one does."""
    cap: Capture = capture(sink="spark", sink_format=fmt)
    s = f'"{cap.schema}"'
    _docs(cap, 0, full=False)
    cap.init()
    _insert(cap, 1, 10)
    assert cap.run(timeout=300) == 0
    cap.sql(f"UPDATE {s}.docs SET n = 1 WHERE id <= 3")  # resolved from the creates
    cap.sql(f"UPDATE {s}.docs SET id = 1001 WHERE id = 1")  # a new key
    cap.sql(f"DELETE FROM {s}.docs WHERE id = 5")
    cap.sql(f"UPDATE {s}.docs SET id = 5 WHERE id = 6")  # a deleted key created again
    assert cap.run(timeout=300) == 0
    cap.sql(f"UPDATE {s}.docs SET n = 2 WHERE id IN (1001, 2)")  # in a later landing
    assert cap.run(timeout=300) == 0
    lander = cap.lander()
    table = cap.table_id("docs")
    changelog = lander.changelog(table)
    current = lander.current_state(table)
    assert changelog is not None and current is not None
    assert changelog.where(f"big = '{UNAVAILABLE_VALUE}'").count() == 0
    created = changelog.where("__op = 'c' AND __unavailable IS NOT NULL")
    assert sorted(r["id"] for r in created.select("id").collect()) == [5, 1001]
    state = {r["id"]: r for r in current.toArrow().to_pylist()}
    source = cap.source_rows("docs")
    for key in (5, 1001):
        assert state[key]["big"] is None and state[key]["__unavailable"] == ["big"], key
        assert state[key]["n"] == source[repr((key,))]["n"]
    for key in (2, 3, 4, 7):
        assert state[key]["big"] == source[repr((key,))]["big"]
        assert state[key]["__unavailable"] is None
    # A change that carries the value resolves it.
    cap.sql(f"UPDATE {s}.docs SET big = 'small now' WHERE id = 1001")
    assert cap.run(timeout=300) == 0
    current = cap.lander().current_state(table)
    assert current is not None
    row = current.where("id = 1001").toArrow().to_pylist()[0]
    assert (row["big"], row["__unavailable"]) == ("small now", None)
