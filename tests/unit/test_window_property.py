"""Property: replaying the merged output (log events + READ rows) in order yields the table.

A simulated database applies random writes (inserts, updates, deletes, primary-key changes,
now and then a TRUNCATE) and appends them to its log. The chunk loop of the DBLog algorithm
runs beside it: record the maximum key, then per chunk register a window, write the open
watermark, SELECT the next chunk, hand it to the window, write the close watermark. A log
consumer that lags by a random amount reads the log, feeds the window and collects output.
Hypothesis picks the interleaving. At the end the output, replayed, must equal the table.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core import ChangeEvent, ChunkWindow, Op, Position, Source, TableProgress
from snapshotter.core.state import SnapshotStatus

TABLE = TableId("public", "items")
SIGNALS = TableId("public", "debezium_signal")

KEY_SHAPES: dict[str, tuple[list[str], pa.Schema]] = {
    "single": (["id"], pa.schema([("id", pa.int64()), ("v", pa.int64())])),
    "composite": (
        ["k1", "k2"],
        pa.schema([("k1", pa.int64()), ("k2", pa.string()), ("v", pa.int64())]),
    ),
}


@dataclass
class Watermark:
    window_id: str
    close: bool


@dataclass
class Sim:
    key_columns: list[str]
    schema: pa.Schema
    table: dict[tuple[Any, ...], dict[str, Any]]
    chunk_size: int
    log: list[ChangeEvent | Watermark] = field(default_factory=list)
    consumed: int = 0
    output: list[ChangeEvent] = field(default_factory=list)
    progress: TableProgress | None = None
    window: ChunkWindow | None = None
    window_step: str = "idle"  # idle -> open_written -> filled -> close_written -> idle
    window_ids: itertools.count = field(default_factory=itertools.count)
    value_seq: itertools.count = field(default_factory=lambda: itertools.count(1000))

    # --- the database -------------------------------------------------------------------
    def source(self, table: TableId, index: int) -> Source:
        return Source("sim", "sim", "db", table, Position(index + 1, 0), ts_ms=index)

    def append(self, make: Any) -> None:
        self.log.append(make(self.source(TABLE, len(self.log))))

    def row(self, key: tuple[Any, ...]) -> dict[str, Any]:
        return {**dict(zip(self.key_columns, key, strict=True)), "v": next(self.value_seq)}

    def write(self, data: st.DataObject) -> None:
        keys = sorted(self.table)
        kinds = ["insert"] + (["update", "delete", "rekey"] if keys else [])
        kind = data.draw(st.sampled_from(kinds + ["truncate"] * (len(keys) > 3)))
        if kind == "truncate":
            self.table.clear()
            self.append(lambda s: ChangeEvent(Op.TRUNCATE, s, 0, None))
            return
        if kind == "insert":
            key = self.fresh_key(data)
            row = self.row(key)
            self.table[key] = row
            self.append(lambda s: ChangeEvent(Op.CREATE, s, 0, key, after=row))
            return
        key = data.draw(st.sampled_from(keys))
        before = self.table[key]
        if kind == "update":
            after = {**before, "v": next(self.value_seq)}
            self.table[key] = after
            self.append(lambda s: ChangeEvent(Op.UPDATE, s, 0, key, before=before, after=after))
        elif kind == "delete":
            del self.table[key]
            self.append(lambda s: ChangeEvent(Op.DELETE, s, 0, key, before=before))
        else:
            new_key = self.fresh_key(data)
            after = self.row(new_key)
            del self.table[key]
            self.table[new_key] = after
            # A key change, as readers emit it: delete of the old key, create of the new one.
            self.append(lambda s: ChangeEvent(Op.DELETE, s, 0, key, before=before))
            self.append(lambda s: ChangeEvent(Op.CREATE, s, 0, new_key, after=after))

    def fresh_key(self, data: st.DataObject) -> tuple[Any, ...]:
        # Small key space, so new keys land before, inside and after the chunk being read.
        while True:
            first = data.draw(st.integers(0, 40))
            key = (
                (first,)
                if len(self.key_columns) == 1
                else (first // 4, data.draw(st.sampled_from(["a", "b", "B", "ä", ""])))
            )
            if key not in self.table:
                return key

    def select_chunk(self) -> pa.Table:
        assert self.progress is not None and self.progress.max_key is not None
        after = self.progress.last_read_key
        keys = [
            k
            for k in sorted(self.table)
            if (after is None or k > after) and k <= self.progress.max_key
        ]
        rows = [self.table[k] for k in keys[: self.chunk_size]]
        return pa.Table.from_pylist(rows, schema=self.schema)

    # --- the chunk loop -----------------------------------------------------------------
    def snapshot_step(self) -> None:
        assert self.progress is not None
        if self.window_step == "idle":
            # A window is registered before its open watermark is written.
            self.window = ChunkWindow(f"w{next(self.window_ids)}", TABLE, self.key_columns)
            self.log.append(Watermark(self.window.window_id, close=False))
            self.window_step = "open_written"
        elif self.window_step == "open_written":
            assert self.window is not None
            self.window.fill(self.select_chunk())
            self.window_step = "filled"
        elif self.window_step == "filled":
            assert self.window is not None
            self.log.append(Watermark(self.window.window_id, close=True))
            self.window_step = "close_written"

    @property
    def snapshot_can_step(self) -> bool:
        return (
            self.progress is not None
            and self.progress.status is SnapshotStatus.RUNNING
            and self.window_step != "close_written"
        )

    # --- the log consumer (what the engine does with each log entry) --------------------
    def consume(self) -> None:
        entry = self.log[self.consumed]
        self.consumed += 1
        position = Position(self.consumed, 0)
        if isinstance(entry, Watermark):
            window = self.window
            if window is None or entry.window_id != window.window_id:
                return  # a watermark of a window we no longer have
            if not entry.close:
                window.open(position)
                return
            batch = window.close(position)
            # Output barrier: READ rows go out before anything after the close watermark.
            close_source = self.source(SIGNALS, self.consumed - 1)
            self.output.extend(batch.stamped(close_source, 0, None).events())
            assert self.progress is not None
            self.progress.chunk_done(
                last_key=batch.last_key,
                selected=batch.selected,
                emitted=batch.rows.num_rows,
                chunk_size=self.chunk_size,
            )
            self.window, self.window_step = None, "idle"
            return
        if self.window is not None and entry.table == self.window.table:
            self.window.observe(entry)
        self.output.append(entry)


def replay(events: list[ChangeEvent]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The oracle: apply the output in order, as a landing keyed by primary key would."""
    state: dict[tuple[Any, ...], dict[str, Any]] = {}
    for event in events:
        if event.op is Op.TRUNCATE:
            state.clear()
        elif event.op is Op.DELETE:
            state.pop(event.key, None)
        else:
            assert event.after is not None and event.key is not None
            state[event.key] = dict(event.after)
    return state


