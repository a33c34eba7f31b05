"""``snapshotter verify`` for the Spark sink, on real servers and real Spark (local mode): a
table of many types is read as the engine reads it, landed through staging and the Lander
as READ events, and verified; then the landed state or the table is changed and verify must
name the keys (missing, extra, differing with the column)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from pyspark.sql import SparkSession

from signals.names import TableId
from signals.table import create_signal_table
from snapshotter.app import cli
from snapshotter.config import SparkConfig
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.sinks.spark.lander import META_FILE, Format, Lander
from snapshotter.sinks.spark.session import spark_session
from snapshotter.sinks.spark.staging import StagingArea
from snapshotter.sinks.spark.types import events_to_landed
from snapshotter.sources.base import ChunkSpec, Dialect, TableSchema
from snapshotter.sources.mysql.dialect import MySqlDialect
from snapshotter.sources.postgres.dialect import PostgresDialect
from snapshotter.verify.spark import LandedVerdict, LandedVerifier

pytestmark = pytest.mark.integration

CHUNK = 7  # small chunks: every table is read in several key ranges


@pytest.fixture(scope="module")
def spark() -> SparkSession:
    # The process's one session; with Delta, as the Spark sink's other tests ask for it.
    return spark_session(SparkConfig(master="local[2]"), delta=True)


def run(engine: sa.Engine, *statements: str) -> None:
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


class Landing:
    """Lands events for tables of one source, batch by batch, as the Spark sink would."""

    def __init__(self, spark: SparkSession, dialect: Dialect, directory: Path, fmt: Format) -> None:
        self.dialect = dialect
        self.lander = Lander(spark, str(directory / "lake"), fmt)
        self.staging = StagingArea(directory / "staging")
        self.staging.open()
        self.seq = 0
        self.pos = 0
        self._schemas: dict[TableId, TableSchema] = {}

    def schema(self, table: TableId) -> TableSchema:
        if table not in self._schemas:
            self._schemas[table] = self.dialect.describe(table)
        return self._schemas[table]

    def event(self, table: TableId, op: Op, row: dict[str, Any]) -> ChangeEvent:
        schema = self.schema(table)
        self.pos += 1
        source = Source(
            self.dialect.connector,
            "test",
            self.dialect.database,
            table,
            Position(self.pos),
            1_700_000_000_000,
            SnapshotMarker.INCREMENTAL if op is Op.READ else SnapshotMarker.FALSE,
        )
        key = tuple(row[k] for k in schema.primary_key)
        if op is Op.DELETE:
            return ChangeEvent(op, source, 1, key, before=row)
        return ChangeEvent(op, source, 1, key, after=row)

    def land(self, table: TableId, events: Sequence[ChangeEvent]) -> None:
        schema = self.schema(table)
        self.seq += 1
        keys = list(schema.primary_key)
        data = events_to_landed(schema, keys, events, self.seq)
        batch = self.staging.stage(self.seq, [(table, keys, data)])
        self.lander.land([batch])
        self.staging.remove(batch)

    def snapshot(self, table: TableId) -> None:
        """The table read as chunks are read, landed as READ events."""
        self.land(
            table, [self.event(table, Op.READ, row) for row in read_rows(self.dialect, table)]
        )

    def verify(self, table: TableId, **kwargs: Any) -> LandedVerdict:
        kwargs.setdefault("chunk_rows", CHUNK)
        return LandedVerifier(self.dialect, self.lander, **kwargs).verify(table)


def read_rows(dialect: Dialect, table: TableId) -> list[dict[str, Any]]:
    """Every row in the value model, through the engine's chunk read and row converter."""
    schema = dialect.describe(table)
    keys = schema.primary_key
    upto = dialect.max_key(schema, keys, None)
    convert = dialect.row_converter(schema)
    rows: list[dict[str, Any]] = []
    after = None
    while upto is not None:
        chunk = dialect.read_chunk(ChunkSpec(schema, keys, after, upto, None, 1000))
        if chunk.last_key is None:
            break
        rows.extend(convert(r) if convert else r for r in chunk.rows.to_pylist())
        after = chunk.last_key
    return rows


