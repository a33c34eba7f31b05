"""The pure parts of the Kafka sink: message encoding (``sinks.encoding``), the Kafka Connect
schemas of ``schemas = true`` (``sinks.connect_schema``), and reading a topic back as current
state (``sinks.kafka_read.materialize_messages``). No broker: messages are built here, the
way the sink sends them (key by murmur2 partition, tombstone after each delete, truncate to
every partition), and replayed at least once."""

from __future__ import annotations

import base64
import binascii
import itertools
import json
import math
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from random import Random
from typing import Any
from uuid import UUID

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import event as note_case
from hypothesis import strategies as st
from kafka.partitioner.default import murmur2

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.values import UNAVAILABLE_VALUE, RawJson
from snapshotter.sinks.encoding import (
    KeyMismatchError,
    encode_key,
    encode_row,
    encode_value,
    json_as_text,
)
from snapshotter.sinks.jsonl import JsonlSink
from snapshotter.sinks.kafka.clients import KafkaPythonProducer
from snapshotter.sinks.kafka.connect_schema import (
    column_schema,
    envelope_schema,
    key_schema,
    row_schema,
    source_schema,
)
from snapshotter.sources.base import ColumnInfo, TableSchema
from snapshotter.sources.mysql import types as my_types
from snapshotter.sources.postgres import types as pg_types
from snapshotter.verify.kafka import Message, materialize_messages
from snapshotter.verify.rows import Materialized, VerifyError, canonical

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

ORDERS = TableId("public", "orders")
TOPIC = "demo.public.orders"


def make_source(
    pos: Position | int = 1,
    *,
    connector: str = "postgresql",
    table: TableId = ORDERS,
    snapshot: SnapshotMarker = SnapshotMarker.FALSE,
    details: Mapping[str, Any] | None = None,
) -> Source:
    position = pos if isinstance(pos, Position) else Position(pos, 0)
    if details is None:
        details = (
            {"lsn": 23_810_888, "txId": 741}
            if connector == "postgresql"
            else {"server_id": 1, "gtid": None, "file": "bin.000001", "binlog_pos": 4, "row": 0}
        )
    return Source(
        connector=connector,
        name="demo",
        db="shop",
        table=table,
        position=position,
        ts_ms=1_700_000_000_000,
        snapshot=snapshot,
        details=details,
    )


def event(
    op: Op,
    key: tuple[Any, ...] | None,
    after: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    *,
    pos: Position | int = 1,
    table: TableId = ORDERS,
    source: Source | None = None,
) -> ChangeEvent:
    src = source if source is not None else make_source(pos, table=table)
    return ChangeEvent(op, src, 1_700_000_000_123, key, before=before, after=after)


# =============================================================================================
# 1. encoding: keys and values
# =============================================================================================


def test_key_is_debeziums_shape_in_key_order() -> None:
    assert encode_key(["id"], (7,)) == '{"id":7}'
    assert encode_key(["region", "n"], ("eu", 1)) == '{"region":"eu","n":1}'
    assert encode_key(["n", "region"], (1, "eu")) == '{"n":1,"region":"eu"}'
    # values are encoded as in rows
    assert encode_key(["b", "t"], (b"ab", datetime(2024, 1, 2, tzinfo=UTC))) == (
        '{"b":"YWI=","t":"2024-01-02T00:00:00Z"}'
    )


@pytest.mark.parametrize(
    ("columns", "key"),
    [(["id"], (1, 2)), (["region", "n"], ("eu",)), ([], (1,)), (["id"], ())],
)
def test_key_length_mismatch_is_a_key_mismatch_error(columns: list[str], key: tuple[Any]) -> None:
    with pytest.raises(
        KeyMismatchError, match=rf"{len(key)} key values.*{columns!r}".replace("[", r"\[")
    ):
        encode_key(columns, key)
    assert issubclass(KeyMismatchError, ValueError)


key_values = st.one_of(
    st.integers(),
    st.text(),
    st.booleans(),
    st.binary(max_size=8),
    st.dates(),
    st.decimals(allow_nan=False, allow_infinity=False, places=2),
)


@FAST
@given(
    st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=4, unique=True).flatmap(
        lambda cols: st.tuples(st.just(cols), st.tuples(*[key_values for _ in cols]))
    )
)
def test_key_columns_follow_key_order(case: tuple[list[str], tuple[Any, ...]]) -> None:
    columns, key = case
    decoded = json.loads(encode_key(columns, key))
    assert list(decoded) == columns
    assert decoded == json.loads(encode_row(dict(zip(columns, key, strict=True))))


# --- the envelope ---------------------------------------------------------------------------

ENVELOPE_KEYS = ["before", "after", "source", "op", "ts_ms"]


@pytest.mark.parametrize(
    "ev",
    [
        event(Op.CREATE, (1,), after={"id": 1, "v": "a"}),
        event(Op.READ, (1,), after={"id": 1, "v": "a"}),
        event(Op.UPDATE, (1,), after={"id": 1, "v": "b"}, before={"id": 1, "v": "a"}),
        event(Op.UPDATE, (1,), after={"id": 1, "v": "b"}),
        event(Op.DELETE, (1,), before={"id": 1, "v": "b"}),
        event(Op.TRUNCATE, None),
    ],
    ids=["c", "r", "u", "u-no-before", "d", "t"],
)
def test_envelope_key_order_and_content(ev: ChangeEvent) -> None:
    text = encode_value(ev)
    value = json.loads(text)
    assert list(value) == ENVELOPE_KEYS
    assert value["op"] == ev.op.value
    assert value["ts_ms"] == ev.ts_ms
    assert value["source"] == ev.source.to_dict()
    assert list(value["source"]) == list(ev.source.to_dict())
    assert value["source"]["pos"] == ev.position.token
    assert value["before"] == (None if ev.before is None else dict(ev.before))
    assert value["after"] == (None if ev.after is None else dict(ev.after))
    assert "\n" not in text and "\r" not in text


def test_envelope_text_is_exact() -> None:
    ev = event(Op.UPDATE, (7,), after={"id": 7, "v": "b"}, before={"id": 7, "v": "a"})
    assert encode_value(ev) == (
        '{"before":{"id":7,"v":"a"},"after":{"id":7,"v":"b"},'
        '"source":{"version":"snapshotter-0.1","connector":"postgresql","name":"demo",'
        '"ts_ms":1700000000000,"snapshot":"false","db":"shop","schema":"public",'
        '"table":"orders","lsn":23810888,"txId":741,"pos":"0000000000000001-0000000000000000"},'
        '"op":"u","ts_ms":1700000000123}'
    )


# Values of the value model (what readers produce), for rows of random shape.
json_docs = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def json_texts(draw: st.DrawFn) -> str:
    """Valid JSON text as a database may keep it: any spacing, newlines, CRLF included."""
    doc = draw(json_docs)
    indent = draw(st.sampled_from([None, 0, 2]))
    text = json.dumps(doc, indent=indent, ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):
        text = text.replace("\n", "\r\n")
    if draw(st.booleans()):
        text = "\n " + text + " \n"
    return text


raw_jsons = json_texts().map(RawJson)

model_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities included
    st.text(),
    st.binary(max_size=16),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.uuids(),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=st.just(UTC)),
    st.times(),
    st.timedeltas(),  # MySQL TIME
    raw_jsons,
    st.just(UNAVAILABLE_VALUE),
)


@st.composite
def any_events(draw: st.DrawFn) -> ChangeEvent:
    columns = draw(st.lists(st.text(min_size=1, max_size=5), min_size=1, max_size=5, unique=True))

    def row() -> dict[str, Any]:
        return {c: draw(model_values) for c in columns}

    op = draw(st.sampled_from(list(Op)))
    pos = Position(draw(st.integers(0, 2**40)), draw(st.integers(0, 2**20)))
    connector = draw(st.sampled_from(["postgresql", "mysql"]))
    source = make_source(
        pos,
        connector=connector,
        snapshot=draw(st.sampled_from(list(SnapshotMarker))),
    )
    if op is Op.TRUNCATE:
        return event(op, None, source=source)
    after = None if op is Op.DELETE else row()
    before = row() if op is Op.DELETE or draw(st.booleans()) else None
    return event(op, (draw(st.integers()),), after=after, before=before, source=source)


