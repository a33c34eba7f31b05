"""How fast the binlog is decoded, on one backlog written before any reader starts.

    python bench/log_bench.py binlog [--captured N] [--other M] [--url URL]
                                        [--profile] [--profile-top K] [--no-process]

One run creates a database ``bench_<random>`` with two tables of the PostgreSQL bench's shape
(``id bigint primary key, k int, name varchar(40), amount double, created datetime(6)``):
``captured`` and ``other``. It records the binlog position, then a writer commits N one-row
INSERTs into ``captured`` and M into ``other`` (autocommit: one transaction each,
interleaved evenly, sent 100 statements per round trip), then records the end position.
Every variant below decodes that same backlog, from the recorded start to the recorded end,
so the writer's speed does not bound any of them:

- naive: ``BinLogStreamReader`` with its defaults (all event types, ``enable_logging=True``),
  reading ``.rows`` of every rows event: the NOTES.md baseline;
- the same, one setting at a time: ``only_events`` restricted to what the decoder needs,
  ``enable_logging=False``, rows of uncaptured tables never decoded, ``freeze_schema=True``,
  and ``only_tables`` (the library then skips the table maps and rows events of other tables
  before parsing them);
- ours (before): ``BinlogLogReader`` + ``BinlogDecoder`` (the engine's log path: a reader
  thread, a queue, positioned ``ChangeEvent`` items) into a counting loop, with
  ``binlog_reader.FREEZE_TABLE_MAPS`` off (table maps parsed before every transaction);
- ours + proposed (the reader as shipped): the same with table maps parsed once per table id
  and forgotten at any statement that may change a table;
- the decoder fed in the calling thread (no reader thread, no queue), with the reader's
  settings, and again with ``freeze_schema=True``;
- the decoder in a child process (``multiprocessing``), its item batches pickled to the
  parent through a queue (skipped with ``--no-process``).

It prints a markdown table: events in the backlog, seconds, binlog events/s, captured row
events/s, and the speed-up over the naive loop (its seconds / this one's). With
``--profile`` it then decodes the backlog twice more under cProfile (ours, then ours +
proposed) and prints the reader thread's top functions by cumulative and by own time.
The database is dropped at the end, also on error.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import queue
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pymysql
from pymysql.constants import CLIENT
from pymysqlreplication import BinLogStreamReader
from pymysqlreplication.row_event import (
    DeleteRowsEvent,
    UpdateRowsEvent,
    WriteRowsEvent,
)

from bench.lib.mysql import bench_database, connect_args, drop_database, execute
from bench.lib.profiling import profile_threads, top_functions
from bench.lib.servers import package_version
from signals.names import TableId
from snapshotter.sources.log import Change, Commit, Progress
from snapshotter.sources.mysql import reader as binlog_reader
from snapshotter.sources.mysql.decoder import BinlogDecoder
from snapshotter.sources.mysql.positions import binlog_offset
from snapshotter.sources.mysql.reader import BinlogLogReader

CAPTURED = "captured"
OTHER = "other"
SERVER_ID = 6102
ROWS_EVENTS = (WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent)
READER_EVENTS = binlog_reader._EVENTS  # what BinlogLogReader asks the library for
# BinlogLogReader's settings, for the inline and child-process decoders
READER_SETTINGS: dict[str, Any] = {
    "only_events": READER_EVENTS,
    "slave_heartbeat": 1.0,
    "enable_logging": False,
}
TIMEOUT_S = 1800.0


# --------------------------------------------------------------------------- the backlog


@dataclass(frozen=True)
class Backlog:
    database: str
    start: dict[str, Any]  # {"file", "pos"}
    end: dict[str, Any]
    captured: int  # one-row transactions written to each table
    other: int
    write_seconds: float

    @property
    def end_offset(self) -> int:
        return binlog_offset(self.end["file"], self.end["pos"])

    def settings(self, url: str) -> dict[str, Any]:
        """``connection_settings`` for BinLogStreamReader, as BinlogLogReader builds them."""
        args = connect_args(url)
        return {
            "host": args["host"],
            "port": args["port"],
            "user": args["user"],
            "passwd": args["password"],
            "charset": "utf8mb4",
        }

    def table(self, name: str) -> TableId:
        return TableId(self.database, name)


def binlog_position(url: str) -> dict[str, Any]:
    for statement in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
        try:
            rows = execute(url, statement)
        except pymysql.err.Error:
            continue
        if not rows:
            sys.exit("binary logging is off on the server (log_bin=OFF)")
        return {"file": str(rows[0][0]), "pos": int(rows[0][1])}
    sys.exit("cannot read the binlog position (SHOW MASTER STATUS)")


def create_tables(url: str, database: str) -> None:
    for name in (CAPTURED, OTHER):
        execute(
            url,
            f"CREATE TABLE `{database}`.`{name}` (id bigint PRIMARY KEY, k int, "
            "name varchar(40), amount double, created datetime(6))",
        )


def write_backlog(url: str, database: str, captured: int, other: int, per_trip: int = 100) -> float:
    """``captured`` + ``other`` autocommit one-row INSERTs, the tables interleaved evenly,
    ``per_trip`` statements per round trip (multi-statement). Returns the seconds taken."""
    total = captured + other
    plan: list[tuple[str, int]] = []
    made = {CAPTURED: 0, OTHER: 0}
    for i in range(total):
        # Bresenham-style interleaving: row i goes to ``other`` when its share is due.
        due_other = (i + 1) * other // total if total else 0
        name = OTHER if made[OTHER] < due_other else CAPTURED
        made[name] += 1
        plan.append((name, made[name]))
    conn = pymysql.connect(
        **connect_args(url), autocommit=True, client_flag=CLIENT.MULTI_STATEMENTS
    )
    started = time.perf_counter()
    try:
        with conn.cursor() as cur:
            for first in range(0, total, per_trip):
                statements = [
                    f"INSERT INTO `{database}`.`{name}` VALUES ({i}, {i * 7919 % 100003}, "
                    f"'name-{i:032x}', {i * 0.25}, '2024-01-01 00:00:00.000000' + INTERVAL {i} "
                    "SECOND)"
                    for name, i in plan[first : first + per_trip]
                ]
                cur.execute(";".join(statements))
                while cur.nextset():
                    pass
    finally:
        conn.close()
    return time.perf_counter() - started


# --------------------------------------------------------------------------- variants


@dataclass
class Run:
    what: str
    events: int  # events the variant received (library events, or log items for ours)
    captured_rows: int
    seconds: float
    note: str = ""


class Reached(Exception):
    pass


def stream_loop(
    backlog: Backlog,
    url: str,
    on_event: Callable[[Any], None],
    **options: Any,
) -> tuple[int, float]:
    """Read the backlog with a BinLogStreamReader built with ``options``; call ``on_event``
    for each event; stop at the recorded end. Returns (events, seconds)."""
    settings = backlog.settings(url)
    started = time.perf_counter()
    stream = BinLogStreamReader(
        connection_settings=settings,
        server_id=SERVER_ID,
        blocking=True,
        resume_stream=True,
        log_file=backlog.start["file"],
        log_pos=backlog.start["pos"],
        **options,
    )
    end_file, end_pos = backlog.end["file"], backlog.end["pos"]
    events = 0
    try:
        while True:
            event = stream.fetchone()
            if event is None:
                raise RuntimeError("the server ended the binlog dump before the end position")
            events += 1
            on_event(event)
            if stream.log_file == end_file and event.packet.log_pos >= end_pos:
                break
            if time.perf_counter() - started > TIMEOUT_S:
                raise RuntimeError("timed out before the end position")
    finally:
        stream.close()
    return events, time.perf_counter() - started


def library_variant(
    backlog: Backlog, url: str, what: str, skip_uncaptured: bool, **options: Any
) -> Run:
    """A plain BinLogStreamReader loop that reads ``.rows`` of rows events (of every table,
    or only of ``captured`` when ``skip_uncaptured``)."""
    counted = [0]

    def on_event(event: Any) -> None:
        if isinstance(event, ROWS_EVENTS):
            if skip_uncaptured and (event.schema, event.table) != (backlog.database, CAPTURED):
                return
            rows = event.rows
            if event.table == CAPTURED and event.schema == backlog.database:
                counted[0] += len(rows)

    events, seconds = stream_loop(backlog, url, on_event, **options)
    return Run(what, events, counted[0], seconds)


def decoder_for(backlog: Backlog) -> BinlogDecoder:
    table = backlog.table(CAPTURED)
    return BinlogDecoder("bench", captured=lambda t: t == table, key_columns=lambda t: ("id",))


def decoder_inline(backlog: Backlog, url: str, what: str, freeze_schema: bool) -> Run:
    """BinlogDecoder fed in this thread from a stream with BinlogLogReader's settings."""
    decoder = decoder_for(backlog)
    decoder.start(backlog.start["file"])
    counts = [0, 0]  # items, changes

    def on_event(event: Any) -> None:
        items = decoder.feed(event)
        counts[0] += len(items)
        counts[1] += sum(1 for i in items if isinstance(i, Change))

    _, seconds = stream_loop(
        backlog,
        url,
        on_event,
        **READER_SETTINGS,
        freeze_schema=freeze_schema,
    )
    return Run(what, counts[0], counts[1], seconds, "events = log items the decoder made")


