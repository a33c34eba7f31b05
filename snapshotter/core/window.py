"""The DBLog window: one chunk's rows, reconciled with the log between two watermarks.

The life of a window, as the engine drives it:

1. REGISTERED: the engine creates the window (its id known) *before* it writes the open
   watermark, so the log reader can never see a watermark it cannot place.
2. OPEN: the log reader sees the open (low) watermark. From here on, every log event of the
   table touches the window: its keys are dropped from the chunk buffer, because the log holds
   a value at least as fresh as the one the chunk SELECT read. Keys are taken from the event's
   before and after rows, so a primary-key change drops the old and the new key whether it
   comes as one event or as a delete and a create; a TRUNCATE drops the whole buffer.
3. The chunk SELECT's rows arrive (``fill``) - before or after the open watermark is seen,
   since the SELECT runs beside the stream - and always before the close watermark is
   written, so the buffer is complete when the close watermark shows up in the log.
4. CLOSED: the log reader sees the close (high) watermark; the surviving rows are emitted as
   READ events positioned just after it. The engine must hand them to the sink before any log
   event that follows the close watermark (the output barrier).

Keys dropped while the window is open are kept in a set (one hash insert per event) and
removed from the Arrow buffer in one anti-join at close, so the per-row work is vectorised.

Watermark rows anyone can forge. The signal table is open to whoever sends signals, and the
log carries every row inserted into it, so the engine may meet a ``<window>-open`` or
``<window>-close`` row it did not write: out of order, twice, or before its own. Acting on a
close that is not the engine's own is not safe, even when the chunk rows are already buffered:
DBLog's guarantee rests on the close watermark being written *after* the chunk SELECT ended,
so that every log event after it is newer than the rows read. A forged close may have
committed at any point after the open watermark (its author needed the window id, public
from then on), possibly before the SELECT started, and the log reader may lag behind, so
"the rows were buffered when the engine saw the close" says nothing about where the close
lies in the log. Emitting the READ rows there could place a row read at time S before log
events older than S: the final state would still converge (the later events carry it), but
the output would move backwards in time for those keys, which DBLog promises never happens.
Watching when the worker *started* writing its own close does not help either, for the same
reason (the log position of the forged row is unrelated to the worker's timing).

So each watermark row carries a token: a random secret the window draws for that row and
the worker writes with it (``ChunkWindow.watermark``). Nobody else can know it before the
row commits, and once it has committed its id is taken (the id is the table's primary key):
a row with the right token is the engine's own, at its own log position. ``judge`` tells the
engine what to do with any other: ignore it (a copy, or a row out of order), or, when a
foreign row took the id of a watermark the engine has still to write (its own insert will
then fail on the duplicate key), give the window up and read the chunk again under a new id.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

import pyarrow as pa

from signals.model import Watermark, WatermarkKind
from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.keys import Key
from snapshotter.core.position import Position, read_tokens
from snapshotter.core.values import RawJson
from snapshotter.core.visibility import ReadVisibility

_ROW_INDEX = "__snapshotter_row"


def buffer_key(key: Key) -> Key:
    """A log key as the chunk buffer holds it: bytes-likes as bytes (they must hash like the
    bytes Arrow gives back), JSON documents as their text (Arrow holds JSON as text)."""
    return tuple(
        bytes(v)
        if isinstance(v, bytearray | memoryview)
        else v.text
        if isinstance(v, RawJson)
        else v
        for v in key
    )


class WindowPhase(StrEnum):
    REGISTERED = "registered"
    OPEN = "open"
    CLOSED = "closed"


class WatermarkVerdict(StrEnum):
    """What the engine does with a watermark row of one of its windows."""

    OWN = "own"  # the window's own row, in order: act on it
    STRAY = "stray"  # not to act on, and the window's own row is still to come: ignore it
    # Not to act on, and the window cannot complete: a foreign row took the id of the
    # watermark the engine has still to write, or the window's own rows came out of order.
    BLOCKING = "blocking"


class WindowOrderError(RuntimeError):
    """The engine broke an ordering rule of the window (a bug, never a data problem)."""


class WindowKeyError(ValueError):
    """A log key that does not fit the chunk's key columns (readers disagree on types)."""


