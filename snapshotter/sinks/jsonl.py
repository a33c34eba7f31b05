"""A sink that appends one JSON line per event to a local file.

Each line is, with keys in this order (other tools script against it)::

    {"topic": "<prefix>.<schema>.<table>",
     "key": {<key column>: <value>, ...} | null,
     "value": {"before": {...} | null, "after": {...} | null, "source": {...},
               "op": "c" | "u" | "d" | "r" | "t", "ts_ms": <int>}}

``key`` is null only for a truncate. The envelope has no ``transaction`` field. The file is
UTF-8 (``ensure_ascii=False``) and every line ends with LF; JSON strings may hold U+0085,
U+2028 or U+2029 unescaped, as JSON allows, so split lines at LF only (not ``splitlines``).

Keys and values are encoded by :mod:`snapshotter.sinks.encoding` (shared with the Kafka
sink), which documents how each value type is written.

Durability: :meth:`JsonlSink.write` appends to a buffered file; :meth:`JsonlSink.checkpoint`
flushes and fsyncs, and acknowledges at once with ``{"path": ..., "offset": <file size>}``.
Reopening with that ``resume`` cuts the file back to the offset, so a crash leaves neither a
half line nor a duplicate: the log replays what came after.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from signals.names import TableId
from snapshotter.common import faults
from snapshotter.common.errors import disk_error
from snapshotter.core.events import ChangeEvent
from snapshotter.core.window import ReadBatch
from snapshotter.sinks import batch_json
from snapshotter.sinks.base import Ack, SinkItem, in_process
from snapshotter.sinks.encoding import (
    KeyMismatchError,
    encode_json,
    encode_key,
    encode_row,
    encode_value,
)

__all__ = ["JsonlSink", "JsonlSinkError", "encode_row", "notifications_path"]


def notifications_path(path: str | Path) -> Path:
    """Where the sink writes notification records: ``events.jsonl`` ->
    ``events.notifications.jsonl``, beside it."""
    path = Path(path)
    return path.with_name(f"{path.stem}.notifications.jsonl")


class JsonlSinkError(RuntimeError):
    """The sink file cannot be used as asked; the message says why and what to do."""


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

    def write(self, items: Sequence[SinkItem]) -> None:
        if self._file is None:
            raise JsonlSinkError(f"sink {self.path} is not open")
        # Key names are asked for once per table and call, not cached for good: a table
        # whose primary key is altered gets the new names from the next batch on.
        names: dict[TableId, tuple[str, ...]] = {}
        chunks: list[bytes] = []
        lines: list[str] = []  # log events' lines not yet in chunks
        for item in map(in_process, items):
            if isinstance(item, ReadBatch):
                if not len(item):
                    continue
                if lines:
                    chunks.append("".join(lines).encode("utf-8"))
                    lines = []
                chunks.append(self._batch_lines(item, names))
            else:
                lines.append(self._line(item, names))
        if lines:
            chunks.append("".join(lines).encode("utf-8"))
        if chunks:
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            faults.failpoint("sink.flush", before=lambda: self._write_torn(data))
            try:
                self._file.write(data)
            except OSError as exc:
                raise self._write_failed(exc) from exc

    def checkpoint(self) -> int:
        if self._file is None:
            raise JsonlSinkError(f"sink {self.path} is not open")
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
        except OSError as exc:
            raise self._write_failed(exc) from exc
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
            file, self._file = self._file, None
            try:
                file.close()
            except OSError as exc:  # what it still buffered was never acknowledged
                raise self._write_failed(exc) from exc

    def notify(self, records: Sequence[Mapping[str, Any]], topic: str) -> None:
        """Notification records (``[notifications] channels`` "sink") as lines of a file
        of their own beside the events (``notifications_path``), shaped as event lines:
        ``{"topic": ..., "key": {"id": ...}, "value": <record>}``. Appended and flushed,
        never cut back: they report what happened, which a replay does not undo."""
        lines = "".join(
            json.dumps(
                {"topic": topic, "key": {"id": r["id"]}, "value": r},
                ensure_ascii=False,
                separators=(",", ":"),
            )
            + "\n"
            for r in records
        )
        with open(notifications_path(self.path), "a", encoding="utf-8", newline="\n") as out:
            out.write(lines)

    def _write_failed(self, exc: OSError) -> JsonlSinkError:
        """A failed write (a full disk) as an error naming the file. What was not
        acknowledged is cut back and replayed on the next start, so nothing is lost."""
        return JsonlSinkError(disk_error(exc, self.path, "the sink file", "[sink] path"))

    def _write_torn(self, data: bytes) -> None:
        """Fault suite: half the batch reaches the file (most often a torn line)."""
        assert self._file is not None
        self._file.write(data[: len(data) // 2])
        self._file.flush()

    # Encoding

    def _opening(self, table: TableId) -> str:
        opening = self._openings.get(table)
        if opening is None:
            if table.schema is None:
                raise JsonlSinkError(f"event for table {table} without a schema")
            topic = f"{self.topic_prefix}.{table.schema}.{table.table}"
            opening = self._openings[table] = '{"topic":' + encode_json(topic) + ',"key":'
        return opening

    def _names(self, table: TableId, names: dict[TableId, tuple[str, ...]]) -> tuple[str, ...]:
        found = names.get(table)
        if found is None:
            columns = self._key_columns(table)
            if not columns:
                raise JsonlSinkError(f"no key columns known for {table}: cannot write its key")
            found = names[table] = tuple(columns)
        return found

    def _batch_lines(self, batch: ReadBatch, names: dict[TableId, tuple[str, ...]]) -> bytes:
        """A READ batch's lines, encoded column-wise (the same bytes as its events' lines)."""
        table = batch.table
        opening = self._opening(table)
        key_names = self._names(table, names)
        if len(key_names) != len(batch.key_columns):
            exc = KeyMismatchError(
                f"{len(batch.key_columns)} key values, but the table's key columns are "
                f"{list(key_names)}"
            )
            raise JsonlSinkError(f"event for {table}: {exc}")
        try:
            encoded = batch_json.encode_batch(batch, key_names)
        except batch_json.NotColumnar:  # a row converter only rows can go through
            return "".join(self._line(e, names) for e in batch.events()).encode("utf-8")
        lines = batch_json.join(opening, encoded.keys, ',"value":', encoded.values, "}\n")
        return batch_json.concatenated(lines)

    def _line(self, event: ChangeEvent, names: dict[TableId, tuple[str, ...]]) -> str:
        table = event.source.table
        opening = self._opening(table)
        if event.key is None:  # a truncate
            key = "null"
        else:
            try:
                key = encode_key(self._names(table, names), event.key)
            except KeyMismatchError as exc:
                raise JsonlSinkError(f"event for {table}: {exc}") from None
        return f'{opening}{key},"value":{encode_value(event)}}}\n'

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