@settings(max_examples=50, deadline=None)
@given(st.lists(any_events(), min_size=1, max_size=5))
def test_value_is_the_value_of_the_jsonl_line(events: list[ChangeEvent]) -> None:
    """The Kafka value is byte for byte the ``value`` of the JSONL sink's line."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.jsonl"
        sink = JsonlSink(path, "demo", lambda table: ["id"])
        sink.open(None)
        sink.write(events)
        sink.close()
        lines = path.read_bytes().decode("utf-8").split("\n")
    assert lines[-1] == ""
    assert len(lines) - 1 == len(events)
    for line, ev in zip(lines, events, strict=False):
        value = encode_value(ev)
        assert line.endswith(',"value":' + value + "}")
        record = json.loads(line)
        assert list(record) == ["topic", "key", "value"]
        assert record["value"] == json.loads(value)
        assert list(record["value"]) == ENVELOPE_KEYS
        if ev.key is not None:
            assert record["key"] == json.loads(encode_key(["id"], ev.key))


# --- JSON columns as text -------------------------------------------------------------------


def test_json_as_text_replaces_only_rawjson() -> None:
    when = datetime(2024, 1, 2, tzinfo=UTC)
    row = {"j": RawJson('{\n  "a": 1.50\n}'), "s": '{"a": 1}', "n": None, "t": when, "b": b"x"}
    out = json_as_text(row)
    assert out == {"j": '{\n  "a": 1.50\n}', "s": '{"a": 1}', "n": None, "t": when, "b": b"x"}
    assert out is not None and list(out) == list(row)
    assert json_as_text(None) is None
    plain = {"a": 1, "b": "text"}
    assert json_as_text(plain) is plain  # nothing to replace: the row itself


def test_json_text_value_holds_the_exact_text() -> None:
    text = '{\r\n  "a": [1.50, 1e400],\n  "b": "x\\ny"\n}'
    ev = event(
        Op.UPDATE,
        (1,),
        after={"id": 1, "doc": RawJson(text), "other": RawJson("null")},
        before={"id": 1, "doc": RawJson("[]"), "other": None},
    )
    value = json.loads(encode_value(ev, json_text=True))
    assert value["after"] == {"id": 1, "doc": text, "other": "null"}
    assert value["before"] == {"id": 1, "doc": "[]", "other": None}
    # embedded (the default): the document itself, CR/LF as spaces
    embedded = json.loads(encode_value(ev))
    assert embedded["after"]["doc"] == {"a": [1.5, math.inf], "b": "x\ny"}
    assert embedded["after"]["other"] is None


@FAST
@given(any_events())
def test_json_text_changes_json_columns_only(ev: ChangeEvent) -> None:
    text = encode_value(ev, json_text=True)
    assert "\n" not in text and "\r" not in text  # one line still
    as_text = json.loads(text)
    embedded = json.loads(encode_value(ev))
    assert list(as_text) == ENVELOPE_KEYS
    for part in ("source", "op", "ts_ms"):
        assert as_text[part] == embedded[part]
    for part in ("before", "after"):
        row = getattr(ev, part)
        if row is None:
            assert as_text[part] is None
            continue
        assert list(as_text[part]) == list(row)
        for column, v in row.items():
            if isinstance(v, RawJson):
                assert as_text[part][column] == v.text  # exact, newlines included
                assert embedded[part][column] == json.loads(v.text)
            else:
                assert as_text[part][column] == embedded[part][column]


MYSQL_TIME = timedelta(hours=838, minutes=59, seconds=59)  # MySQL TIME's range: +-838:59:59
mysql_times = st.timedeltas(min_value=-MYSQL_TIME, max_value=MYSQL_TIME)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "00:00:00"),
        (timedelta(hours=13, minutes=14, seconds=15), "13:14:15"),
        (timedelta(hours=13, minutes=14, seconds=15, microseconds=250000), "13:14:15.250000"),
        (timedelta(microseconds=1), "00:00:00.000001"),
        (-timedelta(microseconds=1), "-00:00:00.000001"),
        (-timedelta(hours=1, minutes=2, seconds=3, microseconds=250000), "-01:02:03.250000"),
        (timedelta(days=1), "24:00:00"),  # hours past 24 as they are
        (timedelta(days=34, hours=22, minutes=59, seconds=59), "838:59:59"),
        (-MYSQL_TIME, "-838:59:59"),
    ],
)
def test_mysql_time_values_are_written_as_mysql_writes_them(value: timedelta, text: str) -> None:
    ev = event(
        Op.CREATE,
        (value,),
        after={"id": 1, "tm": value},
        source=make_source(connector="mysql", table=TableId("shop", "t")),
    )
    for json_text in (False, True):
        assert json.loads(encode_value(ev, json_text=json_text))["after"]["tm"] == text
    assert encode_row({"tm": value}) == f'{{"tm":"{text}"}}'
    assert encode_key(["tm"], (value,)) == f'{{"tm":"{text}"}}'


_MYSQL_TIME_TEXT = re.compile(r"(-?)(\d{2,}):([0-5]\d):([0-5]\d)(?:\.(\d{6}))?")


def parse_mysql_time(text: str) -> timedelta:
    """A ``[-]HH:MM:SS[.ffffff]`` text back to its duration (asserts the form)."""
    found = _MYSQL_TIME_TEXT.fullmatch(text)
    assert found is not None, f"{text!r} is not a MySQL TIME text"
    sign, hours, minutes, seconds, micros = found.groups()
    magnitude = timedelta(
        hours=int(hours), minutes=int(minutes), seconds=int(seconds), microseconds=int(micros or 0)
    )
    assert micros is None or int(micros) != 0, f"{text!r}: a zero fraction is left out"
    assert not (sign and magnitude == timedelta(0)), f"{text!r}: no sign for zero"
    return -magnitude if sign else magnitude


@FAST
@given(mysql_times)
def test_mysql_time_text_round_trips(value: timedelta) -> None:
    (text,) = json.loads(encode_row({"tm": value})).values()
    assert parse_mysql_time(text) == value


# =============================================================================================
# 2. connect_schema
# =============================================================================================


def _named(name: str, kind: str = "string") -> dict[str, Any]:
    return {"type": kind, "name": f"io.debezium.{name}", "version": 1}


FLOATS32 = st.floats(width=32)
INT64 = st.integers(-(2**63), 2**63 - 1)
DECIMAL_0 = {
    "type": "bytes",
    "name": "org.apache.kafka.connect.data.Decimal",
    "version": 1,
    "parameters": {"scale": "0"},
}


@dataclass(frozen=True)
class Kind:
    """A column type of a dialect: how the dialect describes it, its schema, its values."""

    id: str
    type_name: str
    arrow: pa.DataType
    schema: dict[str, Any]  # without "optional"
    values: st.SearchStrategy[Any]
    type_code: int = 0


def pg(type_name: str, oid: int, schema: dict[str, Any], values: st.SearchStrategy[Any]) -> Kind:
    return Kind(f"pg:{type_name}", type_name, pg_types.arrow_type(oid), schema, values, oid)


def my(
    column_type: str,
    schema: dict[str, Any],
    values: st.SearchStrategy[Any],
    precision: int | None = None,
    scale: int | None = None,
) -> Kind:
    data_type = column_type.split("(")[0].split(" ")[0]
    arrow = my_types.arrow_type(data_type, column_type, precision, scale)
    return Kind(f"my:{column_type}", column_type, arrow, schema, values)


PG_KINDS = [
    pg("smallint", 21, {"type": "int16"}, st.integers(-(2**15), 2**15 - 1)),
    pg("integer", 23, {"type": "int32"}, st.integers(-(2**31), 2**31 - 1)),
    pg("bigint", 20, {"type": "int64"}, INT64),
    pg("oid", 26, {"type": "int64"}, st.integers(0, 2**32 - 1)),
    # Connect's JSON schema names: "float" (FLOAT32) and "double" (FLOAT64)
    pg("real", 700, {"type": "float"}, FLOATS32),
    pg("double precision", 701, {"type": "double"}, st.floats()),
    pg(
        "numeric(10,2)",
        1700,
        {"type": "string"},
        st.decimals(-(10**8), 10**8, places=2).map(str),
    ),
    pg("text", 25, {"type": "string"}, st.text()),
    pg("character varying(20)", 1043, {"type": "string"}, st.text(max_size=20)),
    pg("boolean", 16, {"type": "boolean"}, st.booleans()),
    pg("bytea", 17, {"type": "bytes"}, st.binary()),
    pg("jsonb", 3802, _named("data.Json"), raw_jsons),
    pg("json", 114, _named("data.Json"), raw_jsons),
    pg("uuid", 2950, _named("data.Uuid"), st.uuids().map(str)),
    pg(
        "timestamp with time zone",
        1184,
        _named("time.ZonedTimestamp"),
        st.datetimes(timezones=st.just(UTC)),
    ),
    pg("timestamp without time zone", 1114, _named("time.IsoTimestamp"), st.datetimes()),
    pg("date", 1082, _named("time.IsoDate"), st.dates()),
    pg("time without time zone", 1083, _named("time.IsoTime"), st.times()),
    pg("interval", 1186, {"type": "string"}, st.just("1 day 02:00:00")),
]

MY_KINDS = [
    my("tinyint(4)", {"type": "int16"}, st.integers(-128, 127)),
    my("tinyint(1)", {"type": "int16"}, st.integers(-128, 127)),
    my("tinyint(3) unsigned", {"type": "int32"}, st.integers(0, 255)),
    my("smallint(6)", {"type": "int16"}, st.integers(-(2**15), 2**15 - 1)),
    my("smallint(5) unsigned", {"type": "int32"}, st.integers(0, 2**16 - 1)),
    my("mediumint(9)", {"type": "int32"}, st.integers(-(2**23), 2**23 - 1)),
    my("int(11)", {"type": "int32"}, st.integers(-(2**31), 2**31 - 1)),
    my("int(10) unsigned", {"type": "int64"}, st.integers(0, 2**32 - 1)),
    my("int(10) unsigned zerofill", {"type": "int64"}, st.integers(0, 2**32 - 1)),
    my("bigint(20)", {"type": "int64"}, INT64),
    # Past int64: Connect's Decimal of scale 0 (Debezium's bigint.unsigned.handling.mode=
    # precise), written as the exact JSON number (JsonConverter reads a Decimal from a number)
    my("bigint(20) unsigned", DECIMAL_0, st.integers(0, 2**64 - 1)),
    my("bigint unsigned zerofill", DECIMAL_0, st.integers(0, 2**64 - 1)),
    my("year(4)", _named("time.Year", "int32"), st.integers(1901, 2155)),
    my("float", {"type": "float"}, st.floats(width=32, allow_nan=False, allow_infinity=False)),
    my("double", {"type": "double"}, st.floats(allow_nan=False, allow_infinity=False)),
    my(
        "decimal(10,2)",
        {"type": "string"},
        st.decimals(-(10**8), 10**8, places=2),
        precision=10,
        scale=2,
    ),
    my("varchar(20)", {"type": "string"}, st.text(max_size=20)),
    my("longtext", {"type": "string"}, st.text()),
    my("enum('a','b')", _named("data.Enum"), st.sampled_from(["a", "b"])),
    my("set('a')", _named("data.EnumSet"), st.sampled_from(["", "a"])),
    my("set('a','b')", _named("data.EnumSet"), st.sampled_from(["", "a", "b", "a,b"])),
    my("varbinary(8)", {"type": "bytes"}, st.binary(max_size=8)),
    my("blob", {"type": "bytes"}, st.binary()),
    my("bit(8)", {"type": "bytes"}, st.binary(min_size=1, max_size=1)),
    my("json", _named("data.Json"), raw_jsons),
    my("date", _named("time.IsoDate"), st.dates()),
    my("datetime", _named("time.IsoTimestamp"), st.datetimes()),
    my("datetime(6)", _named("time.IsoTimestamp"), st.datetimes()),
    my("timestamp", _named("time.ZonedTimestamp"), st.datetimes(timezones=st.just(UTC))),
    # a signed duration, written as MySQL writes it ("-838:59:59")
    my("time", _named("time.IsoTime"), mysql_times),
    my("time(6)", _named("time.IsoTime"), mysql_times),
]


PG_KIND = {k.type_name: k for k in PG_KINDS}


def column(kind: Kind, name: str = "c", *, nullable: bool = True) -> ColumnInfo:
    return ColumnInfo(name, kind.type_name, kind.type_code, nullable, kind.arrow)


@pytest.mark.parametrize("kind", PG_KINDS + MY_KINDS, ids=lambda k: k.id)
@pytest.mark.parametrize("nullable", [True, False])
def test_column_schema(kind: Kind, nullable: bool) -> None:
    assert column_schema(column(kind, nullable=nullable)) == {**kind.schema, "optional": nullable}
    # an explicit optional wins over nullable (keys are never optional)
    assert column_schema(column(kind, nullable=nullable), optional=False)["optional"] is False


def test_mysql_time_column_is_an_iso_time_string() -> None:
    kind = my("time", _named("time.IsoTime"), st.nothing())
    assert pa.types.is_duration(kind.arrow)
    assert column_schema(column(kind)) == {**kind.schema, "optional": True}


def test_the_kinds_cover_the_dialects_arrow_types() -> None:
    """Every Arrow type the dialects buffer has a kind here (so the table stays complete)."""
    covered = {str(k.arrow) for k in PG_KINDS + MY_KINDS}
    used = {str(p.arrow) for p in pg_types.PG_TYPES.values()}
    used |= {
        str(my_types.arrow_type(t, t, 10, 2))
        for t in [
            "bigint",
            "int",
            "float",
            "decimal",
            "date",
            "datetime",
            "timestamp",
            "time",
            "blob",
            "varchar",
            "json",
            "enum",
            "set",
            "year",
            "bit",
            "geometry",
        ]
    }
    used |= {str(my_types.arrow_type("bigint", "bigint unsigned", None, None))}
    assert used <= covered


@pytest.mark.parametrize(
    ("type_name", "name"),
    [
        ("enum('a)b','c')", "io.debezium.data.Enum"),
        ("enum(')')", "io.debezium.data.Enum"),
        ("enum('x unsigned)','(y')", "io.debezium.data.Enum"),
        ("set(')')", "io.debezium.data.EnumSet"),
        ("set('a(b','c)d)')", "io.debezium.data.EnumSet"),
    ],
)
def test_enum_member_with_a_parenthesis(type_name: str, name: str) -> None:
    """Only the text outside the parentheses names the type: members may hold anything."""
    schema = column_schema(ColumnInfo("e", type_name, 0, True, pa.string()))
    assert schema == {"type": "string", "name": name, "version": 1, "optional": True}


@pytest.mark.parametrize(
    ("type_name", "arrow", "schema"),
    [
        # "unsigned" inside an enum member or a comment-like member is not a modifier
        ("enum('unsigned')", pa.string(), _named("data.Enum")),
        ("int(10) unsigned", pa.int64(), {"type": "int64"}),
        ("INT(10) UNSIGNED", pa.int64(), {"type": "int64"}),
        ("int unsigned", pa.int64(), {"type": "int64"}),
        ("int(10) zerofill", pa.int64(), {"type": "int32"}),
        ("bigint(20) unsigned zerofill", pa.uint64(), DECIMAL_0),
        ("bigint(20)", pa.int64(), {"type": "int64"}),
        ("float unsigned", pa.float64(), {"type": "float"}),
        ("double(10,2) unsigned", pa.float64(), {"type": "double"}),
    ],
)
def test_mysql_modifiers_outside_the_parentheses(
    type_name: str, arrow: pa.DataType, schema: dict[str, Any]
) -> None:
    got = column_schema(ColumnInfo("c", type_name, 0, False, arrow))
    assert got == {**schema, "optional": False}


PG_TABLE = TableSchema(
    ORDERS,
    (
        column(PG_KIND["integer"], "a", nullable=True),
        column(PG_KIND["text"], "region", nullable=False),
        column(PG_KIND["bigint"], "id", nullable=False),
        column(PG_KIND["jsonb"], "doc", nullable=True),
        column(PG_KIND["text"], "note", nullable=False),  # NOT NULL, not in the key
    ),
    ("region", "id"),
)
PG_KEY = PG_TABLE.primary_key


def test_key_schema_fields_follow_key_order_and_are_never_optional() -> None:
    schema = key_schema(TOPIC, PG_TABLE, ["id", "region", "a"])  # a surrogate key may be nullable
    assert schema == {
        "type": "struct",
        "fields": [
            {"type": "int64", "optional": False, "field": "id"},
            {"type": "string", "optional": False, "field": "region"},
            {"type": "int32", "optional": False, "field": "a"},
        ],
        "optional": False,
        "name": f"{TOPIC}.Key",
    }


def test_row_schema_every_column_in_table_order() -> None:
    schema = row_schema(TOPIC, PG_TABLE, PG_KEY)
    assert schema["name"] == f"{TOPIC}.Value" and schema["optional"] is True
    assert [f["field"] for f in schema["fields"]] == ["a", "region", "id", "doc", "note"]
    assert schema["fields"][3]["name"] == "io.debezium.data.Json"
    for f in schema["fields"]:
        assert f == {**column_schema(PG_TABLE.column(f["field"])), **f}


def test_row_schema_only_key_columns_may_be_required() -> None:
    """A PostgreSQL delete under REPLICA IDENTITY DEFAULT has a ``before`` of the key columns
    only: every other column is optional, NOT NULL or not; key columns follow their
    nullability."""
    optional = {f["field"]: f["optional"] for f in row_schema(TOPIC, PG_TABLE, PG_KEY)["fields"]}
    assert optional == {"a": True, "region": False, "id": False, "doc": True, "note": True}
    # another key (a nullable surrogate key follows its nullability, unlike in the key schema)
    optional = {f["field"]: f["optional"] for f in row_schema(TOPIC, PG_TABLE, ["a"])["fields"]}
    assert optional == {"a": True, "region": True, "id": True, "doc": True, "note": True}
    optional = {f["field"]: f["optional"] for f in row_schema(TOPIC, PG_TABLE, ["note"])["fields"]}
    assert optional == {"a": True, "region": True, "id": True, "doc": True, "note": False}
    # and such a before conforms (JsonConverter reads an absent field as null); one without a
    # key column does not
    schema = row_schema(TOPIC, PG_TABLE, PG_KEY)
    check_conforms(schema, {"region": "eu", "id": 2})
    check_conforms(schema, {"a": None, "region": "eu", "id": 2, "doc": None, "note": None})
    for before in ({"id": 2}, {"a": 1, "region": None, "id": 2, "doc": None, "note": "x"}):
        with pytest.raises(AssertionError, match="not optional"):
            check_conforms(schema, before)


@pytest.mark.parametrize(
    ("connector", "name"),
    [
        ("postgresql", "io.debezium.connector.postgresql.Source"),
        ("mysql", "io.debezium.connector.mysql.Source"),
    ],
)
def test_envelope_schema(connector: str, name: str) -> None:
    source = make_source(7, connector=connector).to_dict()
    schema = envelope_schema(TOPIC, PG_TABLE, PG_KEY, source)
    assert schema["type"] == "struct" and schema["optional"] is False
    assert schema["name"] == f"{TOPIC}.Envelope"
    fields = schema["fields"]
    assert [f["field"] for f in fields] == ENVELOPE_KEYS
    before, after, src, op, ts_ms = fields
    row = row_schema(TOPIC, PG_TABLE, PG_KEY)
    assert before == {**row, "field": "before"} and after == {**row, "field": "after"}
    assert before["optional"] is True and after["optional"] is True
    assert src["type"] == "struct" and src["name"] == name and src["optional"] is False
    assert [f["field"] for f in src["fields"]] == list(source)
    assert op == {"type": "string", "optional": False, "field": "op"}
    assert ts_ms["type"] == "int64" and ts_ms["field"] == "ts_ms"


def test_source_schema_types_and_optional_fields() -> None:
    source = make_source(3, connector="mysql").to_dict()
    schema = source_schema({**source, "extra_flag": True, "extra_n": 3})
    types = {f["field"]: (f["type"], f["optional"]) for f in schema["fields"]}
    assert types == {
        "version": ("string", False),
        "connector": ("string", False),
        "name": ("string", False),
        "ts_ms": ("int64", False),
        "snapshot": ("string", True),
        "db": ("string", False),
        "schema": ("string", True),
        "table": ("string", True),
        "server_id": ("int64", True),
        "gtid": ("string", True),
        "file": ("string", True),
        "binlog_pos": ("int64", True),
        "row": ("int32", True),
        "pos": ("string", False),
        "extra_flag": ("boolean", True),
        "extra_n": ("int64", True),
    }


def test_source_schema_float_detail_is_a_double() -> None:
    source = {**make_source(3).to_dict(), "extra_f": 1.5}
    (field,) = [f for f in source_schema(source)["fields"] if f["field"] == "extra_f"]
    assert field == {"type": "double", "optional": True, "field": "extra_f"}


# --- the payload conforms to the schema (as Kafka Connect's JsonConverter reads it) ----------

_INT_RANGE = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
# The sink's (and Connect's own fromConnectData's) text for non-finite floats. JsonConverter
# reads them without error, as 0.0: Connect's own limitation (see the integration test).
_NON_FINITE = {"NaN", "Infinity", "-Infinity"}
DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _check_logical(name: str, value: Any, where: str) -> None:
    """What the Debezium logical type promises about the text (beyond the JSON type)."""
    if name == "io.debezium.time.ZonedTimestamp":
        assert value.endswith("Z"), where
        assert datetime.fromisoformat(value).utcoffset() == timedelta(0), where
    elif name == "io.debezium.time.IsoTimestamp":
        assert datetime.fromisoformat(value).tzinfo is None, where
    elif name == "io.debezium.time.IsoDate":
        date.fromisoformat(value)
    elif name == "io.debezium.time.IsoTime":  # PostgreSQL's time of day; MySQL's duration
        if _MYSQL_TIME_TEXT.fullmatch(value):
            parse_mysql_time(value)
        else:
            time.fromisoformat(value)
    elif name == "io.debezium.data.Uuid":
        UUID(value)
    # an unchanged TOASTed document is the placeholder text: Debezium's way too
    elif name == "io.debezium.data.Json" and value != UNAVAILABLE_VALUE:
        json.loads(value)


def check_conforms(schema: Mapping[str, Any], value: Any, where: str = "$") -> None:
    """Assert that ``value`` (parsed JSON) is data of the Connect ``schema``."""
    if value is None:
        assert schema["optional"], f"{where}: null, but the schema is not optional"
        return
    kind = schema["type"]
    if schema.get("name") == DECIMAL:
        # JsonConverter reads a Decimal from a JSON number (exactly, any size) or base64
        assert kind == "bytes" and "scale" in schema.get("parameters", {}), where
        if type(value) is not int:
            assert type(value) is str, f"{where}: {value!r} is not a Decimal"
            check_conforms({"type": "bytes", "optional": False}, value, where)
        return
    if kind in _INT_RANGE:
        bits = _INT_RANGE[kind]
        assert type(value) is int, f"{where}: {value!r} is not an integer ({kind})"
        assert -(2 ** (bits - 1)) <= value < 2 ** (bits - 1), f"{where}: {value} overflows {kind}"
    elif kind in ("float", "double"):  # Connect's JSON names of FLOAT32 and FLOAT64
        ok = (type(value) in (int, float)) or value in _NON_FINITE
        assert ok, f"{where}: {value!r} is not a number ({kind})"
    elif kind == "string":
        assert type(value) is str, f"{where}: {value!r} is not a string"
    elif kind == "bytes":
        assert type(value) is str, f"{where}: {value!r} is not base64 text"
        try:
            base64.b64decode(value, validate=True)
        except binascii.Error:
            raise AssertionError(f"{where}: {value!r} is not base64") from None
    elif kind == "boolean":
        assert type(value) is bool, f"{where}: {value!r} is not a boolean"
    elif kind == "struct":
        assert type(value) is dict, f"{where}: {value!r} is not an object"
        names = [f["field"] for f in schema["fields"]]
        extra = [name for name in value if name not in names]
        # JsonConverter drops a field the schema does not name: data lost
        assert not extra, f"{where}: fields {extra} are not in the schema {names}"
        for field in schema["fields"]:  # an absent field is read as null
            check_conforms(field, value.get(field["field"]), f"{where}.{field['field']}")
    else:
        raise AssertionError(f"{where}: unexpected schema type {kind!r}")
    if "name" in schema and kind != "struct":
        try:
            _check_logical(schema["name"], value, where)
        except ValueError as exc:
            raise AssertionError(f"{where}: {value!r} is not a {schema['name']}: {exc}") from None


def test_the_checker_refuses_what_converters_refuse() -> None:
    optional_int = {"type": "int32", "optional": True}
    required_str = {"type": "string", "optional": False}
    decimal = {**DECIMAL_0, "optional": False}
    struct_a = {"type": "struct", "optional": False, "fields": [{**required_str, "field": "a"}]}
    cases: list[tuple[dict[str, Any], Any]] = [
        (required_str, None),
        ({"type": "int16", "optional": False}, 40_000),
        (optional_int, "NaN"),
        (optional_int, 1.5),
        (optional_int, True),
        ({"type": "double", "optional": False}, "nan"),
        ({"type": "bytes", "optional": False}, UNAVAILABLE_VALUE),
        ({"type": "boolean", "optional": False}, 1),
        (struct_a, {}),
        (struct_a, {"a": "x", "b": 1}),  # a field JsonConverter would drop
        # names JsonConverter does not know ("Unknown schema type")
        ({"type": "float64", "optional": False}, 1.5),
        ({"type": "float32", "optional": False}, 1.5),
        (decimal, True),
        (decimal, 1.5),
        (decimal, "not base64!"),
        (decimal, None),
        ({**_named("time.IsoTime"), "optional": False}, "25:00"),
        ({**_named("time.IsoTime"), "optional": False}, "1:02:03"),
        ({**_named("data.Json"), "optional": False}, "{"),
    ]
    for schema, value in cases:
        with pytest.raises(AssertionError):
            check_conforms(schema, value)
    check_conforms({"type": "float", "optional": False}, "-Infinity")
    check_conforms({"type": "double", "optional": False}, 2)
    check_conforms({"type": "bytes", "optional": False}, "YWI=")
    check_conforms(decimal, 2**64 - 1)
    check_conforms(decimal, 10**40)
    check_conforms(decimal, "AQ==")  # base64 of the unscaled value: JsonConverter reads it too
    check_conforms(struct_a, {"a": "x"})
    check_conforms({**_named("time.IsoTime"), "optional": False}, "-838:59:59")
    check_conforms({**_named("time.IsoTime"), "optional": False}, "13:14:15.250000")
    check_conforms({**_named("data.Json"), "optional": False}, UNAVAILABLE_VALUE)


@dataclass(frozen=True)
class RandomTable:
    connector: str
    table: TableSchema
    key: tuple[str, ...]
    kinds: dict[str, Kind]


# PostgreSQL types whose unchanged values an UPDATE may leave out of the log (TOAST).
PG_TOASTABLE = {"text", "character varying(20)", "bytea", "json", "jsonb"}
PLACEHOLDER_B64 = base64.b64encode(UNAVAILABLE_VALUE.encode()).decode()
assert PLACEHOLDER_B64 == "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="


@st.composite
def random_tables(draw: st.DrawFn) -> RandomTable:
    connector = draw(st.sampled_from(["postgresql", "mysql"]))
    pool = PG_KINDS if connector == "postgresql" else MY_KINDS
    kinds = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=8))
    # Keys: of JSON types only PostgreSQL's jsonb can be one (json has no equality)
    keyable = [
        i
        for i, k in enumerate(kinds)
        if k.schema.get("name") != "io.debezium.data.Json" or k.id == "pg:jsonb"
    ]
    assume(keyable)
    n_key = draw(st.integers(1, min(3, len(keyable))))
    key_at = draw(st.permutations(keyable))[:n_key]  # key order != table order
    columns = tuple(
        ColumnInfo(
            f"c{i}",
            k.type_name,
            k.type_code,
            False if i in key_at else draw(st.booleans()),
            k.arrow,
        )
        for i, k in enumerate(kinds)
    )
    schema = "public" if connector == "postgresql" else "shop"
    table = TableSchema(TableId(schema, "t"), columns, tuple(f"c{i}" for i in key_at))
    return RandomTable(
        connector, table, table.primary_key, {f"c{i}": k for i, k in enumerate(kinds)}
    )


@st.composite
def rows_of(draw: st.DrawFn, t: RandomTable, *, toast: bool = False) -> dict[str, Any]:
    """A row of ``t``; with ``toast`` (a PostgreSQL update's ``after``), unchanged TOASTed
    values of columns outside the key may be the unavailable-value placeholder."""
    row: dict[str, Any] = {}
    for c in t.table.columns:
        kind = t.kinds[c.name]
        if c.nullable and draw(st.integers(0, 4)) == 0:
            row[c.name] = None
        elif (
            toast
            and c.name not in t.key
            and kind.type_name in PG_TOASTABLE
            and draw(st.integers(0, 2)) == 0
        ):
            row[c.name] = UNAVAILABLE_VALUE
        else:
            row[c.name] = draw(kind.values)
    return row


@st.composite
def table_events(draw: st.DrawFn) -> tuple[RandomTable, list[ChangeEvent]]:
    t = draw(random_tables())
    pg = t.connector == "postgresql"
    events = []
    for i in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from([Op.CREATE, Op.UPDATE, Op.DELETE, Op.READ, Op.TRUNCATE]))
        row = draw(rows_of(t, toast=pg and op is Op.UPDATE))
        key = tuple(row[c] for c in t.key)
        pg_details = {"lsn": draw(st.integers(0, 2**63 - 1)), "txId": draw(st.integers(0, 2**32))}
        my_details = {
            "server_id": draw(st.integers(1, 2**32 - 1)),
            "gtid": draw(st.none() | st.just("3e11fa47-71ca-11e1-9e33-c80aa9429562:23")),
            "file": "binlog.000003",
            "binlog_pos": draw(st.integers(4, 2**40)),
            "row": draw(st.integers(0, 1000)),
        }
        source = make_source(
            Position(i + 1, 0),
            connector=t.connector,
            table=t.table.table,
            snapshot=SnapshotMarker.INCREMENTAL if op is Op.READ else SnapshotMarker.FALSE,
            details=pg_details if pg else my_details,
        )
        if op is Op.TRUNCATE:
            events.append(event(Op.TRUNCATE, None, source=source))
        elif op is Op.DELETE:
            if pg and draw(st.booleans()):  # REPLICA IDENTITY DEFAULT: the key columns only
                row = {c: row[c] for c in t.table.column_names if c in t.key}
            events.append(event(Op.DELETE, key, before=row, source=source))
        else:
            before = draw(rows_of(t)) if op is Op.UPDATE and draw(st.booleans()) else None
            events.append(event(op, key, after=row, before=before, source=source))
    return t, events


def expected_payload(ev: ChangeEvent, binary: Iterable[str]) -> Any:
    """The envelope of ``ev`` as the sink writes it with schemas and json_as_text: the
    placeholder in a binary column as its bytes (base64), as Debezium writes it."""
    value = json.loads(encode_value(ev, json_text=True))
    for part in ("before", "after"):
        for c in binary:
            if value[part] is not None and value[part].get(c) == UNAVAILABLE_VALUE:
                value[part][c] = PLACEHOLDER_B64
    return value


@FAST
@given(table_events(), st.integers(1, 3))
def test_payload_conforms_to_the_envelope_schema(
    case: tuple[RandomTable, list[ChangeEvent]], partitions: int
) -> None:
    """What the sink sends with schemas (json_as_text): every key and value conforms to the
    schema beside it, which is the table's key and envelope schema."""
    t, events = case
    topic = f"demo.{t.table.table.schema}.t"
    kschema = key_schema(topic, t.table, t.key)
    binary = [c.name for c in t.table.columns if t.kinds[c.name].schema == {"type": "bytes"}]
    sink, producer = fake_sink(partitions, schemas=True, json_text=True, table=t.table)
    sink.write(events)
    sent = iter(producer.sent)
    for ev in events:
        vschema = envelope_schema(topic, t.table, t.key, ev.source.to_dict())
        copies = partitions if ev.key is None else 2 if ev.op is Op.DELETE else 1
        for _ in range(copies):
            name, message = next(sent)
            assert name == topic
            if message.value is None:  # the tombstone after a delete
                assert ev.op is Op.DELETE
                continue
            wire = json.loads(message.value)
            assert list(wire) == ["schema", "payload"]
            assert wire["schema"] == vschema
            assert wire["payload"] == expected_payload(ev, binary)
            check_conforms(wire["schema"], wire["payload"])
            if ev.key is None:
                assert message.key is None
                continue
            assert message.key is not None
            key = json.loads(message.key)
            assert list(key) == ["schema", "payload"] and key["schema"] == kschema
            text_key = tuple(v.text if isinstance(v, RawJson) else v for v in ev.key)
            assert key["payload"] == json.loads(encode_key(t.key, text_key))
            check_conforms(kschema, key["payload"], "key")
    assert next(sent, None) is None


def test_truncate_payload_conforms() -> None:
    ev = event(Op.TRUNCATE, None)
    check_conforms(
        envelope_schema(TOPIC, PG_TABLE, PG_KEY, ev.source.to_dict()),
        json.loads(encode_value(ev, json_text=True)),
    )


BYTEA_TABLE = TableSchema(
    ORDERS,
    (
        column(PG_KIND["bigint"], "id", nullable=False),
        column(PG_KIND["bytea"], "b"),
        column(PG_KIND["text"], "note"),
    ),
    ("id",),
)


def test_unavailable_bytea_value_conforms() -> None:
    """An unchanged TOASTed bytea: with schemas, the placeholder's bytes (base64), as
    Debezium writes it, so the payload fits the column's bytes schema; a text column keeps
    the placeholder text; without schemas both are the text. Read back, the row keeps the
    value it had."""
    assert PG_KIND["bytea"].schema == {"type": "bytes"}
    events = [
        event(Op.CREATE, (1,), after={"id": 1, "b": b"\x00big", "note": "old"}, pos=1),
        event(Op.UPDATE, (1,), after={"id": 1, "b": UNAVAILABLE_VALUE, "note": "new"}, pos=2),
        event(
            Op.UPDATE,
            (1,),
            after={"id": 1, "b": UNAVAILABLE_VALUE, "note": UNAVAILABLE_VALUE},
            pos=3,
        ),
    ]
    for schemas in (True, False):
        sink, producer = fake_sink(2, schemas=schemas, table=BYTEA_TABLE)
        sink.write(events)
        values = [json.loads(m.value or b"") for _, m in producer.sent]
        payloads = [v["payload"] if schemas else v for v in values]
        b_text = PLACEHOLDER_B64 if schemas else UNAVAILABLE_VALUE
        assert [p["after"] for p in payloads] == [
            {"id": 1, "b": base64.b64encode(b"\x00big").decode(), "note": "old"},
            {"id": 1, "b": b_text, "note": "new"},
            {"id": 1, "b": b_text, "note": UNAVAILABLE_VALUE},
        ]
        if schemas:
            for value in values:
                check_conforms(value["schema"], value["payload"])
        out = materialize_messages(TOPIC, deliver(m for _, m in producer.sent), schemas=schemas)
        assert out.rows == {
            canonical({"id": 1}): {
                "id": 1,
                "b": base64.b64encode(b"\x00big").decode(),
                "note": "new",
            }
        }


def test_placeholder_bytes_also_in_before_and_keys_untouched() -> None:
    """The placeholder becomes bytes in ``before`` too, only in binary columns; an event
    without it is sent as it is."""
    sink, producer = fake_sink(1, schemas=True, table=BYTEA_TABLE)
    old = {"id": 1, "b": UNAVAILABLE_VALUE, "note": UNAVAILABLE_VALUE}
    sink.write(
        [
            event(Op.UPDATE, (1,), after={"id": 1, "b": None, "note": "x"}, before=old, pos=1),
            event(Op.DELETE, (1,), before={"id": 1}, pos=2),
        ]
    )
    (_, update), (_, delete), (_, tombstone) = producer.sent
    payload = json.loads(update.value or b"")["payload"]
    assert payload["before"] == {"id": 1, "b": PLACEHOLDER_B64, "note": UNAVAILABLE_VALUE}
    assert payload["after"] == {"id": 1, "b": None, "note": "x"}
    deleted = json.loads(delete.value or b"")
    assert deleted["payload"]["before"] == {"id": 1}  # REPLICA IDENTITY DEFAULT
    check_conforms(deleted["schema"], deleted["payload"])
    assert tombstone.value is None and tombstone.key == delete.key


# =============================================================================================
# 3. materialize_messages: a topic read back as current state
# =============================================================================================

KEY_COLUMNS = ("id",)
ITEM_TABLE = TableSchema(
    ORDERS,
    (
        ColumnInfo("id", "bigint", 20, False, pa.int64()),
        ColumnInfo("v", "integer", 23, True, pa.int64()),
        ColumnInfo("big", "text", 25, True, pa.string()),
    ),
    KEY_COLUMNS,
)


@dataclass(frozen=True)
class Sent:
    """One message as the sink sends it (the broker assigns the offset)."""

    partition: int
    key: bytes | None
    value: bytes | None


def partition_of(key: bytes, partitions: int) -> int:
    """What the producer's default partitioner does with a keyed message (murmur2)."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


def sink_messages(ev: ChangeEvent, partitions: int) -> list[Sent]:
    """The messages the sink sends for one event (schemas = false)."""
    value = encode_value(ev).encode("utf-8")
    if ev.key is None:  # a truncate: to every partition
        return [Sent(p, None, value) for p in range(partitions)]
    key = encode_key(KEY_COLUMNS, ev.key).encode("utf-8")
    p = partition_of(key, partitions)
    out = [Sent(p, key, value)]
    if ev.op is Op.DELETE:
        out.append(Sent(p, key, None))  # the tombstone
    return out


def wrap(sent: Sent) -> Sent:
    """The same message with schemas = true (JsonConverter's schemas.enable)."""

    def wrapped(data: bytes | None, schema: dict[str, Any]) -> bytes | None:
        if data is None:
            return None
        return b'{"schema":' + json.dumps(schema).encode() + b',"payload":' + data + b"}"

    value = json.loads(sent.value) if sent.value is not None else None
    vschema = envelope_schema(TOPIC, ITEM_TABLE, KEY_COLUMNS, value["source"]) if value else {}
    return Sent(
        sent.partition,
        wrapped(sent.key, key_schema(TOPIC, ITEM_TABLE, KEY_COLUMNS)),
        wrapped(sent.value, vschema),
    )


def deliver(sent: Iterable[Sent], rng: Random | None = None) -> list[Message]:
    """Offsets per partition; with ``rng``, partitions interleaved at random (each one in
    order, as a consumer of all partitions sees them), else partition after partition (as
    ``read_topic`` reads)."""
    queues: dict[int, list[Message]] = {}
    for s in sent:
        queue = queues.setdefault(s.partition, [])
        queue.append(Message(s.partition, len(queue), s.key, s.value))
    if rng is None:
        return [m for p in sorted(queues) for m in queues[p]]
    out: list[Message] = []
    heads = {p: 0 for p in queues}
    while heads:
        p = rng.choice(sorted(heads))
        out.append(queues[p][heads[p]])
        heads[p] += 1
        if heads[p] == len(queues[p]):
            del heads[p]
    return out


# Operations on a table keyed by id: ("put", id, toast, snapshot_read), ("del", id), ("trunc",)
@st.composite
def one_operation(draw: st.DrawFn) -> tuple[Any, ...]:
    roll = draw(st.integers(0, 19))
    if roll == 0:  # the occasional truncate
        return ("trunc",)
    k = draw(st.integers(0, 5))
    if roll <= 6:
        return ("del", k)
    return ("put", k, draw(st.booleans()), draw(st.integers(0, 4)) == 0)


operations = st.lists(one_operation(), max_size=40)


def run_oracle(
    ops: Sequence[tuple[Any, ...]],
) -> tuple[list[ChangeEvent], dict[int, dict[str, Any]]]:
    """The events the engine emits for ``ops`` on a table, and the table at the end."""
    table: dict[int, dict[str, Any]] = {}
    events: list[ChangeEvent] = []
    for step, op in enumerate(ops, 1):
        pos = Position(step, 0)  # fixed-width token, increasing
        if op[0] == "trunc":
            table.clear()
            events.append(event(Op.TRUNCATE, None, pos=pos))
        elif op[0] == "del":
            k = op[1]
            if k in table:
                events.append(event(Op.DELETE, (k,), before=table.pop(k), pos=pos))
        else:
            _, k, toast, read = op
            old = table.get(k)
            row = {"id": k, "v": step, "big": f"big-{step}" if step % 3 else None}
            after = dict(row)
            if old is not None and toast:  # "big" unchanged and not logged
                row["big"] = old["big"]
                after["big"] = UNAVAILABLE_VALUE
            table[k] = row
            kind = Op.READ if read else (Op.UPDATE if old is not None else Op.CREATE)
            events.append(event(kind, (k,), after=after, before=old, pos=pos))
    return events, table


def expected_rows(table: Mapping[int, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {canonical({"id": k}): dict(row) for k, row in table.items()}


def assert_state(out: Materialized, table: Mapping[int, Mapping[str, Any]]) -> None:
    assert out.rows == expected_rows(table)
    assert out.keys == {canonical({"id": k}): {"id": k} for k in table}


@FAST
@given(operations, st.integers(1, 4), st.randoms(use_true_random=False))
def test_materialized_topic_is_the_table(
    ops: list[tuple[Any, ...]], partitions: int, rng: Random
) -> None:
    events, table = run_oracle(ops)
    sent = [m for ev in events for m in sink_messages(ev, partitions)]
    wrapped = [wrap(s) for s in sent]
    for messages, schemas in [
        (deliver(sent), None),
        (deliver(sent), False),
        (deliver(sent, rng), None),
        (deliver(wrapped, rng), None),
        (deliver(wrapped, rng), True),
    ]:
        out = materialize_messages(TOPIC, messages, schemas=schemas)
        assert_state(out, table)
        assert out.pos_violations == []
        assert out.repeats == 0
        ops_count = {op.value: sum(e.op is op for e in events) for op in Op}
        ops_count["t"] *= partitions
        ops_count["tombstone"] = ops_count["d"]
        assert {k: v for k, v in out.ops.items() if v} == {k: v for k, v in ops_count.items() if v}


@dataclass(frozen=True)
class Replay:
    """A run that stopped, and the run after it: the sink sent ``sent`` (in this order); each
    partition ``p`` got its messages among ``sent[:cuts[p]]`` before the crash (in-flight
    batches differ per partition); the restart sends ``sent[checkpoint:]`` again, the
    messages after the last acknowledged checkpoint (at or before every cut)."""

    ops: list[tuple[Any, ...]]
    partitions: int
    sent: list[Sent]
    table: dict[int, dict[str, Any]]
    checkpoint: int
    cuts: tuple[int, ...]
    rng: Random

    def stream(self) -> list[Sent]:
        before = [s for i, s in enumerate(self.sent) if i < self.cuts[s.partition]]
        return before + self.sent[self.checkpoint :]

    def repeated(self) -> list[Sent]:
        return [s for i, s in enumerate(self.sent) if self.checkpoint <= i < self.cuts[s.partition]]


@st.composite
def replays(draw: st.DrawFn) -> Replay:
    ops = draw(st.lists(one_operation(), min_size=6, max_size=40))
    partitions = draw(st.integers(1, 4))
    events, table = run_oracle(ops)
    sent = [m for ev in events for m in sink_messages(ev, partitions)]
    n = len(sent)
    cut = draw(st.integers(0, n))  # where the first run stopped
    # the last acknowledged checkpoint before it (often well before: long replays)
    checkpoint = draw(st.sampled_from([0, cut // 4, cut // 2]) | st.integers(0, cut))
    if draw(st.booleans()):
        cuts = (cut,) * partitions
    else:
        cuts = tuple(draw(st.integers(checkpoint, n)) for _ in range(partitions))
    rng = draw(st.randoms(use_true_random=False))
    return Replay(ops, partitions, sent, table, checkpoint, cuts, rng)


@FAST
@given(replays())
def test_at_least_once_replay_converges(replay: Replay) -> None:
    """After a crash the sink sends everything after the last acknowledged checkpoint again:
    per partition, the messages after the checkpoint repeat, in order, then the rest."""
    repeated = replay.repeated()
    # per key: how many of its events (not tombstones) were sent twice
    per_key: dict[bytes, int] = {}
    for s in repeated:
        if s.key is not None and s.value is not None:
            per_key[s.key] = per_key.get(s.key, 0) + 1
    note_case(f"partitions={replay.partitions}")
    if any(n > 1 for n in per_key.values()):
        note_case("a key's events repeated")
    if any(s.key is None for s in repeated):
        note_case("a truncate repeated")
    if len(set(replay.cuts)) > 1:
        note_case("partitions cut at different points")
    stream = replay.stream()
    for wrapped in (False, True):
        messages = deliver([wrap(s) for s in stream] if wrapped else stream, replay.rng)
        out = materialize_messages(TOPIC, messages, schemas=wrapped)
        assert_state(out, replay.table)
        assert out.pos_violations == []
        # every event sent again is told apart as a repeat, a key's last one included
        assert out.repeats == sum(per_key.values())


def test_a_repeat_of_a_keys_last_event_counts() -> None:
    ev = event(Op.CREATE, (1,), after={"id": 1, "v": 1, "big": None}, pos=1)
    (sent,) = sink_messages(ev, 1)
    out = materialize_messages(TOPIC, deliver([sent, sent]))  # cut after it, checkpoint before
    assert out.rows == {canonical({"id": 1}): {"id": 1, "v": 1, "big": None}}
    assert out.repeats == 1 and out.pos_violations == []


def test_a_different_event_at_the_same_position_is_not_a_repeat() -> None:
    """A repeat is the same (key, pos, op): another op at the key's position is not one (nor
    a regression: the position did not go back)."""
    pos = Position(4, 0)
    sent = [
        *sink_messages(event(Op.CREATE, (1,), after={"id": 1, "v": 1, "big": None}, pos=pos), 1),
        *sink_messages(event(Op.DELETE, (1,), before={"id": 1, "v": 1, "big": None}, pos=pos), 1),
        *sink_messages(event(Op.CREATE, (2,), after={"id": 2, "v": 1, "big": None}, pos=pos), 1),
    ]
    out = materialize_messages(TOPIC, deliver(sent))
    assert out.repeats == 0 and out.pos_violations == []
    assert set(out.rows) == {canonical({"id": 2})}


def compact(messages: Sequence[Message], cleaned_upto: int, drop_tombstones: bool) -> list[Message]:
    """Log compaction of one partition's messages: below ``cleaned_upto`` only each key's
    latest record (of those below it) stays, and tombstones there go too when their
    retention passed; the head above is untouched. Offsets keep their gaps."""
    latest = {m.key: m.offset for m in messages if m.offset < cleaned_upto}
    return [
        m
        for m in messages
        if m.offset >= cleaned_upto
        or (m.offset == latest[m.key] and not (drop_tombstones and m.value is None))
    ]


@FAST
@given(operations, st.integers(1, 4), st.data())
def test_a_compacted_topic_materializes_the_same(
    ops: list[tuple[Any, ...]], partitions: int, data: st.DataObject
) -> None:
    """(Compaction needs keys: no truncates; and no unchanged TOAST placeholders, whose
    earlier full value compaction may remove.)"""
    ops = [o for o in ops if o[0] != "trunc"]
    ops = [(o[0], o[1], False, o[3]) if o[0] == "put" else o for o in ops]
    events, table = run_oracle(ops)
    sent = [m for ev in events for m in sink_messages(ev, partitions)]
    compacted: list[Message] = []
    for p in range(partitions):
        mine = [m for m in deliver(sent) if m.partition == p]
        point = data.draw(st.integers(0, len(mine)), label=f"cleaned up to, partition {p}")
        compacted += compact(mine, point, data.draw(st.booleans(), label="drop tombstones"))
    out = materialize_messages(TOPIC, compacted)
    assert_state(out, table)
    assert out.pos_violations == [] and out.repeats == 0


def test_a_tombstone_alone_deletes() -> None:
    """After compaction a tombstone may be all that is left of a delete."""
    create = event(Op.CREATE, (1,), after={"id": 1, "v": 1, "big": None}, pos=1)
    (sent,) = sink_messages(create, 1)
    out = materialize_messages(TOPIC, deliver([sent, Sent(0, sent.key, None)]))
    assert out.rows == {} and out.keys == {}
    assert (out.ops["c"], out.ops["tombstone"]) == (1, 1)


def test_a_real_regression_is_a_pos_violation() -> None:
    first = event(Op.CREATE, (1,), after={"id": 1, "v": 5, "big": None}, pos=5)
    older = event(Op.UPDATE, (1,), after={"id": 1, "v": 3, "big": None}, pos=3)
    other = event(Op.CREATE, (2,), after={"id": 2, "v": 4, "big": None}, pos=4)
    for partitions in (1, 3):
        sent = [m for ev in (first, other, older) for m in sink_messages(ev, partitions)]
        messages = deliver(sent)
        out = materialize_messages(TOPIC, messages)
        (violation,) = out.pos_violations
        assert violation.key == {"id": 1}
        assert violation.previous == Position(5, 0).token
        assert violation.pos == Position(3, 0).token
        where = next(m for m in messages if m.value is not None and b'"v":3' in m.value)
        assert (violation.line, violation.partition) == (where.offset, where.partition)
        assert out.repeats == 0


@FAST
@given(replays(), st.data())
def test_a_regression_is_found_among_repeats(replay: Replay, data: st.DataObject) -> None:
    events, _ = run_oracle(replay.ops)
    keyed = [ev for ev in events if ev.key is not None]
    assume(keyed)
    target = data.draw(st.sampled_from(keyed))
    assert target.key is not None
    # an event for that key older than anything sent, never sent itself
    stale = event(Op.UPDATE, target.key, after={"id": target.key[0], "v": -1, "big": None}, pos=0)
    stream = replay.stream() + sink_messages(stale, replay.partitions)
    out = materialize_messages(TOPIC, deliver(stream, replay.rng))
    (violation,) = out.pos_violations
    assert violation.key == {"id": target.key[0]} and violation.pos == Position(0, 0).token


def test_unavailable_value_keeps_the_previous_value() -> None:
    placeholder = {"id": 1, "v": 2, "big": UNAVAILABLE_VALUE}
    sent = [
        *sink_messages(event(Op.CREATE, (1,), after={"id": 1, "v": 1, "big": "B"}, pos=1), 2),
        *sink_messages(event(Op.UPDATE, (1,), after=placeholder, pos=2), 2),
        # no previous row: the placeholder stays
        *sink_messages(
            event(Op.UPDATE, (2,), after={"id": 2, "v": 1, "big": UNAVAILABLE_VALUE}, pos=3), 2
        ),
    ]
    for messages in (deliver(sent), deliver([wrap(s) for s in sent])):
        out = materialize_messages(TOPIC, messages)
        assert out.rows == {
            canonical({"id": 1}): {"id": 1, "v": 2, "big": "B"},
            canonical({"id": 2}): {"id": 2, "v": 1, "big": UNAVAILABLE_VALUE},
        }


def test_truncate_clears_only_its_own_partition() -> None:
    """Partition after partition: a truncate in partition p removes the rows of partition p,
    the rows of other partitions go when their copy of the truncate comes."""
    ks = {partition_of(encode_key(KEY_COLUMNS, (k,)).encode(), 2): k for k in range(20)}
    assert set(ks) == {0, 1}
    a, b = ks[0], ks[1]
    before = [
        event(Op.CREATE, (a,), after={"id": a, "v": 1, "big": None}, pos=1),
        event(Op.CREATE, (b,), after={"id": b, "v": 1, "big": None}, pos=2),
    ]
    t = event(Op.TRUNCATE, None, pos=3)
    sent = [m for ev in before for m in sink_messages(ev, 2)]
    truncates = sink_messages(t, 2)
    assert [(s.partition, s.key) for s in truncates] == [(0, None), (1, None)]
    part0 = [s for s in sent if s.partition == 0] + [truncates[0]]
    out = materialize_messages(TOPIC, deliver(part0 + [s for s in sent if s.partition == 1]))
    assert set(out.rows) == {canonical({"id": b})}
    out = materialize_messages(TOPIC, deliver(sent + truncates))
    assert out.rows == {} and out.ops["t"] == 2


def test_schemas_wrapped_messages_materialize_alike() -> None:
    events, table = run_oracle(
        [("put", 1, False, False), ("put", 2, False, True), ("put", 1, True, False), ("del", 2)]
    )
    sent = [m for ev in events for m in sink_messages(ev, 3)]
    plain = materialize_messages(TOPIC, deliver(sent))
    wrapped_sent = [wrap(s) for s in sent]
    assert all(s.key is None or s.key.startswith(b'{"schema":') for s in wrapped_sent)
    wrapped = materialize_messages(TOPIC, deliver(wrapped_sent))
    assert_state(plain, table)
    assert (wrapped.rows, wrapped.keys, wrapped.ops) == (plain.rows, plain.keys, plain.ops)


def _value(op: str, pos: str = "0000000000000001-0000000000000000", **extra: Any) -> bytes:
    return json.dumps(
        {"before": None, "after": {"id": 1}, "source": {"pos": pos}, "op": op, **extra}
    ).encode()


KEY1 = b'{"id":1}'


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (KEY1, b"\xff\xfe\x00garbage"),
        (KEY1, b"not json"),
        (KEY1, b""),
        (KEY1, b'{"op": "c"'),
        (b"\x00\x01\x02", _value("c")),
        (b"{", _value("c")),
        (b"\xff\xfe\x00garbage", None),
        (KEY1, b"[1, 2]"),
        (KEY1, b'"c"'),
        (KEY1, b"42"),
        (KEY1, b'{"op": "c", "after": {"id": 1}}'),  # no source.pos
        (KEY1, b'{"op": "c", "source": 5}'),
        (KEY1, b'{"source": {"pos": "1"}}'),  # no op
        (KEY1, _value("x")),  # an unknown op
        (None, _value("c")),  # a keyed op without key
        (b"[1]", _value("c")),
        (b"7", _value("u")),
        (KEY1, json.dumps({"op": "c", "source": {"pos": "1"}, "after": [1]}).encode()),
        (KEY1, json.dumps({"op": "u", "source": {"pos": "1"}}).encode()),  # no after
    ],
)
def test_garbage_is_a_verify_error(key: bytes | None, value: bytes | None) -> None:
    with pytest.raises(VerifyError):
        materialize_messages(TOPIC, [Message(0, 0, key, value)])


@pytest.mark.parametrize(
    "messages",
    [
        [Message(0, 0, KEY1, _value(["c"]))],  # type: ignore[arg-type]
        [Message(0, 0, KEY1, _value("c", pos={"a": 1}))],  # type: ignore[arg-type]
        [Message(0, 0, KEY1, _value("c")), Message(0, 1, KEY1, _value("u", pos=0))],  # type: ignore[arg-type]
        [Message(0, 0, KEY1, _value("c", pos=1))],  # type: ignore[arg-type]
        [Message(0, 0, KEY1, _value(None))],  # type: ignore[arg-type]
        [Message(0, 0, None, _value("t", pos=None))],  # type: ignore[arg-type]
    ],
    ids=["op-list", "pos-object", "pos-int", "pos-int-first", "op-null", "truncate-pos-null"],
)
def test_wrongly_typed_fields_are_a_verify_error(messages: list[Message]) -> None:
    with pytest.raises(VerifyError, match="must be strings"):
        materialize_messages(TOPIC, messages)


def test_a_plain_key_named_schema_and_payload_is_not_unwrapped() -> None:
    """A table keyed by columns (schema, payload): with schemas = false its key is a plain
    key. (Telling by shape alone, schemas=None, cannot know: the key is taken for a
    JsonConverter wrapper, and its payload 1 is no key: an error, never a wrong row.)"""
    key = b'{"schema":"s","payload":1}'
    value = json.dumps(
        {"before": None, "after": {"schema": "s", "payload": 1}, "source": {"pos": "1"}, "op": "c"}
    ).encode()
    out = materialize_messages(TOPIC, [Message(0, 0, key, value)], schemas=False)
    assert out.keys == {canonical({"schema": "s", "payload": 1}): {"schema": "s", "payload": 1}}
    assert out.rows == {canonical({"schema": "s", "payload": 1}): {"schema": "s", "payload": 1}}
    with pytest.raises(VerifyError):
        materialize_messages(TOPIC, [Message(0, 0, key, value)])
    # with schemas, the same message wrapped
    wrapped_key = json.dumps({"schema": {"type": "struct"}, "payload": json.loads(key)}).encode()
    wrapped_value = json.dumps({"schema": {"type": "struct"}, "payload": json.loads(value)})
    out = materialize_messages(
        TOPIC, [Message(0, 0, wrapped_key, wrapped_value.encode())], schemas=True
    )
    assert out.keys == {canonical({"schema": "s", "payload": 1}): {"schema": "s", "payload": 1}}


def test_schemas_mode_is_enforced() -> None:
    """schemas=True: every key and value must be a {schema, payload} wrapper; schemas=False:
    a wrapper is never unwrapped (so it is no sink event)."""
    events, _ = run_oracle([("put", 1, False, False), ("del", 1), ("put", 2, False, False)])
    sent = [m for ev in events for m in sink_messages(ev, 1)]
    with pytest.raises(VerifyError, match="schema, payload"):
        materialize_messages(TOPIC, deliver(sent), schemas=True)
    with pytest.raises(VerifyError):
        materialize_messages(TOPIC, deliver([wrap(s) for s in sent]), schemas=False)
    # a wrapped value with a plain key, and the other way round
    (plain,) = sink_messages(events[0], 1)
    wrapped = wrap(plain)
    for key, value in ((plain.key, wrapped.value), (wrapped.key, plain.value)):
        with pytest.raises(VerifyError, match="schema, payload"):
            materialize_messages(TOPIC, [Message(0, 0, key, value)], schemas=True)
    # a tombstone's key too
    with pytest.raises(VerifyError, match="schema, payload"):
        materialize_messages(TOPIC, [Message(0, 0, plain.key, None)], schemas=True)


def test_a_tombstone_without_a_key_is_ignored_and_counted() -> None:
    out = materialize_messages(TOPIC, [Message(0, 0, None, None)])
    assert out.rows == {} and out.ops["tombstone"] == 1


# =============================================================================================
# The sink itself sends those messages (a fake producer: no broker)
# =============================================================================================


class FakeFuture:
    is_done = True
    exception = None

    def failed(self) -> bool:
        return False


class FakeProducer:
    """Records sends; a keyed message without a partition goes where the default
    partitioner (murmur2) puts it."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.sent: list[tuple[str, Sent]] = []

    def send(
        self, topic: str, *, key: bytes | None, value: bytes | None, partition: int | None
    ) -> FakeFuture:
        if partition is None:
            assert key is not None
            partition = partition_of(key, self.partitions)
        self.sent.append((topic, Sent(partition, key, value)))
        return FakeFuture()


def fake_sink(
    partitions: int,
    *,
    schemas: bool = False,
    json_text: bool = False,
    table: TableSchema = ITEM_TABLE,
) -> tuple[Any, FakeProducer]:
    from snapshotter.sinks.kafka.sink import KafkaSink

    sink = KafkaSink(
        bootstrap_servers="nowhere:9092",
        topic_prefix="demo",
        key_columns=lambda t: list(table.primary_key),
        describe=lambda t: table,
        partitions=partitions,
        schemas=schemas,
        json_as_text=json_text,
    )
    producer = FakeProducer(partitions)
    sink._producer = KafkaPythonProducer(producer)  # instead of open(): no broker
    # the topic exists with that many partitions
    sink._topics.ensure = lambda name: partitions  # type: ignore[method-assign]
    return sink, producer


def unwrap(data: bytes | None) -> tuple[Any, bytes | None]:
    """(schema, payload bytes) of a schemas = true message part."""
    if data is None:
        return None, None
    decoded = json.loads(data)
    assert list(decoded) == ["schema", "payload"]
    return decoded["schema"], json.dumps(decoded["payload"]).encode()


@settings(max_examples=60, deadline=None)
@given(operations, st.integers(1, 4))
def test_the_sink_sends_what_the_oracle_assumes(
    ops: list[tuple[Any, ...]], partitions: int
) -> None:
    events, table = run_oracle(ops)
    expected = [m for ev in events for m in sink_messages(ev, partitions)]
    sink, producer = fake_sink(partitions)
    sink.write(events)
    assert {topic for topic, _ in producer.sent} <= {TOPIC}
    assert [m for _, m in producer.sent] == expected
    checkpoint = sink.checkpoint()
    assert [a.checkpoint for a in sink.acknowledged()] == [checkpoint]

    # schemas = true: the same payloads, each conforming to the schema beside it
    sink, producer = fake_sink(partitions, schemas=True, json_text=True)
    sink.write(events)
    plain: list[Sent] = []
    for _, m in producer.sent:
        kschema, key = unwrap(m.key)
        vschema, value = unwrap(m.value)
        if key is not None:
            check_conforms(kschema, json.loads(key), "key")
            assert kschema == key_schema(TOPIC, ITEM_TABLE, KEY_COLUMNS)
        if value is not None:
            check_conforms(vschema, json.loads(value))
        plain.append(Sent(m.partition, key, value))
    # (the partition follows the wrapped key's bytes, so it may differ from the plain one's)
    assert [(m.key is None, m.value is None) for m in plain] == [
        (m.key is None, m.value is None) for m in expected
    ]
    for got, want in zip(plain, expected, strict=True):
        for a, b in ((got.key, want.key), (got.value, want.value)):
            assert (a is None and b is None) or json.loads(a or b"") == json.loads(b or b"")
    wrapped = materialize_messages(TOPIC, deliver(m for _, m in producer.sent))
    assert_state(wrapped, table)


JSONB_TABLE = TableSchema(
    ORDERS,
    (
        ColumnInfo("doc", "jsonb", 3802, False, pa.string()),
        ColumnInfo("v", "integer", 23, True, pa.int64()),
    ),
    ("doc",),
)


def test_a_jsonb_key_is_written_as_text_with_schemas() -> None:
    sink, producer = fake_sink(1, schemas=True, json_text=True, table=JSONB_TABLE)
    doc = RawJson('{"a":  1}')
    sink.write([event(Op.CREATE, (doc,), after={"doc": doc, "v": 1})])
    ((_, message),) = producer.sent
    kschema, key = unwrap(message.key)
    assert key is not None
    assert json.loads(key) == {"doc": '{"a":  1}'}  # the exact text, as in the value
    check_conforms(kschema, json.loads(key), "key")
    _, value = unwrap(message.value)
    assert json.loads(value or b"")["after"] == {"doc": '{"a":  1}', "v": 1}


@pytest.mark.parametrize("schemas", [True, False])
def test_a_jsonb_key_as_text_without_schemas_and_embedded_by_default(schemas: bool) -> None:
    """json_as_text writes key and value alike, schemas or not; without it both embed the
    document."""
    doc = RawJson('{"a":  1}')
    ev = event(Op.CREATE, (doc,), after={"doc": doc, "v": 1})
    for json_text, want in ((True, '{"a":  1}'), (False, {"a": 1})):
        sink, producer = fake_sink(1, schemas=schemas, json_text=json_text, table=JSONB_TABLE)
        sink.write([ev])
        ((_, message),) = producer.sent
        key, value = json.loads(message.key or b""), json.loads(message.value or b"")
        if schemas:
            key, value = key["payload"], value["payload"]
        assert key == {"doc": want} and value["after"] == {"doc": want, "v": 1}


class CountingDescribe:
    """``describe`` for the sink: the table as it is now, counting the calls."""

    def __init__(self, table: TableSchema) -> None:
        self.table = table
        self.calls = 0

    def __call__(self, table: TableId) -> TableSchema:
        self.calls += 1
        return self.table


def test_the_table_is_described_again_only_when_after_changes_shape() -> None:
    from snapshotter.sinks.kafka.sink import KafkaSink

    describe = CountingDescribe(ITEM_TABLE)
    sink = KafkaSink(
        bootstrap_servers="nowhere:9092",
        topic_prefix="demo",
        key_columns=lambda t: list(KEY_COLUMNS),
        describe=describe,
        schemas=True,
    )
    producer = FakeProducer(1)
    sink._producer = KafkaPythonProducer(producer)
    sink._topics.ensure = lambda name: 1  # type: ignore[method-assign]
    row = {"id": 1, "v": 1, "big": "x"}
    sink.write(
        [
            event(Op.CREATE, (1,), after=row, pos=1),
            event(Op.UPDATE, (1,), after={**row, "v": 2}, before=row, pos=2),
            # REPLICA IDENTITY DEFAULT: a before of the key only is no change of shape
            event(Op.DELETE, (1,), before={"id": 1}, pos=3),
            event(Op.TRUNCATE, None, pos=4),
        ]
    )
    assert describe.calls == 1
    # a column added: the next event's after has it
    wider = TableSchema(
        ORDERS, (*ITEM_TABLE.columns, ColumnInfo("w", "text", 25, True, pa.string())), KEY_COLUMNS
    )
    describe.table = wider
    sink.write(
        [
            event(Op.CREATE, (2,), after={"id": 2, "v": 1, "big": None, "w": "new"}, pos=5),
            event(Op.UPDATE, (2,), after={"id": 2, "v": 2, "big": None, "w": "x"}, pos=6),
            event(Op.DELETE, (2,), before={"id": 2}, pos=7),
        ]
    )
    assert describe.calls == 2
    schemas = [json.loads(m.value)["schema"] for _, m in producer.sent if m.value is not None]
    for value_schema in schemas[:4]:
        assert value_schema == envelope_schema(
            TOPIC,
            ITEM_TABLE,
            KEY_COLUMNS,
            json.loads(producer.sent[0][1].value or b"")["payload"]["source"],
        )
    after = schemas[4]["fields"][1]
    assert [f["field"] for f in after["fields"]] == ["id", "v", "big", "w"]
    for _, m in producer.sent:
        if m.value is not None:
            wire = json.loads(m.value)
            check_conforms(wire["schema"], wire["payload"])


# =============================================================================================
# client_settings: each kafka-python client takes the settings it knows
# =============================================================================================


def _clients() -> dict[str, type]:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient

    return {"producer": KafkaProducer, "admin": KafkaAdminClient, "consumer": KafkaConsumer}


def test_client_settings_follow_each_clients_default_config() -> None:
    from snapshotter.sinks.kafka.sink import client_settings

    settings_ = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "linger_ms": 5,
        "compression_type": "gzip",
        "fetch_max_bytes": 1024,
        "no_such_setting": 1,
    }
    clients = _clients()
    got = {name: client_settings(cls, settings_) for name, cls in clients.items()}
    assert got["producer"] == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "linger_ms": 5,
        "compression_type": "gzip",
    }
    assert got["consumer"] == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "fetch_max_bytes": 1024,
    }
    assert got["admin"] == {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}
    for name, cls in clients.items():
        assert set(got[name]) <= set(cls.DEFAULT_CONFIG)  # type: ignore[attr-defined]
    assert client_settings(object, settings_) == {}  # a class without DEFAULT_CONFIG
    assert client_settings(clients["producer"], {}) == {}


def test_the_sink_waits_for_kafka_past_its_bound_on_unacknowledged_bytes() -> None:
    """kafka-python's producer queues without bound: past ``max_unflushed_bytes`` sent since
    everything was last acknowledged, the sink flushes (waits) before sending more."""
    from snapshotter.sinks.kafka.sink import KafkaSink

    flushes: list[int] = []

    class FlushingProducer(FakeProducer):
        def flush(self, timeout: float | None = None) -> None:
            flushes.append(len(self.sent))

    sink = KafkaSink(
        bootstrap_servers="nowhere:9092",
        topic_prefix="demo",
        key_columns=lambda t: list(ITEM_TABLE.primary_key),
        partitions=1,
        max_unflushed_bytes=2_000,
    )
    sink._producer = KafkaPythonProducer(FlushingProducer(1))
    sink._topics.ensure = lambda name: 1  # type: ignore[method-assign]
    row = {"id": 1, "v": 1, "big": "x" * 100}
    sink.write([event(Op.CREATE, (i,), after={**row, "id": i}, pos=i) for i in range(1, 101)])
    # every message is well over 100 bytes: a flush at least every 20 messages, not after each
    assert 5 <= len(flushes) <= 20, flushes
    assert all(b - a > 1 for a, b in itertools.pairwise(flushes)), flushes
    assert sink._unflushed <= 2_000 + 1_000
