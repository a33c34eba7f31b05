"""mysqlclient's converters made to return what pymysql returns (pure; needs mysqlclient)."""

from __future__ import annotations

import pymysql.converters
import pytest

from snapshotter.sources.mysql import client as my_client

MySQLdb = pytest.importorskip("MySQLdb")
from MySQLdb.constants import FIELD_TYPE  # noqa: E402


@pytest.mark.parametrize(
    ("field", "text"),
    [
        (FIELD_TYPE.DATETIME, "0000-00-00 00:00:00"),
        (FIELD_TYPE.DATETIME, "2024-02-00 00:00:00"),
        (FIELD_TYPE.TIMESTAMP, "0000-00-00 00:00:00"),
        (FIELD_TYPE.DATE, "0000-00-00"),
        (FIELD_TYPE.DATE, "2024-00-10"),
        (FIELD_TYPE.DATETIME, "2024-02-29 23:59:59.5"),
        (FIELD_TYPE.DATETIME, "9999-12-31 23:59:59.999999"),
        (FIELD_TYPE.TIMESTAMP, "1970-01-01 00:00:01"),
        (FIELD_TYPE.DATE, "1000-01-01"),
    ],
)
def test_dates_convert_as_pymysql_converts_them(field: int, text: str) -> None:
    ours = my_client._conversions()[field](text)
    theirs = pymysql.converters.decoders[field](text)
    assert ours == theirs and type(ours) is type(theirs)
    if text.startswith("0000") or "-00" in text:
        assert ours == text  # kept as text: the dialect makes it what the binlog has


def test_json_is_text() -> None:
    assert my_client._conversions()[FIELD_TYPE.JSON](b'{"a": "\xc3\xa9"}') == '{"a": "é"}'


def test_the_c_client_is_preferred() -> None:
    assert my_client.available() == (my_client.MYSQLCLIENT, my_client.PYMYSQL)
    assert my_client.default() == my_client.MYSQLCLIENT
