"""The convergence check: replayed as current state, does the sink's output equal the table?

Both sides are turned into plain JSON values before they are compared: the output by reading
its JSON lines, the table by encoding its rows (in the value model, read with the same
loaders the engine uses) with the sink's own encoder, :func:`snapshotter.sinks.jsonl.
encode_row`, and parsing the result. A value therefore matches exactly when the engine would
have written the same JSON for it, and JSON documents compare as parsed JSON (key order and
whitespace do not matter, types do: ``1`` is not ``true``).

Replaying the output (:func:`materialize`) follows the file order for one topic: c/u/r upsert
the row under its key, d removes it, t clears every row. Along the way each key's
``source.pos`` must never go back: a key whose position decreases means events for it were
written out of log order, which can converge by luck today and diverge tomorrow.
"""

from __future__ import annotations

import base64
import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sinks.jsonl import encode_row
from snapshotter.verify.progress import Ticker

# Debezium's unavailable-value placeholder as text, and with it (a binary column of a Kafka
# message with schemas) its bytes in base64.
PLACEHOLDER_TEXT = frozenset({UNAVAILABLE_VALUE})
PLACEHOLDER_TEXT_OR_BASE64 = frozenset(
    {UNAVAILABLE_VALUE, base64.b64encode(UNAVAILABLE_VALUE.encode("ascii")).decode("ascii")}
)


class VerifyError(ValueError):
    """Input the check cannot read (a malformed line, a duplicate table key...)."""


class TableKeyTwice(VerifyError):
    """The table scan returned one key twice: not a key, or a scan the server tore."""


def canonical(value: Any) -> str:
    """A JSON value as one canonical text: equal texts mean equal JSON values."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


# --- the output side ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PosViolation:
    """An event whose ``source.pos`` is lower than the previous event's for the same key."""

    key: Mapping[str, Any]
    previous: str
    pos: str
    line: int  # 1-based line number in the file; Kafka: the message's offset
    partition: int | None = None  # Kafka: the message's partition


@dataclass(slots=True)
class Materialized:
    """One topic of a JSONL file replayed as current state."""

    topic: str
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # canonical key -> after
    keys: dict[str, dict[str, Any]] = field(default_factory=dict)  # canonical key -> key object
    ops: Counter[str] = field(default_factory=Counter)  # events of the topic per op
    pos_violations: list[PosViolation] = field(default_factory=list)
    # Kafka: events seen again (at least once after a restart); not a violation
    repeats: int = 0

    @property
    def events(self) -> int:
        return sum(self.ops.values())

    def remove(self, ck: str) -> None:
        self.rows.pop(ck, None)
        self.keys.pop(ck, None)

    def put(
        self,
        ck: str,
        key: dict[str, Any],
        after: dict[str, Any],
        placeholders: frozenset[str] = PLACEHOLDER_TEXT,
    ) -> None:
        """Upsert a row. A column holding Debezium's unavailable-value placeholder (one of
        ``placeholders``) keeps the value the key had before; the placeholder stays only if
        there was none (a new key, e.g. created by a key change, or one deleted since), and
        the row then differs from the table's, as it should: the output lacks that value."""
        old = self.rows.get(ck)
        if old is not None and any(_placeholder(v, placeholders) for v in after.values()):
            after = {
                c: old.get(c, v) if _placeholder(v, placeholders) else v for c, v in after.items()
            }
        self.rows[ck] = after
        self.keys[ck] = key


def _placeholder(value: Any, placeholders: frozenset[str]) -> bool:
    # Only a string can be the placeholder; other JSON values (objects, lists) are unhashable.
    return isinstance(value, str) and value in placeholders


