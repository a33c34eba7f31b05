"""A sink that appends one JSON line per event to a local file.

Each line is, with keys in this order (other tools script against it)::

    {"topic": "<prefix>.<schema>.<table>",
     "key": {<key column>: <value>, ...} | null,
     "value": {"before": {...} | null, "after": {...} | null, "source": {...},
               "op": "c" | "u" | "d" | "r" | "t", "ts_ms": <int>}}

``key`` is null only for a truncate. The envelope has no ``transaction`` field. The file is
UTF-8 (``ensure_ascii=False``) and every line ends with LF; JSON strings may hold U+0085,
U+2028 or U+2029 unescaped, as JSON allows, so split lines at LF only (not ``splitlines``).

Values (see ``snapshotter.core.values``) are written as:

* str, int, bool, None: as JSON; a finite float as a JSON number (``repr`` precision);
* a NaN or infinite float: the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (JSON has
  no such numbers, and a bare ``NaN`` token would make the line unreadable to strict parsers);
* ``Decimal`` and ``UUID`` (should a reader produce them): their ``str``;
* bytes: standard base64 with padding;
* an aware datetime: converted to UTC, ISO-8601 with a ``Z``, with microseconds only when
  they are non-zero (as ``datetime.isoformat``): ``2024-01-02T03:04:05.123456Z``,
  ``2024-01-02T03:04:05Z``;
* a naive datetime, a date, a time: ``isoformat()`` (no zone for naive values);
* :class:`RawJson`: its text embedded as JSON, byte for byte, except that a raw CR or LF
  (only possible as whitespace between tokens of valid JSON, e.g. from PostgreSQL's ``json``
  type, which keeps its input text) becomes a space, so one event stays one line.

Durability: :meth:`JsonlSink.write` appends to a buffered file; :meth:`JsonlSink.checkpoint`
flushes and fsyncs, and acknowledges at once with ``{"path": ..., "offset": <file size>}``.
Reopening with that ``resume`` cuts the file back to the offset, so a crash leaves neither a
half line nor a duplicate: the log replays what came after.
"""

from __future__ import annotations

import base64
import json
import math
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import IO, Any
from uuid import UUID

from signals.names import TableId
from snapshotter.core.events import ChangeEvent
from snapshotter.core.values import RawJson
from snapshotter.sinks.base import Ack


class JsonlSinkError(RuntimeError):
    """The sink file cannot be used as asked; the message says why and what to do."""


# --- value encoding -----------------------------------------------------------------------
#
# The fast path hands a whole row to the C encoder, which calls ``default`` only for values
# that are not JSON types. A RawJson becomes a placeholder string there, and its text is put
# in place of the placeholder afterwards, so JSON documents are never parsed and re-encoded
# (which would cost time and could change numbers). The placeholder is random per process;
# when a row's own data happens to contain it, the counts disagree and the row takes the
# slow path, so a collision can never corrupt output.

_TOKEN = f"<rawjson-{uuid.uuid4().hex}>"  # '<' and '>' once each: no self-overlap for count()
_PLACEHOLDER = f'"{_TOKEN}"'


def _encode_special(value: Any) -> Any:
    """A non-JSON value of the value model as a JSON value (RawJson excluded)."""
    # datetime before date: a datetime is a date.
    if isinstance(value, datetime):
        text = value.isoformat()
        if value.tzinfo is None:
            return text
        if text.endswith("+00:00"):  # already UTC (the value model's promise): the cheap way
            return text[:-6] + "Z"
        return value.astimezone(UTC).replace(tzinfo=None).isoformat() + "Z"
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Decimal | UUID):
        return str(value)
    raise TypeError(f"cannot write a value of type {type(value).__name__} to JSON")


def _default_fast(value: Any) -> Any:
    if type(value) is RawJson:
        return _TOKEN
    return _encode_special(value)


def _default_plain(value: Any) -> Any:
    if isinstance(value, RawJson):
        raise TypeError("a RawJson value nested inside another value cannot be written")
    return _encode_special(value)


