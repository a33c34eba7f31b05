"""MySQL / MariaDB key types without a server: how chunk bounds are bound (ENUM member lists,
BIT numbers, SET masks), the catalog's ENUM/SET member lists, and the binlog conversions that
make a log key equal the READ key (YEAR 0000, negative TIME fractions, BINARY(n) padding,
empty binary strings, MariaDB's UUID / INET6 / INET4). The same code serves MySQL 8, whose
catalog writes types without display widths and whose binlog carries YEAR, TIME2, BINARY
and BIT as MariaDB's does; the cases marked MySQL 8 are its spellings."""

from __future__ import annotations

import datetime as dt
import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pymysqlreplication.column import Column

from signals.names import TableId
from snapshotter.sources.log import Change
from snapshotter.sources.mysql import types as mt
from snapshotter.sources.mysql.decoder import BinlogDecoder
from tests.unit.test_binlog_decoder import FILE, TableMap, query, xid

# -- ENUM and SET members ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column_type", "members"),
    [
        ("enum('a','b')", ("a", "b")),
        ("ENUM('a','b')", ("a", "b")),  # MySQL 8 spells it either way in SHOW output
        ("enum('a''b','c\\\\d','e,f','g)h',' x')", ("a'b", "c\\d", "e,f", "g)h", " x")),
        ("enum('a\\nb','t\tb','q\"r','\\\\''x','%_')", ("a\nb", "t\tb", 'q"r', "\\'x", "%_")),
        ("enum('nul\\0','cr\\r','z\\Z')", ("nul\0", "cr\r", "z\x1a")),
        ("set('a','b','c')", ("a", "b", "c")),
        ("enum('É','é')", ("É", "é")),
        ("enum('')", ("",)),
    ],
)
def test_members_are_read_from_the_catalog_column_type(
    column_type: str, members: tuple[str, ...]
) -> None:
    assert mt.type_members(column_type) == members


def test_members_of_a_type_that_is_no_enum_raise() -> None:
    with pytest.raises(ValueError):
        mt.type_members("varchar(10)")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=["Cs"])), min_size=1))
def test_members_survive_the_catalogs_quoting(members: list[str]) -> None:
    # How MariaDB and MySQL write them (append_unescaped): '' for a quote, backslash escapes
    # for a backslash, NUL, newline, CR and Ctrl-Z.
    def quoted(member: str) -> str:
        escapes = {"'": "''", "\\": "\\\\", "\0": "\\0", "\n": "\\n", "\r": "\\r", "\x1a": "\\Z"}
        return "'" + "".join(escapes.get(c, c) for c in member) + "'"

    column_type = "enum(" + ",".join(quoted(m) for m in members) + ")"
    assert mt.type_members(column_type) == tuple(members)


# -- bounds in the index's order ---------------------------------------------------------------


def test_enum_bounds_are_member_lists_by_index_not_by_text() -> None:
    binding = mt.key_binding("e", "enum", "enum('z','b','a')")
    assert binding.members == ("z", "b", "a")
    params = binding.enum_params("a0", "b")
    assert params == {
        "a0": "b",
        "a0_gt": ("a",),
        "a0_ge": ("b", "a"),
        "a0_lt": ("", "z"),  # '' is the ENUM's error value, index 0
        "a0_le": ("", "z", "b"),
    }


def test_enum_bounds_at_the_ends_and_at_the_error_value() -> None:
    binding = mt.key_binding("e", "enum", "enum('z','b','a')")
    last = binding.enum_params("u0", "a")
    assert last["u0_gt"] == (None,)  # IN (NULL): no row
    assert last["u0_le"] == ("", "z", "b", "a")
    first = binding.enum_params("u0", "z")
    assert first["u0_lt"] == ("",)
    error = binding.enum_params("a0", "")
    assert error["a0_gt"] == ("z", "b", "a")
    assert error["a0_ge"] == ("", "z", "b", "a")
    assert error["a0_lt"] == (None,)
    assert error["a0_le"] == ("",)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.data())
