"""The Iceberg format's tables through the lander alone (real Spark in local mode, real
Iceberg; judged by Spark SQL through the catalog, by Iceberg's own metadata tables, and by
pyiceberg without Spark): maintenance folds deletion vectors and small files in and expires
snapshots per the policy, the tables equal before and after; a catalog the user names under
``[spark] conf`` holds the tables (nothing at the landing root); an unknown catalog name is
refused with the conf keys to set; columns widened and dropped at the source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from signals.names import TableId
from snapshotter.config import SparkConfig
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.window import ReadBatch
from snapshotter.sinks.spark.formats.iceberg import IcebergError, IcebergPolicy
from snapshotter.sinks.spark.formats.staged import SchemaChangeError
from snapshotter.sinks.spark.lander import Lander
from snapshotter.sinks.spark.session import spark_session
from snapshotter.sinks.spark.staging import StagedBatch, StagingArea
from snapshotter.sinks.spark.types import events_to_landed, read_batch_to_landed
from snapshotter.sources.base import ColumnInfo, TableSchema
from tests.integration.engine_harness import SPARK_MASTER

pytestmark = pytest.mark.integration

TABLE = TableId("shop", "items")
KEYS = ["id"]
COLUMNS = (
    ColumnInfo("id", "bigint", 20, False, pa.int64()),
    ColumnInfo("qty", "integer", 23, True, pa.int32()),
    ColumnInfo("name", "text", 25, True, pa.string()),
)
SCHEMA = TableSchema(TABLE, COLUMNS, ("id",))


def _source(pos: int) -> Source:
    return Source("postgresql", "shop", "shop", TABLE, Position(pos), 1, SnapshotMarker.FALSE)


def chunk(keys: range, close: int) -> ReadBatch:
    rows = pa.Table.from_pylist(
        [{"id": k, "qty": k, "name": f"r{k}"} for k in keys], schema=SCHEMA.arrow_schema()
    )
    batch = ReadBatch("w", TABLE, ("id",), rows, Position(close), len(keys), None, False)
    return batch.stamped(_source(close), 5, None)


def chunk_without_name(key: int, close: int) -> ReadBatch:
    """A READ chunk of the table after ``DROP COLUMN name`` (qty by then a bigint)."""
    schema = pa.schema([("id", pa.int64()), ("qty", pa.int64())])
    rows = pa.Table.from_pylist([{"id": key, "qty": key}], schema=schema)
    batch = ReadBatch("w", TABLE, ("id",), rows, Position(close), 1, None, False)
    return batch.stamped(_source(close), 5, None)


def log(op: str, key: int, pos: int, **row: Any) -> ChangeEvent:
    if op == "d":
        return ChangeEvent(Op.DELETE, _source(pos), 1, (key,), before={"id": key})
    after = {"id": key, "qty": key, "name": f"log{key}", **row}
    return ChangeEvent(Op(op), _source(pos), 1, (key,), after=after)


class Lake:
    def __init__(self, tmp_path: Path, policy: IcebergPolicy) -> None:
        self.spark = spark_session(SparkConfig(master=SPARK_MASTER), iceberg=True)
        self.staging = StagingArea(tmp_path / "staging")
        self.staging.open()
        self.root = tmp_path / "lake"
        self.lander = Lander(self.spark, str(self.root), "iceberg", iceberg=policy)
        self.tables = self.lander.iceberg
        self.schema = SCHEMA

    def stage(self, seq: int, *pieces: ReadBatch | list[ChangeEvent]) -> StagedBatch:
        parts = [
            read_batch_to_landed(self.schema, p, seq)
            if isinstance(p, ReadBatch)
            else events_to_landed(self.schema, KEYS, p, seq)
            for p in pieces
        ]
        return self.staging.stage(seq, [(TABLE, KEYS, pa.concat_tables(parts))])

    def land(self, seq: int, *pieces: ReadBatch | list[ChangeEvent]) -> None:
        self.lander.land([self.stage(seq, *pieces)])

    def spark_rows(self, *columns: str) -> dict[int, tuple[Any, ...]]:
        """The current state through the catalog with Spark SQL."""
        rows = self.spark.sql(
            f"SELECT {', '.join(columns)} FROM {self.tables.current_name(TABLE)}"
        ).collect()
        state = {r["id"]: tuple(r[c] for c in columns) for r in rows}
        assert len(state) == len(rows), "a key twice in the current state"
        return state

    def pyiceberg_rows(self, *columns: str) -> dict[int, tuple[Any, ...]]:
        """The current state without Spark: pyiceberg from the newest metadata file."""
        from pyiceberg.table import StaticTable

        location = self.tables.metadata_location(TABLE)
        assert location is not None
        rows = StaticTable.from_metadata(location).scan().to_arrow().to_pylist()
        state = {r["id"]: tuple(r[c] for c in columns) for r in rows}
        assert len(state) == len(rows), "a key twice in the current state (pyiceberg)"
        return state

    def count(self, name: str, metadata_table: str) -> int:
        return int(self.spark.sql(f"SELECT count(*) FROM {name}.{metadata_table}").first()[0])


def test_maintenance_folds_deletes_and_small_files_in_and_expires_snapshots(
    tmp_path: Path,
) -> None:
    lake = Lake(
        tmp_path,
        IcebergPolicy(
            maintenance_interval_s=0,
            snapshot_retention_s=0,
            snapshots_kept=2,
            rewrite_delete_ratio=0.1,  # the first file ends with 12 of its 40 rows deleted
        ),
    )
    lake.land(1, chunk(range(0, 40), 100))
    expected = {k: (k, f"r{k}") for k in range(40)}
    pos = 200
    for seq in range(2, 8):  # six log batches: each a MERGE (new data files, deletion vectors)
        events = [log("u", seq * 3, pos), log("d", seq * 3 + 1, pos + 1)]
        events.append(log("c", 100 + seq, pos + 2))
        lake.land(seq, events)
        expected[seq * 3] = (seq * 3, f"log{seq * 3}")
        del expected[seq * 3 + 1]
        expected[100 + seq] = (100 + seq, f"log{100 + seq}")
        pos += 10
    current = lake.tables.current_name(TABLE)
    changelog = lake.tables.changelog_name(TABLE)
    data_before = lake.count(current, "data_files")
    # Merge-on-read: no data file rewritten, the deleted rows in a deletion vector (format 3:
    # one per data file, each MERGE's replacing the one before).
    assert lake.count(current, "delete_files") >= 1
    assert data_before >= 7
    assert lake.count(current, "snapshots") >= 7
    assert lake.count(changelog, "snapshots") >= 7
    assert lake.spark_rows("id", "qty", "name") == {k: (k, *v) for k, v in expected.items()}, (
        "before maintenance"
    )

    assert lake.lander.has_tails()  # landed since its last maintenance: due
    assert lake.lander.compact_idle() == [TABLE]
    # The deletion vectors folded into rewritten data files, the small files into fewer.
    assert lake.count(current, "delete_files") == 0
    assert lake.count(current, "data_files") < data_before
    # Every snapshot older than snapshot_retention_s (0) expired, the last snapshots_kept kept.
    assert lake.count(current, "snapshots") == 2
    assert lake.count(changelog, "snapshots") == 2
    want = {k: (k, *v) for k, v in expected.items()}
    assert lake.spark_rows("id", "qty", "name") == want
    assert lake.pyiceberg_rows("id", "qty", "name") == want
    assert lake.lander.changelog(TABLE) is not None
    assert lake.lander.changelog(TABLE).count() == 40 + 6 * 3  # type: ignore[union-attr]
    # Nothing landed since: nothing is due, and an idle lander does nothing.
    assert not lake.lander.has_tails()
    assert lake.lander.compact_idle() == []


@pytest.mark.parametrize(("ratio", "rewritten"), [(0.3, False), (0.001, True)])
def test_maintenance_rewrites_a_file_for_its_deletes_only_past_the_ratio(
    tmp_path: Path, ratio: float, rewritten: bool
) -> None:
    """5 of a 2,000-row file's rows updated (0.25%): under rewrite_delete_ratio 0.3 the file
    and its deletion vector stay (maintenance costs the change, not the table); under 0.001
    it is rewritten with them folded in. Either way the readers see the same rows."""
    lake = Lake(tmp_path, IcebergPolicy(maintenance_interval_s=0, rewrite_delete_ratio=ratio))
    lake.land(1, chunk(range(0, 2000), 100))
    lake.land(2, [log("u", k, 5000 + k) for k in (3, 400, 900, 1500, 1999)])
    current = lake.tables.current_name(TABLE)

    def files() -> set[str]:
        return {
            r[0] for r in lake.spark.sql(f"SELECT file_path FROM {current}.data_files").collect()
        }

    first = {
        r[0]
        for r in lake.spark.sql(
            f"SELECT file_path FROM {current}.data_files WHERE record_count = 2000"
        ).collect()
    }
    assert len(first) == 1 and lake.count(current, "delete_files") == 1
    assert lake.lander.compact_idle() == [TABLE]
    assert lake.count(current, "delete_files") == (0 if rewritten else 1)
    assert (first <= files()) is not rewritten
    want = {k: (k, f"log{k}" if k in (3, 400, 900, 1500, 1999) else f"r{k}") for k in range(2000)}
    assert lake.spark_rows("id", "name") == want
    assert lake.pyiceberg_rows("id", "name") == want


def test_maintenance_waits_for_its_interval(tmp_path: Path) -> None:
    lake = Lake(tmp_path, IcebergPolicy(maintenance_interval_s=3600))
    lake.land(1, chunk(range(0, 10), 100))
    assert lake.lander.compact_idle() == [TABLE]  # never maintained: due at once
    lake.land(2, [log("u", 1, 200)])
    assert not lake.lander.has_tails()  # landed again, but maintained under an hour ago
    assert lake.lander.compact_idle() == []
    assert lake.spark_rows("id", "name")[1] == (1, "log1")


def test_a_catalog_the_user_names_holds_the_tables(tmp_path: Path) -> None:
    spark = spark_session(SparkConfig(master=SPARK_MASTER), iceberg=True)
    warehouse = tmp_path / "elsewhere"
    # What [spark] conf sets for a catalog of the user's (here a Hadoop one; REST, Hive,
    # Glue or Nessie are the same keys with their type or uri).
    spark.conf.set("spark.sql.catalog.lake27", "org.apache.iceberg.spark.SparkCatalog")
    spark.conf.set("spark.sql.catalog.lake27.type", "hadoop")
    spark.conf.set("spark.sql.catalog.lake27.warehouse", str(warehouse))
    lake = Lake(tmp_path, IcebergPolicy(catalog="lake27"))
    assert lake.tables.current_name(TABLE) == "`lake27`.`shop`.`items`"
    lake.land(1, chunk(range(0, 5), 100))
    lake.land(2, [log("u", 1, 200), log("d", 2, 201)])
    want = {0: ("r0",), 1: ("log1",), 3: ("r3",), 4: ("r4",)}
    rows = spark.table("lake27.shop.items").select("id", "name").collect()
    assert {r["id"]: (r["name"],) for r in rows} == want
    assert spark.table("lake27.shop.items_changelog").count() == 7
    assert lake.pyiceberg_rows("name") == want
    # The tables are the catalog's, in its warehouse; none at the landing root.
    assert (warehouse / "shop" / "items" / "metadata").is_dir()
    assert (warehouse / "shop" / "items_changelog" / "metadata").is_dir()
    assert not (lake.root / "shop").exists()


def test_an_unknown_catalog_is_refused_with_the_keys_to_set(tmp_path: Path) -> None:
    spark = spark_session(SparkConfig(master=SPARK_MASTER), iceberg=True)
    with pytest.raises(IcebergError) as refused:
        Lander(spark, str(tmp_path / "lake"), "iceberg", iceberg=IcebergPolicy(catalog="nolake"))
    message = str(refused.value)
    assert 'catalog = "nolake"' in message
    assert "spark.sql.catalog.nolake" in message
    assert "[spark] conf" in message


def test_a_column_widened_then_dropped_at_the_source(tmp_path: Path) -> None:
    """ALTER COLUMN qty TYPE bigint mid-stream: both tables' column widened (Iceberg's
    int -> long promotion), rows landed before unchanged. DROP COLUMN name: the tables keep
    the column, NULL in rows landed from then on."""
    lake = Lake(tmp_path, IcebergPolicy())
    lake.land(1, chunk(range(0, 4), 100))
    big = 2**40
    # A batch staged before the change (qty an int) and one after, landed together.
    before = lake.stage(2, [log("u", 3, 150, qty=33)])
    wide = ColumnInfo("qty", "bigint", 20, True, pa.int64())
    lake.schema = TableSchema(TABLE, (COLUMNS[0], wide, COLUMNS[2]), KEYS)
    after = lake.stage(3, [log("u", 1, 200, qty=big), log("c", 9, 201, qty=-big)])
    lake.lander.land([before, after])
    lake.schema = TableSchema(TABLE, (COLUMNS[0], wide), KEYS)
    lake.land(
        4,
        [log("u", 2, 300, qty=big + 2), log("c", 10, 301, qty=10)],
        chunk_without_name(11, 302),
    )
    want = {
        0: (0, "r0"),
        1: (big, "log1"),
        2: (big + 2, None),
        3: (33, "log3"),
        9: (-big, "log9"),
        10: (10, None),
        11: (11, None),
    }
    assert lake.spark_rows("id", "qty", "name") == {k: (k, *v) for k, v in want.items()}
    assert lake.pyiceberg_rows("qty", "name") == want
    for name in (lake.tables.current_name(TABLE), lake.tables.changelog_name(TABLE)):
        types = {f.name: f.dataType.simpleString() for f in lake.spark.table(name).schema.fields}
        assert (types["qty"], types["name"]) == ("bigint", "string"), name
    changelog = lake.lander.changelog(TABLE)
    assert changelog is not None
    assert changelog.filter("id = 1 AND qty = 1").count() == 1  # landed before: as it was


def test_a_column_changed_to_a_type_it_cannot_widen_to_is_refused(tmp_path: Path) -> None:
    lake = Lake(tmp_path, IcebergPolicy())
    lake.land(1, chunk(range(0, 2), 100))
    text = ColumnInfo("qty", "text", 25, True, pa.string())
    lake.schema = TableSchema(TABLE, (COLUMNS[0], text, COLUMNS[2]), KEYS)
    # Refused before anything is written, by the check every format shares
    # (formats.schema_changes), whatever [sink] schema_changes says.
    with pytest.raises(SchemaChangeError, match="column qty changed from int to string"):
        lake.land(2, [log("u", 1, 200, qty="many")])
    assert lake.spark_rows("id", "qty") == {0: (0, 0), 1: (1, 1)}  # nothing landed
    assert lake.lander.changelog(TABLE).count() == 2  # type: ignore[union-attr]


def test_landing_the_same_batches_again_changes_nothing(tmp_path: Path) -> None:
    """In the same process (the appends' bookkeeping) and in a new one (a run after a crash
    between the commits and the metadata: everything through the merge), batches landed
    again leave both tables as they were, read by Spark SQL and by pyiceberg."""
    lake = Lake(tmp_path, IcebergPolicy())
    b1 = lake.stage(1, chunk(range(0, 10), 100))
    b2 = lake.stage(2, [log("u", 1, 200), log("d", 2, 201), log("c", 20, 202)])
    b3 = lake.stage(3, chunk(range(10, 15), 300), [log("u", 11, 301), log("d", 3, 302)])
    for batch in (b1, b2, b3):
        lake.lander.land([batch])
    columns = ("id", "qty", "name", "__pos", "__op", "__batch")

    def tables() -> tuple[dict[int, Any], dict[int, Any], list[tuple[Any, ...]]]:
        log_rows = lake.spark.table(lake.tables.changelog_name(TABLE)).select(*columns)
        return (
            lake.spark_rows(*columns),
            lake.pyiceberg_rows(*columns),
            sorted((tuple(r) for r in log_rows.collect()), key=repr),
        )

    landed = tables()
    assert set(landed[0]) == {0, 1, *range(4, 15), 20}
    assert len(landed[2]) == 10 + 3 + 5 + 2
    lake.lander.land([b1])
    lake.lander.land([b2, b3])
    assert tables() == landed, "landed again in the same process"
    lake.lander = Lander(lake.spark, str(lake.root), "iceberg", iceberg=IcebergPolicy())
    lake.tables = lake.lander.iceberg
    lake.lander.land([b1, b2, b3])
    lake.lander.land([b3])
    assert tables() == landed, "landed again by a new process"


def test_a_struct_of_the_row_follows_its_columns(tmp_path: Path) -> None:
    """A struct column of the row's columns (the changelog's before-image): a field widened
    and a field added at the source reach the table's struct too."""
    lake = Lake(tmp_path, IcebergPolicy())
    name = f"{lake.tables.catalog}.shop.nested"
    lake.spark.sql("CREATE NAMESPACE IF NOT EXISTS " + f"{lake.tables.catalog}.shop")
    lake.spark.sql(f"CREATE TABLE {name} (id bigint, b struct<qty: int>) USING iceberg")
    lake.spark.sql(f"INSERT INTO {name} VALUES (1, named_struct('qty', 1))")
    wider = lake.spark.sql(f"SELECT 2L AS id, named_struct('qty', {2**40}L, 'extra', 'x') AS b")
    lake.tables._evolve(name, wider)
    assert lake.spark.table(name).schema["b"].dataType.simpleString() == (
        "struct<qty:bigint,extra:string>"
    )
    wider.writeTo(name).append()
    rows = lake.spark.sql(f"SELECT id, b.qty, b.extra FROM {name} ORDER BY id").collect()
    assert [tuple(r) for r in rows] == [(1, 1, None), (2, 2**40, "x")]