@st.composite
def initial_tables(draw: st.DrawFn, key_shape: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    if key_shape == "single":
        keys = draw(st.sets(st.integers(0, 40), max_size=25))
        return {(k,): {"id": k, "v": k} for k in keys}
    pairs = draw(
        st.sets(
            st.tuples(st.integers(0, 10), st.sampled_from(["a", "b", "B", "ä", ""])), max_size=25
        )
    )
    return {p: {"k1": p[0], "k2": p[1], "v": i} for i, p in enumerate(sorted(pairs))}


def run_simulation(data: st.DataObject, key_shape: str) -> Sim:
    key_columns, schema = KEY_SHAPES[key_shape]
    sim = Sim(
        key_columns,
        schema,
        data.draw(initial_tables(key_shape)),
        chunk_size=data.draw(st.integers(1, 6)),
    )
    writes_left = data.draw(st.integers(0, 40))
    # execute-snapshot: the progress record is made, the maximum key recorded.
    sim.progress = TableProgress(table=TABLE, signal_id="sig-1", key_columns=key_columns)
    for _ in range(data.draw(st.integers(0, 3))):  # writes before the maximum key is taken
        if writes_left:
            sim.write(data)
            writes_left -= 1
    sim.progress.start(max(sim.table) if sim.table else None)
    for _ in range(2000):
        actions = []
        if writes_left:
            actions.append("write")
        if sim.snapshot_can_step:
            actions.append("snapshot")
        if sim.consumed < len(sim.log):
            actions.append("consume")
        if not actions:
            break
        action = data.draw(st.sampled_from(actions))
        if action == "write":
            sim.write(data)
            writes_left -= 1
        elif action == "snapshot":
            sim.snapshot_step()
        else:
            sim.consume()
    else:
        raise AssertionError("the snapshot did not finish: it loops")
    return sim


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), key_shape=st.sampled_from(sorted(KEY_SHAPES)))
def test_replaying_the_output_yields_the_table(data: st.DataObject, key_shape: str) -> None:
    sim = run_simulation(data, key_shape)
    assert sim.progress is not None
    assert sim.progress.status is SnapshotStatus.DONE
    assert replay(sim.output) == sim.table
    positions = [e.position for e in sim.output]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert [p.token for p in positions] == sorted(p.token for p in positions)
