"""Running the real engine against the test server: config, init, signals, run, verify.

One ``Capture`` per test: its own schema, signal table, publication, slot, sink file and
state directory, so tests never see each other's events. The engine runs in a thread, the
way ``snapshotter run`` runs it (same ``run_engine``), with optional phase hooks.
"""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.app.cli import main as cli_main
from snapshotter.app.runner import StopFlag, run_engine
from snapshotter.config import Config, load_config
from snapshotter.engine.workers import PhaseHooks
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.verify.convergence import check_table
from snapshotter.verify.rows import Verdict

PREFIX = "test"
SPARK_MASTER = "local[2]"


def mysql_connect(url: str, **kwargs: Any) -> pymysql.connections.Connection[Any]:
    """A pymysql connection (autocommit, utf8mb4, UTC session) to a mysql:// URL."""
    parsed = sa.make_url(url)
    conn = pymysql.connect(
        host=parsed.host or "127.0.0.1",
        port=parsed.port or 3306,
        user=parsed.username or "",
        password=parsed.password or "",
        database=parsed.database,
        charset="utf8mb4",
        autocommit=True,
        **kwargs,
    )
    with conn.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
    return conn


@dataclass
class EngineThread:
    thread: threading.Thread
    stop_flag: StopFlag
    result: dict[str, Any] = field(default_factory=dict)

    def stop(self, timeout: float = 120.0) -> int:
        self.stop_flag.set()
        return self.join(timeout)

    def join(self, timeout: float = 120.0) -> int:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.stop_flag.set()
            self.thread.join(30)
            raise AssertionError(f"the engine did not finish within {timeout} s")
        if "error" in self.result:
            raise self.result["error"]
        code: int = self.result["code"]
        return code