def ours(backlog: Backlog, url: str, proposed: bool = False) -> Run:
    """BinlogLogReader + BinlogDecoder, read() into a counting loop until a Commit or
    Progress item reaches the recorded end. ``proposed`` (now the reader's default): table
    maps parsed once per table id; without it, the reader as it was before (parsed again
    before every transaction)."""
    binlog_reader.FREEZE_TABLE_MAPS = proposed
    started = time.perf_counter()
    reader = BinlogLogReader(
        connect_args(url),
        server_id=SERVER_ID,
        decoder=decoder_for(backlog),
        start=dict(backlog.start),
    )
    items = changes = 0
    target = backlog.end_offset
    try:
        while True:
            batch = reader.read(1.0)
            items += len(batch)
            done = False
            for item in batch:
                if isinstance(item, Change):
                    changes += 1
                elif isinstance(item, Commit | Progress) and item.log_offset >= target:
                    done = True
            if done:
                break
            if time.perf_counter() - started > TIMEOUT_S:
                raise RuntimeError("timed out before the end position")
        seconds = time.perf_counter() - started
    finally:
        reader.close()
        binlog_reader.FREEZE_TABLE_MAPS = True
    what = "ours: BinlogLogReader + BinlogDecoder (reader thread, queue) → counting loop"
    if proposed:
        what = "ours + proposed: freeze_schema=True, table maps forgotten at DDL"
    return Run(
        what,
        items,
        changes,
        seconds,
        "events = log items handed over by read()",
    )


