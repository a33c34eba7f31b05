"""Chunk bounds on MySQL / MariaDB key types whose index order is not their text order
(issue 15): paging an ENUM, SET, BIT, YEAR, UUID or INET6 key with the dialect's chunk query
returns every row once, in the index's order, and the chunk query stays an index range
(``type = range`` in EXPLAIN) where the plain comparison would not be one.

And the binlog's MariaDB INET6 values, turned to text by ``my_types.inet6_text``, are
written exactly as the server writes them, for addresses of every zero-run shape."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from signals.names import TableId
from snapshotter.core.keys import decode_key, encode_key
from snapshotter.sources.base import ChunkSpec, TableError, TableSchema
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.mysql.dialect import MySqlDialect

pytestmark = pytest.mark.integration

UTF8 = "DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_general_ci"


def run(engine: sa.Engine, database: str, *statements: str) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{database}`")
        for statement in statements:
            conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


def fetch(engine: sa.Engine, database: str, statement: str) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        conn.exec_driver_sql(f"USE `{database}`")
        result = conn.exec_driver_sql(statement, execution_options={"no_parameters": True})
        return [tuple(r) for r in result]


@pytest.fixture
def dialect(mysql_url: str, mysql_db: str) -> Iterator[MySqlDialect]:
    out = MySqlDialect(sa.make_url(mysql_url).set(database=mysql_db), TableId(None, "sig"))
    yield out
    out.close()


def page_all(dialect: MySqlDialect, schema: TableSchema, limit: int) -> list[tuple[Any, ...]]:
    """Every key the chunk queries return, paging as the engine does (bounds through the
    state file's codec)."""
    keys = schema.primary_key
    upto = dialect.max_key(schema, keys, None)
    assert upto is not None
    out: list[tuple[Any, ...]] = []
    after = None
    while True:
        chunk = dialect.read_chunk(ChunkSpec(schema, keys, after, upto, None, limit))
        out.extend(tuple(r[k] for k in keys) for r in chunk.rows.to_pylist())
        if chunk.last_key is None or chunk.rows.num_rows < limit:
            return out
        after = decode_key(encode_key(chunk.last_key))


# (column type, SQL literals of the stored keys); 'nope' is stored as the ENUM error value.
KEYS: dict[str, tuple[str, list[str]]] = {
    "enum": ("enum('z','b','a','É','x y')", ["'nope'", "'z'", "'b'", "'a'", "'É'", "'x y'"]),
    "set": ("set('z','b','a')", ["''", "'z'", "'b'", "'a'", "'z,b'", "'z,a'", "'b,a'", "'z,b,a'"]),
    "bit": ("bit(8)", ["b'0'", "b'1'", "b'10'", "b'1111111'", "b'10000000'", "b'11111111'"]),
    "year": ("year", ["0", "1901", "1969", "1970", "1999", "2000", "2069", "2070", "2155"]),
    "uuid": (
        "uuid",
        [
            "'00000000-0000-0000-0000-000000000000'",
            "'123e4567-e89b-12d3-a456-426614174000'",
            "'223e4567-e89b-12d3-a456-426614174000'",
            "'123e4567-e89c-12d3-a456-426614174000'",
            "'123e4567-e89b-42d3-a456-426614174000'",
            "'ffffffff-ffff-ffff-ffff-ffffffffffff'",
        ],
    ),
    "inet6": ("inet6", ["'::'", "'::1'", "'1::'", "'::ffff:1.2.3.4'", "'2001:db8::1'", "'f::'"]),
    "time": ("time(6)", ["'-838:59:59'", "'-01:02:03.25'", "'-00:00:00.000001'", "'00:00:00'"]),
}


@pytest.mark.parametrize("limit", [1, 2, 3])
@pytest.mark.parametrize("name", list(KEYS))
def test_paging_returns_every_key_once_in_the_index_order(
    name: str, limit: int, dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    column, literals = KEYS[name]
    values = ", ".join(f"({v}, {i})" for i, v in enumerate(literals))
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE t (k {column} NOT NULL PRIMARY KEY, n int) {UTF8}",
        "SET SESSION sql_mode = ''",
        f"INSERT INTO t VALUES {values}",
    )
    schema = dialect.describe(TableId(mysql_db, "t"))
    in_order = [(r[0],) for r in fetch(mysql_engine, mysql_db, "SELECT k FROM t ORDER BY k")]
    assert len(in_order) == len(literals)
    assert page_all(dialect, schema, limit) == in_order  # each once, in the index's order


def _analyzed(engine: sa.Engine, database: str, column: str, values: str) -> None:
    run(
        engine,
        database,
        f"CREATE TABLE r (k {column} NOT NULL, id int NOT NULL, v int, PRIMARY KEY (k, id)) "
        + UTF8,
        f"INSERT INTO r SELECT {values}, seq, seq FROM seq_1_to_3000",
        "ANALYZE TABLE r",
    )


def assert_range(plan: str) -> None:
    rows = [json.loads(line) for line in plan.splitlines()]  # one JSON object per plan row
    assert [row["type"] for row in rows] == ["range"], plan
    assert rows[0]["key"] == "PRIMARY", plan


def test_an_enum_key_is_paged_by_an_index_range(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    # ``k > 2`` and ``k > 'b'`` both make MariaDB read the whole index ("index" in EXPLAIN).
    _analyzed(
        mysql_engine, mysql_db, "enum('z','b','a','q','r')", "ELT(1 + seq % 5, 'z','b','a','q','r')"
    )
    schema = dialect.describe(TableId(mysql_db, "r"))
    keys = ("k", "id")
    for condition in (None, "v > 5 OR v < 2"):
        assert_range(
            dialect.explain_chunk(ChunkSpec(schema, keys, ("b", 100), ("q", 2000), condition, 5))
        )
        assert_range(dialect.explain_chunk(ChunkSpec(schema, keys, None, ("a", 40), condition, 5)))
    assert_range(
        dialect.explain_chunk(ChunkSpec(schema, ("k", "id"), ("r", 10), ("r", 2999), None, 5))
    )


def test_bit_and_year_keys_are_paged_by_an_index_range(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    _analyzed(mysql_engine, mysql_db, "bit(8)", "seq % 256")
    schema = dialect.describe(TableId(mysql_db, "r"))
    assert_range(
        dialect.explain_chunk(ChunkSpec(schema, ("k", "id"), (b"\x05", 10), (b"\xc8", 9), None, 5))
    )
    run(mysql_engine, mysql_db, "DROP TABLE r")
    _analyzed(mysql_engine, mysql_db, "year", "1901 + seq % 254")
    schema = dialect.describe(TableId(mysql_db, "r"))
    assert_range(
        dialect.explain_chunk(ChunkSpec(schema, ("k", "id"), (1950, 10), (2100, 9), None, 5))
    )


def test_an_enum_with_an_empty_member_is_refused_when_the_snapshot_starts(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(mysql_engine, mysql_db, f"CREATE TABLE e (k enum('','a') NOT NULL PRIMARY KEY) {UTF8}")
    schema = dialect.describe(TableId(mysql_db, "e"))
    with pytest.raises(TableError, match=r"empty string as a member.*surrogate-key"):
        dialect.snapshot_key(schema, None)


def test_a_zero_date_key_is_refused_with_the_reason(
    dialect: MySqlDialect, mysql_engine: sa.Engine, mysql_db: str
) -> None:
    run(
        mysql_engine,
        mysql_db,
        f"CREATE TABLE z (d date NOT NULL PRIMARY KEY) {UTF8}",
        "SET SESSION sql_mode = ''",
        "INSERT INTO z VALUES ('0000-00-00'), ('2024-01-01')",
    )
    schema = dialect.describe(TableId(mysql_db, "z"))
    upto = dialect.max_key(schema, ("d",), None)
    with pytest.raises(TableError, match="'0000-00-00', which has a zero part"):
        dialect.read_chunk(ChunkSpec(schema, ("d",), None, upto or (), None, 10))


def test_inet6_text_is_the_servers(mysql_engine: sa.Engine, mysql_db: str) -> None:
    rng = random.Random(15)
    words = [0, 0, 0, 1, 0xFFFF, 0xDB8, 0x2001]
    shapes = {bytes(16), bytes(15) + b"\x01", bytes(10) + b"\xff\xff\x01\x02\x03\x04"}
    shapes |= {
        bytes(12) + bytes([a, b, c, d]) for a, b, c, d in itertools.product((0, 1), repeat=4)
    }
    while len(shapes) < 400:
        shapes.add(b"".join(rng.choice(words).to_bytes(2, "big") for _ in range(8)))
    packed = sorted(shapes)
    values = ", ".join(f"(X'{p.hex()}')" for p in packed)
    run(mysql_engine, mysql_db, "CREATE TABLE i (a inet6)", f"INSERT INTO i VALUES {values}")
    texts = fetch(
        mysql_engine, mysql_db, "SELECT HEX(CAST(a AS BINARY(16))), CAST(a AS CHAR) FROM i"
    )
    assert len(texts) == len(packed)
    for hexed, text in texts:
        assert my_types.inet6_text(bytes.fromhex(hexed)) == text
