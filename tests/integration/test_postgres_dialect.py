"""The PostgreSQL dialect and capture setup on a real server: catalog, keys, max key, chunk
paging and its plan, the read-only chunk transaction, value types shared with the log path,
watermarks, publications, slots and the `snapshotter init` checks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pyarrow as pa
import pytest
import sqlalchemy as sa

from signals import TableId, Watermark, WatermarkKind
from signals.table import create_signal_table
from snapshotter.core.keys import Key, decode_key, encode_key
from snapshotter.core.values import RawJson
from snapshotter.core.visibility import PgSnapshot, RecentTransactions
from snapshotter.sources.base import ChunkReadError, ChunkSpec, TableError, TableSchema
from snapshotter.sources.postgres import catalog as pg_catalog
from snapshotter.sources.postgres import publications as pg_publications
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres import types as pg_types
from snapshotter.sources.postgres.dialect import PostgresDialect
from snapshotter.sources.setup_common import SetupError, resolve_tables
from tests.integration.signal_table import read_signals

pytestmark = pytest.mark.integration


def run(engine: sa.Engine, *statements: str) -> None:
    """Test DDL and data, sent as written (no parameters, so "%" is literal)."""
    with engine.begin() as conn:
        for statement in statements:
            conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


def scalar(engine: sa.Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


@pytest.fixture
def dialect(pg_url: str, pg_engine: sa.Engine, pg_schema: str) -> Iterator[PostgresDialect]:
    signal = TableId(pg_schema, "debezium_signal")
    with pg_engine.begin() as conn:
        create_signal_table(conn, signal)
    out = PostgresDialect(pg_url, signal, f"{pg_schema}_pub")
    yield out
    out.close()
    run(pg_engine, f"DROP PUBLICATION IF EXISTS {pg_schema}_pub")


def page_all(
    dialect: PostgresDialect,
    schema: TableSchema,
    upto: Key,
    limit: int,
    condition: str | None = None,
) -> tuple[list[dict[str, Any]], int]:
    """Every chunk up to ``upto``, concatenated; and how many chunks it took."""
    rows: list[dict[str, Any]] = []
    after: Key | None = None
    chunks = 0
    while True:
        chunk = dialect.read_chunk(
            ChunkSpec(schema, schema.primary_key, after, upto, condition, limit)
        )
        chunks += 1
        assert chunk.rows.schema == schema.arrow_schema()
        assert chunk.rows.num_rows <= limit
        rows.extend(chunk.rows.to_pylist())
        if chunk.last_key is None:
            return rows, chunks
        assert chunk.last_key == tuple(rows[-1][k] for k in schema.primary_key)
        # Keys survive the state file's JSON exactly (the engine resumes from them).
        after = decode_key(encode_key(chunk.last_key))


# --- describe and keys --------------------------------------------------------------------


def test_describe_columns_types_and_composite_key_order(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    run(
        pg_engine,
        f"CREATE DOMAIN {pg_schema}.posint AS integer CHECK (VALUE > 0)",
        f"CREATE TABLE {pg_schema}.t (a int NOT NULL, b text NOT NULL, amount numeric(12,2), "
        f"at timestamptz, n {pg_schema}.posint, doc jsonb, PRIMARY KEY (b, a))",
        # TOAST-able columns: a snapshot needs FULL (refused otherwise: test_toast_identity)
        f"ALTER TABLE {pg_schema}.t REPLICA IDENTITY FULL",
    )
    schema = dialect.describe(TableId(pg_schema, "t"))
    assert schema.table == TableId(pg_schema, "t")
    assert schema.primary_key == ("b", "a")  # key order, not table order
    assert schema.column_names == ("a", "b", "amount", "at", "n", "doc")
    domain_oid = scalar(pg_engine, f"SELECT '{pg_schema}.posint'::regtype::oid")
    assert [(c.type_code, c.type_name, c.nullable, c.arrow_type) for c in schema.columns] == [
        (23, "integer", False, pa.int64()),
        (25, "text", False, pa.string()),
        (1700, "numeric(12,2)", True, pa.string()),
        (1184, "timestamp with time zone", True, pa.timestamp("us", tz="UTC")),
        # The domain keeps its own OID (as pgoutput sends it), so it is text on both paths.
        (domain_oid, f"{pg_schema}.posint", True, pa.string()),
        (3802, "jsonb", True, pa.string()),
    ]
    assert dialect.snapshot_key(schema, None) == ("b", "a")
    assert dialect.database == scalar(pg_engine, "SELECT current_database()")


def test_describe_partitioned_table_and_list_tables(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.events (id bigint, region text, PRIMARY KEY (region, id)) "
        "PARTITION BY LIST (region)",
        f"CREATE TABLE {pg_schema}.events_eu PARTITION OF {pg_schema}.events FOR VALUES IN ('eu')",
        f"CREATE TABLE {pg_schema}.events_us PARTITION OF {pg_schema}.events FOR VALUES IN ('us')",
        f"CREATE VIEW {pg_schema}.v AS SELECT 1 AS x",
        f"INSERT INTO {pg_schema}.events SELECT i, CASE WHEN i % 2 = 0 THEN 'eu' ELSE 'us' END "
        "FROM generate_series(1, 50) i",
    )
    schema = dialect.describe(TableId(pg_schema, "events"))
    assert schema.primary_key == ("region", "id")
    upto = dialect.max_key(schema, schema.primary_key, None)
    assert upto == ("us", 49)
    rows, _ = page_all(dialect, schema, upto, 7)
    assert [(r["region"], r["id"]) for r in rows] == sorted(
        ("eu" if i % 2 == 0 else "us", i) for i in range(1, 51)
    )
    mine = [t for t in dialect.list_tables() if t.schema == pg_schema]
    assert mine == [TableId(pg_schema, "debezium_signal"), TableId(pg_schema, "events")]
    with pytest.raises(TableError, match=r"partition of .*events; snapshot"):
        dialect.describe(TableId(pg_schema, "events_eu"))
    with pytest.raises(TableError, match="is a view, not a table"):
        dialect.describe(TableId(pg_schema, "v"))


def test_names_that_need_quoting(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    table = TableId(pg_schema, 'My "Odd".Table%')
    quoted = pg_catalog.quote_table(table)
    run(
        pg_engine,
        f'CREATE TABLE {quoted} ("Key Col" int, "select" text, "50%" int, "a:b" text, '
        'PRIMARY KEY ("Key Col", "select"))',
        f"INSERT INTO {quoted} SELECT i / 3, 'v' || i, i, ':x' FROM generate_series(1, 30) i",
    )
    schema = dialect.describe(table)
    assert schema.primary_key == ("Key Col", "select")
    assert schema.column_names == ("Key Col", "select", "50%", "a:b")
    upto = dialect.max_key(schema, schema.primary_key, '"50%" < 20 AND "a:b" = \':x\'')
    assert upto == (6, "v19")
    rows, _ = page_all(dialect, schema, upto, 4, "\"a:b\" LIKE ':%'")
    assert sorted(r["50%"] for r in rows) == list(range(1, 20))
    assert table in dialect.list_tables()


def test_missing_table(dialect: PostgresDialect, pg_schema: str) -> None:
    with pytest.raises(
        TableError, match=r"table .*\.nope does not exist or is not visible to user snapshotter"
    ):
        dialect.describe(TableId(pg_schema, "nope"))
    with pytest.raises(TableError, match="does not exist"):
        dialect.describe(TableId(pg_schema, "NOPE"))  # names are case-sensitive


def test_no_primary_key_names_the_surrogate_key_way(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    run(pg_engine, f"CREATE TABLE {pg_schema}.nopk (id int NOT NULL, v text)")
    schema = dialect.describe(TableId(pg_schema, "nopk"))
    assert schema.primary_key == ()
    with pytest.raises(TableError) as error:
        dialect.snapshot_key(schema, None)
    message = str(error.value)
    assert "has no primary key" in message
    assert '"surrogate-key" in the execute-snapshot signal' in message
    assert "--surrogate-key COL" in message
    assert f"ALTER TABLE {pg_schema}.nopk REPLICA IDENTITY FULL;" in message


def test_surrogate_key_checks(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.s (good int NOT NULL, maybe int UNIQUE, plain int NOT NULL, "
        "partial int NOT NULL, pair1 int NOT NULL, pair2 int NOT NULL, UNIQUE (pair1, pair2))",
        f"CREATE UNIQUE INDEX ON {pg_schema}.s (good)",
        f"CREATE UNIQUE INDEX ON {pg_schema}.s (partial) WHERE partial > 0",
    )
    schema = dialect.describe(TableId(pg_schema, "s"))
    with pytest.raises(TableError, match="has no such column"):
        dialect.snapshot_key(schema, "Good")
    with pytest.raises(TableError, match="may be NULL; it must be NOT NULL"):
        dialect.snapshot_key(schema, "maybe")
    for column in ("plain", "partial", "pair1"):
        with pytest.raises(TableError, match="no unique index or constraint on exactly"):
            dialect.snapshot_key(schema, column)
    with pytest.raises(TableError) as error:
        dialect.snapshot_key(schema, "good")
    assert "REPLICA IDENTITY FULL" in str(error.value)
    assert f"ALTER TABLE {pg_schema}.s REPLICA IDENTITY FULL;" in str(error.value)
    run(pg_engine, f"ALTER TABLE {pg_schema}.s REPLICA IDENTITY FULL")
    assert dialect.snapshot_key(schema, "good") == ("good",)


def test_surrogate_key_on_a_partitioned_table_needs_full_identity_on_each_partition(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.p (id int NOT NULL, v text) PARTITION BY RANGE (id)",
        f"CREATE TABLE {pg_schema}.p1 PARTITION OF {pg_schema}.p FOR VALUES FROM (0) TO (10)",
        f"CREATE UNIQUE INDEX ON {pg_schema}.p (id)",
        f"ALTER TABLE {pg_schema}.p REPLICA IDENTITY FULL",  # not inherited by p1
    )
    schema = dialect.describe(TableId(pg_schema, "p"))
    with pytest.raises(TableError, match=rf"ALTER TABLE {pg_schema}\.p1 REPLICA IDENTITY FULL;"):
        dialect.snapshot_key(schema, "id")
    run(pg_engine, f"ALTER TABLE {pg_schema}.p1 REPLICA IDENTITY FULL")
    assert dialect.snapshot_key(schema, "id") == ("id",)


# --- max key and chunks -------------------------------------------------------------------


@pytest.fixture
def orders(dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str) -> TableSchema:
    """1000 rows, key (k1 int, k2 text) with k2 values whose text order matters."""
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.orders (k1 int, k2 text, amount numeric(10,2), "
        "note text, PRIMARY KEY (k1, k2))",
        f"INSERT INTO {pg_schema}.orders SELECT i / 10, 'k' || (i % 10) || repeat('z', i % 3), "
        "i * 1.25, CASE WHEN i % 7 = 0 THEN NULL ELSE 'n' || i END "
        "FROM generate_series(0, 999) i",
    )
    return dialect.describe(TableId(pg_schema, "orders"))


def reference_keys(engine: sa.Engine, sql: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql))]


def test_max_key_with_and_without_filter(
    dialect: PostgresDialect, orders: TableSchema, pg_engine: sa.Engine, pg_schema: str
) -> None:
    keys = orders.primary_key
    assert dialect.max_key(orders, keys, None) == (99, "k9")
    # An OR in the filter stays inside its parentheses.
    assert dialect.max_key(orders, keys, "k1 < 50 AND k2 LIKE 'k3%' OR k1 = 7") == (49, "k3z")
    assert dialect.max_key(orders, keys, "false") is None
    run(pg_engine, f"CREATE TABLE {pg_schema}.empty (id int PRIMARY KEY)")
    empty = dialect.describe(TableId(pg_schema, "empty"))
    assert dialect.max_key(empty, ("id",), None) is None


def test_chunks_concatenate_to_the_table_in_key_order_under_upto(
    dialect: PostgresDialect, orders: TableSchema, pg_engine: sa.Engine, pg_schema: str
) -> None:
    upto: Key = (61, "k4zz")  # an existing key (i = 614)
    rows, chunks = page_all(dialect, orders, upto, 37)
    expected = reference_keys(
        pg_engine,
        f"SELECT k1, k2, amount::text, note FROM {pg_schema}.orders "
        "WHERE (k1, k2) <= (61, 'k4zz') ORDER BY k1, k2",
    )
    assert [(r["k1"], r["k2"], r["amount"], r["note"]) for r in rows] == expected
    assert len(rows) > 600 and chunks == -(-len(rows) // 37) + 1  # and one empty read
    assert rows[-1]["k2"] == "k4zz"  # the upto row itself is included


def test_a_filter_with_or_does_not_escape_the_key_range(
    dialect: PostgresDialect, orders: TableSchema, pg_engine: sa.Engine, pg_schema: str
) -> None:
    after, upto = (10, "k5"), (12, "k2zz")
    chunk = dialect.read_chunk(
        ChunkSpec(orders, orders.primary_key, after, upto, "true OR k1 > 0", 1000)
    )
    keys = [(r["k1"], r["k2"]) for r in chunk.rows.to_pylist()]
    assert keys and all(after < k <= upto for k in keys)
    assert keys == sorted(keys)
    condition = "k2 LIKE 'k6%' OR k2 LIKE 'k1%'"
    filtered = dialect.read_chunk(
        ChunkSpec(orders, orders.primary_key, after, upto, condition, 1000)
    )
    expected = reference_keys(
        pg_engine,
        f"SELECT k1, k2 FROM {pg_schema}.orders WHERE (k1, k2) > (10, 'k5') "
        f"AND (k1, k2) <= (12, 'k2zz') AND ({condition}) ORDER BY k1, k2",
    )
    assert [(r["k1"], r["k2"]) for r in filtered.rows.to_pylist()] == expected
    assert len(expected) == 4


@pytest.mark.parametrize(
    ("column_type", "values_sql", "python_type"),
    [
        ("uuid", "gen_random_uuid()", str),
        # 9 < 10 < 100 as numbers, not as text: bounds are compared in the column's type.
        ("numeric", "(i * 10 + 9)::numeric / (CASE WHEN i % 2 = 0 THEN 1 ELSE 10 END)", str),
        ("timestamptz", "timestamptz '2024-01-01 00:00:00+02' + i * interval '1 hour'", datetime),
        ("bytea", "decode(md5(i::text), 'hex')", bytes),
        ("date", "date '2020-01-01' + i", type(datetime.now().date())),
    ],
)
def test_paging_by_keys_of_other_types(
    dialect: PostgresDialect,
    pg_engine: sa.Engine,
    pg_schema: str,
    column_type: str,
    values_sql: str,
    python_type: type,
) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.k (id {column_type} PRIMARY KEY, i int)",
        f"INSERT INTO {pg_schema}.k SELECT {values_sql}, i FROM generate_series(1, 300) i",
    )
    schema = dialect.describe(TableId(pg_schema, "k"))
    upto = dialect.max_key(schema, ("id",), "i <= 250")
    assert upto is not None and type(upto[0]) is python_type
    rows, _ = page_all(dialect, schema, upto, 23)
    expected = reference_keys(
        pg_engine,
        f"SELECT i FROM {pg_schema}.k WHERE id <= (SELECT id FROM {pg_schema}.k "
        "WHERE i <= 250 ORDER BY id DESC LIMIT 1) ORDER BY id",
    )
    assert [(r["i"],) for r in rows] == expected
    assert all(type(r["id"]) is python_type for r in rows)


def test_chunk_query_is_an_index_range_scan(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.big (k1 int, k2 text, v float8, PRIMARY KEY (k1, k2))",
        f"INSERT INTO {pg_schema}.big SELECT i / 50, md5(i::text), i FROM "
        "generate_series(1, 50000) i",
        f"ANALYZE {pg_schema}.big",
    )
    schema = dialect.describe(TableId(pg_schema, "big"))
    upto = dialect.max_key(schema, schema.primary_key, None)
    assert upto is not None
    middle = dialect.read_chunk(
        ChunkSpec(schema, schema.primary_key, None, upto, None, 25_000)
    ).last_key
    for after in (None, middle):
        plan = dialect.explain_chunk(
            ChunkSpec(schema, schema.primary_key, after, upto, "v > 0", 1000)
        )
        assert "Index Scan using big_pkey" in plan, plan
        cond = next(line for line in plan.splitlines() if "Index Cond" in line)
        assert "ROW(k1, k2) <=" in cond, plan
        if after is not None:
            assert "ROW(k1, k2) >" in cond, plan
        assert "Seq Scan" not in plan and "Sort" not in plan, plan
        filters = [line for line in plan.splitlines() if "Filter" in line]
        assert all("ROW(" not in line for line in filters), plan


def test_chunk_transaction_is_read_only(
    dialect: PostgresDialect, orders: TableSchema, pg_engine: sa.Engine, pg_schema: str
) -> None:
    """A filter is SQL from the signal table; it must not be able to write."""
    run(pg_engine, f"CREATE SEQUENCE {pg_schema}.seq")
    keys = orders.primary_key
    writes = f"pg_catalog.nextval('{pg_schema}.seq') > 0"
    with pytest.raises(TableError, match="read-only transaction"):
        dialect.read_chunk(ChunkSpec(orders, keys, None, (99, "k9"), writes, 10))
    with pytest.raises(TableError, match="read-only transaction"):
        dialect.max_key(orders, keys, writes)
    assert scalar(pg_engine, f"SELECT last_value FROM {pg_schema}.seq") == 1
    assert scalar(pg_engine, f"SELECT is_called FROM {pg_schema}.seq") is False
    # The connection is usable again after the refused statement.
    assert dialect.read_chunk(ChunkSpec(orders, keys, None, (0, "k0"), None, 10)).rows.num_rows == 1


def test_a_bad_filter_names_the_table_and_the_database_error(
    dialect: PostgresDialect, orders: TableSchema
) -> None:
    with pytest.raises(TableError, match=r'chunk query on table .*orders failed: column "nope"'):
        dialect.read_chunk(ChunkSpec(orders, orders.primary_key, None, (99, "k9"), "nope = 1", 10))
    with pytest.raises(TableError, match=r"max-key query on table .*orders failed: .*syntax"):
        dialect.max_key(orders, orders.primary_key, "k1 = = 1")


def test_a_lost_connection_is_a_retryable_error_and_the_next_read_reconnects(
    dialect: PostgresDialect, orders: TableSchema, pg_engine: sa.Engine
) -> None:
    keys, upto = orders.primary_key, (99, "k9")
    # The server process serving the dialect's connection.
    pid = dialect._connection().fetch("SELECT pg_backend_pid()").column(0)[0].as_py()
    assert scalar(pg_engine, "SELECT pg_terminate_backend(:pid)", pid=pid)
    with pytest.raises(ChunkReadError, match=r"chunk query on table .*orders failed: ") as error:
        dialect.read_chunk(ChunkSpec(orders, keys, None, upto, None, 10))
    assert not isinstance(error.value, TableError)
    assert dialect.read_chunk(ChunkSpec(orders, keys, None, upto, None, 10)).rows.num_rows == 10


def test_visibility_is_the_chunk_snapshot(
    dialect: PostgresDialect, orders: TableSchema, pg_url: str, pg_schema: str
) -> None:
    with psycopg.connect(pg_url) as other:
        other.execute(f"UPDATE {pg_schema}.orders SET note = 'uncommitted' WHERE k1 = 0")
        xid = int(other.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
        # A later transaction commits, so the open one is inside the snapshot's range.
        dialect.write_watermark(Watermark(str(uuid.uuid4()), WatermarkKind.OPEN))
        chunk = dialect.read_chunk(
            ChunkSpec(orders, orders.primary_key, None, (0, "k9"), None, 100)
        )
        other.rollback()
    assert isinstance(chunk.visibility, PgSnapshot)
    assert chunk.visibility.xmin <= xid < chunk.visibility.xmax
    assert xid in chunk.visibility.xip
    assert not chunk.visibility.sees(xid % (1 << 32))  # as pgoutput's 32-bit xid
    assert chunk.visibility.sees(xid + 1)  # the watermark's transaction had committed
    assert "uncommitted" not in chunk.rows.column("note").to_pylist()
    later = dialect.read_chunk(ChunkSpec(orders, orders.primary_key, None, (0, "k9"), None, 100))
    assert isinstance(later.visibility, PgSnapshot) and later.visibility.xmin > xid


def test_the_unfinished_xids_list_a_transaction_open_now(
    dialect: PostgresDialect, orders: TableSchema, pg_url: str, pg_schema: str
) -> None:
    """What the engine asks as it starts (core.visibility: rule 4 across restarts). The open
    transaction is usually the newest xid here, which a snapshot taken before the question's
    own xid ended would leave out of its in-progress list: this one lists it. Its session
    is idle in it, so a chunk that misses it is used all the same (more:
    test_postgres_open_xacts.py)."""
    with psycopg.connect(pg_url) as other:
        other.execute(f"UPDATE {pg_schema}.orders SET note = 'open' WHERE k1 = 0")
        xid = int(other.execute("SELECT pg_current_xact_id()::text").fetchone()[0])  # type: ignore[index]
        asked = dialect.unfinished_xids()
        chunk = dialect.read_chunk(ChunkSpec(orders, orders.primary_key, None, (0, "k9"), None, 9))
        other.rollback()
    assert xid in asked.snapshot.xip and xid < asked.assigned
    assert [s.state for s in asked.sessions if s.xid == xid % (1 << 32)] == ["idle in transaction"]
    assert isinstance(chunk.visibility, PgSnapshot)
    assert not chunk.visibility.sees(xid % (1 << 32))
    history = RecentTransactions()
    history.started(asked)
    assert xid % (1 << 32) not in {t.xid for t in history.missed_at_start(chunk.visibility)}


# --- values: the same loaders as the log path ---------------------------------------------

_ALL_TYPES = {
    "i2": ("smallint", "-7"),
    "i4": ("integer", "2147483647"),
    "i8": ("bigint", "-9223372036854775808"),
    "f4": ("real", "0.1"),
    "f8": ("double precision", "1e-300"),
    "ok": ("boolean", "true"),
    "t": ("text", "'ünï\\code'"),
    "vc": ("varchar(10)", "'abc'"),
    "bp": ("char(5)", "'ab'"),  # padding kept as sent
    "by": ("bytea", "'\\x00ff10'"),
    "d": ("date", "'2024-02-29'"),
    "ts": ("timestamp", "'2024-02-29 23:59:59.123456'"),
    "tz": ("timestamptz", "'2024-02-29 23:59:59.5+05:30'"),
    "tm": ("time", "'13:14:15.000016'"),
    "ttz": ("timetz", "'13:14:15+02'"),
    "num": ("numeric(20,6)", "'12345678901234.500000'"),
    "u": ("uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"),
    "js": ("jsonb", '\'{"b": [1, 2.50], "a": null}\''),
    "jt": ("json", "'{\"b\":  1}'"),
    "iv": ("interval", "'1 day 02:03:04'"),
    "arr": ("integer[]", "'{1,NULL,3}'"),
    "dom": ("posint", "5"),
    "en": ("mood", "'happy'"),
    "nul": ("integer", "NULL"),
}


def test_values_load_exactly_as_the_log_path_loads_them(
    dialect: PostgresDialect, pg_url: str, pg_engine: sa.Engine, pg_schema: str
) -> None:
    columns = ", ".join(f"{name} {sql_type}" for name, (sql_type, _) in _ALL_TYPES.items())
    run(
        pg_engine,
        f"SET search_path = {pg_schema}",
        f"CREATE DOMAIN {pg_schema}.posint AS integer CHECK (VALUE > 0)",
        f"CREATE TYPE {pg_schema}.mood AS ENUM ('sad', 'happy')",
        f"CREATE TABLE {pg_schema}.v (id int PRIMARY KEY, {columns})",
        f"INSERT INTO {pg_schema}.v VALUES (1, "
        + ", ".join(
            f"{value}::{pg_schema}.{t}" if t in ("posint", "mood") else value
            for t, value in _ALL_TYPES.values()
        )
        + ")",
    )
    schema = dialect.describe(TableId(pg_schema, "v"))
    chunk = dialect.read_chunk(ChunkSpec(schema, ("id",), None, (1,), None, 10))
    (row,) = chunk.rows.to_pylist()
    # What pgoutput sends is each type's output text; load it by the column's OID (as the
    # Relation message gives it) with the log decoder's transformer.
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET TimeZone TO 'Asia/Tokyo'")  # must not matter
        result = conn.pgconn.exec_(f"SELECT * FROM {pg_schema}.v".encode())
        raw = [result.get_value(0, i) for i in range(result.nfields)]
    log_tx = pg_types.transformer()
    for column, text in zip(schema.columns, raw, strict=True):
        expected = None if text is None else log_tx.get_loader(column.type_code, 0).load(text)
        got = row[column.name]
        assert got == expected and type(got) is type(expected), (column, got, expected)
    assert row["bp"] == "ab   " and row["num"] == "12345678901234.500000"
    assert row["tz"] == datetime(2024, 2, 29, 18, 29, 59, 500000, tzinfo=UTC)
    assert row["js"] == '{"a": null, "b": [1, 2.50]}' and row["dom"] == "5"
    converter = dialect.row_converter(schema)
    assert converter is not None
    converted = converter(row)
    assert converted["js"] == RawJson(row["js"]) and converted["jt"] == RawJson('{"b":  1}')
    # The last key comes straight from the loaders too.
    assert chunk.last_key == (1,)


# Edge values of each type the chunk reader reads in binary or casts in SQL (issue 16): each
# row's READ value must be what the log decoder loads from the value's output text.
_EDGES = {
    "b": ("boolean", ["true", "false"]),
    "i2": ("smallint", ["-32768", "32767"]),
    "i4": ("integer", ["-2147483648", "2147483647"]),
    "i8": ("bigint", ["-9223372036854775808", "9223372036854775807"]),
    "o": ("oid", ["0", "4294967295"]),
    "f4": ("real", ["'NaN'", "'-Infinity'", "'-0'", "'1e-45'", "'3.4028235e38'", "'0.1'"]),
    "f8": (
        "double precision",
        ["'Infinity'", "'5e-324'", "'1.7976931348623157e308'", "'-0'", "'0.12345678901234568'"],
    ),
    "t": ("text", ["''", "'é 😀 \\ \"'"]),
    "vc": ("varchar(3)", ["'ab '", "''"]),
    "bp": ("char(4)", ["'a'", "''"]),
    "nm": ("name", ["''", "'Ünï'"]),
    "ch": ('"char"', ['chr(200)::"char"', "''"]),  # a high byte: escaped in its text
    "by": ("bytea", ["'\\x'", "'\\x00ff'"]),
    "d": ("date", ["'0001-01-01'", "'9999-12-31'"]),
    "ts": ("timestamp", ["'0001-01-01 00:00:00'", "'9999-12-31 23:59:59.999999'"]),
    "tz": ("timestamptz", ["'0001-01-01 00:00:00+00'", "'9999-12-31 23:59:59.999999+00'"]),
    "tm": ("time", ["'00:00:00'", "'23:59:59.999999'"]),
}


def _edge_rows() -> int:
    return max(len(values) for _, values in _EDGES.values())


@pytest.mark.parametrize("extra_float_digits", [None, "0"])
def test_binary_read_values_equal_the_log_text_loads(
    pg_url: str, pg_engine: sa.Engine, pg_schema: str, extra_float_digits: str | None
) -> None:
    """Values read in binary (or cast in SQL) are what the log decoder loads from the output
    text, edge values included; with extra_float_digits = 0 (a server or role setting: the
    text rounds floats to 15 digits) float8 is read through its text, rounded alike."""
    columns = ", ".join(f"{name} {sql_type}" for name, (sql_type, _) in _EDGES.items())
    rows = []
    for i in range(_edge_rows()):
        values = [vs[i % len(vs)] for _, vs in _EDGES.values()]
        rows.append(f"({i}, {', '.join(values)})")
    nulls = ", ".join("NULL" for _ in _EDGES)
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.e (id int PRIMARY KEY, {columns})",
        f"INSERT INTO {pg_schema}.e VALUES {', '.join(rows)}, (99, {nulls})",
    )
    url, options = pg_url, {}
    if extra_float_digits is not None:
        options = {"options": f"-c extra_float_digits={extra_float_digits}"}
        url = sa.make_url(pg_url).update_query_dict(options).render_as_string(hide_password=False)
    dialect = PostgresDialect(url, TableId(pg_schema, "debezium_signal"), "unused")
    try:
        schema = dialect.describe(TableId(pg_schema, "e"))
        chunk = dialect.read_chunk(ChunkSpec(schema, ("id",), None, (99,), None, 100))
    finally:
        dialect.close()
    assert chunk.rows.schema == schema.arrow_schema()
    got = chunk.rows.to_pylist()
    # The log side: each value's output text (in the same session settings, in UTC: year
    # 9999 in a zone east of it is year 10000), loaded by OID.
    with psycopg.connect(pg_url, **options) as conn:
        conn.execute("SET TimeZone TO 'UTC'")
        result = conn.pgconn.exec_(f"SELECT * FROM {pg_schema}.e ORDER BY id".encode())
        texts = [
            [result.get_value(r, c) for c in range(result.nfields)] for r in range(result.ntuples)
        ]
    log_tx = pg_types.transformer()
    assert len(got) == len(texts) == _edge_rows() + 1
    for row, raw in zip(got, texts, strict=True):
        for column, text in zip(schema.columns, raw, strict=True):
            want = None if text is None else log_tx.get_loader(column.type_code, 0).load(text)
            value = row[column.name]
            same = value == want or (value != value and want != want)  # NaN
            assert same and type(value) is type(want), (column.name, row["id"], value, want)
            if isinstance(want, float):  # -0.0 is not 0.0
                assert str(value) == str(want), (column.name, value, want)
    f8 = {r["id"]: r["f8"] for r in got}
    if extra_float_digits is None:  # the shortest exact text: binary is the same value
        assert f8[2] == 1.7976931348623157e308 and f8[4] == 0.12345678901234568
    else:  # 15 digits: the maximum rounds up past it (inf, as Python reads it)
        assert f8[2] == float("inf") and f8[4] == 0.123456789012346
    assert got[0]["ch"] == "\\303" and got[0]["o"] == 0 and got[1]["o"] == 4294967295
    assert got[5]["f4"] == 0.1  # float4's text read as a double, not 0.10000000149...


@pytest.mark.parametrize(
    ("sql_type", "value"),
    [
        ("date", "'infinity'"),
        ("date", "'10000-01-01'"),
        ("date", "'0001-12-31 BC'"),
        ("timestamp", "'-infinity'"),
        ("timestamp", "'10000-01-01 00:00:00'"),
        ("timestamptz", "'9999-12-31 23:59:59.999999-01'"),  # year 10000 in UTC
        ("time", "'24:00:00'"),
    ],
)
def test_a_value_python_cannot_hold_fails_the_read_as_the_log_loaders_would(
    dialect: PostgresDialect,
    pg_url: str,
    pg_engine: sa.Engine,
    pg_schema: str,
    sql_type: str,
    value: str,
) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.x (id int PRIMARY KEY, v {sql_type})",
        f"INSERT INTO {pg_schema}.x VALUES (1, {value})",
    )
    schema = dialect.describe(TableId(pg_schema, "x"))
    with psycopg.connect(pg_url) as conn:  # the log decoder's loaders refuse it too
        conn.execute("SET TimeZone TO 'UTC'")
        text = conn.pgconn.exec_(f"SELECT v FROM {pg_schema}.x".encode()).get_value(0, 0)
    with pytest.raises(psycopg.DataError):
        pg_types.transformer().get_loader(schema.columns[1].type_code, 0).load(text)
    with pytest.raises(TableError, match="cannot represent"):
        dialect.read_chunk(ChunkSpec(schema, ("id",), None, (1,), None, 10))
    run(pg_engine, f"CREATE TABLE {pg_schema}.xk (v {sql_type} PRIMARY KEY)")
    run(pg_engine, f"INSERT INTO {pg_schema}.xk VALUES ({value})")
    keyed = dialect.describe(TableId(pg_schema, "xk"))
    with pytest.raises(TableError, match="cannot represent"):
        dialect.max_key(keyed, ("v",), None)


def test_timestamptz_keys_are_utc_whatever_the_server_zone(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.tt (at timestamptz PRIMARY KEY)",
        f"INSERT INTO {pg_schema}.tt VALUES ('2024-03-31 01:30:00+00'), "
        "('2024-03-31 02:30:00+02'), ('2024-10-27 00:30:00+00')",
    )
    schema = dialect.describe(TableId(pg_schema, "tt"))
    upto = dialect.max_key(schema, ("at",), None)
    assert upto == (datetime(2024, 10, 27, 0, 30, tzinfo=UTC),)
    first = dialect.read_chunk(ChunkSpec(schema, ("at",), None, upto, None, 1))
    assert first.last_key == (datetime(2024, 3, 31, 0, 30, tzinfo=UTC),)
    assert first.last_key[0].utcoffset() == timedelta(0)
    rest = dialect.read_chunk(ChunkSpec(schema, ("at",), first.last_key, upto, None, 10))
    assert rest.rows.num_rows == 2


# --- watermarks and capture ---------------------------------------------------------------


def test_watermark_insert_is_committed(dialect: PostgresDialect, pg_engine: sa.Engine) -> None:
    window = str(uuid.uuid4())
    dialect.write_watermark(Watermark(window, WatermarkKind.OPEN))
    dialect.write_watermark(Watermark(window, WatermarkKind.CLOSE))
    with pg_engine.connect() as conn:
        back = read_signals(conn, dialect.signal_table)
    assert sorted(back, key=lambda s: s.id) == [  # type: ignore[union-attr]
        Watermark(window, WatermarkKind.CLOSE),
        Watermark(window, WatermarkKind.OPEN),
    ]


def published(engine: sa.Engine, publication: str) -> set[TableId]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = :p"),
            {"p": publication},
        )
        return {TableId(r.schemaname, r.tablename) for r in rows}


def test_ensure_captured_adds_tables_to_the_publication(
    dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str
) -> None:
    odd = TableId(pg_schema, 'Odd "%" name')
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.a (id int PRIMARY KEY)",
        f"CREATE TABLE {pg_catalog.quote_table(odd)} (id int PRIMARY KEY)",
        f"CREATE TABLE {pg_schema}.p (id int PRIMARY KEY) PARTITION BY RANGE (id)",
        f"CREATE TABLE {pg_schema}.p1 PARTITION OF {pg_schema}.p FOR VALUES FROM (0) TO (10)",
    )
    with pytest.raises(SetupError, match="does not exist; run `snapshotter init`"):
        dialect.ensure_captured([TableId(pg_schema, "a")])
    change = pg_publications.ensure_publication(
        pg_engine, dialect.publication, [dialect.signal_table]
    )
    assert change.created and change.added == (dialect.signal_table,)
    wanted = [TableId(pg_schema, "a"), odd, TableId(pg_schema, "p")]
    assert dialect.ensure_captured(wanted) == wanted
    assert dialect.ensure_captured(wanted) == []
    # The partitioned table is published as itself (publish_via_partition_root).
    assert published(pg_engine, dialect.publication) == {dialect.signal_table, *wanted}
    with pytest.raises(TableError, match="does not exist"):
        dialect.ensure_captured([TableId(pg_schema, "missing")])


def test_log_end_is_past_what_committed_and_flushed(
    dialect: PostgresDialect, pg_engine: sa.Engine
) -> None:
    before = dialect.log_end()
    dialect.write_watermark(Watermark(str(uuid.uuid4()), WatermarkKind.OPEN))
    after = dialect.log_end()
    assert 0 < before < after
    text = scalar(pg_engine, "SELECT pg_current_wal_flush_lsn()::text")
    high, low = text.split("/")
    assert (int(high, 16) << 32 | int(low, 16)) >= after


# --- snapshotter init ---------------------------------------------------------------------


def test_prerequisites_on_the_dev_server(pg_engine: sa.Engine, pg_schema: str) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.ints (id int PRIMARY KEY, n bigint)",
        f"CREATE TABLE {pg_schema}.docs (id int PRIMARY KEY, body text)",
        f"CREATE TABLE {pg_schema}.full_docs (id int PRIMARY KEY, body text)",
        f"ALTER TABLE {pg_schema}.full_docs REPLICA IDENTITY FULL",
        f"CREATE TABLE {pg_schema}.nokey (n int)",
        f'CREATE TABLE {pg_schema}."Parted" (id int PRIMARY KEY, b bytea) PARTITION BY RANGE (id)',
        f'CREATE TABLE {pg_schema}."Parted_1" PARTITION OF {pg_schema}."Parted" '
        "FOR VALUES FROM (0) TO (10)",
    )
    tables = [
        TableId(pg_schema, name)
        for name in ("ints", "docs", "full_docs", "nokey", "Parted", "missing")
    ]
    problems = pg_setup.check_prerequisites(pg_engine, tables, f"{pg_schema}_slot")
    errors = {p.what.split(":")[0]: p for p in problems if p.severity == "error"}
    advice = {p.what.split(":")[0]: p for p in problems if p.severity == "warning"}
    assert not any("wal_level" in p.what for p in problems)  # the dev server is logical
    assert not any("REPLICATION" in p.what for p in problems)
    # TOAST alone is a warning: capture works, with Debezium's placeholder for the value.
    docs = advice[f"{pg_schema}.docs should have REPLICA IDENTITY FULL"]
    assert docs.fix == f"ALTER TABLE {pg_schema}.docs REPLICA IDENTITY FULL;"
    assert "unchanged" in docs.what and "TOAST" in docs.what
    assert "__debezium_unavailable_value" in docs.what
    assert f"execute-snapshot of {pg_schema}.docs is refused" in docs.what
    nokey = errors[f"{pg_schema}.nokey needs REPLICA IDENTITY FULL"]
    assert "no primary key" in nokey.what
    # Replica identity is per partition (not inherited); the fix quotes the mixed case.
    part = advice[
        f"partition {pg_schema}.Parted_1 of {pg_schema}.Parted should have REPLICA IDENTITY FULL"
    ]
    assert part.fix == f'ALTER TABLE {pg_schema}."Parted_1" REPLICA IDENTITY FULL;'
    assert any("does not exist" in p.what for p in errors.values())
    assert len(errors) == 2  # nokey and missing; ints and full_docs are fine
    keep = scalar(pg_engine, "SHOW max_slot_wal_keep_size")
    warnings = [p for p in problems if p.severity == "warning"]
    assert any("max_slot_wal_keep_size" in p.fix for p in warnings) == (keep == "-1")


def test_publication_and_slot_setup(pg_url: str, pg_engine: sa.Engine, pg_schema: str) -> None:
    publication, slot = f"{pg_schema}_pub", f"{pg_schema}_slot"
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.a (id int PRIMARY KEY)",
        f"CREATE TABLE {pg_schema}.b (id int PRIMARY KEY)",
    )
    a, b = TableId(pg_schema, "a"), TableId(pg_schema, "b")
    try:
        created = pg_publications.ensure_publication(pg_engine, publication, [a])
        assert created.created and created.statements == (
            f"CREATE PUBLICATION {publication} FOR TABLE {pg_schema}.a "
            "WITH (publish_via_partition_root = true)",
        )
        added = pg_publications.ensure_publication(pg_engine, publication, [a, b])
        assert not added.created and added.added == (b,)
        assert str(pg_publications.ensure_publication(pg_engine, publication, [a, b])).endswith(
            "already there"
        )
        assert scalar(
            pg_engine, "SELECT pubviaroot FROM pg_publication WHERE pubname = :p", p=publication
        )
        assert pg_setup.ensure_slot(pg_url, slot) == "created"
        assert pg_setup.ensure_slot(pg_engine, slot) == "existing"
        assert (
            scalar(
                pg_engine,
                "SELECT plugin FROM pg_replication_slots WHERE slot_name = :s",
                s=slot,
            )
            == "pgoutput"
        )
        assert not [p for p in pg_setup.check_prerequisites(pg_engine, [], slot) if slot in p.what]
    finally:
        assert pg_setup.drop_slot(pg_engine, slot) is True
        run(pg_engine, f"DROP PUBLICATION IF EXISTS {publication}")
    assert pg_setup.drop_slot(pg_engine, slot) is False


def test_a_slot_of_the_wrong_kind_is_reported(pg_engine: sa.Engine, pg_schema: str) -> None:
    slot = f"{pg_schema}_wrong"
    with pg_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(
            sa.text("SELECT pg_create_logical_replication_slot(:s, 'test_decoding')"), {"s": slot}
        )
    try:
        (problem,) = [
            p for p in pg_setup.check_prerequisites(pg_engine, [], slot) if slot in p.what
        ]
        assert "test_decoding" in problem.what and "pg_drop_replication_slot" in problem.fix
        with pytest.raises(SetupError, match="needs a logical pgoutput slot"):
            pg_setup.ensure_slot(pg_engine, slot)
    finally:
        pg_setup.drop_slot(pg_engine, slot)


def test_resolve_tables(dialect: PostgresDialect, pg_engine: sa.Engine, pg_schema: str) -> None:
    run(
        pg_engine,
        f"CREATE TABLE {pg_schema}.orders_1 (id int PRIMARY KEY)",
        f"CREATE TABLE {pg_schema}.orders_2 (id int PRIMARY KEY)",
        f'CREATE TABLE {pg_schema}."Orders" (id int PRIMARY KEY)',
    )
    found = resolve_tables(
        dialect,
        [f'{pg_schema}."Orders"', rf"{pg_schema}\.orders_\d", f"{pg_schema}.orders_1"],
        "public",
    )
    assert found == [
        TableId(pg_schema, "Orders"),
        TableId(pg_schema, "orders_1"),
        TableId(pg_schema, "orders_2"),
    ]
    assert resolve_tables(dialect, [rf"{pg_schema}\.nothing.*"], "public") == []
    with pytest.raises(TableError, match="does not exist"):
        resolve_tables(dialect, [f"{pg_schema}.orders"], "public")