def keys_of(examples: Sequence[Any]) -> list[dict[str, Any]]:
    return [dict(k) for k in examples]


# --- PostgreSQL ---------------------------------------------------------------------------------

PG_TYPED = """
CREATE TABLE {s}.typed (
    id bigint PRIMARY KEY,
    name text,
    amount numeric(12, 2),
    loose numeric,
    at timestamptz,
    naive timestamp,
    b bytea,
    j jsonb,
    js json,
    f float8,
    d date,
    flag bool,
    tm time,
    arr int[]
)
"""
PG_ROWS = """
INSERT INTO {s}.typed
SELECT i, 'name ' || i || CASE WHEN i % 5 = 0 THEN ' ünïcødé' ELSE '' END,
       i * 1.25, i / 7.0, timestamptz '2024-01-01 00:00:00+00' + i * interval '1 hour 1 us',
       timestamp '2000-02-29 12:00:00' - i * interval '1 day', decode(md5(i::text), 'hex'),
       jsonb_build_object('i', i, 'tags', jsonb_build_array('a', i)), '{{ "keep":  1 }}',
       i / 3.0, date '2024-02-29' + i, i % 2 = 0, time '03:04:05.000600', ARRAY[i, -i]
FROM generate_series(1, 60) AS i;
INSERT INTO {s}.typed (id) VALUES (0);
INSERT INTO {s}.typed (id, name, f, b, amount) VALUES (-1, '', 'NaN', '', 0.00);
"""
PG_PAIRS = """
CREATE TABLE {s}.pairs (
    region text COLLATE "C",
    n int,
    label text,
    PRIMARY KEY (region, n)
);
INSERT INTO {s}.pairs
SELECT r, n, r || n FROM unnest(ARRAY['a', 'B', 'c', 'Ä', 'b']) AS r, generate_series(1, 9) AS n;
"""


@pytest.fixture
def pg_dialect(pg_url: str, pg_engine: sa.Engine, pg_schema: str) -> Iterator[PostgresDialect]:
    signal = TableId(pg_schema, "debezium_signal")
    with pg_engine.begin() as conn:
        create_signal_table(conn, signal)
    dialect = PostgresDialect(pg_url, signal, f"{pg_schema}_pub")
    yield dialect
    dialect.close()


def test_postgres_landed_state_verifies_and_tampering_names_the_keys(
    spark: SparkSession,
    pg_engine: sa.Engine,
    pg_schema: str,
    pg_dialect: PostgresDialect,
    tmp_path: Path,
) -> None:
    run(pg_engine, PG_TYPED.format(s=pg_schema), PG_ROWS.format(s=pg_schema))
    table = TableId(pg_schema, "typed")
    landing = Landing(spark, pg_dialect, tmp_path, "parquet")
    landing.snapshot(table)

    clean = landing.verify(table)
    assert clean.ok, clean.render()
    assert clean.verdict.table_rows == clean.verdict.output_rows == 62
    assert clean.render().startswith("converged: 62 rows match")

    # The landed row of key 2 rewritten by a later event; key 3 deleted and 100 inserted at
    # the source without the log reaching the landing.
    rows = {r["id"]: r for r in read_rows(pg_dialect, table)}
    changed = {**rows[2], "name": "tampered", "amount": "3.50"}  # numeric: its text
    landing.land(table, [landing.event(table, Op.UPDATE, changed)])
    run(
        pg_engine,
        f"DELETE FROM {pg_schema}.typed WHERE id = 3",
        f"INSERT INTO {pg_schema}.typed (id, name) VALUES (100, 'new')",
    )
    verdict = landing.verify(table)
    assert not verdict.ok
    v = verdict.verdict
    assert (v.missing, v.extra, v.differing) == (1, 1, 1), verdict.render()
    assert keys_of(v.missing_examples) == [{"id": 100}]
    assert keys_of(v.extra_examples) == [{"id": 3}]
    [diff] = v.differing_examples
    assert dict(diff.key) == {"id": 2}
    assert {(c.column, c.table, c.output) for c in diff.columns} == {
        ("name", "name 2", "tampered"),
        ("amount", "2.50", "3.50"),
    }
    text = verdict.render()
    assert text.startswith("NOT converged: 1 missing, 1 extra, 1 differ")
    assert 'missing: key {"id": 100}' in text
    assert 'extra: key {"id": 3}' in text
    assert 'differ: key {"id": 2}: column name: table "name 2", output "tampered"' in text


