"""The end-to-end bench's pure parts (bench/lib): statistics, config text, --set, the report's
ratios and latency phases, the timing proxy the engine's sink is wrapped in, and the counting
sink."""

from __future__ import annotations

import json
import math
import os
import time
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.lib import report
from bench.lib.child import Channel, TimedSink
from bench.lib.configs import apply_settings, parse_setting, toml_text
from bench.lib.counting import CountingSink
from bench.lib.runs import EngineRun
from bench.lib.stats import percentile
from bench.lib.tables import PlainRead
from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, Source
from snapshotter.core.position import Position
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.base import Ack, SinkItem

TABLE = TableId("s", "items")
TICKER = TableId("s", "ticker")
SINKS = ("counting", "jsonl", "spark", "kafka")


# --------------------------------------------------------------------------- statistics


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1))
def test_percentile_is_a_value_and_ordered(values: list[float]) -> None:
    p50, p99, p100 = (percentile(values, q) for q in (50, 99, 100))
    assert p50 in values and p99 in values
    assert p50 <= p99 <= p100 == max(values)


def test_percentile_nearest_rank() -> None:
    assert percentile(range(1, 101), 99) == 99
    assert percentile([5.0], 50) == 5.0
    assert math.isnan(percentile([], 50))


# --------------------------------------------------------------------------- config text

toml_scalars = (
    st.text(max_size=20)
    | st.integers(-(2**62), 2**62)
    | st.booleans()
    | st.floats(allow_nan=False, allow_infinity=False)
)
keys = st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True)


@given(
    st.dictionaries(
        keys,
        st.dictionaries(
            keys,
            toml_scalars
            | st.lists(st.text(max_size=10), max_size=3)
            | st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
            max_size=5,
        ),
        max_size=4,
    )
)
def test_toml_text_reads_back(sections: dict[str, dict[str, Any]]) -> None:
    assert tomllib.loads(toml_text(sections)) == sections


def test_parse_setting() -> None:
    s = parse_setting("source.read_parallelism=2", SINKS)
    assert (s.sink, s.section, s.key, s.value) == (None, "source", "read_parallelism", 2)
    s = parse_setting('kafka:sink.client="confluent"', SINKS)
    assert (s.sink, s.section, s.key, s.value) == ("kafka", "sink", "client", "confluent")
    s = parse_setting("kafka:sink.client=confluent", SINKS)  # a bare word: a string
    assert s.value == "confluent"
    s = parse_setting('spark:spark.conf={ "spark.driver.memory" = "2g" }', SINKS)
    assert s.value == {"spark.driver.memory": "2g"}
    for bad in ("source.x", "nope:source.x=1", "sourcex=1", "=1", "source.=1"):
        with pytest.raises(ValueError):
            parse_setting(bad, SINKS)


def test_apply_settings_for_all_or_one_sink() -> None:
    settings = [
        parse_setting("source.chunk_size=100", SINKS),
        parse_setting("kafka:sink.partitions=3", SINKS),
    ]
    sections: dict[str, dict[str, Any]] = {"source": {"kind": "postgres"}, "sink": {}}
    apply_settings(sections, settings, "jsonl")
    assert sections == {"source": {"kind": "postgres", "chunk_size": 100}, "sink": {}}
    apply_settings(sections, settings, "kafka")
    assert sections["sink"] == {"partitions": 3}


# --------------------------------------------------------------------------- report


def run(sink: str, seconds: float, round_no: int, **kw: Any) -> EngineRun:
    fields: dict[str, Any] = {
        "source": "postgres",
        "sink": sink,
        "rows": 1000,
        "seconds": seconds,
        "marks": {},
        "session_s": None,
        "engine_cpu_s": 1.0,
        "below_cpu_s": 0.0,
        "engine_rss_mb": 100.0,
        "below_rss_mb": 0.0,
        "exit_rss_mb": 100.0,
        "progress": [],
        "round": round_no,
    }
    return EngineRun(**{**fields, **kw})


def test_summary_ratios_are_per_round_then_median() -> None:
    res = report.SourceResults("postgres", 1000, 0.1)
    # A: 1000 rows/s in round 0, 2000 in round 1, 4000 in round 2.
    res.plain = [PlainRead(1000, s, 0.0, 0.0, "r", 1.0) for s in (1.0, 0.5, 0.25)]
    # Counting: always half of that round's A, though its own rate varies 4x.
    res.runs = [run("counting", s, i) for i, s in enumerate((2.0, 1.0, 0.5))]
    res.runs += [run("spark", 4.0, i, session_s=6.0) for i in range(3)]
    lines = {x.what: x for x in report.summary(res, ["counting", "spark"])}
    a = lines["A: plain read → pyarrow Parquet"]
    assert a.rate == 2000 and a.ratio == 1.0
    counting = lines[report.SINK_NAMES["counting"]]
    assert counting.ratio == 0.5 and counting.rate == 1000
    with_session = lines[report.SPARK_WITH_SESSION]
    assert with_session.seconds == 10.0 and with_session.rate == 100


def test_latency_phases_by_send_time() -> None:
    r = run("spark", 5.0, 0, marks={"last_read_handed": 4.0}, idle_s=2.0)
    # (sent, returned, arrived), seconds after the signal
    r.ticks = [(-2.5, -2.4, -2.3), (-1.0, -0.999, -0.998), (0.5, 0.501, 0.6), (3.9, 3.91, 4.2)]
    r.ticks.append((4.5, 4.51, 4.52))
    idle, during = report.latency(r)
    assert idle.ticks == 1 and idle.p50 == pytest.approx(2.0)  # the first: warm-up, left out
    assert during.ticks == 2  # the tick sent after the last READ row is in neither phase
    assert during.p50 == pytest.approx(100.0) and during.max == pytest.approx(300.0)