def test_a_snapshot_chunk_is_linked_into_both_tables_not_written_again(tmp_path: Path) -> None:
    """The staged file is the changelog's data file and the stager's copy without
    before-images the current state's (the same inode: no row read or encoded again), and
    both tables read back whole through Spark SQL and pyiceberg."""
    import os

    lake = Lake(tmp_path, IcebergPolicy())
    batch = lake.stage(1, chunk(range(0, 50), 100))
    part = batch.tables[0]
    assert part.current_file is not None
    lake.lander.land([batch])

    def inodes(name: str) -> set[int]:
        paths = [r[0] for r in lake.spark.sql(f"SELECT file_path FROM {name}.files").collect()]
        return {os.stat(p.removeprefix("file:")).st_ino for p in paths}

    assert inodes(lake.tables.changelog_name(TABLE)) == {os.stat(part.file).st_ino}
    assert inodes(lake.tables.current_name(TABLE)) == {os.stat(part.current_file).st_ino}
    assert lake.spark_rows("id", "name") == {k: (k, f"r{k}") for k in range(50)}
    assert set(lake.pyiceberg_rows("id")) == set(range(50))
    assert lake.lander.changelog(TABLE).count() == 50  # type: ignore[union-attr]


def test_tables_only_appended_to_by_this_process_are_maintained_without_asking_until_due(
    tmp_path: Path,
) -> None:
    """A snapshot's fresh tables hold what this process appended (a file per landing, a
    snapshot per commit): while that is too little to rewrite or expire, maintenance asks
    the metadata tables nothing; past min-input-files small files it rewrites them."""
    lake = Lake(tmp_path, IcebergPolicy(maintenance_interval_s=0, snapshots_kept=100))
    asked: list[str] = []
    count_files = lake.tables._files_and_snapshots

    def counted(name: str) -> tuple[int, int, int]:
        asked.append(name)
        return count_files(name)

    lake.tables._files_and_snapshots = counted  # type: ignore[method-assign]
    lake.land(1, chunk(range(0, 40), 100))
    assert lake.lander.compact_idle() == [TABLE]
    assert asked == []  # one small file each, two snapshots: nothing to do, nothing asked
    for seq in range(2, 7):  # five more landings, a small file each
        lake.land(seq, chunk(range(seq * 100, seq * 100 + 10), seq * 100 + 50))
    changelog = lake.tables.changelog_name(TABLE)
    before = lake.count(changelog, "data_files")
    assert before == 6
    assert lake.lander.compact_idle() == [TABLE]
    assert changelog in asked
    assert lake.count(changelog, "data_files") < before  # six small files: rewritten
    want = {
        k: (k, f"r{k}")
        for k in [*range(40), *(k for s in range(2, 7) for k in range(s * 100, s * 100 + 10))]
    }
    assert lake.spark_rows("id", "name") == want
    assert lake.pyiceberg_rows("id", "name") == want