RowConvert = Callable[[dict[str, Any]], dict[str, Any]]


def _read_source(close_source: Source, table: TableId) -> Source:
    """The ``source`` template of a window's READ rows: the close watermark's, with the
    window's table and snapshot "incremental"."""
    return replace(close_source, table=table, snapshot=SnapshotMarker.INCREMENTAL)


def _stamped(source: Source | None, window_id: str) -> Source:
    if source is None:
        raise WindowOrderError(f"READ batch of window {window_id} was never stamped")
    return source


@dataclass(frozen=True, slots=True)
class ReadBatch:
    """What a window emits at its close watermark: the surviving chunk rows as one Arrow
    table, never as per-row objects. Sinks that write in bulk (Spark, JSONL, Kafka, the
    bench's counting sink) take the columns as they are; ``events`` builds per-row
    ``ChangeEvent`` objects only for a consumer that truly needs rows one at a time, on
    whatever thread asks."""

    window_id: str
    table: TableId
    key_columns: tuple[str, ...]
    rows: pa.Table  # the surviving chunk rows, in the chunk's key order (Arrow storage types)
    position: Position  # the close watermark's position
    selected: int  # rows the chunk SELECT returned
    last_key: Key | None  # the last key the SELECT returned (None for an empty chunk)
    truncated: bool  # a TRUNCATE inside the window dropped everything
    # Set by the engine at the close watermark (``stamped``): the READ rows' ``source``
    # template (the close watermark's, with this table and snapshot "incremental"), the
    # envelope's ``ts_ms``, and the dialect's converter from Arrow storage values to the
    # value model (JSON text to RawJson...; None: nothing to convert).
    source: Source | None = None
    ts_ms: int = 0
    convert: RowConvert | None = None

    @property
    def dropped(self) -> int:
        survivors: int = self.rows.num_rows
        return self.selected - survivors

    def __len__(self) -> int:
        rows: int = self.rows.num_rows
        return rows

    def stamped(self, close_source: Source, ts_ms: int, convert: RowConvert | None) -> ReadBatch:
        """The batch as it goes to the sink: ``close_source`` is the close watermark's."""
        return replace(
            self, source=_read_source(close_source, self.table), ts_ms=ts_ms, convert=convert
        )

    @property
    def template(self) -> Source:
        return _stamped(self.source, self.window_id)

    def position_tokens(self) -> pa.Array:
        """Each row's position token (``position.read_row(i).token``), built column-wise."""
        return read_tokens(self.position, self.rows.num_rows)

    def row_dicts(self) -> list[dict[str, Any]]:
        """The rows in the value model, one dict per row (for consumers that need them)."""
        dicts = self.rows.to_pylist()
        convert = self.convert
        return dicts if convert is None else [convert(row) for row in dicts]

    def events(self) -> list[ChangeEvent]:
        """The survivors as ``op: "r"`` events sharing the stamped source template. Built
        without re-validating what the template and the chunk guarantee (a READ row always
        has its key and an ``after`` row)."""
        template = self.template
        key_columns = self.key_columns
        fields = [(f, getattr(template, f)) for f in Source.__slots__ if f != "position"]
        new = object.__new__
        set_field = object.__setattr__
        read_row = self.position.read_row
        ts_ms = self.ts_ms
        out: list[ChangeEvent] = []
        for index, row in enumerate(self.row_dicts()):
            source = new(Source)
            for name, value in fields:
                set_field(source, name, value)
            set_field(source, "position", read_row(index))
            event = new(ChangeEvent)
            set_field(event, "op", Op.READ)
            set_field(event, "source", source)
            set_field(event, "ts_ms", ts_ms)
            set_field(event, "key", tuple(row[c] for c in key_columns))
            set_field(event, "before", None)
            set_field(event, "after", row)
            out.append(event)
        return out


