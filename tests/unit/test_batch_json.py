"""READ batches encoded column-wise (``sinks.batch_json``) are byte for byte what the per-row
path writes for the same rows as ``op: "r"`` events: JSONL lines, and Kafka keys and values
(plain or ``schemas = true``, JSON columns embedded or as text). The rows span the Arrow
storage types both dialects' chunk readers build, with nulls, every float oddity, unicode
and control characters, and JSON text that the dialect's converter turns into RawJson."""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.events import Source
from snapshotter.core.position import Position
from snapshotter.core.values import RawJson
from snapshotter.core.window import ReadBatch
from snapshotter.sinks import batch_json
from snapshotter.sinks.encoding import encode_row
from snapshotter.sinks.jsonl import JsonlSink, JsonlSinkError
from snapshotter.sinks.kafka.clients import KafkaPythonProducer
from snapshotter.sinks.kafka.sink import KafkaSink, KafkaSinkError
from snapshotter.sources.base import ColumnInfo, TableSchema
from snapshotter.sources.sql_common import columns_converter

TABLE = TableId("shop", "items")
SIGNALS = TableId("shop", "debezium_signal")
PROPERTY = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,  # tmp_path: the file is rewritten each time
    ],
)

# --- values per Arrow storage type ------------------------------------------------------------

# Text with what JSON must escape, what it must not (U+2028, DEL), and non-BMP characters.
HOSTILE = '"\\\n\r\t\b\f\x00\x1f\x7f\u2028\u2029\u0085é✓😀 a'
TEXT = st.one_of(
    st.text(st.sampled_from(HOSTILE), max_size=8), st.text(st.characters(codec="utf-8"), max_size=8)
)
FLOATS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1e16, 1e15, 1e-5, 5e-324, 1.5e300, float("nan")]),
)
UTC_DATETIMES = st.datetimes(timezones=st.just(UTC))
NUMERIC_TEXT = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False).map(str),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "0.00", "-0.5"]),
)


def _decimals(precision: int, scale: int) -> st.SearchStrategy[Decimal]:
    bound = 10**precision - 1
    return st.integers(-bound, bound).map(lambda n: Decimal(f"{n}e-{scale}"))  # exact


def _json_texts() -> st.SearchStrategy[str]:
    """Valid JSON text as a database keeps it: any spacing, CR/LF between tokens."""
    scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), TEXT)
    documents = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)
        ),
        max_leaves=6,
    )
    spacing = st.sampled_from([(",", ":"), (", ", ": "), (",\n  ", ":\r\n ")])
    return st.tuples(documents, spacing).map(
        lambda d: json.dumps(d[0], separators=d[1], ensure_ascii=False)
    )


@dataclass(frozen=True)
class Kind:
    name: str
    arrow: pa.DataType
    values: st.SearchStrategy[Any]
    json: bool = False  # JSON text: the converter makes RawJson of it


