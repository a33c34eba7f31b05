"""The Kafka sink end to end, against a plain read of the same table measured in the same run.

    python bench/kafka_bench.py [--rows N] [--source postgres|mysql|both] [--bootstrap H:P]
                                [--chunk-size C] [--read-back] [--pure-crc] [--profile]

One table of N rows (``bench.lib.inprocess``' table and loader: PostgreSQL, and with ``--source
mysql|both`` MySQL / MariaDB), measured in this process, per source:

A. the plain read into Arrow, ``bench.lib.inprocess``' baseline (psycopg with the engine's
   loaders, or pymysql with the dialect's Arrow types): **the baseline** of the ratio column;
B. snapshotter end to end with ``[sink] kind = "kafka"``, ``partitions = 3``: ``init``, the
   ``execute-snapshot`` signal, ``run_engine(until_caught_up=True)``, timed from the committed
   signal to ``run_engine``'s return (caught up: every checkpoint acknowledged by the broker,
   the producer flushed and closed). Then the topic's message count (end offsets minus
   beginning offsets, per partition) must equal N;
C. the same with ``schemas = true`` (every key and value wrapped as ``{"schema": ...,
   "payload": ...}``, Kafka Connect's JsonConverter: bigger messages);
D. where the time goes:
   D1. the engine into ``CountingSink`` (``bench.lib.inprocess``' row: no sink cost at all);
   D2. the engine into the kafka sink with its producer replaced by a counter: the sink's
       own work (key and envelope encoded to JSON bytes, its bookkeeping), no kafka-python;
   D3. kafka-python alone: one ``KafkaProducer`` with the sink's settings
       (``PRODUCER_DEFAULTS`` + ``PRODUCER_FIXED``: acks=all, enable_idempotence=True,
       linger_ms=20, batch_size=256 KiB) sending N pre-encoded messages in a loop, then
       ``flush()``; the messages are B's own, read back from B's topic (a sample from every
       partition, cycled, so the same sizes and the same spread over the partitions);
   D4. the same with C's messages;
   D5. (``--pure-crc``) D3 with kafka-python's own pure-Python CRC32C swapped in for the
       ``crc32c`` package's: what the producer manages without that dependency.

A D3–D5 whose sends fail (the broker refused them, or they expired) is reported as failed,
with the errors, and the run goes on; any other mismatch (B or C not leaving exactly N
messages, D1 or D2 not counting N) stops the run. Each result is also logged to stderr as
it is measured.

With ``--read-back`` it also reads B's whole topic back with ``kafka_read.read_topic`` (a
kafka-python consumer) and checks that it holds N distinct keys (a row of its own).
With ``--profile`` it runs B once more under cProfile (every thread: the engine's, the chunk
worker, kafka-python's sender) and prints the top functions per thread.

Every engine run gets its own topic prefix (``[source] name``), slot, publication and state
directory; topics are ``kbench-<run>-<source>-<what>.<schema>.items``. Every topic of the run
(prefix ``kbench-<run>``) is deleted at the end with ``KafkaAdminClient.delete_topics``, the
schema / database dropped, also after an error or Ctrl-C.

Results: markdown on stdout, progress on stderr. See bench/README.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # the bootstrap (bench/README.md): import bench.lib from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import contextlib
import cProfile
import itertools
import logging
import os
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.lib import inprocess as inproc
from bench.lib import mysql as mydb
from bench.lib.counting import CountingSink
from bench.lib.profiling import (
    per_thread,
)
from bench.lib.servers import mysql_url, package_version, pg_url
from bench.lib.stats import Result
from snapshotter.sinks.kafka.sink import PRODUCER_DEFAULTS, PRODUCER_FIXED, KafkaSink
from snapshotter.verify.kafka import read_topic

DEFAULT_BOOTSTRAP = "127.0.0.1:29092"
PARTITIONS = 3
SAMPLE_PER_PARTITION = 5000  # messages read back per partition for D3 / D4


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- results


@dataclass
class Row:
    what: str
    rows: int
    seconds: float
    source: str  # "postgres" or "mysql"
    kind: str  # "A" (the baseline), "B", "C", "D", "R"
    note: str = ""
    error: str = ""  # a D row that failed: why

    @property
    def rate(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def render_table(rows: Sequence[Row]) -> str:
    """One row per measurement; the ratio divides by A of the same source."""
    lines = [
        "| what | rows (messages) | seconds | rows/s | ratio to A |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        base = next((b for b in rows if b.kind == "A" and b.source == r.source), None)
        ratio = f"{r.rate / base.rate:.2f}" if base else "–"
        prefix = inproc.MYSQL_PREFIX if r.source == "mysql" else ""
        if r.error:
            lines.append(f"| {prefix}{r.what} | {r.rows:,} | – | – | failed (see below) |")
            continue
        lines.append(
            f"| {prefix}{r.what} | {r.rows:,} | {r.seconds:.2f} | {r.rate:,.0f} | {ratio} |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- kafka helpers


def servers(bootstrap: str) -> list[str]:
    return [s.strip() for s in bootstrap.split(",") if s.strip()]


def admin_client(bootstrap: str) -> Any:
    from kafka.admin import KafkaAdminClient

    return KafkaAdminClient(bootstrap_servers=servers(bootstrap), request_timeout_ms=30_000)


def check_broker(bootstrap: str) -> str:
    """Fail early, with a hint, when no broker answers; the broker's API version as
    kafka-python infers it."""
    from kafka.errors import KafkaError

    try:
        admin = admin_client(bootstrap)
    except KafkaError as exc:
        sys.exit(
            f"no Kafka broker at {bootstrap} ({type(exc).__name__}: {exc}): start one with "
            "scripts/services up kafka, or pass --bootstrap / SNAPSHOTTER_KAFKA_BOOTSTRAP"
        )
    try:
        version = admin._client.check_version()  # the client's own probe; (4, 3) etc.
    except Exception:
        version = None
    finally:
        admin.close()
    return ".".join(map(str, version)) if version else "?"


def crc_implementation() -> str:
    """Which CRC32C kafka-python checksums its record batches with: the ``crc32c`` package (C)
    when importable, else its own pure-Python loop (a few MB/s: often the producer's ceiling)."""
    from kafka.record import util

    if getattr(util, "crc32c_c", None) is not None:
        return "CRC32C from the `crc32c` package (C)"
    return "CRC32C in pure Python (kafka-python's own; the `crc32c` package is not installed)"


@contextlib.contextmanager
def pure_python_crc() -> Iterator[None]:
    """kafka-python's record batches checksummed by its own pure-Python CRC32C, as without
    the ``crc32c`` package (``default_records`` looks ``calc_crc32c`` up at each batch)."""
    from kafka.record import default_records
    from kafka.record._crc32c import crc

    saved = default_records.calc_crc32c
    default_records.calc_crc32c = lambda memview: crc(memview)
    try:
        yield
    finally:
        default_records.calc_crc32c = saved


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from kafka.admin import NewTopic

    admin = admin_client(bootstrap)
    try:
        admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            wait_for_metadata=True,
        )
    finally:
        admin.close()


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete every topic whose name starts with ``prefix``; report, never raise."""
    try:
        admin = admin_client(bootstrap)
    except Exception as exc:
        log(f"warning: cannot reach {bootstrap} to delete the topics {prefix}*: {exc}")
        return []
    try:
        names = sorted(t for t in admin.list_topics() if t.startswith(prefix))
        if names:
            admin.delete_topics(names, raise_errors=False)
        return names
    except Exception as exc:
        log(f"warning: deleting the topics {prefix}*: {exc}")
        return []
    finally:
        admin.close()


def consumer(bootstrap: str) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=servers(bootstrap), enable_auto_commit=False, group_id=None
    )


def topic_counts(bootstrap: str, topic: str) -> dict[int, int]:
    """Messages per partition: end offset − beginning offset (no transactions, so no control
    records: one offset per message)."""
    from kafka import TopicPartition

    c = consumer(bootstrap)
    try:
        numbers = c.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, n) for n in sorted(numbers)]
        end = c.end_offsets(tps)
        begin = c.beginning_offsets(tps)
        return {tp.partition: end[tp] - begin[tp] for tp in tps}
    finally:
        c.close()


Message = tuple[bytes | None, bytes | None]


def sample_topic(bootstrap: str, topic: str, per_partition: int) -> list[Message]:
    """Up to ``per_partition`` messages from the start of every partition, interleaved
    (partition 0's first, 1's first, ..., 0's second, ...): cycled, they keep the spread."""
    from kafka import TopicPartition

    counts = topic_counts(bootstrap, topic)
    want = {p: min(per_partition, n) for p, n in counts.items()}
    got: dict[int, list[Message]] = {p: [] for p in counts}
    c = consumer(bootstrap)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(counts)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        deadline = time.monotonic() + 120.0
        while any(len(got[p]) < want[p] for p in got):
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading a sample of {topic}: too slow")
            for tp, records in c.poll(timeout_ms=1000, max_records=10_000).items():
                room = want[tp.partition] - len(got[tp.partition])
                got[tp.partition] += [(r.key, r.value) for r in records[: max(room, 0)]]
    finally:
        c.close()
    lists = [got[p] for p in sorted(got)]
    return [m for group in itertools.zip_longest(*lists) for m in group if m is not None]


def sizes(messages: Sequence[Message]) -> tuple[float, float]:
    """Mean key and value bytes."""
    n = max(len(messages), 1)
    return (
        sum(len(k or b"") for k, _ in messages) / n,
        sum(len(v or b"") for _, v in messages) / n,
    )


# --------------------------------------------------------------------------- engine runs


@dataclass
class KafkaSettings:
    """A capture's kafka sink: topic prefix, brokers, partitions, schemas."""

    name: str = "bench"
    bootstrap: str = DEFAULT_BOOTSTRAP
    partitions: int = PARTITIONS
    schemas: bool = False

    def sink(self) -> str:
        """The ``[sink]`` section (``inprocess.Capture``'s ``sink``)."""
        return (
            f'[sink]\nkind = "kafka"\nbootstrap_servers = "{self.bootstrap}"\n'
            f"partitions = {self.partitions}\nschemas = {'true' if self.schemas else 'false'}\n"
            'client = "kafka-python"\n'  # what this bench measures; "auto" may pick confluent
        )


@dataclass
class _KafkaSinkMixin:
    """A capture (own slot/publication or server id, own state directory) with the kafka
    sink, its topic prefix the source's name."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)

    def __post_init__(self) -> None:
        self.sink, self.name = self.kafka.sink(), self.kafka.name
        super().__post_init__()  # type: ignore[misc]

    @property
    def topic(self) -> str:
        return f"{self.kafka.name}.{self.schema}.{inproc.TABLE}"  # type: ignore[attr-defined]


@dataclass
class KafkaCapture(_KafkaSinkMixin, inproc.Capture):
    """``inprocess.Capture`` with the kafka sink."""


@dataclass
class KafkaMySqlCapture(_KafkaSinkMixin, inproc.MySqlCapture):
    """``inprocess.MySqlCapture`` with the kafka sink."""


AnyKafkaCapture = KafkaCapture | KafkaMySqlCapture


@dataclass
class Sent:
    """What an engine run left on its topic."""

    row: Row
    sample: list[Message]


def engine_to_kafka(capture: AnyKafkaCapture, rows: int, what: str, kind: str, source: str) -> Sent:
    """Signal, ``run_engine(until_caught_up=True)`` with the configured kafka sink; then the
    topic must hold exactly ``rows`` messages."""
    code, seconds = capture.run_snapshot()
    if code != 0:
        raise RuntimeError(f"{what}: the engine exited {code}")
    bootstrap = capture.kafka.bootstrap
    counts = topic_counts(bootstrap, capture.topic)
    if sum(counts.values()) != rows or len(counts) != capture.kafka.partitions:
        raise RuntimeError(
            f"{what}: topic {capture.topic} holds {counts} messages per partition, "
            f"wanted {rows} in {capture.kafka.partitions} partitions"
        )
    sample = sample_topic(bootstrap, capture.topic, SAMPLE_PER_PARTITION)
    key_b, value_b = sizes(sample)
    spread = " / ".join(f"{counts[p]:,}" for p in sorted(counts))
    note = (
        f"topic holds {rows:,} messages ({spread} per partition); mean key {key_b:.0f} B, "
        f"value {value_b:.0f} B (about {rows * (key_b + value_b) / 1e6:,.0f} MB)"
    )
    return Sent(Row(what, rows, seconds, source, kind, note), sample)


class _Done:
    """A send future that is already acknowledged."""

    is_done = True
    exception = None

    def failed(self) -> bool:
        return False


_DONE = _Done()


class NullProducer:
    """Stands in for ``KafkaProducer``: counts what it is given."""

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0

    def send(
        self,
        topic: str,
        key: bytes | None = None,
        value: bytes | None = None,
        partition: int | None = None,
    ) -> _Done:
        self.messages += 1
        self.bytes += len(key or b"") + len(value or b"")
        return _DONE

    def flush(self, timeout: float | None = None) -> None:
        pass

    def close(self, timeout: float | None = None) -> None:
        pass


class EncodeOnlySink(KafkaSink):
    """The kafka sink's own work (topic lookup, key and envelope encoded to JSON bytes, a
    future kept per message, checkpoints) with its producer replaced by ``NullProducer`` and no
    topic created: the sink's cost without kafka-python or a broker. It leans on two private
    members of ``KafkaSink`` (``_producer``, ``_topics.ensure``): a bench, not an API."""

    def __init__(self, bootstrap: str, topic_prefix: str, key: Sequence[str]) -> None:
        super().__init__(
            bootstrap_servers=bootstrap,
            topic_prefix=topic_prefix,
            key_columns=lambda table: key,
            partitions=PARTITIONS,
        )
        self.null = NullProducer()
        self._topics.ensure = lambda name: PARTITIONS  # type: ignore[method-assign]

    def open(self, resume: Mapping[str, Any] | None) -> None:
        if not hasattr(self, "_producer"):
            raise RuntimeError("KafkaSink changed: no _producer to replace")
        from snapshotter.sinks.kafka.clients import KafkaPythonProducer

        self._producer = KafkaPythonProducer(self.null)  # kafka-python's send() API


def engine_encode_only(capture: inproc.Capture, rows: int, source: str) -> Row:
    what = "D2: snapshot → kafka sink's encoding only (producer stubbed, no kafka-python)"
    sink = EncodeOnlySink(DEFAULT_BOOTSTRAP, "encode-only", ("id",))
    code, seconds = capture.run_snapshot(sink)
    if code != 0 or sink.null.messages != rows:
        raise RuntimeError(f"{what}: exit {code}, {sink.null.messages} messages for {rows} rows")
    note = f"{sink.null.bytes / 1e6:,.0f} MB of keys and values encoded"
    return Row(what, rows, seconds, source, "D", note)


def engine_counting(capture: inproc.Capture, rows: int, source: str) -> Row:
    r = inproc.snapshot(capture, rows, CountingSink(), "counting")
    assert r.seconds is not None
    return Row(
        "D1: snapshot → counting sink (the engine, no sink cost)", rows, r.seconds, source, "D"
    )


def raw_producer(
    bootstrap: str,
    topic: str,
    messages: Sequence[Message],
    count: int,
    what: str,
    source: str,
    pure_crc: bool = False,
) -> Row:
    """kafka-python alone: ``count`` sends of pre-encoded messages (``messages`` cycled) with
    the sink's producer settings, then ``flush()``; timed from the first send (the producer
    is connected and the topic exists) to ``flush`` returned."""
    from kafka import KafkaProducer

    if not messages:
        raise RuntimeError(f"{what}: no messages to send")
    create_topic(bootstrap, topic, PARTITIONS)
    producer = KafkaProducer(
        bootstrap_servers=servers(bootstrap), **PRODUCER_DEFAULTS, **PRODUCER_FIXED
    )
    crc = pure_python_crc() if pure_crc else contextlib.nullcontext()
    try:
        send = producer.send
        futures: list[Any] = []
        append = futures.append
        with crc:
            started = time.perf_counter()
            for key, value in itertools.islice(itertools.cycle(messages), count):
                append(send(topic, key=key, value=value))
            producer.flush()
            seconds = time.perf_counter() - started
    finally:
        producer.close(timeout=30)
    failed = Counter(
        f"{type(f.exception).__name__}: {str(f.exception)[:120]}" for f in futures if f.failed()
    )
    counts = topic_counts(bootstrap, topic)
    if failed or sum(counts.values()) != count:
        raise RuntimeError(
            f"{what}: {sum(failed.values())} sends failed ({dict(failed.most_common(3))}) "
            f"after {seconds:.1f} s; topic holds {counts}"
        )
    key_b, value_b = sizes(messages)
    note = (
        f"{len(messages):,} distinct messages cycled; mean key {key_b:.0f} B, value {value_b:.0f} B"
    )
    return Row(what, count, seconds, source, "D", note)


def read_back(bootstrap: str, topic: str, rows: int, source: str) -> Row:
    """B's whole topic through ``kafka_read.read_topic``: N messages, N distinct keys."""
    what = "R: read B's topic back (kafka_read.read_topic, a kafka-python consumer)"
    started = time.perf_counter()
    keys = set()
    count = 0
    for message in read_topic(bootstrap, topic):
        keys.add(message.key)
        count += 1
    seconds = time.perf_counter() - started
    if count != rows or len(keys) != rows:
        raise RuntimeError(f"{what}: {count} messages, {len(keys)} distinct keys, for {rows}")
    return Row(what, rows, seconds, source, "R", f"{rows:,} messages, {rows:,} distinct keys")


