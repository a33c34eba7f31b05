"""What the database's users do: rows before the capture, writer transactions, signals.

Every write gets a value of its own (``v`` counts up), so a stale row can never pass for a
fresh one. A transaction's changes are drawn against the latest rows, its own earlier
changes included: inserts, updates, deletes, and key changes (a row moving to another key,
logged as a delete and a create).
"""

from __future__ import annotations

import random

from signals import ExecuteSnapshot, PauseSnapshot, ResumeSnapshot, StopSnapshot
from signals.model import Signal
from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.sources.base import TableSchema
from tests.sim.db import DATA_TABLES, ITEMS, Database, LoggedChange, Row, key_of

NOTES = (None, "x", "yy")


class Workload:
    def __init__(self, rng: random.Random, db: Database) -> None:
        self._rng = rng
        self._db = db
        self._values = 0
        self._signals = 0

    # --- rows -----------------------------------------------------------------------------

    def initial_rows(self, schema: TableSchema, count: int) -> list[Row]:
        keys: dict[Key, None] = {}
        while len(keys) < count:
            keys[self._new_key(schema)] = None
        return [self._row(schema, key) for key in keys]

    def _new_key(self, schema: TableSchema) -> Key:
        if schema is ITEMS:
            return (self._rng.randint(1, 60),)
        return (self._rng.randint(1, 6), self._rng.choice("abcdef"))

    def _value(self) -> int:
        self._values += 1
        return self._values

    def _row(self, schema: TableSchema, key: Key) -> Row:
        if schema is ITEMS:
            return {"id": key[0], "v": self._value(), "note": self._rng.choice(NOTES)}
        return {"g": key[0], "name": key[1], "v": self._value()}

    # --- transactions ---------------------------------------------------------------------

    def changes(self) -> list[LoggedChange]:
        """One transaction's changes, against the latest rows (and its own earlier ones)."""
        rng = self._rng
        changes: list[LoggedChange] = []
        mine: dict[tuple[TableId, Key], Row | None] = {}
        for _ in range(rng.randint(1, 3)):
            schema = rng.choice(DATA_TABLES)
            table = schema.table
            rows = self._db.latest(table)
            for (t, key), row in mine.items():
                if t == table and row is None:
                    rows.pop(key, None)
                elif t == table and row is not None:
                    rows[key] = row
            kind = rng.choices(("insert", "update", "delete", "move"), (3, 4, 2, 1))[0]
            if kind == "insert" or not rows:
                key = self._new_key(schema)
                if key not in rows:
                    after = self._row(schema, key)
                    changes.append(LoggedChange(table, "c", None, after))
                    mine[(table, key)] = after
                continue
            key = rng.choice(sorted(rows))
            before = rows[key]
            if kind == "update":
                after = {**before, "v": self._value()}
                if schema is ITEMS and rng.random() < 0.3:
                    after["note"] = rng.choice(NOTES)
                changes.append(LoggedChange(table, "u", before, after))
                mine[(table, key)] = after
            elif kind == "delete":
                changes.append(LoggedChange(table, "d", before, None))
                mine[(table, key)] = None
            else:
                new_key = self._new_key(schema)
                if new_key in rows:
                    continue
                moved = {**before, **dict(zip(schema.primary_key, new_key, strict=True))}
                moved["v"] = self._value()
                changes.append(LoggedChange(table, "d", before, None))
                changes.append(LoggedChange(table, "c", None, moved))
                mine[(table, key)] = None
                mine[(table, key_of(schema, moved))] = moved
        return changes

    # --- signals --------------------------------------------------------------------------

    def signal(self) -> Signal:
        """execute-snapshot (of one table or both), stop (of some or all), pause, resume."""
        rng = self._rng
        self._signals += 1
        sid = f"sig-{self._signals}"
        tables = tuple(t.table for t in DATA_TABLES)
        some = tuple(t for t in tables if rng.random() < 0.5) or tables
        kind = rng.choices(("execute", "stop", "pause", "resume"), (6, 1, 1, 1))[0]
        if kind == "execute":
            return ExecuteSnapshot(sid, some)
        if kind == "stop":
            return StopSnapshot(sid, some if rng.random() < 0.5 else ())
        if kind == "pause":
            return PauseSnapshot(sid)
        return ResumeSnapshot(sid)