@dataclass(frozen=True, slots=True)
class StagedRows:
    """A chunk read elsewhere (Spark tasks on executors, ``[snapshot] executors``): its rows
    are in Parquet files the readers wrote, never in this process. Each file holds one key
    sub-range of the window, in key order: the landed columns, the key columns as the chunk
    reader gives them (``RAW_KEY_PREFIX`` + name, for the anti-join at the close) and each
    row's READ index (``ROW_INDEX``)."""

    files: tuple[str, ...]
    selected: int  # rows in the files
    last_key: Key | None  # the last key read (None: none)
    key_types: pa.Schema  # the key columns' Arrow types as the chunk reader gives them
    # The window's range was read only up to this key (a sub-range reached its read limit;
    # the files after it are not part of the chunk); None: read whole.
    covered: Key | None = None


RAW_KEY_PREFIX = "__raw_"
ROW_INDEX = "__read_index"


@dataclass(frozen=True, slots=True)
class StagedReadBatch:
    """What a window of a staged chunk emits at its close: where the rows are and which
    keys the log dropped (an Arrow table of the key columns, typed as ``key_types``). The
    sink applies the drops where the rows are (Spark: an anti-join), so the rows never pass
    through this process. Positions: READ row ``i`` of the files is
    ``position.read_row(file's ROW_INDEX)``."""

    window_id: str
    table: TableId
    key_columns: tuple[str, ...]
    staged: StagedRows
    dropped_keys: pa.Table
    position: Position
    truncated: bool
    source: Source | None = None
    ts_ms: int = 0

    @property
    def selected(self) -> int:
        return self.staged.selected

    @property
    def last_key(self) -> Key | None:
        return self.staged.last_key

    @property
    def dropped(self) -> int:
        """Keys the log dropped in the window (some may lie outside the chunk's range)."""
        count: int = self.dropped_keys.num_rows
        return count

    def __len__(self) -> int:
        """Rows read; the survivors are known where they are landed."""
        return 0 if self.truncated else self.staged.selected

    def stamped(
        self, close_source: Source, ts_ms: int, convert: RowConvert | None
    ) -> StagedReadBatch:
        """As ``ReadBatch.stamped`` (``convert`` is not needed: the readers wrote the landed
        columns)."""
        return replace(self, source=_read_source(close_source, self.table), ts_ms=ts_ms)

    @property
    def template(self) -> Source:
        return _stamped(self.source, self.window_id)


