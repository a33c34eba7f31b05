"""Spanner as a source, against the emulator, in both dialects: ``init``'s checks, a snapshot
while a random writer changes the table and the change stream's partitions split, move and
merge every few seconds (``scripts/services up spanner`` runs the emulator with
``--override_change_stream_partition_token_alive_seconds=2``), a stop in the middle of a
partition merge and a resume, ``verify``.

The writer commits inserts, updates (some columns, or all), deletes and key changes (a
delete and an insert in one transaction), retrying what the emulator aborts: it runs one
read-write transaction at a time, the watermark writes included. TIMESTAMP values are whole
seconds: the emulator drops the fraction inside change-stream mods (docs/spanner.md).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from snapshotter.engine.workers import ChunkTask, PhaseHooks
from tests.integration.engine_harness import Capture

pytestmark = pytest.mark.integration

STREAM = "cs"
ROWS = 2500

GOOGLESQL_DDL = [
    "CREATE TABLE items (id INT64 NOT NULL, region STRING(16) NOT NULL, qty INT64, "
    "price NUMERIC, ratio FLOAT64, flag BOOL, note STRING(MAX), day DATE, seen_at TIMESTAMP, "
    "blob BYTES(MAX), doc JSON, tags ARRAY<INT64>) PRIMARY KEY (id, region)",
    "CREATE TABLE debezium_signal (id STRING(42) NOT NULL, type STRING(32) NOT NULL, "
    "data STRING(MAX)) PRIMARY KEY (id)",
]
POSTGRESQL_DDL = [
    "CREATE TABLE items (id bigint NOT NULL, region varchar(16) NOT NULL, qty bigint, "
    "price numeric, ratio float8, flag boolean, note text, day date, seen_at timestamptz, "
    "blob bytea, doc jsonb, tags bigint[], PRIMARY KEY (id, region))",
    "CREATE TABLE debezium_signal (id varchar(42) NOT NULL, type varchar(32) NOT NULL, "
    "data text, PRIMARY KEY (id))",
]
COLUMNS = (
    "id",
    "region",
    "qty",
    "price",
    "ratio",
    "flag",
    "note",
    "day",
    "seen_at",
    "blob",
    "doc",
    "tags",
)
REGIONS = ("eu", "us", "ap")


def stream_ddl(dialect: str, capture: str = "NEW_ROW_AND_OLD_VALUES") -> str:
    option = "WITH" if dialect == "postgresql" else "OPTIONS"
    return (
        f"CREATE CHANGE STREAM {STREAM} FOR items, debezium_signal "
        f"{option} (value_capture_type = '{capture}')"
    )


def _row(rng: random.Random, key: tuple[int, str], dialect: str) -> tuple[Any, ...]:
    at = dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=rng.randrange(10**7))
    doc: Any = {"n": rng.randrange(100), "s": rng.choice(["a", "ü", "x y"])}
    if dialect == "googlesql":
        from google.cloud.spanner_v1.data_types import JsonObject

        doc = JsonObject(doc)
    else:
        doc = json.dumps(doc)
    return (
        key[0],
        key[1],
        rng.choice([None, rng.randrange(-(2**62), 2**62)]),
        rng.choice([None, Decimal(rng.randrange(10**8)) / 100]),
        rng.choice([None, rng.random() * 1e6, -0.5]),
        rng.choice([None, True, False]),
        rng.choice([None, "", "plain", "naïve ☃", "x" * rng.randrange(1, 300)]),
        rng.choice([None, dt.date(2020, 1, 1) + dt.timedelta(days=rng.randrange(2000))]),
        rng.choice([None, at]),
        rng.choice([None, base64.b64encode(rng.randbytes(rng.randrange(0, 40)))]),
        rng.choice([None, doc]),
        rng.choice([None, [], [rng.randrange(100) for _ in range(rng.randrange(1, 5))]]),
    )


@dataclass
class SpannerWriter:
    """Random changes to ``items`` until stopped: inserts, updates, deletes, key changes."""

    database: Any
    dialect: str
    seed: int
    keys: list[tuple[int, str]]
    next_id: int
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="spanner-writer", daemon=True)

    def start(self) -> SpannerWriter:
        self.thread.start()
        return self

    def stop(self) -> dict[str, int]:
        self.stop_event.set()
        self.thread.join(60)
        if self.errors:
            raise self.errors[0]
        return self.counts

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.step()
            except BaseException as exc:  # reported by stop()
                self.errors.append(exc)
                return
            time.sleep(self.rng.random() * 0.02)

    def _new_key(self) -> tuple[int, str]:
        self.next_id += 1
        return (self.next_id, self.rng.choice(REGIONS))

    def step(self) -> None:
        rng = self.rng
        op = rng.choice(["insert", "update", "update", "partial", "delete", "rekey"])
        if not self.keys:
            op = "insert"
        if op == "insert":
            key = self._new_key()
            row = _row(rng, key, self.dialect)
            self._run(lambda tx: tx.insert("items", COLUMNS, [row]))
            self.keys.append(key)
        elif op in ("update", "partial"):
            key = rng.choice(self.keys)
            row = _row(rng, key, self.dialect)
            if op == "partial":  # a mutation naming some columns: only they change
                names = ("id", "region", "qty", "note")
                values = (row[0], row[1], row[2], row[6])
                self._run(lambda tx: tx.update("items", names, [values]))
            else:
                self._run(lambda tx: tx.update("items", COLUMNS, [row]))
        elif op == "delete":
            key = self.keys.pop(rng.randrange(len(self.keys)))
            self._delete(key)
        else:  # a new key for a row: a delete and an insert in one transaction
            from google.cloud.spanner_v1 import KeySet

            old = self.keys.pop(rng.randrange(len(self.keys)))
            key = self._new_key()
            row = _row(rng, key, self.dialect)

            def rekey(tx: Any) -> None:
                tx.delete("items", KeySet(keys=[list(old)]))
                tx.insert("items", COLUMNS, [row])

            self._run(rekey)
            self.keys.append(key)
        self.counts[op] = self.counts.get(op, 0) + 1

    def _delete(self, key: tuple[int, str]) -> None:
        from google.cloud.spanner_v1 import KeySet

        self._run(lambda tx: tx.delete("items", KeySet(keys=[list(key)])))

    def _run(self, work: Callable[[Any], None]) -> None:
        self.database.run_in_transaction(work)


def seed_rows(database: Any, dialect: str, count: int, seed: int = 7) -> list[tuple[int, str]]:
    rng = random.Random(seed)
    keys = [(i, REGIONS[i % 3]) for i in range(1, count + 1)]
    for start in range(0, count, 500):
        batch = [_row(rng, k, dialect) for k in keys[start : start + 500]]
        with database.batch() as b:
            b.insert("items", COLUMNS, batch)
    return keys


@dataclass
class SpannerCase:
    capture: Capture
    database: Any
    dialect: str
    started_us: int = field(default_factory=lambda: _now_us())  # after the stream DDL


@pytest.fixture
def spanner_case(
    spanner_emulator: str, spanner_database: Callable[..., Any], tmp_path: Path
) -> Iterator[Callable[..., SpannerCase]]:
    captures: list[Capture] = []

    def make(
        dialect: str,
        *,
        sink: str = "jsonl",
        chunk_size: int = 200,
        capture_type: str = "NEW_ROW_AND_OLD_VALUES",
        stream: bool = True,
    ) -> SpannerCase:
        ddl = GOOGLESQL_DDL if dialect == "googlesql" else POSTGRESQL_DDL
        made = spanner_database(
            dialect, [*ddl, *([stream_ddl(dialect, capture_type)] if stream else [])]
        )
        directory = tmp_path / f"{dialect}-{sink}-{len(captures)}"
        directory.mkdir()
        capture = Capture(
            url=f"spanner:///{made.name}",
            schema="public",
            directory=directory,
            chunk_size=chunk_size,
            kind="spanner",
            sink=sink,
            tables=["public.items"],
            extra_config=(
                f'change_stream = "{STREAM}"\nemulator_host = "{spanner_emulator}"\n'
                "heartbeat_ms = 200\nread_parallelism = 2"
            ),
        )
        captures.append(capture)
        return SpannerCase(capture, made.database, dialect)

    yield make


class _Churn(logging.Handler):
    """The partition ends the log reader reports (commit-timestamp µs)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.ends: list[int] = []

    def emit(self, record: logging.LogRecord) -> None:
        end = getattr(record, "partition_end_us", None)
        if end is not None:
            self.ends.append(int(end))