def test_enum_lists_split_the_members_at_the_bound(size: int, data: st.DataObject) -> None:
    members = tuple(f"m{i}" for i in range(size))
    binding = mt.key_binding("e", "enum", "enum(" + ",".join(f"'{m}'" for m in members) + ")")
    value = data.draw(st.sampled_from(("", *members)))
    index = 0 if value == "" else members.index(value) + 1
    everything = ("", *members)  # in index order
    params = binding.enum_params("p", value)

    def listed(suffix: str) -> set[str]:
        return {m for m in params["p" + suffix] if m is not None}

    assert listed("_gt") == set(everything[index + 1 :])
    assert listed("_ge") == set(everything[index:])
    assert listed("_lt") == set(everything[:index])
    assert listed("_le") == set(everything[: index + 1])


def test_an_enum_with_an_empty_member_cannot_be_a_paging_key() -> None:
    with pytest.raises(mt.KeyTypeError, match="empty string"):
        mt.key_binding("e", "enum", "enum('','a')")


def test_a_value_outside_the_enum_is_an_error_that_names_the_members() -> None:
    binding = mt.key_binding("e", "enum", "enum('a','b')")
    with pytest.raises(mt.KeyTypeError, match="'c' is not a member"):
        binding.enum_params("a0", "c")


def test_a_long_enum_is_compared_by_index() -> None:
    members = [f"m{i}" for i in range(mt.MAX_ENUM_LIST + 1)]
    binding = mt.key_binding("e", "enum", "enum(" + ",".join(f"'{m}'" for m in members) + ")")
    assert binding.members is None and binding.to_param is not None
    assert binding.to_param("m0") == 1
    assert binding.to_param("") == 0
    assert binding.to_param(members[-1]) == len(members)


def test_bit_bounds_are_numbers() -> None:
    binding = mt.key_binding("b", "bit", "bit(8)")
    assert binding.to_param is not None
    assert [binding.to_param(b) for b in (b"\x00", b"\x01", b"\xff")] == [0, 1, 255]
    wide = mt.key_binding("b", "bit", "bit(64)")
    assert wide.to_param is not None
    assert wide.to_param(b"\xff" * 8) == 2**64 - 1


def test_set_bounds_are_bit_masks_in_definition_order() -> None:
    binding = mt.key_binding("s", "set", "set('a','b','c')")
    assert binding.to_param is not None
    assert binding.to_param("") == 0
    assert binding.to_param("a") == 1
    assert binding.to_param("a,c") == 5
    assert binding.to_param("A,B") == 3  # under a case-insensitive collation
    with pytest.raises(mt.KeyTypeError):
        binding.to_param("d")


@pytest.mark.parametrize(
    ("data_type", "column_type"),
    [
        ("int", "int"),  # MySQL 8: no display width
        ("int", "int(11)"),
        ("bigint", "bigint unsigned"),
        ("tinyint", "tinyint(1)"),  # MySQL 8 keeps the width of tinyint(1) only
        ("varchar", "varchar(10)"),
        ("year", "year"),  # 0 or 1901..2155: a number compares as a YEAR
        ("binary", "binary(16)"),  # MySQL 8's UUID_TO_BIN keys
        ("datetime", "datetime(6)"),
        ("time", "time(6)"),
    ],
)
def test_other_types_are_bound_as_they_are(data_type: str, column_type: str) -> None:
    assert mt.key_binding("k", data_type, column_type) == mt.KeyBinding()


# -- zero dates ----------------------------------------------------------------------------------


def test_zero_dates_become_what_the_binlog_has() -> None:
    columns = [("id", "int"), ("d", "date"), ("dt", "datetime"), ("ts", "timestamp")]
    rows = [
        (1, "0000-00-00", "0000-00-00 00:00:00", "0000-00-00 00:00:00"),
        (2, dt.date(2024, 1, 1), "2024-00-01 00:00:00", dt.datetime(2024, 1, 1)),
    ]
    assert mt.zero_dates_to_none(columns, rows) == [
        (1, None, None, dt.datetime(1970, 1, 1)),
        (2, dt.date(2024, 1, 1), None, dt.datetime(2024, 1, 1)),
    ]


def test_rows_without_dates_are_left_alone() -> None:
    rows = [(1, "0000-00-00")]
    assert mt.zero_dates_to_none([("id", "int"), ("t", "varchar")], rows) is rows


def test_a_zero_date_in_a_key_is_refused_with_the_fix() -> None:
    with pytest.raises(mt.KeyTypeError, match=r"zero part.*surrogate-key"):
        mt.zero_dates_to_none([("d", "date")], [("0000-00-00",)], key_columns=("d",))