def _make_encoder(default: Callable[[Any], Any]) -> Callable[[Any], str]:
    """``json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False,
    default=default)`` without its per-call setup.

    ``JSONEncoder.encode`` builds a new C encoder on every call, which costs about as much as
    encoding a small row; the C encoder itself is reusable, so build it once. No circular
    check (rows are flat). Falls back to the public API where the C encoder is missing.
    """
    public = json.JSONEncoder(
        ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=default
    ).encode
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # pragma: no cover - CPython has it
        return public
    try:
        encoder = c_make_encoder(
            None,  # markers: no circular-reference check
            default,
            json.encoder.encode_basestring,  # the C one; ensure_ascii=False
            None,  # indent
            ":",  # key separator
            ",",  # item separator
            False,  # sort_keys
            False,  # skipkeys
            False,  # allow_nan
        )
    except TypeError:  # pragma: no cover - a future CPython changed the private signature
        return public

    def encode(value: Any) -> str:
        # The C encoder returns a str for a str top level and a tuple of chunks otherwise.
        chunks = encoder(value, 0)
        return chunks if isinstance(chunks, str) else "".join(chunks)

    return encode


_FAST = _make_encoder(_default_fast)
_PLAIN = _make_encoder(_default_plain)
_NON_FINITE = {"nan": '"NaN"', "inf": '"Infinity"', "-inf": '"-Infinity"'}


def _raw_text(raw: RawJson) -> str:
    text = raw.text
    if "\n" in text or "\r" in text:
        # Valid JSON has CR/LF only as whitespace between tokens (never raw inside a string).
        text = text.replace("\r", " ").replace("\n", " ")
    return text


def _encode_one(value: Any) -> str:
    if isinstance(value, RawJson):
        return _raw_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return _NON_FINITE[repr(value)]
    return _PLAIN(value)


def _encode_row_slow(row: Mapping[str, Any]) -> str:
    parts = [_PLAIN(str(name)) + ":" + _encode_one(v) for name, v in row.items()]
    return "{" + ",".join(parts) + "}"


def encode_row(row: Mapping[str, Any] | None) -> str:
    """One row (column name -> value) as a JSON object text, exactly as the sink writes it.

    This is the single encoder of the value model: the sink uses it for ``key``, ``before``
    and ``after``, and ``snapshotter.verify`` for the table side, so both compare alike.
    """
    if row is None:
        return "null"
    if type(row) is not dict:  # the C encoder takes only a real dict as an object
        row = dict(row)
    try:
        text = _FAST(row)
    except ValueError:  # a NaN or infinite float (allow_nan=False)
        return _encode_row_slow(row)
    if _TOKEN not in text:
        return text
    raws = [v for v in row.values() if type(v) is RawJson]
    if text.count(_TOKEN) != len(raws):  # the data itself holds the token (or nested RawJson)
        return _encode_row_slow(row)
    pieces = text.split(_PLACEHOLDER)
    out = [pieces[0]]
    for raw, piece in zip(raws, pieces[1:], strict=True):
        out.append(_raw_text(raw))
        out.append(piece)
    return "".join(out)


# --- the sink -----------------------------------------------------------------------------