@pytest.fixture
def churn() -> Iterator[_Churn]:
    handler = _Churn()
    logger = logging.getLogger("snapshotter.sources.spanner.reader")

    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _now_us() -> int:
    return time.time_ns() // 1000


def _windows_hooks(windows: list[list[int]], hold_s: float) -> PhaseHooks:
    """Record each chunk's window (from its open watermark's commit to its close's, in
    wall-clock µs: the emulator's commit timestamps come from this machine's clock), holding
    it open ``hold_s`` after the read so that partitions churn inside some windows."""

    def opened(task: ChunkTask) -> None:
        windows.append([_now_us(), 0])

    def read(task: ChunkTask) -> None:
        time.sleep(hold_s)

    def closed(task: ChunkTask) -> None:
        for window in reversed(windows):
            if window[1] == 0:
                window[1] = _now_us()
                break

    return PhaseHooks(after_open=opened, after_read=read, after_close=closed)


def _converged(capture: Capture, sink: str, case: SpannerCase | None = None) -> str:
    verdict = capture.verify_landed("items") if sink == "spark" else capture.verify("items")
    if not verdict.ok and case is not None:
        raise AssertionError(f"{verdict.render()}\n{_trace(case, verdict)}")
    assert verdict.ok, verdict.render()
    if sink == "spark":  # and a reader that knows nothing of snapshotter sees the same
        assert capture.landed_rows("items") == capture.source_rows("items")
    return str(verdict.render())