def test_quarter_rates() -> None:
    r = run("counting", 4.0, 0, rows=400)
    # 100 rows/s over the first quarter, 50 rows/s over the last
    r.progress = [(0.0, 20), (0.5, 70), (1.0, 120), (2.0, 220), (3.0, 320), (4.0, 400)]
    first, last = report.quarter_rates(r)
    assert first == pytest.approx(100.0) and last == pytest.approx(80 / 1.0)


def test_json_has_no_nan() -> None:
    text = json.dumps(report.to_json({"a": [math.nan, 1.0], "b": run("counting", 1.0, 0)}))
    assert "NaN" not in text and json.loads(text)["a"] == [None, 1.0]


# --------------------------------------------------------------------------- TimedSink


class FakeSink:
    """Acknowledges every checkpoint at once; with ``staged``, like the Spark sink: the ack
    says which batch is staged, and ``landed`` grows when the test lands them."""

    def __init__(self, staged: bool = False) -> None:
        self.items: list[SinkItem] = []
        self.next_id = 0
        self.acks: list[Ack] = []
        self.staged = staged
        self.landed: list[Any] = []

    def open(self, resume: Mapping[str, Any] | None) -> None:
        pass

    def write(self, items: Sequence[SinkItem]) -> None:
        self.items.extend(items)

    def checkpoint(self) -> int:
        self.next_id += 1
        resume = {"staged": self.next_id} if self.staged else {"n": len(self.items)}
        self.acks.append(Ack(self.next_id, resume))
        return self.next_id

    def acknowledged(self) -> list[Ack]:
        acks, self.acks = self.acks, []
        return acks

    def close(self) -> None:
        pass


class Landed:
    def __init__(self, batches: tuple[int, ...]) -> None:
        self.batches = batches
        self.rows = 0


def read_batch(n: int) -> ReadBatch:
    rows = pa.table({"id": pa.array(range(n), pa.int64())})
    return ReadBatch("w", TABLE, ("id",), rows, Position(1, 2), n, None, False)


def tick(seq: int) -> ChangeEvent:
    source = Source("postgresql", "t", "db", TICKER, Position(3), 0)
    return ChangeEvent(Op.UPDATE, source, 0, (seq % 8,), after={"slot": seq % 8, "seq": seq})


def messages(read_fd: int) -> list[dict[str, Any]]:
    with os.fdopen(read_fd, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def timed(inner: FakeSink, rows: int) -> tuple[TimedSink, Channel, int]:
    read_fd, write_fd = os.pipe()
    chan = Channel(write_fd)
    return TimedSink(inner, chan, TABLE, TICKER, rows), chan, read_fd


def test_timed_sink_acknowledges_the_last_read_row_and_hides_its_own_checkpoint() -> None:
    inner = FakeSink()
    sink, chan, read_fd = timed(inner, rows=30)
    sink.write([read_batch(10), tick(1)])
    engine_checkpoint = sink.checkpoint()
    sink.write([read_batch(20)])  # the last READ rows: the bench's own checkpoint, acked
    assert [a.checkpoint for a in sink.acknowledged()] == [engine_checkpoint]
    assert sink.acknowledged() == []
    assert len(inner.items) == 3  # every item passed on, in order
    chan._file.close()
    got = messages(read_fd)
    assert [m["ev"] for m in got] == ["ticks", "done"]
    assert got[0]["seqs"] == [1]
    done = got[1]
    assert done["read_rows"] == 30 and [n for _, n in done["progress"]] == [10, 30]
    assert set(done["marks"]) >= {"first_read", "last_read_handed", "acked"}


def test_timed_sink_waits_for_the_landing_of_the_staged_batch() -> None:
    inner = FakeSink(staged=True)
    sink, chan, read_fd = timed(inner, rows=5)
    sink.checkpoint()  # batch 1: an earlier one
    sink.write([read_batch(5)])  # the bench's checkpoint stages batch 2
    inner.landed.append(Landed((1,)))  # not yet
    time.sleep(0.05)
    assert "landed" not in sink.marks
    inner.landed.append(Landed((2, 3)))
    deadline = time.monotonic() + 5
    while "landed" not in sink.marks and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sink.marks["landed"] >= sink.marks["acked"]
    sink.close()
    chan._file.close()
    assert [m["ev"] for m in messages(read_fd)] == ["done"]


# --------------------------------------------------------------------------- CountingSink


def test_counting_sink_counts_per_op_and_acks_at_once() -> None:
    sink = CountingSink()
    sink.open(None)
    sink.write([read_batch(2), tick(1)])  # a READ batch counts its rows
    source = Source("postgresql", "t", "db", TABLE, Position(4), 0)
    sink.write([ChangeEvent(Op.DELETE, source, 0, (1,), before={"id": 1})])
    cp = sink.checkpoint()
    assert [a.checkpoint for a in sink.acknowledged()] == [cp]
    assert sink.counts == {Op.READ: 2, Op.UPDATE: 1, Op.DELETE: 1}
    assert sink.total == 4
    sink.close()
    assert len(sink.acknowledged()) == 1