# -- the binlog side -----------------------------------------------------------------------------


def convert(field_type: int, value: Any, **kwargs: Any) -> Any:
    converter = mt.binlog_converter(field_type, **kwargs)
    return value if converter is None else converter(value)


def test_year_0000_arrives_as_1900_and_is_0_again() -> None:
    assert convert(mt.YEAR, 1900) == 0
    assert convert(mt.YEAR, 1901) == 1901
    assert convert(mt.YEAR, 2155) == 2155


def _as_mysql_replication_decodes(value: dt.timedelta) -> dt.timedelta:
    """What mysql-replication 1.0.17 makes of a stored negative TIME2 -S.f: -(S + 1 - f)."""
    micros = -(value // dt.timedelta(microseconds=1))
    whole, fraction = divmod(micros, 1_000_000)
    if value >= dt.timedelta(0) or not fraction:
        return value
    return -dt.timedelta(microseconds=whole * 1_000_000 + 1_000_000 - fraction)


@pytest.mark.parametrize(
    ("decoded", "stored"),
    [  # as seen on MariaDB 10.11 (tests/integration/test_mysql_dialect.py checks it live)
        (-dt.timedelta(hours=1, minutes=2, seconds=3, microseconds=750000), "-01:02:03.25"),
        (-dt.timedelta(microseconds=999999), "-00:00:00.000001"),
        (-dt.timedelta(seconds=59, microseconds=500000), "-00:00:59.5"),
        (-dt.timedelta(hours=838, minutes=59, seconds=58, microseconds=1), "-838:59:58.999999"),
        (-dt.timedelta(hours=1), "-01:00:00"),
        (dt.timedelta(hours=1, microseconds=250000), "01:00:00.25"),
    ],
)
def test_negative_time_fractions_are_corrected(decoded: dt.timedelta, stored: str) -> None:
    sign = -1 if stored.startswith("-") else 1
    hours, minutes, seconds = stored.lstrip("-").split(":")
    expected = sign * dt.timedelta(hours=int(hours), minutes=int(minutes), seconds=float(seconds))
    assert convert(mt.TIME2, decoded) == expected


@settings(max_examples=300, deadline=None)
@given(st.integers(-(838 * 3600 + 59 * 60 + 59) * 10**6 - 999999, 838 * 3600 * 10**6))
def test_every_time_survives_the_binlog(micros: int) -> None:
    stored = dt.timedelta(microseconds=micros)
    assert convert(mt.TIME2, _as_mysql_replication_decodes(stored)) == stored


def test_binary_strings_come_back_as_the_chunk_reads_them() -> None:
    # BINARY(4): the binlog cuts trailing 0x00, the chunk SELECT returns them padded.
    assert convert(mt.STRING, b"\x01", binary=True, max_length=4) == b"\x01\x00\x00\x00"
    assert convert(mt.STRING, "", binary=True, max_length=4) == b"\x00" * 4
    assert convert(mt.STRING, b"abcd", binary=True, max_length=4) == b"abcd"
    # VARBINARY / BLOB: mysql-replication hands over '' (a str) for an empty value.
    assert convert(mt.VARCHAR, "", binary=True, max_length=8) == b""
    assert convert(mt.BLOB, "", binary=True) == b""
    assert convert(mt.VARCHAR, b"\x00", binary=True, max_length=8) == b"\x00"
    # A text CHAR is not padded (neither side keeps its trailing blanks).
    assert mt.binlog_converter(mt.STRING, max_length=12) is None


@pytest.mark.parametrize(
    ("text", "packed"),
    [  # MariaDB 10.11's own output for these (seen on the server)
        ("::", ""),
        ("::1", "00000000000000000000000000000001"),
        ("::ffff:1.2.3.4", "00000000000000000000ffff01020304"),
        ("::1.2.3.4", "00000000000000000000000001020304"),
        ("2001:db8::1", "20010db8000000000000000000000001"),
        ("1::", "0001"),
        ("1:0:0:1::1", "00010000000000010000000000000001"),
        ("1::1:1:1:1:1:1", "00010000000100010001000100010001"),
        ("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "ff" * 16),
        ("::2:3:4:5:6:7:8", "00000002000300040005000600070008"),
        ("1::1:0:0:0", "00010000000000000001000000000000"),  # the first of equal runs
    ],
)
def test_inet6_is_written_as_mariadb_writes_it(text: str, packed: str) -> None:
    value: Any = bytes.fromhex(packed) if packed else ""  # '' when all 16 bytes are 0x00
    assert convert(mt.STRING, value, binary=True, max_length=16, data_type="inet6") == text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0, 0, 0, 1, 0xFFFF, 0xDB8]), min_size=8, max_size=8))