def _trace(case: SpannerCase, verdict: Any) -> str:
    """Where the wrong keys' changes are: in the change stream (read again without the
    engine) and in the JSONL output, so a rare failure says whose record went missing."""
    from tests.integration.spanner_trace import trace_keys

    keys = [
        *verdict.missing_examples,
        *verdict.extra_examples,
        *(d.key for d in verdict.differing_examples),
    ][:5]
    lines = trace_keys(case.database, case.dialect, STREAM, case.started_us, _now_us(), keys)
    if case.capture.sink == "jsonl":
        for event in case.capture.events("items"):
            value = event["value"]
            row = value.get("after") or value.get("before") or {}
            if any(all(str(row.get(c)) == str(v) for c, v in k.items()) for k in keys):
                lines.append(f"  output: op {value['op']} pos {value['source'].get('pos')}")
    return "\n".join(lines)


def _positions_increase(capture: Capture) -> None:
    """No event twice, none out of order: the JSONL file's positions strictly increase."""
    positions = [e["value"]["source"]["pos"] for e in capture.events("items")]
    assert positions, "no events"
    repeated = len(positions) - len(set(positions))
    assert repeated == 0, f"{repeated} events written twice"
    assert positions == sorted(positions), "events out of position order"


FULL_VARIABLE = "SNAPSHOTTER_CONVERGENCE_MATRIX"  # as test_convergence.py's full matrix


@pytest.mark.parametrize(
    ("dialect", "sink"),
    [
        ("googlesql", "jsonl"),
        ("postgresql", "jsonl"),
        ("googlesql", "spark"),
        # CI: Spark in one dialect (the landing past the decoder is the same)
        *(
            [("postgresql", "spark")]
            if os.environ.get("SNAPSHOTTER_CONVERGENCE_MATRIX") == "full"
            else []
        ),
    ],
)
def test_a_snapshot_under_a_random_writer_converges_while_partitions_churn(
    spanner_case: Callable[..., SpannerCase], churn: _Churn, dialect: str, sink: str
) -> None:
    case = spanner_case(dialect, sink=sink)
    capture = case.capture
    keys = seed_rows(case.database, dialect, ROWS)
    capture.init()
    windows: list[list[int]] = []
    engine = capture.start(hooks=_windows_hooks(windows, hold_s=1.0))
    writer = SpannerWriter(case.database, dialect, seed=11, keys=keys, next_id=ROWS).start()
    try:
        time.sleep(1.0)
        capture.execute("public.items")
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status = capture.status() if (capture.directory / "state/state.json").exists() else {}
            tables = status.get("snapshots") or []
            if tables and all(t.get("state") == "done" for t in tables):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"the snapshot did not finish: {status}")
        counts = writer.stop()
    finally:
        writer.stop_event.set()
        engine.stop(timeout=120)
    assert capture.run(timeout=180) == 0  # catch up with the writer's last changes
    report = _converged(capture, sink, case)
    inside = [e for e in churn.ends if any(o < e < c for o, c in windows if c)]
    logging.getLogger(__name__).warning(
        "spanner %s -> %s: %s; writer %s; %d partition ends, %d inside one of %d windows",
        dialect,
        sink,
        report,
        counts,
        len(churn.ends),
        len(inside),
        len(windows),
    )
    assert churn.ends, "no partition split, moved or merged during the test"
    assert inside, "no partition ended inside a snapshot window"
    if sink == "jsonl":
        _positions_increase(capture)
        ops = {e["value"]["op"] for e in capture.events("items")}
        assert {"r", "c", "u", "d"} <= ops