def materialize(
    path: str | Path, topic: str, key_columns: Sequence[str] | None = None
) -> Materialized:
    """Replay the events of ``topic`` in ``path`` (a :class:`JsonlSink` file) in file order.

    A column holding Debezium's unavailable-value placeholder (PostgreSQL's unchanged TOAST
    value under a replica identity that does not log it) keeps the value the key had before,
    as a consumer of Debezium's events must; the placeholder stays only if there was none.

    ``key_columns``: replay by these columns of each event's row instead of its ``key`` (a
    table without a primary key: its changes before a surrogate-key snapshot are keyed by the
    whole row, those after by the surrogate key; a consumer that knows the surrogate key
    replays all of them by it).
    """
    out = Materialized(topic)
    # Lines of other topics are skipped without parsing; the sink writes the topic first.
    ours = ('{"topic":' + json.dumps(topic, ensure_ascii=False) + ",").encode("utf-8")
    sink_line = b'{"topic":"'
    last_pos: dict[str, str] = {}
    # Binary mode: lines end only at b"\n" (text mode would also split at a raw CR).
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise VerifyError(
            f"cannot read the sink file {path}: {exc.strerror or exc} (is [sink] path the one "
            "the engine writes?)"
        ) from None
    with f:
        ticker = Ticker("events read from the sink file", _size(f), done_bytes=f.tell)
        for number, line in enumerate(f, 1):
            ticker.tick()
            if not line.endswith(b"\n"):
                raise VerifyError(f"{path}:{number}: the last line is incomplete")
            if not line.startswith(ours) and line.startswith(sink_line):
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise VerifyError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(record, dict) or record.get("topic") != topic:
                continue
            if key_columns:
                record = _rekeyed(record, key_columns)
            _apply(out, last_pos, record, f"{path}:{number}", number)
    return out


def _size(f: BinaryIO) -> int | None:
    try:
        return os.fstat(f.fileno()).st_size
    except OSError:
        return None


def _rekeyed(record: dict[str, Any], key_columns: Sequence[str]) -> dict[str, Any]:
    """The record keyed by ``key_columns`` of its row (as it is, if its row lacks them)."""
    value = record.get("value")
    if not isinstance(value, dict):
        return record
    row = value.get("before") if value.get("op") == "d" else value.get("after")
    if not isinstance(row, dict) or any(c not in row for c in key_columns):
        return record
    return {**record, "key": {c: row[c] for c in key_columns}}


def _apply(
    out: Materialized, last_pos: dict[str, str], record: dict[str, Any], where: str, line: int
) -> None:
    try:
        value = record["value"]
        op = value["op"]
        key = record["key"]
        pos = value["source"]["pos"]
    except (KeyError, TypeError):
        raise VerifyError(
            f"{where}: not a sink event (no key, value.op or value.source.pos)"
        ) from None
    out.ops[op] += 1
    if op == "t":
        out.rows.clear()
        out.keys.clear()
        return
    if not isinstance(key, dict) or op not in ("c", "u", "r", "d"):
        raise VerifyError(f"{where}: an {op!r} event with key {key!r}")
    ck = canonical(key)
    previous = last_pos.get(ck)
    if previous is not None and pos < previous:  # fixed-width tokens: text order = log order
        out.pos_violations.append(PosViolation(key, previous, pos, line))
    last_pos[ck] = pos
    if op == "d":
        out.remove(ck)
        return
    after = value.get("after")
    if not isinstance(after, dict):
        raise VerifyError(f"{where}: an {op!r} event without an 'after' row")
    out.put(ck, key, after)


# --- the table side -----------------------------------------------------------------------