KINDS = [
    Kind("int64", pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    Kind("int32", pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    Kind("uint64", pa.uint64(), st.integers(0, 2**64 - 1)),
    Kind("bool", pa.bool_(), st.booleans()),
    Kind("float64", pa.float64(), FLOATS),
    Kind("decimal(12,2)", pa.decimal128(12, 2), _decimals(12, 2)),
    Kind("decimal(20,10)", pa.decimal128(20, 10), _decimals(20, 10)),
    Kind("decimal(38,0)", pa.decimal128(38, 0), _decimals(38, 0)),
    Kind("decimal(65,30)", pa.decimal256(65, 30), _decimals(65, 30)),
    Kind("numeric", pa.string(), NUMERIC_TEXT),  # PostgreSQL numeric: its text
    Kind("text", pa.string(), TEXT),
    Kind("large_text", pa.large_string(), TEXT),
    Kind("binary", pa.binary(), st.binary(max_size=10)),
    Kind("large_binary", pa.large_binary(), st.binary(max_size=10)),
    Kind("date", pa.date32(), st.dates()),
    Kind("timestamp", pa.timestamp("us"), st.datetimes()),
    Kind("timestamptz", pa.timestamp("us", tz="UTC"), UTC_DATETIMES),
    Kind("timestamp_ms_tz", pa.timestamp("ms", tz="+05:30"), UTC_DATETIMES),
    Kind("time", pa.time64("us"), st.times()),
    Kind(
        "mysql_time", pa.duration("us"), st.timedeltas(-timedelta(hours=839), timedelta(hours=839))
    ),
    Kind(
        "duration",
        pa.duration("us"),
        st.timedeltas(-timedelta(days=10**8), timedelta(days=10**8)),  # int64 microseconds
    ),
    Kind("json", pa.string(), _json_texts(), json=True),
]


def _in_range(kind: Kind, value: Any) -> Any:
    """Values an Arrow column of ``kind`` holds and gives back as they went in."""
    if kind.arrow == pa.timestamp("ms", tz="+05:30") and value is not None:
        return value.replace(microsecond=value.microsecond // 1000 * 1000)
    return value


@dataclass
class Case:
    batch: ReadBatch
    key_columns: tuple[str, ...]


@st.composite
def cases(draw: st.DrawFn, convert: str = "columns") -> Case:
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=6))
    names = draw(
        st.lists(
            st.text(string.ascii_letters + '_"\\é ', min_size=1, max_size=5),
            min_size=len(kinds),
            max_size=len(kinds),
            unique=True,
        )
    )
    rows = draw(st.integers(1, 12))  # (an empty batch: test_an_empty_batch_writes_nothing)
    columns = {}
    for name, kind in zip(names, kinds, strict=True):
        nullable = draw(st.booleans())
        values = st.one_of(st.none(), kind.values) if nullable else kind.values
        cells = [_in_range(kind, v) for v in draw(st.lists(values, min_size=rows, max_size=rows))]
        columns[name] = pa.array(cells, kind.arrow)
    table = pa.table(columns)
    if draw(st.booleans()) and rows > 1:  # several chunks, as a window's anti-join may leave
        cut = draw(st.integers(1, rows - 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    key_columns = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)))
    close = Position(*draw(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=3)))
    details = draw(
        st.dictionaries(
            st.sampled_from(["lsn", "txId", "file", "gtid", "server_id"]),
            st.one_of(st.none(), st.integers(0, 2**63), TEXT),
            max_size=3,
        )
    )
    source = Source(
        connector=draw(st.sampled_from(["postgresql", "mysql"])),
        name="demo",
        db="shop",
        table=SIGNALS,
        position=close,
        ts_ms=draw(st.integers(0, 2**45)),
        details=details,
    )
    json_columns = {n: k for n, k in zip(names, kinds, strict=True) if k.json}
    converter: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    if convert == "columns":
        converter = columns_converter(
            {n: (lambda v: None if v is None else RawJson(v)) for n in json_columns}
        )
    elif json_columns:  # a converter that is a plain function: the per-row fallback

        def converter(row: dict[str, Any]) -> dict[str, Any]:
            return {
                k: RawJson(v) if k in json_columns and v is not None else v for k, v in row.items()
            }

    batch = ReadBatch("w", TABLE, key_columns, table, close, rows, None, False)
    return Case(batch.stamped(source, draw(st.integers(0, 2**45)), converter), key_columns)


# --- the two paths ----------------------------------------------------------------------------


def jsonl_bytes(tmp: Path, items: Sequence[Any], key_columns: Sequence[str]) -> bytes:
    path = tmp / "out.jsonl"
    path.unlink(missing_ok=True)
    sink = JsonlSink(path, "demo", lambda t: list(key_columns))
    sink.open(None)
    sink.write(items)
    sink.close()
    return path.read_bytes()