def test_inet6_text_reads_back_as_the_same_address(words: list[int]) -> None:
    packed = b"".join(w.to_bytes(2, "big") for w in words)
    text = mt.inet6_text(packed)
    assert ipaddress.IPv6Address(text).packed == packed
    assert ":::" not in text and text.count("::") <= 1


def test_inet4_and_uuid_are_written_as_text() -> None:
    assert convert(mt.STRING, b"\x01", binary=True, max_length=4, data_type="inet4") == "1.0.0.0"
    assert convert(mt.STRING, "", binary=True, max_length=4, data_type="inet4") == "0.0.0.0"
    assert (
        convert(mt.STRING, bytes.fromhex("123e4567e89b12d3a456426614174000"), data_type="uuid")
        == "123e4567-e89b-12d3-a456-426614174000"
    )
    assert (
        convert(mt.STRING, bytes.fromhex("1234567800001000"), data_type="UUID")
        == "12345678-0000-1000-0000-000000000000"
    )
    # Without the catalog a BINARY(16) stays bytes (MySQL 8's UUID_TO_BIN keys).
    raw = bytes.fromhex("123e4567e89b12d3a456426614174000")
    assert convert(mt.STRING, raw, binary=True, max_length=16) == raw


# -- the decoder uses them -----------------------------------------------------------------------

T = TableId("db", "t")


def _column(name: str, type_: int, **attrs: Any) -> Any:
    column = Column(name=name, type=type_, set_values=None, bits=0)
    for key, value in attrs.items():
        setattr(column, key, value)
    return column


def test_the_decoder_asks_the_catalog_once_per_table_until_ddl() -> None:
    asked: list[TableId] = []

    def catalog(table: TableId) -> dict[str, str]:
        asked.append(table)
        return {"id": "inet6", "y": "year", "b": "binary"}

    dec = BinlogDecoder(
        "srv", captured=lambda t: t == T, key_columns=lambda t: ("id",), column_types=catalog
    )
    dec.start(FILE)
    columns = [
        _column("id", mt.STRING, character_set_name="binary", max_length=16),
        _column("y", mt.YEAR),
        _column("b", mt.STRING, character_set_name="binary", max_length=4),
    ]
    items = []
    for end in (300, 500):  # two transactions: a new table map (columns list) each
        table_map = TableMap(100, "db", "t", list(columns))
        items += dec.feed(table_map.write(end, {"id": b"\x00\x01", "y": 1900, "b": b"\x01"}))
        items += dec.feed(xid(end + 31))
    events = [i.event for i in items if isinstance(i, Change)]
    assert [e.key for e in events] == [("1::",), ("1::",)]
    assert events[0].after == {"id": "1::", "y": 0, "b": b"\x01\x00\x00\x00"}
    assert asked == [T]
    dec.feed(query(700, "ALTER TABLE t ADD COLUMN z int"))
    table_map = TableMap(101, "db", "t", list(columns))
    dec.feed(table_map.write(900, {"id": b"", "y": 2000, "b": b""}))
    assert asked == [T, T]


def test_a_catalog_that_fails_leaves_the_binlog_to_decide() -> None:
    def catalog(table: TableId) -> dict[str, str]:
        raise RuntimeError("the table was dropped")

    dec = BinlogDecoder(
        "srv", captured=lambda t: t == T, key_columns=lambda t: ("id",), column_types=catalog
    )
    dec.start(FILE)
    table_map = TableMap(
        100, "db", "t", [_column("id", mt.STRING, character_set_name="binary", max_length=2)]
    )
    (change,) = [
        i for i in dec.feed(table_map.write(300, {"id": b"\x01"})) if isinstance(i, Change)
    ]
    assert change.event.key == (b"\x01\x00",)