class ChunkWindow:
    def __init__(self, window_id: str, table: TableId, key_columns: Sequence[str]) -> None:
        if not key_columns:
            raise ValueError(f"table {table} has no key columns")
        self.window_id = window_id
        self.table = table
        self.key_columns = tuple(key_columns)
        self.phase = WindowPhase.REGISTERED
        self.opened_at: Position | None = None
        self._rows: pa.Table | None = None
        self._staged: StagedRows | None = None  # a chunk read elsewhere (fill_staged)
        self._dropped: set[Key] = set()
        self._truncated = False
        self.visibility: ReadVisibility | None = None
        # One secret per watermark row (see the module docstring).
        self._tokens = {kind: secrets.token_hex(16) for kind in WatermarkKind}

    def watermark(self, kind: WatermarkKind) -> Watermark:
        """The window's own open or close row, as the worker writes it."""
        return Watermark(self.window_id, kind, self._tokens[kind])

    def judge(self, watermark: Watermark) -> tuple[WatermarkVerdict, str]:
        """Whether a watermark row of this window is its own, in order; if not, why not."""
        own = watermark.token is not None and secrets.compare_digest(
            watermark.token.encode("utf-8", "surrogatepass"),
            self._tokens[watermark.kind].encode("ascii"),
        )
        if watermark.kind is WatermarkKind.OPEN:
            if self.phase is not WindowPhase.REGISTERED:
                return WatermarkVerdict.STRAY, "a second open row for a window already open"
            if not own:
                return (
                    WatermarkVerdict.BLOCKING,
                    "an open row the engine did not write, before its own",
                )
            return WatermarkVerdict.OWN, ""
        if not own:
            return WatermarkVerdict.BLOCKING, "a close row the engine did not write, before its own"
        if self.phase is not WindowPhase.OPEN:
            return WatermarkVerdict.BLOCKING, "the window's own close row came before its open row"
        if not self.filled:
            return (
                WatermarkVerdict.BLOCKING,
                "the window's own close row came before its chunk rows",
            )
        return WatermarkVerdict.OWN, ""

    @property
    def filled(self) -> bool:
        return self._rows is not None or self._staged is not None

    def open(self, position: Position) -> None:
        """The open (low) watermark was seen in the log at ``position``."""
        if self.phase is not WindowPhase.REGISTERED:
            raise WindowOrderError(f"window {self.window_id} opened twice")
        self.phase = WindowPhase.OPEN
        self.opened_at = position

    def fill(self, rows: pa.Table, visibility: ReadVisibility | None = None) -> None:
        """The chunk SELECT's complete result, in key order, and what its snapshot could not
        see (kept for the close, where ``core.visibility`` decides what else is stale). The
        rows stay Arrow: nothing is converted per row, on any thread."""
        self._check_fill()
        missing = [c for c in self.key_columns if c not in rows.column_names]
        if missing:
            raise ValueError(f"chunk of {self.table} lacks key columns {missing}")
        self.visibility = visibility
        self._rows = rows

    def fill_staged(self, staged: StagedRows, visibility: ReadVisibility | None = None) -> None:
        """``fill`` for a chunk read elsewhere: the rows stay in the readers' files;
        ``visibility`` must miss every transaction any of the reads' snapshots missed."""
        self._check_fill()
        missing = [c for c in self.key_columns if c not in staged.key_types.names]
        if missing:
            raise ValueError(f"staged chunk of {self.table} lacks key columns {missing}")
        self.visibility = visibility
        self._staged = staged

    def _check_fill(self) -> None:
        if self.filled:
            raise WindowOrderError(f"window {self.window_id} got a second chunk")
        if self.phase is WindowPhase.CLOSED:
            raise WindowOrderError(
                f"window {self.window_id}: chunk rows arrived after the close watermark; the "
                "buffer must be complete before the close watermark is written"
            )

    def observe(self, event: ChangeEvent) -> bool:
        """Feed a log event of this window's table; returns whether it fell inside the window.

        Events before the open watermark are outside the window: the chunk SELECT, which
        starts after the open watermark committed, already saw their effect.
        """
        if event.table != self.table:
            raise ValueError(f"event of {event.table} fed to the window of {self.table}")
        if self.phase is WindowPhase.REGISTERED:
            return False
        if self.phase is WindowPhase.CLOSED:
            raise WindowOrderError(f"window {self.window_id} got an event after it closed")
        if event.op is Op.TRUNCATE:
            self._truncated = True
            self._dropped.clear()
            return True
        if not self._truncated:
            try:
                self._dropped.update(self._keys_of(event))
            except TypeError as exc:  # an unhashable value: no reader should produce one
                raise WindowKeyError(
                    f"{self.table}: a log event's key value is not usable as a key: {exc}"
                ) from None
        return True

    def drop(self, keys: set[Key]) -> None:
        """Drop rows the chunk read stale for a reason the log order alone does not show
        (PostgreSQL: transactions logged before the open watermark that the chunk's snapshot
        did not see; see ``core.visibility``)."""
        if self.phase is not WindowPhase.OPEN:
            raise WindowOrderError(f"window {self.window_id}: drop while {self.phase.value}")
        if not self._truncated:
            self._dropped.update(keys)

    def _keys_of(self, event: ChangeEvent) -> list[Key]:
        """The window's keys of the event's rows: before and after, so a key change made in
        one event drops both. Taken by the window's own key columns, which are the snapshot's
        (a surrogate key, possibly) and not necessarily the table's primary key."""
        keys: list[Key] = []
        for side, row in (("before", event.before), ("after", event.after)):
            if row is None:
                continue
            try:
                key = tuple(row[c] for c in self.key_columns)
            except KeyError as missing:
                raise WindowKeyError(
                    f"{self.table}: the {side} row of a log event lacks key column {missing}; "
                    "the log must carry every key column (on PostgreSQL a surrogate key needs "
                    "REPLICA IDENTITY FULL)"
                ) from None
            nulls = [c for c, v in zip(self.key_columns, key, strict=True) if v is None]
            if nulls:
                raise WindowKeyError(
                    f"{self.table}: the {side} row of a log event has NULL in key column "
                    f"{nulls[0]!r}; key columns must be NOT NULL, and the log must carry them "
                    "(on PostgreSQL a surrogate key needs REPLICA IDENTITY FULL)"
                )
            keys.append(buffer_key(key))
        if not keys:
            raise WindowKeyError(f"{self.table}: an {event.op.value!r} log event has no row")
        return keys

    def close(self, position: Position) -> ReadBatch | StagedReadBatch:
        """The close (high) watermark was seen at ``position``: emit the survivors."""
        if self.phase is not WindowPhase.OPEN:
            raise WindowOrderError(
                f"window {self.window_id}: close watermark seen while {self.phase.value}; the "
                "open watermark must come first"
            )
        if not self.filled:
            raise WindowOrderError(
                f"window {self.window_id}: close watermark seen before the chunk rows arrived; "
                "the buffer must be complete before the close watermark is written"
            )
        self.phase = WindowPhase.CLOSED
        if self._staged is not None:
            staged = self._staged
            dropped = self._key_table(self._dropped, staged.key_types)
            self._dropped.clear()
            return StagedReadBatch(
                window_id=self.window_id,
                table=self.table,
                key_columns=self.key_columns,
                staged=staged,
                dropped_keys=dropped,
                position=position,
                truncated=self._truncated,
            )
        rows = self._rows
        assert rows is not None
        last_key = (
            tuple(rows.column(c)[rows.num_rows - 1].as_py() for c in self.key_columns)
            if rows.num_rows
            else None
        )
        if self._truncated:
            survivors = rows.slice(0, 0)
        elif self._dropped and rows.num_rows:
            survivors = rows.take(self._kept(rows))
        else:
            survivors = rows
        self._dropped.clear()
        return ReadBatch(
            window_id=self.window_id,
            table=self.table,
            key_columns=self.key_columns,
            rows=survivors,
            position=position,
            selected=rows.num_rows,
            last_key=last_key,
            truncated=self._truncated,
        )

    def _kept(self, rows: pa.Table) -> pa.Array:
        """Indices of ``rows`` whose key was not dropped, in one anti-join, in chunk order."""
        keys = rows.select(list(self.key_columns)).append_column(
            _ROW_INDEX, pa.array(range(rows.num_rows), type=pa.int64())
        )
        dropped = self._key_table(self._dropped, rows.schema)
        kept = keys.join(dropped, keys=list(self.key_columns), join_type="left anti")
        return kept.column(_ROW_INDEX).combine_chunks().sort()

    def _key_table(self, keys: set[Key], types: pa.Schema) -> pa.Table:
        """``keys`` as a table of the key columns, typed as in ``types`` (the chunk's)."""
        dropped = list(keys)
        columns = {}
        for i, name in enumerate(self.key_columns):
            arrow_type = types.field(name).type
            values = [k[i] for k in dropped]
            try:
                columns[name] = pa.array(values, type=arrow_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
                raise WindowKeyError(
                    f"{self.table}: a log key value for column {name!r} does not fit the "
                    f"chunk's Arrow type {arrow_type}: {_first_misfit(values, arrow_type)}; "
                    "the chunk reader and the log reader must produce the same value types"
                ) from exc
        return pa.table(columns)


def _first_misfit(values: Sequence[object], arrow_type: pa.DataType) -> str:
    """Describe the first value that Arrow refuses as ``arrow_type`` (only on the error path)."""
    for value in values:
        try:
            pa.array([value], type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
            return f"{type(value).__name__} value ({exc})"
    return "values of mixed types"