def profiled(capture: AnyKafkaCapture, rows: int, top: int, source: str) -> str:
    """B once more under cProfile in every thread; the top entries per thread."""
    profiles: dict[str, cProfile.Profile] = {}
    code, seconds = capture.run_snapshot(profiles=profiles)
    counts = topic_counts(capture.kafka.bootstrap, capture.topic)
    if code != 0 or sum(counts.values()) != rows:
        raise RuntimeError(f"profiled run: exit {code}, topic holds {counts}")
    prefix = inproc.MYSQL_PREFIX if source == "mysql" else ""
    out = [
        f"### {prefix}cProfile: snapshot → kafka sink, {rows:,} rows, {seconds:.2f} s under "
        f"the profiler ({rows / seconds:,.0f} rows/s); top {top} by cumulative time per thread"
    ]
    return "\n".join(out + per_thread(profiles, top))


# --------------------------------------------------------------------------- per source


@dataclass
class Measured:
    rows: list[Row]
    machine: list[str]
    profile: str = ""


def measure(
    args: argparse.Namespace,
    source: str,
    prefix: str,
    baseline: Callable[[], Result],
    new_capture: Callable[[str, KafkaSettings | None], inproc.Capture],
) -> tuple[list[Row], str]:
    """A, B, C, D1–D4 (and R, the profile) for one loaded table."""
    rows: list[Row] = []
    tag = "pg" if source == "postgres" else "my"
    n = args.rows

    def settings(what: str, schemas: bool) -> KafkaSettings:
        return KafkaSettings(f"{prefix}-{tag}-{what}", args.bootstrap, PARTITIONS, schemas)

    def kafka_capture(what: str, schemas: bool) -> AnyKafkaCapture:
        c = new_capture(what, settings(what, schemas))
        assert isinstance(c, KafkaCapture | KafkaMySqlCapture)
        return c

    def add(row: Row) -> Row:
        rows.append(row)
        done = f"failed: {row.error}" if row.error else f"{row.seconds:.2f} s, {row.rate:,.0f}/s"
        log(f"{source}:   {row.what.split(':')[0]}: {done}")
        return row

    log(f"{source}: A, plain read ...")
    a = baseline()
    assert a.rows is not None and a.seconds is not None
    add(Row("A: " + a.what.removeprefix(inproc.MYSQL_PREFIX), a.rows, a.seconds, source, "A"))

    log(f"{source}: B, snapshot → kafka sink ...")
    b_capture = kafka_capture("b", False)
    b = engine_to_kafka(
        b_capture, n, f"B: snapshot → kafka sink ({PARTITIONS} partitions)", "B", source
    )
    b_capture.drop()
    add(b.row)
    log(f"{source}: C, snapshot → kafka sink, schemas = true ...")
    c_capture = kafka_capture("c", True)
    c = engine_to_kafka(c_capture, n, "C: the same, schemas = true", "C", source)
    c_capture.drop()
    add(c.row)
    log(f"{source}: D1, snapshot → counting sink ...")
    d_capture = new_capture("d1", None)
    add(engine_counting(d_capture, n, source))
    d_capture.drop()
    log(f"{source}: D2, snapshot → kafka sink's encoding only ...")
    d_capture = new_capture("d2", None)
    add(engine_encode_only(d_capture, n, source))
    d_capture.drop()
    raw = [("d3", "B", b, False), ("d4", "C", c, False)]
    if args.pure_crc:
        raw.append(("d5", "B", b, True))
    for name, label, sent, pure in raw:
        what = f"{name.upper()}: kafka-python producer alone, {label}'s messages pre-encoded"
        if pure:
            what += ", pure-Python CRC32C (as without the crc32c package)"
        log(f"{source}: {what} ...")
        topic = f"{prefix}-{tag}-{name}.raw"
        try:
            add(raw_producer(args.bootstrap, topic, sent.sample, n, what, source, pure))
        except RuntimeError as exc:  # a failed send: reported in the table, the run goes on
            add(Row(what, n, float("nan"), source, "D", error=str(exc).removeprefix(what + ": ")))
    if args.read_back:
        log(f"{source}: reading B's topic back ...")
        add(read_back(args.bootstrap, b_capture.topic, n, source))
    profile = ""
    if args.profile:
        log(f"{source}: B under cProfile ...")
        p_capture = kafka_capture("profile", False)
        profile = profiled(p_capture, n, args.profile_top, source)
        p_capture.drop()
    return rows, profile