class JsonlSink:
    """Appends events to ``path`` as JSON lines; see the module docstring for the format.

    ``key_columns(table)`` names the key columns of a table (events carry key values only);
    it is asked once per table per ``write`` call, and None or no columns is an error. A
    batch that fails to encode writes nothing.

    ``open(resume)``:

    * without ``resume`` (no saved state), the file must be missing or empty: an existing
      non-empty file with no state recorded for it is refused rather than appended to or
      overwritten, since either could mix two runs or lose data. Delete it, or point
      ``[sink] path`` elsewhere.
    * with ``resume`` (from an :class:`Ack`), the file is cut back to the acknowledged
      offset: anything after it was written but never acknowledged and will be replayed. A
      file shorter than the offset, or not ending a line there, was changed by someone else
      and is refused; so is a ``resume`` saved for another path.
    """

    def __init__(
        self,
        path: str | Path,
        topic_prefix: str,
        key_columns: Callable[[TableId], Sequence[str] | None],
    ) -> None:
        self.path = Path(path)
        self.topic_prefix = topic_prefix
        self._key_columns = key_columns
        self._file: IO[bytes] | None = None
        self._checkpoint_id = 0
        self._acks: list[Ack] = []
        # Per table: the line's opening, up to the key (the topic never changes).
        self._openings: dict[TableId, str] = {}

    # Sink protocol

    def open(self, resume: Mapping[str, Any] | None) -> None:
        if self._file is not None:
            raise JsonlSinkError(f"sink {self.path} is already open")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        size = self._size()
        if resume is None:
            if size:
                raise JsonlSinkError(
                    f"sink file {self.path} exists ({size} bytes) but there is no saved state "
                    "for it; delete it or set [sink] path to another file"
                )
        else:
            self._cut_back(resume, size)
        created = size is None
        self._file = open(self.path, "ab")  # noqa: SIM115 - lives until close()
        if created:
            self._fsync_dir()

    def write(self, events: Sequence[ChangeEvent]) -> None:
        if self._file is None:
            raise JsonlSinkError(f"sink {self.path} is not open")
        if events:
            # Key names are asked for once per table and call, not cached for good: a table
            # whose primary key is altered gets the new names from the next batch on.
            names: dict[TableId, tuple[str, ...]] = {}
            lines = [self._line(event, names) for event in events]
            self._file.write("".join(lines).encode("utf-8"))

    def checkpoint(self) -> int:
        if self._file is None:
            raise JsonlSinkError(f"sink {self.path} is not open")
        self._file.flush()
        os.fsync(self._file.fileno())
        self._checkpoint_id += 1
        offset = self._file.tell()
        self._acks.append(Ack(self._checkpoint_id, {"path": str(self.path), "offset": offset}))
        return self._checkpoint_id

    def acknowledged(self) -> list[Ack]:
        acks, self._acks = self._acks, []
        return acks

    def close(self) -> None:
        if self._file is None:
            return
        try:
            self.checkpoint()
        finally:
            self._file.close()
            self._file = None

    # Encoding

    def _opening(self, table: TableId) -> str:
        opening = self._openings.get(table)
        if opening is None:
            if table.schema is None:
                raise JsonlSinkError(f"event for table {table} without a schema")
            topic = f"{self.topic_prefix}.{table.schema}.{table.table}"
            opening = self._openings[table] = '{"topic":' + _PLAIN(topic) + ',"key":'
        return opening

    def _names(self, table: TableId, names: dict[TableId, tuple[str, ...]]) -> tuple[str, ...]:
        found = names.get(table)
        if found is None:
            columns = self._key_columns(table)
            if not columns:
                raise JsonlSinkError(f"no key columns known for {table}: cannot write its key")
            found = names[table] = tuple(columns)
        return found

    def _line(self, event: ChangeEvent, names: dict[TableId, tuple[str, ...]]) -> str:
        table = event.source.table
        opening = self._opening(table)
        if event.key is None:  # a truncate
            key = "null"
        else:
            columns = self._names(table, names)
            if len(columns) != len(event.key):
                raise JsonlSinkError(
                    f"event for {table} has {len(event.key)} key values, "
                    f"but the table's key columns are {list(columns)}"
                )
            key = encode_row(dict(zip(columns, event.key, strict=True)))
        # The line is assembled by hand so rows go through encode_row (RawJson, NaN) while the
        # key order stays fixed. Op values are plain letters: no escaping needed.
        return (
            f'{opening}{key},"value":{{"before":{encode_row(event.before)},'
            f'"after":{encode_row(event.after)},"source":{_PLAIN(event.source.to_dict())},'
            f'"op":"{event.op.value}","ts_ms":{int(event.ts_ms)}}}}}\n'
        )

    # Files

    def _size(self) -> int | None:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return None

    def _cut_back(self, resume: Mapping[str, Any], size: int | None) -> None:
        offset = resume.get("offset")
        saved_path = resume.get("path")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise JsonlSinkError(f"saved sink state has no valid offset: {dict(resume)!r}")
        if saved_path is not None and Path(str(saved_path)).resolve() != self.path.resolve():
            raise JsonlSinkError(
                f"the saved state belongs to sink file {saved_path}, but the sink now writes "
                f"to {self.path}; set [sink] path back, or start over without the state"
            )
        have = size or 0
        if have < offset:
            what = "is missing" if size is None else f"has {have} bytes"
            raise JsonlSinkError(
                f"sink file {self.path} {what}, but {offset} bytes were acknowledged: it was "
                "changed by someone else; restore it, or start over without the state"
            )
        if size is None:  # offset 0 of a file not created yet: nothing to cut
            return
        with open(self.path, "r+b") as f:
            if offset:
                f.seek(offset - 1)
                if f.read(1) != b"\n":
                    raise JsonlSinkError(
                        f"sink file {self.path} has no line end at the acknowledged offset "
                        f"{offset}: it was changed by someone else"
                    )
            if have > offset:
                # Written after the last acknowledged checkpoint: the log replays it.
                f.truncate(offset)
                f.flush()
                os.fsync(f.fileno())

    def _fsync_dir(self) -> None:
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