def as_json_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of the value model as the plain JSON values the sink would write for it."""
    decoded: dict[str, Any] = json.loads(encode_row(row))
    return decoded


# --- the comparison -----------------------------------------------------------------------


class _Absent:
    """A column one side does not have."""

    def __repr__(self) -> str:
        return "(absent)"


ABSENT: Any = _Absent()


@dataclass(frozen=True, slots=True)
class ColumnDiff:
    column: str
    table: Any  # JSON value, or ABSENT
    output: Any  # JSON value, or ABSENT


@dataclass(frozen=True, slots=True)
class RowDiff:
    key: Mapping[str, Any]
    columns: tuple[ColumnDiff, ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    topic: str
    table_rows: int
    output_rows: int
    missing: int  # keys in the table, not in the output
    extra: int  # keys in the output, not in the table
    differing: int  # keys in both, with different rows
    missing_examples: tuple[Mapping[str, Any], ...]
    extra_examples: tuple[Mapping[str, Any], ...]
    differing_examples: tuple[RowDiff, ...]
    pos_violations: tuple[PosViolation, ...]
    repeats: int = 0  # Kafka: events delivered again after a restart (at least once)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.differing or self.pos_violations)

    def render(self) -> str:
        if self.ok:
            again = f" ({self.repeats} events repeated, as at least once allows)"
            return f"converged: {self.table_rows} rows match" + (again if self.repeats else "")
        counts = [
            f"{n} {label}"
            for n, label in (
                (self.missing, "missing"),
                (self.extra, "extra"),
                (self.differing, "differ"),
                (len(self.pos_violations), "position regressions"),
            )
            if n
        ]
        lines = [
            f"NOT converged: {', '.join(counts)} "
            f"(table {self.table_rows} rows, output {self.output_rows} rows)"
        ]
        for key in self.missing_examples:
            lines.append(f"  missing: key {_show(key)} is in the table, not in the output")
        for key in self.extra_examples:
            lines.append(f"  extra: key {_show(key)} is in the output, not in the table")
        for diff in self.differing_examples:
            columns = "; ".join(
                f"column {c.column}: table {_show(c.table)}, output {_show(c.output)}"
                for c in diff.columns
            )
            lines.append(f"  differ: key {_show(diff.key)}: {columns}")
        for v in self.pos_violations[:5]:
            where = (
                f"line {v.line}"
                if v.partition is None
                else f"partition {v.partition} offset {v.line}"
            )
            lines.append(
                f"  position went back: key {_show(v.key)}: pos {v.pos} after {v.previous} "
                f"({where})"
            )
        return "\n".join(lines)


def _show(value: Any, limit: int = 120) -> str:
    text = "(absent)" if value is ABSENT else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def compare(
    materialized: Materialized,
    expected_rows: Iterable[Mapping[str, Any]],
    key_columns: Sequence[str],
    *,
    examples: int = 5,
) -> Verdict:
    """Compare the table's rows (in the value model) with the replayed output.

    Table rows are streamed: only their canonical keys are kept, not the rows.
    """
    if not key_columns:
        raise ValueError("the comparison needs the table's key columns")
    seen: set[str] = set()
    missing: list[Mapping[str, Any]] = []
    differing: list[RowDiff] = []
    n_missing = n_differing = n_table = 0
    for row in expected_rows:
        n_table += 1
        expected = as_json_row(row)
        try:
            key = {c: expected[c] for c in key_columns}
        except KeyError as exc:
            raise VerifyError(f"a table row has no key column {exc.args[0]!r}") from None
        ck = canonical(key)
        if ck in seen:
            raise TableKeyTwice(f"the table has key {_show(key)} twice; is it really the key?")
        seen.add(ck)
        actual = materialized.rows.get(ck)
        if actual is None:
            n_missing += 1
            if len(missing) < examples:
                missing.append(key)
            continue
        if canonical(expected) != canonical(actual):
            n_differing += 1
            if len(differing) < examples:
                differing.append(RowDiff(key, _column_diffs(expected, actual)))
    extra_keys = [ck for ck in materialized.rows if ck not in seen]
    return Verdict(
        topic=materialized.topic,
        table_rows=n_table,
        output_rows=len(materialized.rows),
        missing=n_missing,
        extra=len(extra_keys),
        differing=n_differing,
        missing_examples=tuple(missing),
        extra_examples=tuple(materialized.keys[ck] for ck in extra_keys[:examples]),
        differing_examples=tuple(differing),
        pos_violations=tuple(materialized.pos_violations),
        repeats=materialized.repeats,
    )


def _column_diffs(expected: dict[str, Any], actual: dict[str, Any]) -> tuple[ColumnDiff, ...]:
    columns = list(expected) + [c for c in actual if c not in expected]
    diffs = []
    for column in columns:
        a = expected.get(column, ABSENT)
        b = actual.get(column, ABSENT)
        if a is ABSENT or b is ABSENT or canonical(a) != canonical(b):
            diffs.append(ColumnDiff(column, a, b))
    return tuple(diffs)


def verdict_json(verdict: Verdict) -> dict[str, Any]:
    """A verdict (either sink) as plain JSON; ``table_rows`` are the source's rows and
    ``output_rows`` the sink's."""

    def column(diff: ColumnDiff) -> dict[str, Any]:
        out = {"column": diff.column}
        for side, value in (("table", diff.table), ("output", diff.output)):
            if value is not ABSENT:
                out[side] = value
        return out

    return {
        "ok": verdict.ok,
        "table_rows": verdict.table_rows,
        "output_rows": verdict.output_rows,
        "missing": verdict.missing,
        "extra": verdict.extra,
        "differing": verdict.differing,
        "repeats": verdict.repeats,
        "missing_examples": [dict(k) for k in verdict.missing_examples],
        "extra_examples": [dict(k) for k in verdict.extra_examples],
        "differing_examples": [
            {"key": dict(d.key), "columns": [column(c) for c in d.columns]}
            for d in verdict.differing_examples
        ],
        "position_regressions": [
            {"key": dict(v.key), "previous": v.previous, "pos": v.pos, "line": v.line}
            if v.partition is None
            else {
                "key": dict(v.key),
                "previous": v.previous,
                "pos": v.pos,
                "partition": v.partition,
                "offset": v.line,
            }
            for v in verdict.pos_violations
        ],
    }
