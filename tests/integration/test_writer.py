"""The random writer used by convergence tests: it runs, mixes every kind of change, keeps its
key cache true to the table, paces itself, and hands its errors to the caller."""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import psycopg
import pytest

from signals.names import TableId
from tests.integration.writer import KINDS, RandomWriter

pytestmark = pytest.mark.integration


def make_table(pg_url: str, table: TableId, ddl: str, rows: list[tuple[Any, ...]]) -> None:
    with psycopg.connect(pg_url) as conn:
        conn.execute(f"CREATE TABLE {table} ({ddl})")
        if rows:
            marks = ", ".join(["%s"] * len(rows[0]))
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)


def table_keys(pg_url: str, query: str) -> set[tuple[Any, ...]]:
    with psycopg.connect(pg_url) as conn:
        return {tuple(r) for r in conn.execute(query)}


def test_writes_every_kind_of_change_and_keeps_its_cache_true(pg_url: str, pg_schema: str) -> None:
    table = TableId(pg_schema, "items")
    make_table(
        pg_url, table, "id int PRIMARY KEY, v text, n int", [(i, "x", i) for i in range(200)]
    )
    ids = itertools.count(1000)
    writer = RandomWriter(
        pg_url,
        table,
        ["id"],
        new_key=lambda: (next(ids),),
        new_row=lambda key: {"v": uuid.uuid4().hex, "n": key[0] % 7},
        changes=5000,
        hot_keys=5,
        seed=7,
    )
    started = time.monotonic()
    writer.start()
    writer.wait(timeout=120)
    elapsed = time.monotonic() - started
    print(f"\n5000 changes in {elapsed:.1f} s ({writer.counts})")
    assert writer.total == 5000
    assert all(writer.counts[k] > 0 for k in KINDS)
    assert writer.counts["transactions"] >= 5000 / 5
    keys = table_keys(pg_url, f"SELECT id FROM {table}")
    assert keys == set(writer._index)
    assert len(keys) == 200 + writer.counts["insert"] - writer.counts["delete"]
    writer.stop()  # after the end: nothing to do, no error


def test_composite_keys_rate_and_stop(pg_url: str, pg_schema: str) -> None:
    table = TableId(pg_schema, "Regional Items")
    make_table(
        pg_url,
        table,
        'region text, "n" int, payload jsonb, PRIMARY KEY (region, "n")',
        [(r, i, '{"a": 1}') for r in ("eu", "us") for i in range(20)],
    )
    ns = itertools.count(100)
    with RandomWriter(
        pg_url,
        table,
        ["region", "n"],
        new_key=lambda: (("eu", "us", "ap")[next(ns) % 3], next(ns)),
        new_row=lambda key: {"payload": psycopg.types.json.Jsonb({"k": list(key)})},
        changes=None,
        rate=200,
        hot_keys=3,
        hot_share=0.9,
    ) as writer:
        time.sleep(1.0)
        assert writer.running
    done = writer.total
    assert 0 < done <= 200 * 1.0 + 2 * 5 + 50  # paced: about rate x time
    keys = table_keys(pg_url, f'SELECT region, "n" FROM {table}')
    assert keys == set(writer._index)


def test_errors_in_the_thread_are_raised_by_stop(pg_url: str, pg_schema: str) -> None:
    table = TableId(pg_schema, "items")
    make_table(pg_url, table, "id int PRIMARY KEY, v text", [])
    writer = RandomWriter(
        pg_url,
        table,
        ["id"],
        new_key=lambda: (1,),
        new_row=lambda key: {"no_such_column": 1},
        changes=10,
    ).start()
    with pytest.raises(RuntimeError, match="random writer") as info:
        writer.wait(timeout=30)
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedColumn)
    with pytest.raises(RuntimeError):
        writer.stop()


def test_unique_violations_from_outside_are_conflicts_not_failures(
    pg_url: str, pg_schema: str
) -> None:
    table = TableId(pg_schema, "items")
    make_table(pg_url, table, "id int PRIMARY KEY, v text", [])
    ids = itertools.count()
    with psycopg.connect(pg_url, autocommit=True) as outside:

        def new_key() -> tuple[int]:
            key = next(ids)
            if key % 10 == 3:  # someone else takes this key first
                outside.execute(f"INSERT INTO {table} VALUES (%s, 'outside')", [key])
            return (key,)

        writer = RandomWriter(
            pg_url,
            table,
            ["id"],
            new_key=new_key,
            new_row=lambda key: {"v": "w"},
            changes=300,
            weights={"insert": 2, "update": 1, "key_change": 1},
            seed=3,
        )
        writer.start()
        writer.wait(timeout=60)
    assert writer.counts["conflicts"] > 0
    assert writer.total == 300
    assert table_keys(pg_url, f"SELECT id FROM {table}") == set(writer._index)