# Delta only here: its landing (MERGE) is slow in local mode, and verify reads either format
# through Lander.current_state alike.
@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_postgres_composite_key_verifies(
    spark: SparkSession,
    pg_engine: sa.Engine,
    pg_schema: str,
    pg_dialect: PostgresDialect,
    tmp_path: Path,
    fmt: Format,
) -> None:
    run(pg_engine, PG_PAIRS.format(s=pg_schema))
    table = TableId(pg_schema, "pairs")
    landing = Landing(spark, pg_dialect, tmp_path, fmt)
    landing.snapshot(table)
    assert landing.verify(table).ok
    run(pg_engine, f"UPDATE {pg_schema}.pairs SET label = 'x' WHERE region = 'Ä' AND n = 4")
    verdict = landing.verify(table)
    [diff] = verdict.verdict.differing_examples
    assert dict(diff.key) == {"region": "Ä", "n": 4}
    assert [(c.column, c.table, c.output) for c in diff.columns] == [("label", "x", "Ä4")]


def test_postgres_many_differences_are_narrowed_within_the_cap(
    spark: SparkSession,
    pg_engine: sa.Engine,
    pg_schema: str,
    pg_dialect: PostgresDialect,
    tmp_path: Path,
) -> None:
    run(pg_engine, PG_TYPED.format(s=pg_schema), PG_ROWS.format(s=pg_schema))
    table = TableId(pg_schema, "typed")
    landing = Landing(spark, pg_dialect, tmp_path, "parquet")
    landing.snapshot(table)
    run(pg_engine, f"UPDATE {pg_schema}.typed SET f = f + 1 WHERE id BETWEEN 1 AND 40")
    verdict = landing.verify(table, max_keys=10)
    assert not verdict.ok
    assert verdict.differing_buckets == 40
    assert verdict.verdict.differing == 10  # one row per bucket: ten buckets narrowed
    assert verdict.unexamined_buckets == 30 and verdict.unexamined_rows == 30
    assert "30 more differing buckets (up to 30 rows) were not narrowed down" in verdict.render()
    everything = landing.verify(table)
    assert everything.verdict.differing == 40 and everything.unexamined_buckets == 0


def test_postgres_nothing_landed_counts_every_row_missing(
    spark: SparkSession,
    pg_engine: sa.Engine,
    pg_schema: str,
    pg_dialect: PostgresDialect,
    tmp_path: Path,
) -> None:
    run(pg_engine, PG_PAIRS.format(s=pg_schema))
    landing = Landing(spark, pg_dialect, tmp_path, "parquet")
    verdict = landing.verify(TableId(pg_schema, "pairs"))
    assert verdict.verdict.missing == 45 and verdict.verdict.output_rows == 0
    assert "nothing is landed for" in verdict.render()


# --- the command ----------------------------------------------------------------------------


def write_config(path: Path, url: str, schema: str) -> Path:
    config = path / "snapshotter.toml"
    config.write_text(
        f"""
[source]
kind = "postgres"
url = "{url}"
tables = ["{schema}.*"]
signal_table = "{schema}.debezium_signal"

[sink]
kind = "spark"
path = "lake"

[spark]
master = "local[2]"
""",
        encoding="utf-8",
    )
    return config


