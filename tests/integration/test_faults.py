"""Hard faults at every step of a snapshot: the engine is SIGKILLed, ``snapshotter resume``
finishes the snapshot, and the output still converges to the table.

Each run: a table of FAULT_ROWS rows under the random writer (inserts, updates, deletes, key
changes) for the whole run; ``execute-snapshot``; ``snapshotter run --until-caught-up`` in a
subprocess with ``SNAPSHOTTER_FAULTS=<point>@<N>`` (snapshotter/common/faults.py), so the process
kills itself the N-th time it reaches the point, N drawn from the run's seed (a random
moment inside that phase); then ``snapshotter resume --until-caught-up``; then, the writer
stopped, a last catch-up and the convergence check of the sink (JSONL: ``verify`` on the
file; Kafka: the topic replayed by a plain consumer, and ``verify``; Spark: the landed
current state against the table, and ``verify``).

What a crash costs is reported per run (and written as JSON lines to the file named by
``SNAPSHOTTER_FAULT_REPORT``, if set):

* ``discarded``: events the sink held past the last acknowledged checkpoint at the kill (the
  JSONL file's tail, a torn line included; Spark batches staged but not recorded); the
  restart drops them and the log sends them again.
* ``repeated``: Kafka messages delivered twice (Kafka cannot take back what it acknowledged
  past the saved checkpoint; ``verify`` tells these repeats from regressions).
* ``relanded``: Spark rows staged and recorded but not landed at the kill, landed first
  thing on resume (a landing cut short is landed again whole: batches overwrite by number).
* ``reread``: chunks the killed run had read (SELECT done) beyond the progress it saved; the
  resumed run reads them again.

CI runs a slice (SLICE). The full matrix, every point on every sink and both databases, with
``SNAPSHOTTER_FAULT_SEEDS`` seeds each (``3``: seeds 1 to 3; ``4-6``: seeds 4 to 6)::

    SNAPSHOTTER_FAULT_MATRIX=full SNAPSHOTTER_FAULT_SEEDS=3 \\
        SNAPSHOTTER_FAULT_REPORT=faults.jsonl scripts/test tests/integration/test_faults.py
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.integration.engine_harness import Capture
from tests.integration.test_convergence import (
    REPO,
    _cli,
    assert_kafka_converged,
    progress,
    qualified,
    source_named,
    state_of,
    wait_for,
)

FAULT_ROWS = 20_000
FAULT_CHUNK = 100  # 200 chunks
WRITER_RATE = 400  # changes per second, for the whole run
# Checkpoints 5 times as often as by default: a snapshot of FAULT_ROWS takes ~2 s, and a
# crash should find some of it saved and some not.
CHECKPOINT_MS = 200

# Where the N of ``point@N`` is drawn from, so that every N is reached in every run (measured
# on unfaulted runs: each chunk point ~200 times; JSONL and Kafka take ~400 writes; state is
# saved 5 times a second, 10-20 times; the Spark sink stages as often; Spark lands once,
# having started after the snapshot was read).
CHUNK_MOMENTS = (1, 190)
MOMENTS: dict[tuple[str, str], tuple[int, int]] = {
    **{
        (p, s): CHUNK_MOMENTS
        for p in ("watermark.open", "chunk.select", "window.close")
        for s in ("jsonl", "kafka", "spark")
    },
    ("sink.flush", "jsonl"): (1, 300),
    ("sink.flush", "kafka"): (1, 300),
    ("sink.flush", "spark"): (1, 8),
    ("state.write", "jsonl"): (1, 8),
    ("state.write", "kafka"): (1, 8),
    ("state.write", "spark"): (1, 8),
    ("spark.land", "spark"): (1, 1),
    # Parquet compactions: at the latest the killed run's closing one (the writer leaves a
    # tail).
    ("spark.compact.written", "spark"): (1, 1),
    ("spark.compact.named", "spark"): (1, 1),
    # "iceberg": the spark sink landing Iceberg tables. Between a landing's commits: after
    # the changelog's, and after the current state's appends (before its merge).
    **{(p, "iceberg"): CHUNK_MOMENTS for p in ("watermark.open", "chunk.select", "window.close")},
    ("sink.flush", "iceberg"): (1, 8),
    ("state.write", "iceberg"): (1, 8),
    ("spark.land", "iceberg"): (1, 1),
    ("spark.iceberg.changelog", "iceberg"): (1, 1),
    ("spark.iceberg.appended", "iceberg"): (1, 1),
    # "delta": the spark sink landing Delta tables.
    **{(p, "delta"): CHUNK_MOMENTS for p in ("watermark.open", "chunk.select", "window.close")},
    ("sink.flush", "delta"): (1, 8),
    ("state.write", "delta"): (1, 8),
    ("spark.land", "delta"): (1, 1),
}
SINKS = ("jsonl", "kafka", "spark", "iceberg", "delta")
TABLE_FORMATS = ("iceberg", "delta")  # the spark sink, landing this format


def _points(sink: str) -> list[str]:
    return [p for p, s in MOMENTS if s == sink]


# CI: every point once on the JSONL sink and both databases, and the points where Kafka and
# Spark differ most (Spark starts in ~10 s per process: each run starts it three times).
SLICE: list[tuple[str, str, str, int]] = [
    *((db, "jsonl", point, 1) for db in ("postgres", "mysql") for point in _points("jsonl")),
    ("postgres", "kafka", "sink.flush", 1),
    ("mysql", "kafka", "window.close", 1),
    ("postgres", "spark", "spark.land", 1),
    # Iceberg and Delta: a crash between a landing's commits (the other Iceberg point,
    # spark.iceberg.appended, and every other point with SNAPSHOTTER_FAULT_MATRIX=full).
    ("postgres", "iceberg", "spark.iceberg.changelog", 1),
    ("postgres", "delta", "spark.land", 1),
]


def _matrix() -> list[tuple[str, str, str, int]]:
    if os.environ.get("SNAPSHOTTER_FAULT_MATRIX") != "full":
        return SLICE
    # "3": seeds 1 to 3; "4-6": seeds 4 to 6.
    first, _, last = os.environ.get("SNAPSHOTTER_FAULT_SEEDS", "3").rpartition("-")
    seeds = range(int(first or 1), int(last) + 1)
    return [
        (db, sink, point, seed)
        for db in ("postgres", "mysql")
        for sink in SINKS
        for point in _points(sink)
        for seed in seeds
    ]


CASES = [
    pytest.param(db, sink, point, seed, id=f"{db}-{sink}-{point}-{seed}")
    for db, sink, point, seed in _matrix()
]


@dataclass
class Cost:
    """What one crash cost (see the module's docstring)."""

    source: str
    sink: str
    point: str
    at: int
    seed: int
    chunks_saved: int
    reread: int
    discarded: int
    repeated: int
    relanded: int
    writer_changes: int
    rows: int
    seconds: float

    def line(self) -> str:
        return (
            f"{self.source}/{self.sink} killed at {self.point}@{self.at}: {self.chunks_saved} "
            f"chunks saved, {self.reread} re-read; {self.discarded} events discarded and "
            f"re-sent, {self.repeated} repeated in Kafka, {self.relanded} rows re-landed; "
            f"writer {self.writer_changes} changes; {self.rows} rows converged in "
            f"{self.seconds:.0f} s"
        )


def _state(cap: Capture) -> dict[str, Any]:
    path = cap.directory / "state" / "state.json"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return data


def _jsonl_tail(cap: Capture, state: dict[str, Any]) -> int:
    """Events in the JSONL file past the acknowledged offset (a torn last line counts)."""
    if not cap.sink_path.exists():
        return 0
    offset = int(state.get("sink", {}).get("offset", 0))
    tail = cap.sink_path.read_bytes()[offset:]
    return tail.count(b"\n") + (0 if not tail or tail.endswith(b"\n") else 1)


def _staged(cap: Capture, state: dict[str, Any]) -> tuple[int, int]:
    """Rows in staged batches (not recorded by state, recorded but not landed)."""
    recorded = int(state.get("sink", {}).get("staged", 0))
    discarded = relanded = 0
    staging = cap.config.staging_dir
    if not staging.is_absolute():
        staging = cap.config_path.parent / staging
    # A batch killed before its rename is a temporary directory: never recorded either.
    for manifest in [*staging.glob("batch-*/manifest.json"), *staging.glob(".tmp-*/manifest.json")]:
        batch = json.loads(manifest.read_text(encoding="utf-8"))
        rows = sum(pq.read_metadata(manifest.parent / t["file"]).num_rows for t in batch["tables"])
        if batch["batch"] > recorded or manifest.parent.name.startswith(".tmp-"):
            discarded += rows
        else:
            relanded += rows
    return discarded, relanded


SELECTED = re.compile(r"chunk (\d+) of \S+: \d+ rows selected")


@pytest.mark.parametrize(("db", "sink", "point", "seed"), CASES)
def test_a_hard_crash_then_resume_converges(
    request: pytest.FixtureRequest, db: str, sink: str, point: str, seed: int
) -> None:
    started = time.monotonic()
    rng = random.Random(f"{db}/{sink}/{point}/{seed}")
    at = rng.randint(*MOMENTS[point, sink])
    src = source_named(request, db)
    extra: dict[str, Any] = {}
    if sink == "kafka":
        extra["kafka_bootstrap"] = request.getfixturevalue("kafka_bootstrap")
    if sink in TABLE_FORMATS:
        extra["sink_format"] = sink
    cap = src.capture(
        chunk_size=FAULT_CHUNK,
        sink="spark" if sink in TABLE_FORMATS else sink,
        state_config=f"checkpoint_interval_ms = {CHECKPOINT_MS}",
        **extra,
    )
    table = src.create(cap, "items", FAULT_ROWS)
    cap.init()
    writer = src.writer(cap, table, FAULT_ROWS, changes=None, seed=seed, rate=WRITER_RATE)
    with writer:
        wait_for(lambda: writer.total >= 50, "the writer to get going")
        cap.execute(qualified(cap, table.name))
        killed = subprocess.run(
            [*_cli(cap, "run", "--until-caught-up"), "-v"],
            cwd=REPO,
            env={**os.environ, "SNAPSHOTTER_FAULTS": f"{point}@{at}"},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        said = killed.stdout + killed.stderr
        assert f"fault {point}@{at}" in said, f"the fault was not reached:\n{said[-3000:]}"
        assert killed.returncode == -signal.SIGKILL, said[-3000:]
        state = _state(cap)
        saved = progress(cap, table.name)
        chunks_saved = int(saved.get("chunks", 0))
        selected = [int(n) for n in SELECTED.findall(said)]
        reread = max(0, max(selected, default=0) - chunks_saved)
        discarded = relanded = 0
        if sink == "jsonl":
            discarded = _jsonl_tail(cap, state)
        elif sink in ("spark", *TABLE_FORMATS):
            discarded, relanded = _staged(cap, state)
        resumed = subprocess.run(
            _cli(cap, "resume", "--until-caught-up"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
        time.sleep(0.5)  # the writer goes on after the resume
    assert cap.run(timeout=300) == 0  # the writer's last changes
    assert state_of(cap, table.name) == "done"
    repeated = 0
    if sink == "jsonl":
        verdict = cap.verify(table.name)
        assert verdict.ok, verdict.render()
        rows = verdict.table_rows
    elif sink == "kafka":
        verdict = assert_kafka_converged(cap, table.name, extra["kafka_bootstrap"])
        rows, repeated = verdict.table_rows, verdict.repeats
    else:
        landed = cap.verify_landed(table.name)
        assert landed.ok, landed.render()
        expected = cap.source_rows(table.name)
        assert cap.landed_rows(table.name) == expected
        rows = len(expected)
    cost = Cost(
        db,
        sink,
        point,
        at,
        seed,
        chunks_saved,
        reread,
        discarded,
        repeated,
        relanded,
        writer.total,
        rows,
        time.monotonic() - started,
    )
    print("\n" + cost.line())
    report = os.environ.get("SNAPSHOTTER_FAULT_REPORT")
    if report:
        with open(report, "a", encoding="utf-8") as out:
            out.write(json.dumps(asdict(cost)) + "\n")


def _bases(cap: Capture, table: str) -> set[str]:
    """The bases whose files are in ``current/`` (``base-<batch>.<file>``)."""
    (current,) = (cap.directory / "lake").glob(f"*.{table}/current")
    return {f.name.split(".", 1)[0] for f in current.glob("base-*")}


# CI: each point once, on one database each (the compaction is the sink's, whatever the
# source); SNAPSHOTTER_FAULT_MATRIX=full: both points on both.
COMPACTION_CASES = [
    pytest.param(db, point, id=f"{db}-{point}")
    for db in ("postgres", "mysql")
    for point in ("spark.compact.written", "spark.compact.named")
    if os.environ.get("SNAPSHOTTER_FAULT_MATRIX") == "full"
    or (db, point) in {("postgres", "spark.compact.written"), ("mysql", "spark.compact.named")}
]


@pytest.mark.parametrize(("db", "point"), COMPACTION_CASES)
def test_a_crash_inside_a_compaction_leaves_current_exact_after_the_next_run(
    request: pytest.FixtureRequest, db: str, point: str
) -> None:
    """Issue 26: SIGKILL inside a Parquet compaction, after the new base is written hidden
    (and before the metadata commits it) or after the metadata records it pending (and
    before its buckets are moved into place), then a resume with no new writes to the
    table: the resume lands nothing of it, and still removes what the crash left hidden or
    rolls the committed compaction forward, and folds the tail in, so plain readers of
    current/ (Spark, pyarrow, pandas) read the table, and verify says so."""
    src = source_named(request, db)
    cap = src.capture(chunk_size=500, sink="spark")
    table = src.create(cap, "items", 2000)
    cap.init()
    cap.execute(qualified(cap, table.name))
    assert cap.run(timeout=300) == 0  # the snapshot, appended to the base (no compaction)
    (base,) = _bases(cap, table.name)
    # Changes for the changelog tail: the next run's closing compaction folds them in.
    src.sql(cap, "UPDATE {s}.items SET name = 'changed' WHERE n % 10 = 0")
    src.sql(cap, "DELETE FROM {s}.items WHERE n % 20 = 1")
    killed = subprocess.run(
        [*_cli(cap, "run", "--until-caught-up"), "-v"],
        cwd=REPO,
        env={**os.environ, "SNAPSHOTTER_FAULTS": f"{point}@1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    said = killed.stdout + killed.stderr
    assert f"fault {point}@1" in said and killed.returncode == -signal.SIGKILL, said[-3000:]
    # Issue 27: the new base's buckets are written hidden; at the second point the metadata
    # records the compaction as pending (the commit), not yet in place: a plain reader still
    # reads the old base alone, never two.
    assert _bases(cap, table.name) == {base}
    (current,) = (cap.directory / "lake").glob(f"*.{table.name}/current")
    assert list(current.glob(".compacting-*")), "the new base is not written hidden"
    recorded = json.loads((current.parent / "_snapshotter.json").read_text())
    assert (recorded["pending"] is not None) == (point == "spark.compact.named"), recorded
    resumed = subprocess.run(
        _cli(cap, "resume", "--until-caught-up"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    expected = cap.source_rows(table.name)
    assert len(expected) == 1900
    for reader in ("spark", "pyarrow", "pyarrow.dataset", "pandas"):
        seen = cap.plain_landed_rows(table.name, reader)
        assert len(seen) == len(expected), f"{reader} reads {len(seen)} rows of current/"
        if reader != "pandas":  # its own value types: its keys are compared below
            assert seen == expected, f"{reader} reads other rows of current/"
    assert cap.landed_rows(table.name) == expected  # every plain reader, pandas's keys too
    (after,) = _bases(cap, table.name)
    meta = cap.lander().meta(cap.table_id(table.name))
    assert meta is not None and meta.tail_rows == 0 and meta.base_dir == after
    verdict = cap.verify_landed(table.name)
    assert verdict.ok, verdict.render()


@pytest.mark.parametrize(
    ("db", "point"),
    [("postgres", "sink.flush"), ("mysql", "window.close")]
    if os.environ.get("SNAPSHOTTER_FAULT_MATRIX") == "full"
    else [("mysql", "window.close")],
)
def test_a_hard_crash_with_the_confluent_kafka_client_then_resume_converges(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, db: str, point: str
) -> None:
    """The Kafka cases of the CI slice with ``[sink] client = "confluent"`` (the harness
    reads SNAPSHOTTER_KAFKA_CLIENT; the killed process inherits it too)."""
    pytest.importorskip("confluent_kafka")
    monkeypatch.setenv("SNAPSHOTTER_KAFKA_CLIENT", "confluent")
    test_a_hard_crash_then_resume_converges(request, db, "kafka", point, 1)


def test_a_binlog_stream_without_a_saved_position_resumes_where_it_began(
    request: pytest.FixtureRequest,
) -> None:
    """MySQL state without a binlog position (``init`` saves one; here it is removed): the
    first run streams from the binlog's end and saves that start before its first
    checkpoint, so a crash in that first checkpoint resumes from the start, not from a later
    end (which would skip the changes in between)."""
    src = source_named(request, "mysql")
    cap = src.capture(sink="jsonl")
    table = src.create(cap, "items", 0)
    cap.init()
    path = cap.directory / "state" / "state.json"
    state = json.loads(path.read_text(encoding="utf-8"))
    state["stream"]["resume"] = {}
    path.write_text(json.dumps(state), encoding="utf-8")
    run = subprocess.Popen(
        _cli(cap, "run"),  # until the fault
        cwd=REPO,
        # Saves: 1 the empty sink, 2 the stream's start, 3 the first checkpoint (killed).
        env={**os.environ, "SNAPSHOTTER_FAULTS": "state.write@3"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(3)  # the stream is open
        for key in (1, 2):
            src.sql(cap, f"INSERT INTO {{s}}.items VALUES ({key}, 1, 'after the start', 1)")
            time.sleep(1.5)
        stdout, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    said = stdout + stderr
    assert run.returncode == -signal.SIGKILL, said[-3000:]
    found = re.search(r"current end of the binlog, (\S+) at (\d+)", said)
    assert found, said[-3000:]
    assert _state(cap)["stream"]["resume"] == {"file": found[1], "pos": int(found[2])}
    assert cap.run(timeout=300) == 0
    verdict = cap.verify(table.name)
    assert verdict.ok, verdict.render()
    assert verdict.table_rows == 2
