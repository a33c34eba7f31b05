"""The connector registry and what each connector says without a server: drivers, signal
syntax, what init creates and teardown drops, saved positions, the chunk spec's checks."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from signals.names import TableId
from snapshotter.config import SOURCE_KINDS, ConfigError, parse_config
from snapshotter.sources.base import ChunkSpec, ColumnInfo, TableSchema
from snapshotter.sources.connector import Connector, connector_for, saved_position_text
from snapshotter.sources.mysql.connector import MySqlConnector
from snapshotter.sources.postgres.connector import PostgresConnector


def connector(kind: str, url: str, extra: str = "") -> Connector:
    text = f'[source]\nkind = "{kind}"\nurl = "{url}"\n{extra}'
    return connector_for(parse_config(text, base_dir=Path("/tmp"), environ={}).source)


def test_the_kind_picks_the_connector() -> None:
    pg = connector("postgres", "postgresql://u:p@h:5432/shop", 'slot = "s1"\npublication = "p1"')
    my = connector("mysql", "mysql://u:p@h:3306/shop")
    assert isinstance(pg, PostgresConnector) and isinstance(my, MySqlConnector)
    assert pg.sqlalchemy_url().drivername == "postgresql+psycopg"
    assert my.sqlalchemy_url().drivername == "mysql+pymysql"
    assert (pg.dollar_quotes, my.dollar_quotes) == (True, False)
    assert my.connect_args() == {"charset": "utf8mb4"} and pg.connect_args() == {}
    assert pg.capture_objects() == ["replication slot s1", "publication p1"]
    assert my.capture_objects() == []
    assert pg.signal_table_grant("bob") == 'GRANT CREATE ON SCHEMA "public" TO "bob"'
    assert my.signal_table_grant("bob") == "GRANT CREATE, INSERT, SELECT ON `shop`.* TO 'bob'@'%'"
    assert (pg.log_name, my.log_name) == ("replication slot", "binlog")


def test_an_unknown_kind_is_refused_with_every_kind_a_connector_serves() -> None:
    """The kinds the config accepts are the ones with a connector: each makes one, and any
    other is refused at load, naming them all."""
    urls = {
        "postgres": "postgresql://u:p@h/shop",
        "mysql": "mysql://u:p@h/shop",
        "spanner": "spanner:///projects/p-test/instances/i/databases/shop",
    }
    assert set(SOURCE_KINDS) == set(urls)
    for kind, url in urls.items():
        extra = 'change_stream = "cs"' if kind == "spanner" else ""
        assert connector(kind, url, extra).kind == kind
    with pytest.raises(ConfigError, match=r"source\.kind: Input should be 'postgres', 'mysql' or"):
        connector("oracle", "x")


def test_saved_positions_per_source() -> None:
    pg = connector("postgres", "postgresql://u:p@h/shop")
    my = connector("mysql", "mysql://u:p@h/shop")
    assert pg.has_saved_position({"lsn": 16}) and not pg.has_saved_position({"lsn": 0})
    assert my.has_saved_position({"file": "b.000001", "pos": 4})
    assert not my.has_saved_position({})
    assert saved_position_text({"lsn": 16}) == "LSN 0/10"
    assert saved_position_text({"file": "b.000001", "pos": 4}) == "binlog file b.000001 at 4"
    assert saved_position_text({}) == "no saved position"


def test_the_mysql_client_id_is_the_configured_one_or_debeziums_range() -> None:
    chosen = connector("mysql", "mysql://u:p@h/shop", "server_id = 77")
    assert isinstance(chosen, MySqlConnector) and chosen.server_id() == 77
    drawn = connector("mysql", "mysql://u:p@h/shop")
    assert isinstance(drawn, MySqlConnector) and 5400 <= drawn.server_id() < 6400


SCHEMA = TableSchema(
    TableId("s", "t"),
    (
        ColumnInfo("a", "int", 23, False, pa.int32()),
        ColumnInfo("b", "text", 25, False, pa.string()),
    ),
    ("a", "b"),
)


def test_a_chunk_spec_checks_its_keys_and_limit() -> None:
    spec = ChunkSpec(SCHEMA, ["a", "b"], None, (9, "z"), None, 10)  # type: ignore[arg-type]
    assert spec.key_columns == ("a", "b") and spec.table == TableId("s", "t")
    assert not spec.filtered and ChunkSpec(SCHEMA, ("a", "b"), (1, "a"), (9, "z"), "x", 1).filtered
    with pytest.raises(ValueError, match=r"upto key .* does not match key columns"):
        ChunkSpec(SCHEMA, ("a", "b"), None, (9,), None, 10)
    with pytest.raises(ValueError, match="after key"):
        ChunkSpec(SCHEMA, ("a",), (1, "x"), (9,), None, 10)
    with pytest.raises(ValueError, match="limit >= 1"):
        ChunkSpec(SCHEMA, ("a",), None, (9,), None, 0)