@dataclass
class Capture:
    url: str
    schema: str
    directory: Path
    chunk_size: int = 500
    extra_config: str = ""  # more [source] settings
    state_config: str = ""  # more [state] settings
    tables: Sequence[str] = ()
    # or "mysql" (MariaDB here; MySQL 8 with docker compose), or "spanner" (the emulator; the
    # change stream and emulator_host in extra_config)
    kind: str = "postgres"
    sink: str = "jsonl"  # or "spark": staged Parquet landed by Spark (local mode) into "lake"
    sink_format: str = "parquet"  # spark: or "delta", "iceberg"
    kafka_partitions: int = 3  # kafka: several, so per-key order across partitions is tested
    kafka_schemas: bool = False  # kafka: JsonConverter-style {"schema", "payload"} messages
    kafka_bootstrap: str = ""  # kafka: unset, SNAPSHOTTER_KAFKA_BOOTSTRAP (scripts/test)
    kafka_settings: str = ""  # kafka: a TOML inline table of the client's settings
    # kafka: "kafka-python" or "confluent"; unset, SNAPSHOTTER_KAFKA_CLIENT or kafka-python
    # (so the whole Kafka suite can run against either client)
    kafka_client: str = ""
    # spark: where Spark runs: a master URL (local[2] by default, or spark://...: the
    # standalone cluster of scripts/services up spark) or a Spark Connect URL (sc://...)
    spark: str = ""
    executors: int = 0  # [snapshot] executors: chunks read on Spark executors (spark sink)
    sink_config: str = ""  # spark: more [sink] settings

    def __post_init__(self) -> None:
        tag = uuid.uuid4().hex[:10]
        self.slot = f"s_{tag}"
        self.publication = f"p_{tag}"
        self.sink_path = self.directory / "events.jsonl"
        self.config_path = self.directory / "snapshotter.toml"
        tables = list(self.tables) or [f"{self.schema}.*"]
        if self.kind == "mysql":
            # A replication client id of its own: a second client with the same id would
            # disconnect the first (tests may run engines side by side).
            capture_settings = f"server_id = {random.randrange(100_000, 2_000_000_000)}"
        elif self.kind == "spanner":
            capture_settings = ""  # the change stream and emulator come in extra_config
        else:
            capture_settings = f'slot = "{self.slot}"\npublication = "{self.publication}"'
        self.config_path.write_text(
            f"""
[source]
kind = "{self.kind}"
name = "{PREFIX}"
url = "{self.url}"
tables = {tables!r}
signal_table = "{self.schema}.debezium_signal"
chunk_size = {self.chunk_size}
{capture_settings}
{self.extra_config}
{self._sink_config()}

[state]
dir = "state"
{self.state_config}

[snapshot]
executors = {self.executors}
""".replace("'", '"'),
            encoding="utf-8",
        )
        self.initialized = False

    def _sink_config(self) -> str:
        if self.sink == "jsonl":
            return '[sink]\nkind = "jsonl"\npath = "events.jsonl"\n'
        if self.sink == "kafka":
            bootstrap = self.kafka_bootstrap or os.environ.get(
                "SNAPSHOTTER_KAFKA_BOOTSTRAP", "127.0.0.1:29092"
            )
            return (
                f'[sink]\nkind = "kafka"\nbootstrap_servers = "{bootstrap}"\n'
                f"partitions = {self.kafka_partitions}\n"
                f"schemas = {'true' if self.kafka_schemas else 'false'}\n"
                f'client = "{self.client}"\n'
                + (f"kafka = {self.kafka_settings}\n" if self.kafka_settings else "")
            )
        # One Spark session per test process at a time (snapshotter.sinks.spark.session);
        # local[2] as CI, unless the test asks for the cluster or Spark Connect.
        spark = self.spark or SPARK_MASTER
        where = "remote" if spark.startswith("sc://") else "master"
        # On the two-core test cluster an application takes every free core and keeps it: a
        # second engine (a subprocess of the test, while the test's own session lives) would
        # wait for cores forever. One core each.
        cores = '\nconf = { "spark.cores.max" = "1" }' if spark.startswith("spark://") else ""
        return (
            f'[sink]\nkind = "spark"\npath = "lake"\nformat = "{self.sink_format}"\n'
            f"compact_min_rows = 20000\n{self.sink_config}\n\n"
            f'[spark]\n{where} = "{spark}"{cores}\n'
        )

    @property
    def client(self) -> str:
        """The Kafka client the sink uses."""
        return self.kafka_client or os.environ.get("SNAPSHOTTER_KAFKA_CLIENT", "kafka-python")

    def lander(self) -> Any:
        """A Lander over this capture's landing root (the process's Spark session)."""
        from snapshotter.sinks.spark.lander import Lander
        from snapshotter.sinks.spark.session import spark_session

        config = self.config
        fmt = config.sink.format
        spark = spark_session(config.spark, delta=fmt == "delta", iceberg=fmt == "iceberg")
        return Lander(spark, config.sink.path, fmt)

    def verify_landed(self, table: str) -> Any:
        """``snapshotter verify`` for the spark sink: the table against its landed current
        state, by key-hash buckets narrowed down to keys."""
        from snapshotter.app.runner import open_dialect
        from snapshotter.verify.spark import LandedVerifier

        dialect = open_dialect(self.config)
        try:
            return LandedVerifier(dialect, self.lander()).verify(self.table_id(table))
        finally:
            dialect.close()

    def landed_rows(self, table: str, *, plain: bool = True) -> dict[str, dict[str, Any]]:
        """The landed current state of ``table``, read with Spark: canonical key -> row
        (data columns only, as Python values). With ``plain`` (call it once the engine has
        stopped), also as readers that know nothing of snapshotter read it
        (``spark.read.parquet(<table>/current)``, and for Parquet
        ``pyarrow.parquet.read_table``, ``pyarrow.dataset.dataset`` and
        ``pandas.read_parquet``: the same rows, and the same keys for pandas)."""
        key = self.key_of(table)
        lander = self.lander()
        state = lander.current_state(self.table_id(table))
        if state is None:
            return {}
        rows = state.select(*[f"`{c}`" for c in data_columns(state)]).toArrow().to_pylist()
        merged = {_canonical_key(r, key): r for r in rows}
        if plain:
            readers = ["spark"]
            if self.config.sink.format == "parquet":
                readers += ["pyarrow", "pyarrow.dataset", "pandas"]
            if self.config.sink.format == "iceberg":  # through the catalog, and without Spark
                readers = ["spark", "pyiceberg"]
            if self.config.sink.format == "delta":  # and delta-rs, without Spark
                readers = ["spark", "deltalake"]
            for reader in readers:
                seen = self.plain_landed_rows(table, reader)
                if reader == "pandas":  # its values are pandas' own types: the keys here
                    seen, merged_keys = dict.fromkeys(seen), dict.fromkeys(merged)
                    assert seen == merged_keys, f"{reader} reads other keys of {table}'s current/"
                    continue
                assert len(seen) == len(merged) and seen == merged, (
                    f"{reader} reading {table}'s current/ sees {len(seen)} rows, "
                    f"{sum(1 for k in merged if seen.get(k) != merged[k])} differing from the "
                    f"exact state's {len(merged)}"
                )
        return merged

    def plain_landed_rows(self, table: str, reader: str = "spark") -> dict[str, dict[str, Any]]:
        """``current/`` read the way a user reads it, with the reader's default options:
        ``spark.read.parquet`` (or Delta's reader), ``pyarrow.parquet.read_table`` or
        ``pandas.read_parquet`` (its rows back through Arrow); the data columns; a key seen
        twice fails."""
        import pyarrow as pa

        lander = self.lander()
        path = f"{lander.table_path(self.table_id(table))}/current"
        if self.config.sink.format == "iceberg":
            tables = lander.iceberg
            if reader == "pyiceberg":
                from pyiceberg.table import StaticTable

                location = tables.metadata_location(self.table_id(table))
                arrow = StaticTable.from_metadata(location).scan().to_arrow()
            else:  # Spark SQL through the catalog
                arrow = lander.spark.sql(
                    f"SELECT * FROM {tables.current_name(self.table_id(table))}"
                ).toArrow()
        elif reader == "deltalake":
            from deltalake import DeltaTable, QueryBuilder

            found = QueryBuilder().register("t", DeltaTable(path)).execute("SELECT * FROM t")
            arrow = pa.RecordBatchReader.from_stream(found).read_all()
        elif reader == "pyarrow":
            import pyarrow.parquet as pq

            arrow = pq.read_table(path)
        elif reader == "pyarrow.dataset":  # its defaults: no partitioning (issue 27)
            import pyarrow.dataset as ds

            arrow = ds.dataset(path, format="parquet").to_table()
        elif reader == "pandas":
            import pandas as pd

            arrow = pa.Table.from_pandas(pd.read_parquet(path), preserve_index=False)
        else:
            if self.config.sink.format == "delta":
                df = lander.spark.read.format("delta").load(path)
            else:
                df = lander.spark.read.parquet(path)
            arrow = df.toArrow()
        # Without the meta columns (and __base, the partition column of an older layout).
        rows = arrow.select(data_columns_of(arrow))
        key = self.key_of(table)
        out: dict[str, dict[str, Any]] = {}
        for r in rows.to_pylist():
            k = _canonical_key(r, key)
            assert k not in out, f"{reader} reading {table}'s current/ sees key {k} twice"
            out[k] = r
        return out

    def source_rows(self, table: str) -> dict[str, dict[str, Any]]:
        """The table at the source, converted as the sink converts rows for landing:
        canonical key -> row."""
        import pyarrow as pa

        from snapshotter.app.runner import open_dialect
        from snapshotter.sinks.spark.types import landed_columns, rows_to_landed

        dialect = open_dialect(self.config)
        try:
            schema = dialect.describe(self.table_id(table))
            rows = list(dialect.scan(schema))
        finally:
            dialect.close()
        names = [c.name for c in landed_columns(schema)]
        landed = pa.Table.from_arrays(rows_to_landed(schema, rows), names=names).to_pylist()
        key = self.key_of(table)
        return {_canonical_key(r, key): r for r in landed}

    def key_of(self, table: str) -> list[str]:
        from snapshotter.app.runner import open_dialect

        dialect = open_dialect(self.config)
        try:
            schema = dialect.describe(self.table_id(table))
        finally:
            dialect.close()
        return list(schema.primary_key) or list(schema.column_names)

    @property
    def config(self) -> Config:
        return load_config(self.config_path)

    def cli(self, *args: str) -> int:
        return cli_main([args[0], "-c", str(self.config_path), *args[1:]])

    def init(self) -> None:
        assert self.cli("init") == 0
        self.initialized = True

    def execute(self, *tables: str, filters: Sequence[str] = (), surrogate: str = "") -> None:
        args = ["signal", "execute-snapshot", *tables]
        for item in filters:
            args += ["--filter", item]
        if surrogate:
            args += ["--surrogate-key", surrogate]
        assert self.cli(*args) == 0

    def sql(self, statement: str, params: Sequence[Any] | None = ()) -> list[tuple[Any, ...]]:
        if self.kind == "mysql":
            conn = mysql_connect(self.url)
            try:
                with conn.cursor() as cur:
                    cur.execute(statement, params or None)
                    return list(cur.fetchall()) if cur.description else []
            finally:
                conn.close()
        with psycopg.connect(self.url, autocommit=True) as pg:
            pgcur = pg.execute(statement, params)
            return pgcur.fetchall() if pgcur.description else []

    def start(
        self, *, until_caught_up: bool = False, hooks: PhaseHooks | None = None
    ) -> EngineThread:
        flag = StopFlag()
        holder = EngineThread(threading.Thread(), flag)

        def target() -> None:
            try:
                holder.result["code"] = run_engine(
                    self.config, until_caught_up=until_caught_up, stop=flag, hooks=hooks
                )
            except BaseException as exc:  # re-raised in the test's thread by join()
                holder.result["error"] = exc

        holder.thread = threading.Thread(target=target, name="engine-under-test", daemon=True)
        holder.thread.start()
        return holder

    def run(self, *, hooks: PhaseHooks | None = None, timeout: float = 300.0) -> int:
        """``snapshotter run --until-caught-up``, in a thread with a time limit."""
        return self.start(until_caught_up=True, hooks=hooks).join(timeout)

    def table_id(self, table: str) -> TableId:
        return TableId(self.schema, table)

    def topic(self, table: str) -> str:
        return f"{PREFIX}.{self.schema}.{table}"

    def verify(self, table: str) -> Verdict:
        """Materialize the sink file for ``table`` and compare it with the table, row by row
        (what ``snapshotter verify`` does)."""
        return check_table(self.config, self.table_id(table))

    def events(self, table: str) -> list[dict[str, Any]]:
        import json

        topic = self.topic(table)
        out = []
        if not self.sink_path.exists():
            return out
        for line in self.sink_path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record["topic"] == topic:
                out.append(record)
        return out

    def status(self) -> dict[str, Any]:
        from snapshotter.app.status import status_report
        from snapshotter.core.state import EngineState

        path = self.directory / "state" / "state.json"
        return status_report(EngineState.from_json(path.read_text(encoding="utf-8")), None)

    def cleanup(self) -> None:
        if self.kind in ("mysql", "spanner"):
            return  # the test's database is dropped by its fixture; the binlog needs nothing
        try:
            pg_setup.drop_slot(self.url, self.slot)
        finally:
            self.sql(f'DROP PUBLICATION IF EXISTS "{self.publication}"')


CaptureFactory = Callable[..., Capture]


def data_columns_of(arrow: Any) -> list[str]:
    """The table's own columns of a landed Arrow table (the sink's __ columns left out)."""
    from snapshotter.sinks.spark.types import RESERVED_COLUMNS

    return [c for c in arrow.column_names if c not in RESERVED_COLUMNS]


def data_columns(df: Any) -> list[str]:
    """The table's own columns of a landed Spark DataFrame (the sink's __ columns left out)."""
    from snapshotter.sinks.spark.types import RESERVED_COLUMNS

    return [c for c in df.columns if c not in RESERVED_COLUMNS]


def _canonical_key(row: dict[str, Any], key: Sequence[str]) -> str:
    return repr(tuple(row[c] for c in key))
