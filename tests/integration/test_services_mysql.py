"""The MySQL/MariaDB server scripts/services starts is set up for binlog CDC."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.integration


def test_server_has_binlog_cdc_settings_and_replication_grants(
    mysql_engine: sa.Engine, mysql_db: str
) -> None:
    names = ("log_bin", "binlog_format", "binlog_row_image", "binlog_row_metadata", "server_id")
    with mysql_engine.connect() as conn:
        variables = {
            str(name).lower(): str(value)
            for name, value in conn.exec_driver_sql("SHOW GLOBAL VARIABLES").all()
            if str(name).lower() in names
        }
        grants = [str(row[0]) for row in conn.exec_driver_sql("SHOW GRANTS").all()]
        charset = conn.execute(
            sa.text(
                "SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA"
                " WHERE SCHEMA_NAME = :name"
            ),
            {"name": mysql_db},
        ).scalar_one()

    assert variables["log_bin"].upper() == "ON"
    assert variables["binlog_format"].upper() == "ROW"
    assert variables["binlog_row_image"].upper() == "FULL"
    assert variables["binlog_row_metadata"].upper() == "FULL"
    assert int(variables["server_id"]) != 0
    # MariaDB shows ALL PRIVILEGES; MySQL 8 spells the static privileges out.
    assert any(
        " ON *.* " in grant and ("ALL PRIVILEGES" in grant or "REPLICATION SLAVE" in grant)
        for grant in grants
    ), grants
    assert charset == "utf8mb4"  # the mysql_db fixture made it
