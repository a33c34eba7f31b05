"""Wiring: build the engine for a config (the source's dialect and log reader, sink, state)
and run it until a signal asks it to stop. The CLI's ``run`` and ``resume`` use this; tests
use it to run an engine in a thread with phase hooks."""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from signals.names import TableId, parse_table_selector
from snapshotter.chunk_worker import PhaseHooks
from snapshotter.config import Config
from snapshotter.connect import sqlalchemy_url
from snapshotter.core.state import EngineState
from snapshotter.engine import Engine
from snapshotter.sinks.base import Sink
from snapshotter.sinks.jsonl import JsonlSink
from snapshotter.sources.base import Dialect
from snapshotter.sources.log import LogReader
from snapshotter.sources.postgres.decoder import PgOutputDecoder
from snapshotter.sources.postgres.dialect import PostgresDialect
from snapshotter.sources.postgres.reader import PgLogReader
from snapshotter.state_store import StateStore

STATE_FILE = "state.json"

log = logging.getLogger(__name__)


def state_path(config: Config) -> Path:
    return config.state.dir / STATE_FILE


def libpq_url(config: Config) -> str:
    """The source URL as libpq (psycopg) takes it."""
    url = sa.make_url(config.source.url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def build_engine(
    config: Config,
    *,
    hooks: PhaseHooks | None = None,
    sink: Sink | None = None,
    on_progress: Callable[[EngineState], None] | None = None,
    store: StateStore | None = None,
) -> tuple[Engine, StateStore]:
    """The engine for ``config``; it loads state from ``store`` at once, so pass a store
    whose lock is held (``run_engine`` does) unless only inspecting."""
    source = config.source
    dialect = open_dialect(config)
    store = store or StateStore(state_path(config))
    holder: list[Engine] = []

    def key_names(table: TableId) -> Sequence[str]:
        return holder[0].key_names(table)

    open_reader = (
        _binlog_reader_opener(config, dialect)
        if source.kind == "mysql"
        else _pg_reader_opener(config, dialect)
    )
    engine = Engine(
        config=config,
        dialect=dialect,
        open_reader=open_reader,
        sink=sink or open_sink(config, dialect, key_names),
        store=store,
        hooks=hooks,
        on_progress=on_progress,
        # One more dialect (connection, statement guard) per extra chunk worker.
        open_dialect=lambda: open_dialect(config),
    )
    holder.append(engine)
    return engine, store


def open_sink(
    config: Config, dialect: Dialect, key_names: Callable[[TableId], Sequence[str]]
) -> Sink:
    """The configured sink (``[sink] kind``)."""
    if config.sink.kind == "spark":
        from snapshotter.sinks.spark import SparkSink

        return SparkSink.from_config(config, describe=dialect.describe, key_columns=key_names)
    if config.sink.kind == "kafka":
        from snapshotter.sinks.kafka import KafkaSink

        sink = config.sink
        return KafkaSink(
            bootstrap_servers=sink.bootstrap_servers,
            topic_prefix=config.source.topic_prefix,
            key_columns=key_names,
            describe=dialect.describe,
            partitions=sink.partitions,
            replication=sink.replication,
            schemas=sink.schemas,
            json_as_text=sink.json_as_text,
            settings=sink.kafka,
            max_unflushed_bytes=sink.max_unacked_mb * 1024 * 1024,
            client=sink.client,
        )
    return JsonlSink(config.sink.local_path, config.source.topic_prefix, key_columns=key_names)


def open_dialect(config: Config) -> Dialect:
    """The dialect of the configured source (close it when done)."""
    source = config.source
    if source.kind == "mysql":
        from snapshotter.sources.mysql.dialect import MySqlDialect

        return MySqlDialect(
            source.url,
            signal_table=source.signal_table_id,
            chunk_timeout_s=source.chunk_timeout_s,
        )
    return PostgresDialect(
        sqlalchemy_url(source),
        signal_table=source.signal_table_id,
        publication=source.publication,
        chunk_timeout_s=source.chunk_timeout_s,
    )


def binlog_server_id(config: Config) -> int:
    """The configured replication client id, or a random one in 5400..6399 (Debezium's
    habit) when unset."""
    chosen = config.source.server_id
    return chosen if chosen is not None else random.randrange(5400, 6400)


def _binlog_reader_opener(
    config: Config, dialect: Dialect
) -> Callable[[Mapping[str, Any], Callable[[TableId], Sequence[str] | None]], LogReader]:
    from snapshotter.sources.mysql.decoder import BinlogDecoder
    from snapshotter.sources.mysql.dialect import MySqlDialect
    from snapshotter.sources.mysql.reader import BinlogLogReader
    from snapshotter.stream_position import check_before_streaming

    assert isinstance(dialect, MySqlDialect)
    source = config.source
    # Before anything opens: a saved binlog position the server no longer has is an error
    # that says what to do, never a silent start elsewhere.
    check_before_streaming(config, dialect, state_path(config))
    selectors = [
        s.with_default_schema(source.default_schema) if isinstance(s, TableId) else s
        for s in map(parse_table_selector, source.tables)
    ]
    signal_table = source.signal_table_id

    def captured(table: TableId) -> bool:
        return table == signal_table or any(
            s == table if isinstance(s, TableId) else s.matches(table) for s in selectors
        )

    def open_reader(
        resume: Mapping[str, Any], key_columns: Callable[[TableId], Sequence[str] | None]
    ) -> LogReader:
        start = dict(resume)
        if not start.get("file"):
            start = dict(dialect.binlog_start())
            log.warning(
                "no saved binlog position (snapshotter init records one): streaming from "
                "the current end of the binlog, %s at %s",
                start["file"],
                start["pos"],
            )
        decoder = BinlogDecoder(
            source.topic_prefix,
            captured=captured,
            key_columns=key_columns,
            column_types=dialect.catalog_types,
        )
        return BinlogLogReader(
            dialect.connect_args(),
            server_id=binlog_server_id(config),
            decoder=decoder,
            start=start,
        )

    return open_reader


def _pg_reader_opener(
    config: Config, dialect: Dialect
) -> Callable[[Mapping[str, Any], Callable[[TableId], Sequence[str] | None]], LogReader]:
    from snapshotter.stream_position import check_before_streaming

    source = config.source
    # Before anything opens: PostgreSQL would start a dropped-and-recreated or moved-on slot
    # at its own position, skipping changes without a word; a lost slot is no better.
    check_before_streaming(config, dialect, state_path(config))

    def open_reader(
        resume: Mapping[str, Any], key_columns: Callable[[TableId], Sequence[str] | None]
    ) -> LogReader:
        decoder = PgOutputDecoder(
            name=source.topic_prefix, database=dialect.database, key_columns=key_columns
        )
        return PgLogReader(
            libpq_url(config),
            slot=source.slot,
            publication=source.publication,
            decoder=decoder,
            start_lsn=int(resume.get("lsn", 0)),
        )

    return open_reader


class StopFlag:
    """Set by SIGINT/SIGTERM (or by a test); the engine checks it between reads."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def __call__(self) -> bool:
        return self._event.is_set()

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: self._event.set())


def run_engine(
    config: Config,
    *,
    until_caught_up: bool = False,
    stop: StopFlag | None = None,
    hooks: PhaseHooks | None = None,
    sink: Sink | None = None,
    on_progress: Callable[[EngineState], None] | None = None,
) -> int:
    """Lock the state directory, then stream; returns the engine's exit code."""
    config.state.dir.mkdir(parents=True, exist_ok=True)
    # Lock first, then load state: state read before another engine's last save would
    # restart the sink and the slot from different points.
    with StateStore(state_path(config)) as store:
        engine, _ = build_engine(
            config, hooks=hooks, sink=sink, on_progress=on_progress, store=store
        )
        return engine.run(until_caught_up=until_caught_up, should_stop=stop)