def measure_postgres(args: argparse.Namespace, prefix: str, chunk: int, tmp: Path) -> Measured:
    url = pg_url(args.url)
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    captures: list[inproc.Capture] = []

    def new_capture(name: str, kafka: KafkaSettings | None) -> inproc.Capture:
        directory = tmp / f"pg-{name}"
        c: inproc.Capture
        if kafka is None:
            c = inproc.Capture(url, schema, directory, chunk)
        else:
            c = KafkaCapture(url, schema, directory, chunk, kafka=kafka)
        captures.append(c)
        return c

    try:
        log(f"postgres: loading {args.rows:,} rows into {schema}.{inproc.TABLE} ...")
        load_s = inproc.load_table(url, schema, args.rows)
        log(f"postgres: loaded in {load_s:.1f} s")
        rows, profile = measure(
            args, "postgres", prefix, lambda: inproc.plain_read(url, schema), new_capture
        )
    finally:
        inproc.cleanup(url, schema, captures)
    return Measured(rows, inproc.machine(url), profile)


def measure_mysql(args: argparse.Namespace, prefix: str, chunk: int, tmp: Path) -> Measured:
    server = mysql_url(args.mysql_url)
    database = f"bench_{uuid.uuid4().hex[:10]}"
    url = mydb.with_database(server, database)

    def new_capture(name: str, kafka: KafkaSettings | None) -> inproc.Capture:
        directory = tmp / f"my-{name}"
        if kafka is None:
            return inproc.MySqlCapture(url, database, directory, chunk)
        return KafkaMySqlCapture(url, database, directory, chunk, kafka=kafka)

    mydb.create_database(server, database)
    try:
        log(f"mysql: loading {args.rows:,} rows into {database}.{inproc.TABLE} ...")
        load_s = mydb.load_items(server, database, args.rows)
        log(f"mysql: loaded in {load_s:.1f} s")
        rows, profile = measure(
            args, "mysql", prefix, lambda: inproc.mysql_plain_read(url, database), new_capture
        )
    finally:
        mydb.drop_database(server, database)
    return Measured(rows, inproc.mysql_machine(server), profile)


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="table rows (1,000,000)")
    parser.add_argument(
        "--source",
        choices=("postgres", "mysql", "both"),
        default="postgres",
        help="which source(s) to measure (postgres)",
    )
    parser.add_argument("--url", help="PostgreSQL URL (default: $SNAPSHOTTER_PG_URL or services)")
    parser.add_argument(
        "--mysql-url", help="MySQL URL (default: $SNAPSHOTTER_MYSQL_URL or services)"
    )
    parser.add_argument(
        "--bootstrap",
        default=os.environ.get("SNAPSHOTTER_KAFKA_BOOTSTRAP") or DEFAULT_BOOTSTRAP,
        help=f"Kafka brokers (default: $SNAPSHOTTER_KAFKA_BOOTSTRAP, else {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        help=f"engine chunk size (default: the config's default, {inproc.DEFAULT_CHUNK_SIZE})",
    )
    parser.add_argument(
        "--read-back",
        action="store_true",
        help="also read B's whole topic back with kafka_read.read_topic (timed, checked)",
    )
    parser.add_argument(
        "--pure-crc",
        action="store_true",
        help="also D5: D3 with kafka-python's pure-Python CRC32C (as without the crc32c package)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="afterwards, run B once more under cProfile"
    )
    parser.add_argument("--profile-top", type=int, default=15, help="entries per thread (15)")
    args = parser.parse_args(argv)
    if args.rows < 1 or (args.chunk_size is not None and args.chunk_size < 1):
        parser.error("--rows and --chunk-size must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # mysql-replication warns on every reconnect, closing the binlog stream included.
    logging.getLogger("pymysqlreplication").setLevel(logging.ERROR)
    chunk = args.chunk_size or inproc.DEFAULT_CHUNK_SIZE
    broker = check_broker(args.bootstrap)
    prefix = f"kbench-{uuid.uuid4().hex[:8]}"
    parts: list[Measured] = []
    load = os.getloadavg()
    started = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="snapshotter-kafka-bench-") as tmp:
            if args.source in ("postgres", "both"):
                parts.append(measure_postgres(args, prefix, chunk, Path(tmp)))
            if args.source in ("mysql", "both"):
                parts.append(measure_mysql(args, prefix, chunk, Path(tmp)))
    finally:
        deleted = delete_topics(args.bootstrap, prefix)
        log(f"deleted {len(deleted)} topics {prefix}*")
    wall = time.perf_counter() - started

    rows = [r for part in parts for r in part.rows]
    print(f"## kafka sink bench: {args.rows:,} rows, chunk size {chunk}\n")
    lines = [line for part in parts for line in part.machine]
    lines.append(
        f"- kafka-python {package_version('kafka-python')}, broker {args.bootstrap} "
        f"(API version {broker} as kafka-python infers it), {crc_implementation()}; topics of "
        f"{PARTITIONS} partitions, replication 1; producer: "
        + ", ".join(f"{k}={v}" for k, v in {**PRODUCER_DEFAULTS, **PRODUCER_FIXED}.items())
    )
    end = os.getloadavg()
    lines.append(
        f"- load average (1 min) {load[0]:.2f} at the start, {end[0]:.2f} at the end; "
        f"the run took {wall / 60:.1f} min"
    )
    print("\n".join(dict.fromkeys(lines)))  # the machine and Python lines once
    print()
    print(render_table(rows))
    notes = [
        f"- {inproc.MYSQL_PREFIX if r.source == 'mysql' else ''}{r.what.split(':')[0]}: {r.note}"
        for r in rows
        if r.note
    ] + [
        f"- {inproc.MYSQL_PREFIX if r.source == 'mysql' else ''}{r.what.split(':')[0]} failed: "
        f"{r.error}"
        for r in rows
        if r.error
    ]
    if notes:
        print()
        print("\n".join(notes))
    for part in parts:
        if part.profile:
            print()
            print(part.profile)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