def _child(backlog: Backlog, url: str, out: Any) -> None:
    """The child process: decode inline, put batches of 500 items (pickled) on ``out``."""
    decoder = decoder_for(backlog)
    decoder.start(backlog.start["file"])
    batch: list[Any] = []

    def on_event(event: Any) -> None:
        batch.extend(decoder.feed(event))
        if len(batch) >= 500 and not decoder.in_transaction:
            out.put(list(batch))
            batch.clear()

    try:
        stream_loop(
            backlog,
            url,
            on_event,
            **READER_SETTINGS,
        )
        if batch:
            out.put(batch)
        out.put(None)
    except BaseException as exc:
        out.put(RuntimeError(f"child: {type(exc).__name__}: {exc}"))


def in_process(backlog: Backlog, url: str) -> Run:
    context = multiprocessing.get_context("fork")
    out = context.Queue(64)
    started = time.perf_counter()
    child = context.Process(target=_child, args=(backlog, url, out), daemon=True)
    child.start()
    items = changes = 0
    try:
        while True:
            try:
                batch = out.get(timeout=TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError("the decoding process sent nothing in time") from None
            if batch is None:
                break
            if isinstance(batch, BaseException):
                raise batch
            items += len(batch)
            changes += sum(1 for i in batch if isinstance(i, Change))
        seconds = time.perf_counter() - started
    finally:
        child.join(10)
        if child.is_alive():
            child.terminate()
    return Run(
        "decoder in a child process, items pickled through a multiprocessing queue",
        items,
        changes,
        seconds,
        "events = log items received by the parent",
    )


# --------------------------------------------------------------------------- profile


def profiled(backlog: Backlog, url: str, top: int, proposed: bool) -> str:
    with profile_threads() as profiles:
        run = ours(backlog, url, proposed)
    out = [
        f"### cProfile: {run.what}, same backlog, "
        f"{run.seconds:.2f} s under the profiler ({run.captured_rows / run.seconds:,.0f} "
        f"captured row events/s); top {top} by cumulative time, reader thread"
    ]
    for name, profiler in profiles.items():
        if name != "binlog-reader":
            continue
        out += ["", "```", *top_functions(profiler, top), "```"]
        by_own_time = top_functions(profiler, top, "tottime")
        out += ["", f"top {top} by own time (tottime), reader thread:", "```", *by_own_time, "```"]
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def render(runs: list[Run], backlog_events: int, backlog: Backlog) -> str:
    naive = runs[0].seconds
    lines = [
        "| variant | events received | captured rows | seconds | binlog events/s "
        "| captured row events/s | speed-up vs naive |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r.what} | {r.events:,} | {r.captured_rows:,} | {r.seconds:.2f} | "
            f"{backlog_events / r.seconds:,.0f} | {r.captured_rows / r.seconds:,.0f} | "
            f"{naive / r.seconds:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--captured", type=int, default=50_000, help="one-row txns into captured (50,000)"
    )
    parser.add_argument(
        "--other", type=int, default=50_000, help="one-row txns into other (50,000)"
    )
    parser.add_argument("--url", help="MySQL URL (default: $SNAPSHOTTER_MYSQL_URL or services)")
    parser.add_argument("--no-process", action="store_true", help="skip the child-process run")
    parser.add_argument("--profile", action="store_true", help="then profile ours with cProfile")
    parser.add_argument("--profile-top", type=int, default=10, help="entries (10)")
    args = parser.parse_args(argv)
    if args.captured < 1 or args.other < 0:
        parser.error("--captured must be positive, --other not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    url, database = bench_database(args.url)
    runs: list[Run] = []
    profile_text = ""
    try:
        create_tables(url, database)
        start = binlog_position(url)
        print(
            f"writing {args.captured:,} + {args.other:,} one-row transactions ...", file=sys.stderr
        )
        write_seconds = write_backlog(url, database, args.captured, args.other)
        backlog = Backlog(
            database, start, binlog_position(url), args.captured, args.other, write_seconds
        )
        settings_ours = {
            "only_events": READER_EVENTS,
            "enable_logging": False,
        }
        plan: list[tuple[str, Callable[[], Run]]] = [
            (
                "naive",
                lambda: library_variant(
                    backlog,
                    url,
                    "naive: BinLogStreamReader defaults, `.rows` of every rows event",
                    False,
                ),
            ),
            (
                "only_events",
                lambda: library_variant(
                    backlog,
                    url,
                    "+ only_events = the reader's 9 event types",
                    False,
                    only_events=READER_EVENTS,
                ),
            ),
            (
                "no logging",
                lambda: library_variant(
                    backlog,
                    url,
                    "+ enable_logging=False",
                    False,
                    **settings_ours,
                ),
            ),
            (
                "lazy",
                lambda: library_variant(
                    backlog,
                    url,
                    "+ rows of uncaptured tables never decoded",
                    True,
                    **settings_ours,
                ),
            ),
            (
                "freeze",
                lambda: library_variant(
                    backlog,
                    url,
                    "+ freeze_schema=True",
                    True,
                    **settings_ours,
                    freeze_schema=True,
                ),
            ),
            (
                "only_tables",
                lambda: library_variant(
                    backlog,
                    url,
                    "+ only_tables=[captured], only_schemas=[db] (no freeze_schema)",
                    True,
                    **settings_ours,
                    only_tables=[CAPTURED],
                    only_schemas=[database],
                ),
            ),
            ("ours", lambda: ours(backlog, url)),
            ("ours proposed", lambda: ours(backlog, url, proposed=True)),
            (
                "inline",
                lambda: decoder_inline(
                    backlog, url, "BinlogDecoder fed inline (no thread, no queue)", False
                ),
            ),
            (
                "inline freeze",
                lambda: decoder_inline(
                    backlog, url, "BinlogDecoder fed inline, freeze_schema=True", True
                ),
            ),
        ]
        if not args.no_process:
            plan.append(("process", lambda: in_process(backlog, url)))
        for name, measure in plan:
            print(f"{name} ...", file=sys.stderr)
            runs.append(measure())
        if args.profile:
            print("profiled ...", file=sys.stderr)
            profile_text = profiled(backlog, url, args.profile_top, False)
            profile_text += "\n\n" + profiled(backlog, url, args.profile_top, True)
    finally:
        drop_database(url, database)

    backlog_events = runs[0].events
    server = execute(url, "SELECT version()")[0][0]
    print(
        f"## binlog decode bench: {args.captured:,} one-row transactions into `captured`, "
        f"{args.other:,} into `other`\n"
    )
    print(f"- machine: {platform.platform()}, {os.cpu_count()} cores")
    print(
        f"- Python {platform.python_version()}, mysql-replication "
        f"{package_version('mysql-replication')}, PyMySQL {package_version('PyMySQL')}; "
        f"server {server}"
    )
    print(
        f"- backlog: {backlog.start['file']} {backlog.start['pos']} → {backlog.end['file']} "
        f"{backlog.end['pos']} ({backlog.end['pos'] - backlog.start['pos']:,} bytes if one "
        f"file), {backlog_events:,} events as the naive loop received them; the writer took "
        f"{backlog.write_seconds:.1f} s "
        f"({(backlog.captured + backlog.other) / backlog.write_seconds:,.0f} txn/s)"
    )
    print()
    print(render(runs, backlog_events, backlog))
    notes = [f"- {r.what}: {r.note}" for r in runs if r.note]
    if notes:
        print()
        print("\n".join(notes))
    if profile_text:
        print()
        print(profile_text)
    return 0