@pytest.mark.parametrize("dialect", ["postgresql"])
def test_a_stop_in_the_middle_of_a_partition_merge_resumes_without_loss_or_duplicates(
    spanner_case: Callable[..., SpannerCase], churn: _Churn, dialect: str
) -> None:
    case = spanner_case(dialect)
    capture = case.capture
    keys = seed_rows(case.database, dialect, ROWS)
    capture.init()
    writer = SpannerWriter(case.database, dialect, seed=5, keys=keys, next_id=ROWS).start()
    try:
        capture.execute("public.items")
        for _ in range(3):
            # Stop while partitions churn (every 2-4 s), with chunks in flight: the saved
            # state holds the live partitions and those whose ends are not yet released.
            engine = capture.start(hooks=_windows_hooks([], hold_s=0.3))
            ended = len(churn.ends)
            deadline = time.monotonic() + 30
            while len(churn.ends) == ended and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(random.random())
            engine.stop(timeout=120)
            saved = json.loads((capture.directory / "state/state.json").read_text())
            partitions = saved["stream"]["resume"]["partitions"]
            assert partitions["live"], partitions
        writer.stop()
    finally:
        writer.stop_event.set()
    assert capture.run(timeout=240) == 0
    assert capture.status()["snapshots"][0]["state"] == "done"
    _converged(capture, "jsonl")
    _positions_increase(capture)


@pytest.mark.parametrize("dialect", ["googlesql"])
def test_a_crash_in_the_middle_of_a_partition_merge_resumes_without_loss(
    spanner_case: Callable[..., SpannerCase], dialect: str
) -> None:
    """SIGKILL when a partition has ended (``spanner.partition_end``), then ``resume``: the
    state's restart point (the last checkpointed transaction's, older than what was handed
    on) re-reads partitions that had already finished, and nothing is lost or goes back."""
    case = spanner_case(dialect)
    capture = case.capture
    keys = seed_rows(case.database, dialect, ROWS)
    capture.init()
    writer = SpannerWriter(case.database, dialect, seed=3, keys=keys, next_id=ROWS).start()
    try:
        capture.execute("public.items")
        for at in (1, 2):
            said_path = capture.directory / f"run-{at}.log"
            with said_path.open("w") as said_file:
                killed = subprocess.run(
                    [*_cli(capture, "run", "--until-caught-up"), "-v"],
                    env={**os.environ, "SNAPSHOTTER_FAULTS": f"spanner.partition_end@{at}"},
                    stdout=said_file,
                    stderr=subprocess.STDOUT,
                    timeout=300,
                    check=False,
                )
            said = said_path.read_text()
            # The first run dies at the first partition end (the emulator's first churn
            # comes under a second after the start); the second may catch up before two.
            expected = (-signal.SIGKILL,) if at == 1 else (-signal.SIGKILL, 0)
            assert killed.returncode in expected, said[-3000:]
        writer.stop()
    finally:
        writer.stop_event.set()
    resumed = subprocess.run(
        _cli(capture, "resume", "--until-caught-up"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert capture.status()["snapshots"][0]["state"] == "done"
    _converged(capture, "jsonl")


def _cli(capture: Capture, command: str, *args: str) -> list[str]:
    config = str(capture.config_path)
    return [sys.executable, "-m", "snapshotter.app.cli", command, "-c", config, *args]


@pytest.mark.parametrize("dialect", ["googlesql", "postgresql"])
def test_init_checks_the_change_stream_and_says_the_ddl(
    spanner_case: Callable[..., SpannerCase], dialect: str, capsys: pytest.CaptureFixture[str]
) -> None:
    case = spanner_case(dialect, stream=False)
    capture = case.capture
    assert capture.cli("init") == 1
    err = capsys.readouterr().err
    assert f"change stream {STREAM} does not exist" in err
    assert f"CREATE CHANGE STREAM {STREAM} FOR" in err
    case.database.update_ddl([stream_ddl(dialect, "NEW_VALUES")]).result(60)
    assert capture.cli("init") == 1
    err = capsys.readouterr().err
    assert "NEW_VALUES" in err and "NEW_ROW_AND_OLD_VALUES" in err
    case.database.update_ddl(
        [f"DROP CHANGE STREAM {STREAM}", stream_ddl(dialect, "OLD_AND_NEW_VALUES")]
    ).result(60)
    assert capture.cli("init") == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err and "OLD_AND_NEW_VALUES" in captured.err
    assert "stream position: change stream cs from" in captured.out
