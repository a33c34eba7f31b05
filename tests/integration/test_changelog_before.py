"""The Spark landing's changelog keeps update and delete before-images (``__before``), as the
JSONL and Kafka outputs keep Debezium's ``before``: on PostgreSQL (REPLICA IDENTITY FULL) and
MariaDB (binlog_row_image=FULL), read back with plain Spark; the current state has no
``__before``."""

from __future__ import annotations

import pytest

from tests.integration.test_convergence import Source, source

__all__ = ["source"]  # the fixture, used by name

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("fmt", ["parquet", "iceberg"])
def test_updates_and_deletes_land_their_before_image(source: Source, fmt: str) -> None:
    cap = source.capture(chunk_size=100, sink="spark", sink_format=fmt)
    table = source.create(cap, "items", 200)
    cap.init()
    cap.execute(f"{cap.schema}.{table.name}")
    assert cap.run(timeout=300) == 0
    before = {
        r[0]: (r[1], r[2])
        for r in source.sql(cap, "SELECT id, name, n FROM {s}.items ORDER BY id")[:6]
    }
    updated, deleted = sorted(before)[:3], sorted(before)[3:6]
    marks = ", ".join(str(k) for k in updated)
    source.sql(cap, f"UPDATE {{s}}.items SET name = 'changed', n = n + 1 WHERE id IN ({marks})")
    marks = ", ".join(str(k) for k in deleted)
    source.sql(cap, f"DELETE FROM {{s}}.items WHERE id IN ({marks})")
    assert cap.run(timeout=300) == 0
    lander = cap.lander()
    changelog = lander.changelog(cap.table_id("items"))
    assert changelog is not None
    rows = {
        (r["__op"], r["id"]): r["__before"]
        for r in changelog.where("__op IN ('u', 'd')").select("__op", "id", "__before").collect()
    }
    for key in updated:
        image = rows[("u", key)]
        assert image is not None and (image["name"], image["n"]) == before[key], image
    for key in deleted:
        image = rows[("d", key)]
        assert image is not None and (image["name"], image["n"]) == before[key], image
    reads = changelog.where("__op = 'r'").where("__before IS NOT NULL").count()
    assert reads == 0
    current = lander.current_state(cap.table_id("items"))
    assert current is not None and "__before" not in current.columns
    assert cap.landed_rows("items") == cap.source_rows("items")  # plain readers: no __before
