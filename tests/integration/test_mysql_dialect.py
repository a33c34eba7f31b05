"""The MySQL / MariaDB dialect on a real server: catalog and keys, the chunk query's plan,
paging under a case- and accent-insensitive PAD SPACE collation, filters, and the value
model: a READ row and the binlog row of the same stored row must be equal, Python types
included, for every column type snapshotter supports (MariaDB 10.11, mysql-replication
1.0.17: ``my_types`` corrects an empty VARBINARY/BLOB, str '' in the binlog; a negative TIME
with a fraction, decoded wrongly; BINARY(n) values, their trailing 0x00 cut in the binlog;
MariaDB's UUID/INET6/INET4, binary in the binlog; YEAR 0000, 1900 in the binlog; zero
dates, text from pymysql and None in the binlog).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import random
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
import pytest
import sqlalchemy as sa

from signals.model import SignalError
from signals.names import TableId
from signals.parser import parse_signal
from snapshotter.core.events import ChangeEvent, Op
from snapshotter.core.keys import Key, decode_key, encode_key
from snapshotter.sources.base import ChunkSpec, TableError, TableSchema
from snapshotter.sources.log import Change, LogItem, TableShape
from snapshotter.sources.mysql import client as my_client
from snapshotter.sources.mysql import types as mt
from snapshotter.sources.mysql.decoder import BinlogDecoder
from snapshotter.sources.mysql.dialect import MySqlDialect
from snapshotter.sources.mysql.reader import BinlogLogReader

pytestmark = pytest.mark.integration

UTF8 = "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci"


# -- helpers -----------------------------------------------------------------------------------


def run(engine: sa.Engine, database: str, *statements: str) -> None:
    """Statements as written (no parameters, so "%" is literal), in ``database``."""
    with engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{database}`")
        for statement in statements:
            conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


def fetch(engine: sa.Engine, database: str, sql: str) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{database}`")
        return [
            tuple(r) for r in conn.exec_driver_sql(sql, execution_options={"no_parameters": True})
        ]


@pytest.fixture(params=my_client.available())
def dialect(
    request: pytest.FixtureRequest, mysql_url: str, mysql_db: str
) -> Iterator[MySqlDialect]:
    """The dialect with each installed client library for its chunk connection
    (mysqlclient, pymysql): both must read the same values."""
    url = sa.make_url(mysql_url).set(database=mysql_db)
    out = MySqlDialect(url, TableId(None, "debezium_signal"), client=request.param)
    yield out
    out.close()


def new_server_id() -> int:
    # Distinct per reader: the server drops an older dump of the same server id.
    return random.SystemRandom().randrange(100_000, 2**31 - 1)


def binlog_items(
    dialect: MySqlDialect,
    table: TableId,
    write: Callable[[], None],
    done: Callable[[list[LogItem]], bool],
    timeout: float = 15.0,
) -> list[LogItem]:
    """What the binlog reader makes of ``write()`` for ``table``, read from the binlog's end
    before it, until ``done(items)``."""
    decoder = BinlogDecoder(
        "test",
        captured=lambda t: t == table,
        key_columns=lambda t: dialect.describe(t).primary_key,
        column_types=dialect.catalog_types,
    )
    reader = BinlogLogReader(
        dialect.connect_args(),
        server_id=new_server_id(),
        decoder=decoder,
        start=dialect.binlog_start(),
    )
    items: list[LogItem] = []
    try:
        write()
        deadline = time.monotonic() + timeout
        while not done(items):
            assert time.monotonic() < deadline, f"binlog items so far: {items}"
            items.extend(reader.read(0.5))
    finally:
        reader.close()
    return items


def changes_of(items: Sequence[LogItem]) -> list[ChangeEvent]:
    return [i.event for i in items if isinstance(i, Change)]


def chunk_rows(
    dialect: MySqlDialect, schema: TableSchema, upto: Key, condition: str | None = None
) -> list[dict[str, Any]]:
    chunk = dialect.read_chunk(ChunkSpec(schema, schema.primary_key, None, upto, condition, 10_000))
    assert chunk.rows.schema == schema.arrow_schema()
    rows = chunk.rows.to_pylist()
    convert = dialect.row_converter(schema)
    return rows if convert is None else [convert(r) for r in rows]


def page_all(
    dialect: MySqlDialect,
    schema: TableSchema,
    keys: Sequence[str],
    upto: Key,
    limit: int,
    condition: str | None = None,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    after: Key | None = None
    while True:
        chunk = dialect.read_chunk(ChunkSpec(schema, keys, after, upto, condition, limit))
        assert chunk.rows.num_rows <= limit
        rows.extend(chunk.rows.to_pylist())
        if chunk.last_key is None:
            return rows
        assert chunk.last_key == tuple(rows[-1][k] for k in keys)
        after = decode_key(encode_key(chunk.last_key))  # as the state file keeps it


def typed(value: Any) -> Any:
    """A value with its Python type, compared exactly (Decimal scale, float bits, the
    instant and UTC offset of an aware datetime whatever its tzinfo class)."""
    if isinstance(value, dt.datetime):
        return (dt.datetime, value.isoformat())
    if isinstance(value, decimal.Decimal):
        return (decimal.Decimal, str(value))
    if isinstance(value, float):
        return (float, value.hex())
    return (type(value), value)


def typed_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: typed(v) for k, v in row.items()}


# -- the type matrix ---------------------------------------------------------------------------

MATRIX_DDL = f"""CREATE TABLE matrix (
  id int NOT NULL,
  i int NULL,
  ub bigint unsigned NULL,
  de decimal(14,3) NULL,
  vc varchar(40) COLLATE utf8mb4_general_ci NULL,
  ch char(6) NULL,
  dt datetime(6) NULL,
  ts timestamp(6) NULL DEFAULT NULL,
  da date NULL,
  vb varbinary(16) NULL,
  bl blob NULL,
  js json NULL,
  en enum('x','y','z') NULL,
  st set('a','b','c') NULL,
  bt bit(10) NULL,
  fl float NULL,
  db double NULL,
  tm time(6) NULL,
  yr year NULL,
  tx text NULL,
  PRIMARY KEY (id)
) {UTF8}"""

MATRIX_COLUMNS = (
    "id i ub de vc ch dt ts da vb bl js en st bt fl db tm yr tx".split()  # noqa: SIM905
)

# Column values as SQL literals; columns not named are NULL.
MATRIX_ROWS: dict[str, dict[str, str]] = {
    "nulls": {},
    "typical": {
        "i": "-42",
        "ub": "18446744073709551615",
        "de": "-12345678901.125",
        "vc": "'Grüße 😀'",
        "ch": "'ab'",
        "dt": "'2024-02-29 23:59:59.123456'",
        "ts": "'2024-06-01 12:00:00.5'",
        "da": "'2024-02-29'",
        "vb": "X'00FF10'",
        "bl": "X'DEADBEEF00'",
        "js": """'{"a": [1, 2.5, null], "b": "é"}'""",
        "en": "'y'",
        "st": "'c,a'",
        "bt": "b'1010101010'",
        "fl": "1.1",
        "db": "0.1",
        "tm": "'-838:59:59'",
        "yr": "2155",
        "tx": "'line1\\nline2\\ttab'",
    },
    "edges": {
        "i": "2147483647",
        "ub": "0",
        "de": "0.000",
        "vc": "'trailing  '",
        "ch": "'a  '",
        "dt": "'1000-01-01 00:00:00'",
        "ts": "'1970-01-01 00:00:01'",
        "da": "'9999-12-31'",
        "vb": "X'0000'",
        "bl": "X'20'",
        "js": "'[]'",
        "en": "'x'",
        "st": "''",
        "bt": "b'0'",
        "fl": "-3.4e38",
        "db": "-1.7976931348623157e308",
        "tm": "'12:34:56.000001'",
        "yr": "1901",
        "tx": "''",
    },
    "more": {
        "i": "-2147483648",
        "ub": "9223372036854775808",
        "de": "99999999999.999",
        "vc": "'ABC'",
        "ch": "'ÄÖÜ'",
        "dt": "'2038-01-19 03:14:08.000001'",
        "ts": "'2038-01-19 03:14:07.999999'",
        "da": "'1000-01-01'",
        "vb": "X'20'",
        "bl": "X'00'",
        "js": """'{"n": 12345678901234567890, "f": 0.1}'""",
        "en": "'z'",
        "st": "'a,b,c'",
        "bt": "b'1111111111'",
        "fl": "16777217",
        "db": "5e-324",
        "tm": "'838:59:59.999999'",
        "yr": "2000",
        "tx": "'x'",
    },
    "empty_binary": {"vb": "''", "bl": "''"},
    "negative_fractional_time": {"tm": "'-01:02:03.25'"},
}


def insert_matrix_row(row_id: int, values: dict[str, str]) -> str:
    names = ["id", *values]
    literals = [str(row_id), *values.values()]
    return f"INSERT INTO matrix ({', '.join(names)}) VALUES ({', '.join(literals)})"


def test_describe_column_order_and_composite_key_order(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE t (a int NOT NULL, b varchar(10) NOT NULL, c text, "
        f"amount decimal(12,2), PRIMARY KEY (b, a)) {UTF8}",
    )
    schema = dialect.describe(TableId(None, "t"))  # the URL's database by default
    assert schema.table == TableId(mysql_db, "t")
    assert schema.column_names == ("a", "b", "c", "amount")
    assert schema.primary_key == ("b", "a")  # key order, not table order
    assert [(c.type_name, c.nullable, c.arrow_type) for c in schema.columns] == [
        ("int(11)", False, pa.int64()),
        ("varchar(10)", False, pa.string()),
        ("text", True, pa.string()),
        ("decimal(12,2)", True, pa.decimal128(12, 2)),
    ]
    assert dialect.snapshot_key(schema, None) == ("b", "a")
    assert dialect.database == mysql_db
    assert TableId(mysql_db, "t") in dialect.list_tables()


def test_catalog_type_families_equal_the_binlog_table_shape(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(mysql_engine, mysql_db, MATRIX_DDL)
    table = TableId(mysql_db, "matrix")
    schema = dialect.describe(table)
    assert schema.column_names == tuple(MATRIX_COLUMNS)
    assert all(c.type_code != 0 for c in schema.columns), schema.columns
    items = binlog_items(
        dialect,
        table,
        lambda: run(mysql_engine, mysql_db, "INSERT INTO matrix (id) VALUES (1)"),
        lambda items: len(changes_of(items)) == 1,
    )
    shapes = [i for i in items if isinstance(i, TableShape)]
    assert len(shapes) == 1
    assert shapes[0].table == table
    assert shapes[0].columns == schema.signature()
    assert shapes[0].key == ("id",)
    # Spot checks of the family codes (MariaDB: JSON is LONGTEXT, a BLOB in the binlog).
    codes = dict(schema.signature())
    assert codes["ts"] == mt.TIMESTAMP and codes["dt"] == mt.DATETIME and codes["tm"] == mt.TIME
    assert codes["en"] == mt.ENUM and codes["st"] == mt.SET and codes["bt"] == mt.BIT


# Where a READ row and the binlog row of the same stored row cannot be equal today.
MATRIX_XFAIL: dict[str, str] = {}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=pytest.mark.xfail(strict=True, reason=MATRIX_XFAIL[n], raises=AssertionError),
        )
        if n in MATRIX_XFAIL
        else n
        for n in MATRIX_ROWS
    ],
)
def test_read_row_equals_binlog_row(
    name: str, dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(mysql_engine, mysql_db, MATRIX_DDL)
    table = TableId(mysql_db, "matrix")
    schema = dialect.describe(table)
    values = MATRIX_ROWS[name]
    items = binlog_items(
        dialect,
        table,
        lambda: run(mysql_engine, mysql_db, insert_matrix_row(1, values)),
        lambda items: len(changes_of(items)) == 1,
    )
    (event,) = changes_of(items)
    assert event.op is Op.CREATE and event.key == (1,)
    (read,) = chunk_rows(dialect, schema, (1,))
    assert set(read) == set(MATRIX_COLUMNS)
    # The READ row is what was stored (spot checks against the literals)...
    if name == "nulls":
        assert all(v is None for k, v in read.items() if k != "id")
    if name == "typical":
        assert read["vc"] == "Grüße 😀"
        assert read["ub"] == 2**64 - 1
        assert read["de"] == decimal.Decimal("-12345678901.125")
        assert read["ts"] == dt.datetime(2024, 6, 1, 12, 0, 0, 500000, tzinfo=dt.UTC)
        assert read["st"] == "a,c"  # definition order
        assert read["bt"] == (0b1010101010).to_bytes(2, "big")
        f32 = struct.unpack("<f", struct.pack("<f", 1.1))[0]
        assert read["fl"] == f32 and f32 != 1.1  # the float32 exactly, not its 6 digits
        assert read["tm"] == -dt.timedelta(hours=838, minutes=59, seconds=59)
        assert json.loads(read["js"]) == {"a": [1, 2.5, None], "b": "é"}
    if name == "edges":
        assert read["ch"] == "a"  # CHAR pads are not stored
        assert read["vc"] == "trailing  "  # VARCHAR keeps them
        assert read["st"] == ""
        assert read["vb"] == b"\x00\x00" and read["bl"] == b" "
    if name == "empty_binary":
        assert read["vb"] == b"" and read["bl"] == b""
    if name == "negative_fractional_time":
        assert read["tm"] == -dt.timedelta(hours=1, minutes=2, seconds=3, microseconds=250000)
    # ... and the binlog row is the same, Python types included.
    assert typed_row(dict(event.after)) == typed_row(read)


def test_binary_n_read_row_and_key_equal_binlog_row(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE bin (k binary(4) NOT NULL PRIMARY KEY, b binary(4)) {UTF8}",
    )
    table = TableId(mysql_db, "bin")
    schema = dialect.describe(table)
    items = binlog_items(
        dialect,
        table,
        lambda: run(mysql_engine, mysql_db, "INSERT INTO bin VALUES (X'01000000', 'ab')"),
        lambda items: len(changes_of(items)) == 1,
    )
    (event,) = changes_of(items)
    (read,) = chunk_rows(dialect, schema, (b"\xff" * 4,))
    assert read == {"k": b"\x01\x00\x00\x00", "b": b"ab\x00\x00"}
    assert event.key == (read["k"],)
    assert typed_row(dict(event.after)) == typed_row(read)


# Types beyond the matrix: (column definition, SQL literal, why READ and binlog differ today).
MORE_TYPES: dict[str, tuple[str, str, str | None]] = {
    "tinyint_unsigned": ("tinyint unsigned", "255", None),
    "smallint": ("smallint", "-32768", None),
    "mediumint_unsigned": ("mediumint unsigned", "16777215", None),
    "int_unsigned": ("int unsigned", "4294967295", None),
    "bool": ("bool", "1", None),
    "decimal_65_30": (
        "decimal(65,30)",
        "-12345678901234567890123456789012345.123456789012345678901234567891",
        None,
    ),
    "datetime_0": ("datetime", "'2020-01-01 01:02:03'", None),
    "timestamp_0": ("timestamp NULL", "'2020-01-01 01:02:03'", None),
    "negative_time_0": ("time", "'-01:02:03'", None),
    "latin1_varchar": ("varchar(10) CHARACTER SET latin1", "'é'", None),
    "ascii_char": ("char(3) CHARACTER SET ascii", "'ab'", None),
    "full_binary_4": ("binary(4)", "'abcd'", None),
    "point": ("point", "POINT(1, 2)", None),
    "float_denormal": ("float", "1e-45", None),
    "enum_invalid_empty": ("enum('a','b')", "'c'", None),  # non-strict mode stores ''
    "uuid": ("uuid", "'123e4567-e89b-12d3-a456-426614174000'", None),
    "uuid_trailing_zeros": ("uuid", "'12345678-0000-1000-8000-000000000000'", None),
    "inet6": ("inet6", "'2001:db8::1'", None),
    "inet6_zero": ("inet6", "'::'", None),
    "inet6_mapped": ("inet6", "'::ffff:10.1.2.3'", None),
    "inet4": ("inet4", "'10.1.2.3'", None),
    "inet4_trailing_zero": ("inet4", "'10.0.0.0'", None),
    "year_0": ("year", "0", None),
    "zero_date": ("date", "'0000-00-00'", None),
    "zero_datetime": ("datetime", "'0000-00-00 00:00:00'", None),
    "zero_timestamp": ("timestamp NULL", "'0000-00-00 00:00:00'", None),
    "date_zero_day": ("date", "'2024-01-00'", None),
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(
            n,
            marks=pytest.mark.xfail(
                strict=True,
                reason=why,
                raises=pa.ArrowTypeError if n.startswith("zero_") else AssertionError,
            ),
        )
        if (why := MORE_TYPES[n][2]) is not None
        else n
        for n in MORE_TYPES
    ],
)
def test_more_types_read_row_equals_binlog_row(
    name: str, dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    column, literal, _ = MORE_TYPES[name]
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE more (id int NOT NULL PRIMARY KEY, x {column}) {UTF8}",
    )
    table = TableId(mysql_db, "more")
    schema = dialect.describe(table)

    def write() -> None:
        # Without a strict SQL mode, so legacy values (zero dates, invalid ENUMs) are stored.
        run(
            mysql_engine,
            mysql_db,
            "SET SESSION sql_mode = ''",
            f"INSERT INTO more VALUES (1, {literal})",
        )

    items = binlog_items(dialect, table, write, lambda items: len(changes_of(items)) == 1)
    (shape,) = [i for i in items if isinstance(i, TableShape)]
    assert shape.columns == schema.signature()
    (event,) = changes_of(items)
    (read,) = chunk_rows(dialect, schema, (1,))
    assert typed_row(dict(event.after)) == typed_row(read)


def test_generated_columns_are_in_both_rows(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        "CREATE TABLE gen (id int NOT NULL PRIMARY KEY, x int, v int AS (x * 2) VIRTUAL, "
        f"p int AS (x * 3) PERSISTENT) {UTF8}",
    )
    table = TableId(mysql_db, "gen")
    schema = dialect.describe(table)
    items = binlog_items(
        dialect,
        table,
        lambda: run(mysql_engine, mysql_db, "INSERT INTO gen (id, x) VALUES (1, 5)"),
        lambda items: len(changes_of(items)) == 1,
    )
    (shape,) = [i for i in items if isinstance(i, TableShape)]
    assert shape.columns == schema.signature()
    (event,) = changes_of(items)
    (read,) = chunk_rows(dialect, schema, (1,))
    assert read == {"id": 1, "x": 5, "v": 10, "p": 15}
    assert typed_row(dict(event.after)) == typed_row(read)


# -- the chunk query's plan ----------------------------------------------------------------------


@pytest.fixture
def composite(dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str) -> TableSchema:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE comp (a int NOT NULL, b varchar(20) COLLATE utf8mb4_general_ci "
        f"NOT NULL, c datetime NOT NULL, v int, PRIMARY KEY (a, b, c)) {UTF8}",
    )
    start = dt.datetime(2024, 1, 1)
    rows = [
        {"a": i // 20, "b": f"k{(i * 7) % 13}", "c": start + dt.timedelta(minutes=i), "v": i}
        for i in range(3000)
    ]
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{mysql_db}`")
        conn.execute(
            sa.text("INSERT INTO comp (a, b, c, v) VALUES (:a, :b, :c, :v)"),
            rows,
        )
        conn.exec_driver_sql("ANALYZE TABLE comp")
    return dialect.describe(TableId(mysql_db, "comp"))


def assert_range_on_primary(plan: str) -> None:
    rows = [json.loads(line) for line in plan.splitlines()]  # one JSON object per plan row
    assert rows, "EXPLAIN returned nothing"
    for row in rows:
        assert row["type"] == "range", plan
        assert row["key"] == "PRIMARY", plan


@pytest.mark.parametrize("condition", [None, "v % 3 = 0", "b LIKE 'k1%' OR v > 100"])
def test_chunk_query_is_a_range_scan_of_the_composite_key(
    dialect: MySqlDialect, composite: TableSchema, condition: str | None
) -> None:
    keys = composite.primary_key
    assert keys == ("a", "b", "c")
    after = (40, "k3", dt.datetime(2024, 1, 1, 13, 20))
    upto = (60, "k5", dt.datetime(2024, 1, 1, 20, 0))
    for lower in (after, None):
        bound = upto if lower is not None else (3, "k1", dt.datetime(2024, 1, 1, 1, 0))
        plan = dialect.explain_chunk(ChunkSpec(composite, keys, lower, bound, condition, 100))
        assert_range_on_primary(plan)


def test_chunk_query_is_a_range_scan_for_single_column_keys(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE ints (id bigint NOT NULL PRIMARY KEY, v int) {UTF8}",
        f"CREATE TABLE strs (k varchar(20) NOT NULL PRIMARY KEY, v int) {UTF8}",
    )
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{mysql_db}`")
        conn.execute(sa.text("INSERT INTO ints VALUES (:i, :i)"), [{"i": i} for i in range(2000)])
        conn.execute(
            sa.text("INSERT INTO strs VALUES (:k, :i)"),
            [{"k": f"key{i:05d}", "i": i} for i in range(2000)],
        )
        conn.exec_driver_sql("ANALYZE TABLE ints, strs")
    ints = dialect.describe(TableId(mysql_db, "ints"))
    strs = dialect.describe(TableId(mysql_db, "strs"))
    for condition in (None, "v > 5 OR v < 2"):
        assert_range_on_primary(
            dialect.explain_chunk(ChunkSpec(ints, ("id",), (500,), (600,), condition, 50))
        )
        assert_range_on_primary(
            dialect.explain_chunk(ChunkSpec(ints, ("id",), None, (40,), condition, 50))
        )
        plan = dialect.explain_chunk(
            ChunkSpec(strs, ("k",), ("key00500",), ("key00600",), condition, 50)
        )
        assert_range_on_primary(plan)
        assert_range_on_primary(
            dialect.explain_chunk(ChunkSpec(strs, ("k",), None, ("key00040",), None, 9))
        )


def test_composite_chunks_concatenate_to_the_table_in_key_order(
    dialect: MySqlDialect, composite: TableSchema, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    keys = composite.primary_key
    upto = (80, "k5", dt.datetime(2024, 1, 2, 2, 40))
    rows = page_all(dialect, composite, keys, upto, 77)
    expected = fetch(
        mysql_engine,
        mysql_db,
        "SELECT a, b, c, v FROM comp WHERE (a, b, c) <= (80, 'k5', '2024-01-02 02:40:00') "
        "ORDER BY a, b, c",
    )
    assert [(r["a"], r["b"], r["c"], r["v"]) for r in rows] == expected
    assert len(rows) > 1500


# -- paging under a case- and accent-insensitive PAD SPACE collation -----------------------------

# Pairwise distinct under utf8mb4_general_ci, which calls 'b' = 'B' = 'b ' and 'e' = 'é' =
# 'E' = 'É' and 'a' = 'ä' = 'Ä', and 's' = 'ß': one of each class can be stored.
CI_KEYS = ["a", "B", "c ", "É", "f", "Ö", "ß", "x\t", "y", "Z  ", "😀", "", "mixed Case"]


@pytest.mark.parametrize("limit", [1, 2])
def test_paging_a_ci_key_returns_every_row_once_with_stored_values(
    limit: int, dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE ci (k varchar(20) COLLATE utf8mb4_general_ci NOT NULL PRIMARY KEY, "
        f"n int) {UTF8}",
    )
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{mysql_db}`")
        conn.execute(
            sa.text("INSERT INTO ci VALUES (:k, :n)"),
            [{"k": k, "n": n} for n, k in enumerate(CI_KEYS)],
        )
        # The collation calls these equal to stored keys: they cannot coexist.
        for clash in ("A", "b", "C", "e", "ä", "s", "z", "F "):
            with pytest.raises(sa.exc.IntegrityError), conn.begin_nested():
                conn.execute(sa.text("INSERT INTO ci VALUES (:k, -1)"), {"k": clash})
    schema = dialect.describe(TableId(mysql_db, "ci"))
    in_order = [r[0] for r in fetch(mysql_engine, mysql_db, "SELECT k FROM ci ORDER BY k")]
    upto = dialect.max_key(schema, ("k",), None)
    assert upto == (in_order[-1],)
    rows = page_all(dialect, schema, ("k",), upto, limit)
    assert [r["k"] for r in rows] == in_order  # each row once, in the index's order
    assert sorted(r["k"] for r in rows) == sorted(CI_KEYS)  # stored values unchanged
    assert {r["k"]: r["n"] for r in rows} == {k: n for n, k in enumerate(CI_KEYS)}


def test_a_float_key_whose_maximum_is_not_a_short_decimal_is_read_to_its_end(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    """The max-key query reads a FLOAT key as DOUBLE, as the chunk query does: the text
    protocol's 6 digits (1.1) are below the stored float32 (1.100000023841858), and a
    maximum read that way left the last row out of the snapshot."""
    run(mysql_engine, mysql_db, f"CREATE TABLE fk (k float NOT NULL PRIMARY KEY, v int) {UTF8}")
    run(mysql_engine, mysql_db, "INSERT INTO fk VALUES (0.5, 1), (1.1, 2)")
    schema = dialect.describe(TableId(mysql_db, "fk"))
    upto = dialect.max_key(schema, ("k",), None)
    assert upto is not None and upto[0] == pytest.approx(1.1) and upto[0] > 1.1
    assert [r["v"] for r in page_all(dialect, schema, ("k",), upto, 1)] == [1, 2]


@pytest.mark.parametrize("limit", [1, 2])
def test_paging_a_composite_ci_key(
    limit: int, dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE ci2 (g int NOT NULL, k varchar(20) COLLATE utf8mb4_general_ci NOT NULL, "
        f"PRIMARY KEY (g, k)) {UTF8}",
    )
    stored = [(g, k) for g in (1, 2) for k in CI_KEYS]
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{mysql_db}`")
        conn.execute(
            sa.text("INSERT INTO ci2 VALUES (:g, :k)"), [{"g": g, "k": k} for g, k in stored]
        )
    schema = dialect.describe(TableId(mysql_db, "ci2"))
    upto = dialect.max_key(schema, ("g", "k"), None)
    assert upto is not None
    rows = page_all(dialect, schema, ("g", "k"), upto, limit)
    got = [(r["g"], r["k"]) for r in rows]
    assert got == fetch(mysql_engine, mysql_db, "SELECT g, k FROM ci2 ORDER BY g, k")
    assert sorted(got) == sorted(stored)


# -- filters ----------------------------------------------------------------------------------


def test_a_filter_with_or_stays_inside_its_parentheses(
    dialect: MySqlDialect, composite: TableSchema, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    keys = composite.primary_key
    after = (10, "k3", dt.datetime(2024, 1, 1, 3, 20))
    upto = (12, "k5", dt.datetime(2024, 1, 1, 4, 0))
    chunk = dialect.read_chunk(ChunkSpec(composite, keys, after, upto, "1 = 1 OR a > 0", 1000))
    got = [(r["a"], r["b"], r["c"]) for r in chunk.rows.to_pylist()]
    assert got and all(after < k <= upto for k in got)
    condition = "b LIKE 'k1%' OR v % 5 = 0"
    filtered = dialect.read_chunk(ChunkSpec(composite, keys, after, upto, condition, 1000))
    expected = fetch(
        mysql_engine,
        mysql_db,
        "SELECT a, b, c FROM comp WHERE (a, b, c) > (10, 'k3', '2024-01-01 03:20:00') "
        f"AND (a, b, c) <= (12, 'k5', '2024-01-01 04:00:00') AND ({condition}) "
        "ORDER BY a, b, c",
    )
    assert [(r["a"], r["b"], r["c"]) for r in filtered.rows.to_pylist()] == expected
    assert 0 < len(expected) < len(got)
    # max_key too: the OR does not reach past the filter.
    assert dialect.max_key(composite, keys, "a < 5 AND b = 'k2' OR a = 7 AND v < 0") == (
        4,
        "k2",
        max(
            r[0]
            for r in fetch(mysql_engine, mysql_db, "SELECT c FROM comp WHERE a = 4 AND b = 'k2'")
        ),
    )
    assert dialect.max_key(composite, keys, "1 = 0") is None


def test_a_dollar_quoted_paren_escape_is_refused_for_mysql(dialect: MySqlDialect) -> None:
    assert dialect.dollar_quotes is False
    data = json.dumps(
        {
            "type": "incremental",
            "data-collections": ["comp"],
            "additional-conditions": [{"data-collection": "comp", "filter": "v = $$ ) OR ( $$"}],
        }
    )
    refused = parse_signal("s1", "execute-snapshot", data, dollar_quotes=dialect.dollar_quotes)
    assert isinstance(refused, SignalError)
    assert "parenthes" in refused.problem, refused
    # PostgreSQL reads the same text as one quoted string: accepted there.
    accepted = parse_signal("s1", "execute-snapshot", data, dollar_quotes=True)
    assert not isinstance(accepted, SignalError)


# -- table errors -----------------------------------------------------------------------------


def test_table_errors_for_views_missing_tables_and_keys(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE nokey (a int NULL, b int NOT NULL, c int NOT NULL, d int NOT NULL, "
        f"UNIQUE KEY ua (a), KEY ib (b), UNIQUE KEY ucd (c, d)) {UTF8}",
        f"CREATE TABLE good (u int NOT NULL, UNIQUE KEY uu (u)) {UTF8}",
        "CREATE VIEW v AS SELECT 1 AS x",
    )
    with pytest.raises(TableError, match="is a view"):
        dialect.describe(TableId(mysql_db, "v"))
    with pytest.raises(TableError, match="does not exist"):
        dialect.describe(TableId(mysql_db, "nope"))
    with pytest.raises(TableError, match="does not exist"):
        dialect.describe(TableId("no_such_database_x", "t"))
    assert TableId(mysql_db, "v") not in dialect.list_tables()

    schema = dialect.describe(TableId(mysql_db, "nokey"))
    assert schema.primary_key == ()
    with pytest.raises(TableError, match="no primary key"):
        dialect.snapshot_key(schema, None)
    with pytest.raises(TableError, match="may be NULL"):
        dialect.snapshot_key(schema, "a")  # unique but nullable
    with pytest.raises(TableError, match="no unique index"):
        dialect.snapshot_key(schema, "b")  # indexed, not unique
    with pytest.raises(TableError, match="no unique index"):
        dialect.snapshot_key(schema, "c")  # unique only together with d
    with pytest.raises(TableError, match="not a column"):
        dialect.snapshot_key(schema, "zz")
    good = dialect.describe(TableId(mysql_db, "good"))
    assert dialect.snapshot_key(good, "u") == ("u",)