class RecordingProducer:
    """kafka-python's send(), recorded (no broker)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, int | None]] = []

    def send(
        self, topic: str, *, key: bytes | None, value: bytes | None, partition: int | None
    ) -> Any:
        self.sent.append((topic, key, value, partition))
        return _Done()

    def flush(self, timeout: float | None = None) -> None:
        pass


class _Done:
    is_done = True
    exception = None

    def failed(self) -> bool:
        return False


def schema_of(batch: ReadBatch) -> TableSchema:
    return TableSchema(
        TABLE,
        tuple(ColumnInfo(f.name, "text", 25, True, f.type) for f in batch.rows.schema),
        batch.key_columns,
    )


def kafka_messages(
    items: Sequence[Any], case: Case, *, schemas: bool, json_text: bool
) -> list[tuple[str, bytes | None, bytes | None, int | None]]:
    sink = KafkaSink(
        bootstrap_servers="nowhere:9092",
        topic_prefix="demo",
        key_columns=lambda t: list(case.key_columns),
        describe=lambda t: schema_of(case.batch),
        schemas=schemas,
        json_as_text=json_text,
    )
    producer = RecordingProducer()
    sink._producer = KafkaPythonProducer(producer)
    sink._topics.ensure = lambda name: 1  # type: ignore[method-assign]
    sink.write(items)
    return producer.sent


# --- properties -------------------------------------------------------------------------------


@PROPERTY
@given(cases())
def test_a_batch_writes_the_jsonl_lines_of_its_events(tmp_path: Path, case: Case) -> None:
    events = case.batch.events()
    assert jsonl_bytes(tmp_path, [case.batch], case.key_columns) == jsonl_bytes(
        tmp_path, events, case.key_columns
    )


@PROPERTY
@given(cases(), st.booleans(), st.booleans())
def test_a_batch_sends_the_kafka_messages_of_its_events(
    case: Case, schemas: bool, json_text: bool
) -> None:
    events = case.batch.events()
    got = kafka_messages([case.batch], case, schemas=schemas, json_text=json_text)
    want = kafka_messages(events, case, schemas=schemas, json_text=json_text)
    assert got == want


@PROPERTY
@given(cases(convert="rows"))
def test_an_opaque_converter_takes_the_per_row_path(tmp_path: Path, case: Case) -> None:
    events = case.batch.events()
    assert jsonl_bytes(tmp_path, [case.batch], case.key_columns) == jsonl_bytes(
        tmp_path, events, case.key_columns
    )
    got = kafka_messages([case.batch], case, schemas=False, json_text=True)
    assert got == kafka_messages(events, case, schemas=False, json_text=True)


@PROPERTY
@given(cases())
def test_column_fragments_are_the_row_encoders_values(case: Case) -> None:
    """Each fragment is the text ``encode_row`` writes for that value: the after object
    of a row in the value model (what a log create of the same row carries)."""
    batch = case.batch
    converters = batch_json.column_converters(batch.convert)
    fragments = {
        name: batch_json.column_fragments(batch.rows.column(name), False, converters.get(name))
        for name in batch.rows.column_names
    }
    after = batch_json.join(
        *batch_json.object_parts(batch.rows.column_names, list(fragments.values()))
    )
    assert batch_json.texts(after) == [encode_row(row) for row in batch.row_dicts()]


# --- examples ---------------------------------------------------------------------------------


def _one_column_batch(array: pa.Array, convert: Any = None) -> ReadBatch:
    table = pa.table({"id": pa.array(range(len(array)), pa.int64()), "v": array})
    close = Position(5, 1)
    source = Source("postgresql", "demo", "shop", SIGNALS, close, 1)
    batch = ReadBatch("w", TABLE, ("id",), table, close, len(array), None, False)
    return batch.stamped(source, 2, convert)


@pytest.mark.parametrize(
    ("array", "texts"),
    [
        (
            pa.array([1.0, -0.0, 1e16, float("nan"), None]),
            ["1.0", "-0.0", "1e+16", '"NaN"', "null"],
        ),
        (
            pa.array([Decimal("1E-7"), Decimal("0.0000000")], pa.decimal128(10, 7)),
            ['"1E-7"', '"0E-7"'],
        ),
        (
            pa.array(
                [
                    datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
                    datetime(1, 1, 1, 0, 0, 0, 5, tzinfo=UTC),
                ],
                pa.timestamp("us", tz="UTC"),
            ),
            ['"2024-01-02T03:04:05Z"', '"0001-01-01T00:00:00.000005Z"'],
        ),
        (pa.array([time(0, 0), time(23, 59, 59, 10)]), ['"00:00:00"', '"23:59:59.000010"']),
        (
            pa.array(
                [
                    timedelta(hours=-838, minutes=-59, seconds=-59),
                    timedelta(microseconds=-1),
                    timedelta(0),
                ],
                pa.duration("us"),
            ),
            ['"-838:59:59"', '"-00:00:00.000001"', '"00:00:00"'],
        ),
        (pa.array(['a"b\\c\n\u2028\x01', None]), ['"a\\"b\\\\c\\n\u2028\\u0001"', "null"]),
        (pa.array([b"ab", b""]), ['"YWI="', '""']),
    ],
)
def test_fragments(array: pa.Array, texts: list[str]) -> None:
    assert batch_json.texts(batch_json.column_fragments(array)) == texts


def test_a_json_column_is_embedded_with_crlf_as_spaces_or_written_as_text() -> None:
    array = pa.array(['{"a":\r\n 1.50}', None])
    make = columns_converter({"v": lambda v: None if v is None else RawJson(v)})
    assert make is not None
    convert = make.columns["v"]  # type: ignore[attr-defined]
    assert batch_json.texts(batch_json.column_fragments(array, False, convert)) == [
        '{"a":   1.50}',
        "null",
    ]
    assert batch_json.texts(batch_json.column_fragments(array, True, convert)) == [
        '"{\\"a\\":\\r\\n 1.50}"',
        "null",
    ]


def test_an_empty_batch_writes_nothing(tmp_path: Path) -> None:
    batch = _one_column_batch(pa.array([], pa.int64()))
    assert jsonl_bytes(tmp_path, [batch], ["id"]) == b""


def test_key_names_that_do_not_fit_the_batch_are_an_error(tmp_path: Path) -> None:
    batch = _one_column_batch(pa.array([1]))
    sink = JsonlSink(tmp_path / "out.jsonl", "demo", lambda t: ["id", "v"])
    sink.open(None)
    with pytest.raises(
        JsonlSinkError, match=r"1 key values, but the table's key columns are \['id', 'v'\]"
    ):
        sink.write([batch])
    case = Case(batch, ("id", "v"))
    with pytest.raises(KafkaSinkError, match=r"1 key values"):
        kafka_messages([batch], case, schemas=False, json_text=False)


def test_batches_and_events_keep_their_order(tmp_path: Path) -> None:
    first = _one_column_batch(pa.array(["a", "b"]))
    second = _one_column_batch(pa.array(["c"]))
    items = [first.events()[0], first, second, *second.events()]
    flat = [first.events()[0], *first.events(), *second.events(), *second.events()]
    assert jsonl_bytes(tmp_path, items, ["id"]) == jsonl_bytes(tmp_path, flat, ["id"])
