"""The properties a finished simulation must have (besides those checked as it runs).

Checked as it runs (``tests.sim.scheduler.World``): every READ row is the row as the log had
it at its close watermark; within one engine run no key range is read by two chunks of one
snapshot, and a resumed run never reads below the durable key it resumed from (so what a
crash costs is only the chunks beyond the saved state); the engine never confirms the log
backwards, and never resumes it before the slot's confirmed point.

Checked at the end (``check_world``): all output is durable; the newest snapshot of every
table is done; applying the output's events by key, in order (c/u/r upsert, d delete),
gives every table exactly; the positions of each key's events only go forward; and every
snapshot that finished (not only the last, whose reads would hide a gap in earlier ones)
left the output equal to its table at its last chunk's close (a gap in an early snapshot
would be hidden by the later ones at the end).
"""

from __future__ import annotations

from typing import Any

from signals.names import TableId
from snapshotter.core.events import Op
from snapshotter.core.keys import Key
from snapshotter.core.position import Position
from snapshotter.core.state import SnapshotStatus
from tests.sim.db import DATA_TABLES, Row
from tests.sim.errors import Property, SimFailure
from tests.sim.scheduler import World
from tests.sim.sink import BatchMark, OutEvent


def materialize(events: list[OutEvent]) -> dict[TableId, dict[Key, Row]]:
    tables: dict[TableId, dict[Key, Row]] = {}
    for event in events:
        rows = tables.setdefault(event.table, {})
        assert event.key is not None
        if event.op is Op.DELETE:
            rows.pop(event.key, None)
        elif event.op in (Op.CREATE, Op.UPDATE, Op.READ):
            assert event.row is not None
            rows[event.key] = dict(event.row)
        else:
            raise SimFailure(
                Property.BAD_EVENT, f"unexpected {event.op.value!r} event of {event.table}"
            )
    return tables


def positions_go_forward(events: list[OutEvent]) -> None:
    last: dict[tuple[TableId, Any], tuple[Position, int]] = {}
    for index, event in enumerate(events):
        slot = (event.table, event.key)
        seen = last.get(slot)
        if seen is not None and not seen[0] < event.position:
            raise SimFailure(
                Property.POSITIONS_BACKWARDS,
                f"{event.table} key {event.key}: event {index} ({event.op.value}) at "
                f"{event.position} after event {seen[1]} at {seen[0]}",
            )
        last[slot] = (event.position, index)


def check_world(world: World) -> None:
    output = world.output
    if output.durable != len(output.events):
        raise SimFailure(
            Property.NOT_DURABLE,
            f"{len(output.events) - output.durable} events not durable at the end",
        )
    newest = world.newest_snapshots()
    for schema in DATA_TABLES:
        status = newest.get(str(schema.table))
        if status is not SnapshotStatus.DONE:
            raise SimFailure(
                Property.SNAPSHOT_NOT_DONE,
                f"the newest snapshot of {schema.table} is {status}, not done",
            )
    events = output.rows()
    positions_go_forward(events)
    snapshots_complete(world)
    materialized = materialize(events)
    for schema in DATA_TABLES:
        table = schema.table
        want = world.db.latest(table)
        got = materialized.get(table, {})
        if got != want:
            raise SimFailure(
                Property.OUTPUT_NOT_TABLE,
                f"{table}: the output is not the table: {_difference(got, want)}",
            )


def snapshots_complete(world: World) -> None:
    """Each finished snapshot left the output equal to its table at its last chunk's close:
    the output up to there (log events in log order, READ batches at their closes),
    applied by key, gives the table as the log had it at that point."""
    assert world.engine is not None
    closes: dict[str, Position] = {}
    for item in world.output.events:
        if isinstance(item, BatchMark) and item.window_id in world.watch.read_windows:
            snapshot = world.watch.read_windows[item.window_id][1]
            if snapshot not in closes or closes[snapshot] < item.position:
                closes[snapshot] = item.position
    events = world.output.rows()
    for progress in world.engine.state.snapshots:
        snapshot = f"{progress.signal_id}/{progress.table}"
        if progress.status is not SnapshotStatus.DONE or snapshot not in closes:
            continue  # not finished, or nothing to read (empty at its start)
        if progress.started_ms is None or progress.estimated_rows is None:
            # Set at the start and saved with it: no crash or resume may lose them.
            raise SimFailure(
                Property.SNAPSHOT_RECORD,
                f"{snapshot} finished without its start time or row estimate",
            )
        end = closes[snapshot]
        table = progress.table
        upto = [e for e in events if e.table == table and e.position.parts[0] <= end.parts[0]]
        got = materialize(upto).get(table, {})
        want: dict[Key, Row] = {}
        for key in world.db.versions[table]:
            row = world.db.row_at(table, key, end.parts[0])
            if row is not None:
                want[key] = row
        if got != want:
            raise SimFailure(
                Property.SNAPSHOT_GAP,
                f"{snapshot} finished at {end}, but the output there is not the table: "
                + _difference(got, want),
            )


def _difference(got: dict[Key, Row], want: dict[Key, Row]) -> str:
    missing = sorted(k for k in want if k not in got)
    extra = sorted(k for k in got if k not in want)
    differ = sorted(k for k in want if k in got and got[k] != want[k])
    return (
        f"missing keys {missing[:5]}, extra keys {extra[:5]}, different rows "
        f"{[(k, got[k], want[k]) for k in differ[:3]]}"
    )