def test_the_verify_command_on_the_spark_sink(
    spark: SparkSession,
    pg_url: str,
    pg_engine: sa.Engine,
    pg_schema: str,
    pg_dialect: PostgresDialect,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run(pg_engine, PG_PAIRS.format(s=pg_schema), PG_TYPED.format(s=pg_schema))
    run(pg_engine, PG_ROWS.format(s=pg_schema))
    landing = Landing(spark, pg_dialect, tmp_path, "parquet")
    pairs, typed = TableId(pg_schema, "pairs"), TableId(pg_schema, "typed")
    landing.snapshot(pairs)
    landing.snapshot(typed)
    config = str(write_config(tmp_path, pg_url, pg_schema))

    assert cli.main(["verify", "-c", config]) == 0  # every table source.tables selects
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"{pairs}: converged: 45 rows match",
        f"{typed}: converged: 62 rows match",
    ]

    run(pg_engine, f"UPDATE {pg_schema}.pairs SET label = NULL WHERE region = 'a' AND n = 1")
    assert cli.main(["verify", "-c", config, "--json", str(pairs)]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert result["table"] == str(pairs) and not result["ok"]
    assert result["differing_examples"] == [
        {
            "key": {"region": "a", "n": 1},
            "columns": [{"column": "label", "table": None, "output": "a1"}],
        }
    ]

    run(pg_engine, f"DROP TABLE {pg_schema}.typed")
    assert cli.main(["verify", "-c", config, str(typed)]) == 1  # named: gone at the source
    out = capsys.readouterr().out
    assert f"{typed}: error: " in out and "landed under" in out


# --- MariaDB / MySQL ----------------------------------------------------------------------------

MY_TYPED = """
CREATE TABLE typed (
    code varchar(20) COLLATE utf8mb4_general_ci,
    n int,
    name varchar(100),
    amount decimal(12, 2),
    big bigint unsigned,
    at timestamp(6) NULL,
    naive datetime(6),
    b varbinary(64),
    j json,
    f double,
    g float,
    d date,
    tm time(6),
    PRIMARY KEY (code, n)
)
"""


@pytest.fixture
def my_dialect(mysql_url: str, mysql_db: str) -> Iterator[MySqlDialect]:
    url = sa.make_url(mysql_url).set(database=mysql_db)
    dialect = MySqlDialect(url, TableId(None, "debezium_signal"))
    yield dialect
    dialect.close()


def my_rows(engine: sa.Engine, database: str) -> None:
    codes = ["apple", "Banana", "cherry", "Éclair", "date", "ZETA", "zz", "a b"]
    values = []
    for i, code in enumerate(codes):
        for n in range(1, 6):
            k = i * 10 + n
            values.append(
                f"('{code}', {n}, 'name {k}', {k}.25, {18446744073709551615 - k}, "
                f"'2024-01-0{n} 0{n}:00:00.{k:06d}', '1999-12-31 23:59:{k % 60:02d}.5', "
                f"UNHEX(MD5('{k}')), '{{\"k\": {k}, \"t\": [1, null]}}', {k} / 3, {k} / 8, "
                f"'2024-02-{n + 20}', '-{n}:02:03.000004')"
            )
    with engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{database}`")
        conn.exec_driver_sql(MY_TYPED)
        conn.exec_driver_sql("INSERT INTO typed VALUES " + ", ".join(values))
        conn.exec_driver_sql("INSERT INTO typed (code, n) VALUES ('nulls', 0)")


def test_mysql_landed_state_verifies_and_tampering_names_the_keys(
    spark: SparkSession,
    mysql_engine: sa.Engine,
    mysql_db: str,
    my_dialect: MySqlDialect,
    tmp_path: Path,
) -> None:
    """A _ci collation orders the key ('apple' < 'Banana' < 'cherry' < 'Éclair') unlike
    Spark and Python: buckets of the key hash do not care."""
    my_rows(mysql_engine, mysql_db)
    table = TableId(mysql_db, "typed")
    landing = Landing(spark, my_dialect, tmp_path, "parquet")
    landing.snapshot(table)
    clean = landing.verify(table)
    assert clean.ok, clean.render()
    assert clean.verdict.table_rows == 41

    rows = {(r["code"], r["n"]): r for r in read_rows(my_dialect, table)}
    landing.land(table, [landing.event(table, Op.DELETE, rows[("Éclair", 2)])])
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{mysql_db}`")
        conn.exec_driver_sql("UPDATE typed SET b = UNHEX('00') WHERE code = 'Banana' AND n = 5")
        conn.exec_driver_sql("DELETE FROM typed WHERE code = 'zz' AND n = 1")
    verdict = landing.verify(table)
    v = verdict.verdict
    assert keys_of(v.missing_examples) == [{"code": "Éclair", "n": 2}], verdict.render()
    assert keys_of(v.extra_examples) == [{"code": "zz", "n": 1}]
    [diff] = v.differing_examples
    assert dict(diff.key) == {"code": "Banana", "n": 5}
    assert [(c.column, c.table) for c in diff.columns] == [("b", "AA==")]


# --- current/ as plain readers read it (issue 26) ------------------------------------------
#
# ``spark.read.parquet``, ``pyarrow.parquet.read_table``, ``pandas.read_parquet``, default
# options: a base no metadata names (what a compaction a crash cut short leaves), a changelog
# tail not compacted yet, and a base of the layout before issue 26 (``current/__base=<batch>``,
# which pyarrow and pandas read as 0 rows) are each NOT converged, for that reason; a writing
# lander's start (``take_over``) and its closing compaction make ``current/`` exact again.


def _current(landing: Landing, table: TableId) -> Path:
    return Path(landing.lander.table_path(table)) / "current"


def _plain_ids(spark: SparkSession, current: Path) -> dict[str, list[int]]:
    """The keys each plain reader reads of ``current/`` (sorted, duplicates kept)."""
    return {
        "spark": sorted(r["id"] for r in spark.read.parquet(str(current)).select("id").collect()),
        "pyarrow": sorted(pq.read_table(str(current)).column("id").to_pylist()),
        "pandas": sorted(int(i) for i in pd.read_parquet(str(current))["id"]),
    }


def _writing_lander(landing: Landing) -> Lander:
    """A lander as the engine's next run opens one: it takes over every table first."""
    lander = Lander(landing.lander.spark, landing.lander.root, "parquet")
    lander.take_over()
    return lander


def test_a_stray_base_and_a_lagging_tail_are_not_converged_for_plain_readers(
    spark: SparkSession,
    pg_engine: sa.Engine,
    pg_schema: str,
    pg_dialect: PostgresDialect,
    tmp_path: Path,
) -> None:
    run(pg_engine, PG_TYPED.format(s=pg_schema), PG_ROWS.format(s=pg_schema))
    table = TableId(pg_schema, "typed")
    landing = Landing(spark, pg_dialect, tmp_path, "parquet")
    landing.snapshot(table)
    current = _current(landing, table)
    ids = list(range(-1, 61))
    assert _plain_ids(spark, current) == {"spark": ids, "pyarrow": ids, "pandas": ids}
    clean = landing.verify(table)
    assert clean.ok, clean.render()
    assert clean.plain is not None
    assert [(r.reader, r.rows) for r in clean.plain.reads] == [
        ("spark.read.parquet", 62),
        ("pyarrow.parquet.read_table", 62),
        ("pyarrow.dataset", 62),
        ("pandas.read_parquet", 62),
    ]

    # Key 3 deleted, key 2 updated; landed into the changelog tail, not compacted yet: the
    # landed state is exact, current/ lags it.
    rows = {r["id"]: r for r in read_rows(pg_dialect, table)}
    run(
        pg_engine,
        f"DELETE FROM {pg_schema}.typed WHERE id = 3",
        f"UPDATE {pg_schema}.typed SET name = 'changed' WHERE id = 2",
    )
    landing.land(
        table,
        [
            landing.event(table, Op.DELETE, rows[3]),
            landing.event(table, Op.UPDATE, {**rows[2], "name": "changed"}),
        ],
    )
    lagging = landing.verify(table)
    assert lagging.verdict.ok and not lagging.ok, lagging.render()
    text = lagging.render()
    assert text.startswith("NOT converged: the landed state matches the table's 61 rows, but ")
    assert "spark.read.parquet: reads 62 rows for the table's 61: " in text
    assert "1 key the table does not have" in text and "1 row differing from the table's" in text
    assert "why: current/ lags the landed state: up to 2 changelog rows after batch 1" in text

    # A compaction killed after the new base was named, before the old one was deleted: the
    # old base's files are back beside the new base's.
    old = {f.name: f.read_bytes() for f in current.glob("base-*")}
    landing.lander.compact_idle()
    assert not [name for name in old if (current / name).exists()]
    for name, data in old.items():
        (current / name).write_bytes(data)
    broken = landing.verify(table)
    assert broken.verdict.ok and not broken.ok, broken.render()
    text = broken.render()
    # Every key twice (key 2 in two versions), and key 3, deleted, back.
    twice = "reads 123 rows for the table's 61: 61 keys read more than once"
    assert f"spark.read.parquet: {twice}" in text
    assert f"pyarrow.parquet.read_table: {twice}" in text
    assert f"pyarrow.dataset: {twice}" in text
    assert '1 key the table does not have (a deleted row back?), e.g. {"id":3}' in text
    assert "pandas.read_parquet: reads 123 rows for the table's 61; 61 keys read more than" in text
    assert "why: current/ holds base-000000000001, which the table's metadata does not name" in text
    assert "lags" not in text
    result = broken.to_json()
    assert not result["ok"] and not result["plain_reads"]["ok"]
    assert (current / next(iter(old))).exists(), "verify only reads"

    # The engine's next run: strays removed at the start, whether it lands the table or not.
    _writing_lander(landing)
    ids.remove(3)
    assert _plain_ids(spark, current) == {"spark": ids, "pyarrow": ids, "pandas": ids}
    assert landing.verify(table).ok


def test_a_base_of_the_layout_before_issue_26_is_read_by_plain_readers_after_the_next_run(
    spark: SparkSession,
    pg_engine: sa.Engine,
    pg_schema: str,
    pg_dialect: PostgresDialect,
    tmp_path: Path,
) -> None:
    """``current/__base=<batch>/``: pyarrow and pandas read 0 rows (a name starting with
    ``_``), Spark reads a column ``__base``. verify says so; the next run rewrites it."""
    run(pg_engine, PG_TYPED.format(s=pg_schema), PG_ROWS.format(s=pg_schema))
    table = TableId(pg_schema, "typed")
    landing = Landing(spark, pg_dialect, tmp_path, "parquet")
    landing.snapshot(table)
    current = _current(landing, table)
    # The layout issues 19 to 25 wrote: the base's files in a partition directory.
    legacy = current / "__base=000000000001"
    legacy.mkdir()
    for f in current.glob("base-*"):
        f.rename(legacy / f"part-{f.name.split('.', 1)[1]}")
    meta_path = current.parent / META_FILE
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    meta["base_dir"] = legacy.name
    meta_path.write_text(json.dumps(meta), encoding="utf-8")
    assert pq.read_table(str(current)).num_rows == 0  # what issue 26 found
    assert len(pd.read_parquet(str(current))) == 0
    reader = Landing(spark, pg_dialect, tmp_path, "parquet")  # metadata read afresh
    old = reader.verify(table)
    assert old.verdict.ok and not old.ok, old.render()
    text = old.render()
    assert (
        "spark.read.parquet: reads 62 rows for the table's 62: column(s) __base the table" in text
    )
    assert (
        "pyarrow.parquet.read_table: reads 0 rows for the table's 62: no data file found; "
        '62 keys missing, e.g. {"id":-1}'
    ) in text
    assert "pyarrow.dataset: reads 0 rows for the table's 62: no data file found" in text
    assert "pandas.read_parquet: reads 0 rows for the table's 62" in text
    assert "why: its base current/__base=000000000001 is of an older layout" in text

    lander = _writing_lander(reader)  # the next run, landing nothing
    assert lander.compact_idle() == [table]  # as the sink's close
    assert not legacy.exists()
    ids = list(range(-1, 61))
    assert _plain_ids(spark, current) == {"spark": ids, "pyarrow": ids, "pandas": ids}
    assert Landing(spark, pg_dialect, tmp_path, "parquet").verify(table).ok
