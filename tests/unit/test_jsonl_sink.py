"""The JSONL sink (line shape, value encoding, durability and resume), the counting sink, and
the output side of the convergence check (materialize, compare, position order)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from signals.names import TableId
from snapshotter.core.events import ChangeEvent, Op, SnapshotMarker, Source
from snapshotter.core.position import Position
from snapshotter.core.values import UNAVAILABLE_VALUE, RawJson
from snapshotter.sinks import encoding
from snapshotter.sinks.jsonl import JsonlSink, JsonlSinkError, encode_row
from snapshotter.verify.rows import ABSENT, as_json_row, canonical, compare, materialize

ORDERS = TableId("public", "orders")
ITEMS = TableId("shop", "items")
KEYS = {ORDERS: ["id"], ITEMS: ["region", "n"]}
TOPIC = "demo.public.orders"


def key_columns(table: TableId) -> list[str]:
    return KEYS[table]


def event(
    op: Op,
    key: tuple[Any, ...] | None,
    after: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    *,
    pos: Position | int = 1,
    table: TableId = ORDERS,
    snapshot: SnapshotMarker = SnapshotMarker.FALSE,
) -> ChangeEvent:
    position = pos if isinstance(pos, Position) else Position(pos, 0)
    source = Source(
        connector="postgresql",
        name="demo",
        db="shop",
        table=table,
        position=position,
        ts_ms=1_700_000_000_000,
        snapshot=snapshot,
        details={"lsn": 23_810_888, "txId": 741},
    )
    return ChangeEvent(op, source, 1_700_000_000_123, key, before=before, after=after)


def sink_at(path: Path) -> JsonlSink:
    return JsonlSink(path, "demo", key_columns)


def lines(path: Path) -> list[str]:
    # Split at LF only: str.splitlines would also split at U+0085 or U+2028 inside strings,
    # which JSON (and so the sink) writes unescaped.
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n")
    return text.split("\n")[:-1]


# --- line shape -----------------------------------------------------------------------------


def test_update_line_is_exactly_the_documented_shape(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = sink_at(path)
    sink.open(None)
    sink.write([event(Op.UPDATE, (7,), after={"id": 7, "v": "b"}, before={"id": 7, "v": "a"})])
    sink.close()
    assert path.read_text(encoding="utf-8") == (
        '{"topic":"demo.public.orders","key":{"id":7},"value":{'
        '"before":{"id":7,"v":"a"},"after":{"id":7,"v":"b"},'
        '"source":{"version":"snapshotter-0.1","connector":"postgresql","name":"demo",'
        '"ts_ms":1700000000000,"snapshot":"false","db":"shop","schema":"public",'
        '"table":"orders","lsn":23810888,"txId":741,"pos":"0000000000000001-0000000000000000"},'
        '"op":"u","ts_ms":1700000000123}}\n'
    )


def test_key_order_topic_and_every_op(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = sink_at(path)
    sink.open(None)
    row = {"region": "eu", "n": 1, "x": None}
    sink.write(
        [
            event(Op.CREATE, ("eu", 1), after=row, table=ITEMS, pos=1),
            event(Op.READ, ("eu", 1), after=row, table=ITEMS, pos=Position(1, 0, 0)),
            event(Op.DELETE, ("eu", 1), before=row, table=ITEMS, pos=2),
            event(Op.TRUNCATE, None, table=ITEMS, pos=3),
        ]
    )
    sink.close()
    records = [json.loads(line) for line in lines(path)]
    for record in records:
        assert list(record) == ["topic", "key", "value"]
        assert list(record["value"]) == ["before", "after", "source", "op", "ts_ms"]
        assert record["topic"] == "demo.shop.items"
    assert [r["value"]["op"] for r in records] == ["c", "r", "d", "t"]
    assert [list(r["key"]) for r in records[:3]] == [["region", "n"]] * 3
    assert records[0]["key"] == {"region": "eu", "n": 1}
    assert records[2]["value"]["before"] == row and records[2]["value"]["after"] is None
    assert records[3]["key"] is None
    assert records[3]["value"]["before"] is None and records[3]["value"]["after"] is None
    assert records[1]["value"]["source"]["pos"] == Position(1, 0, 0).token


def test_key_arity_mismatch_is_an_error(tmp_path: Path) -> None:
    sink = sink_at(tmp_path / "out.jsonl")
    sink.open(None)
    with pytest.raises(JsonlSinkError, match=r"2 key values.*\['id'\]"):
        sink.write([event(Op.CREATE, (1, 2), after={"id": 1})])


def test_unknown_key_columns_are_an_error_and_the_batch_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = JsonlSink(path, "demo", lambda t: None if t == ITEMS else ["id"])
    sink.open(None)
    with pytest.raises(JsonlSinkError, match=r"no key columns known for shop\.items"):
        sink.write(
            [
                event(Op.CREATE, (1,), after={"id": 1}),
                event(Op.CREATE, ("eu", 1), after={"region": "eu", "n": 1}, table=ITEMS),
            ]
        )
    sink.write([event(Op.TRUNCATE, None, table=ITEMS)])  # a truncate needs no key
    sink.close()
    assert [json.loads(line)["value"]["op"] for line in lines(path)] == ["t"]


# --- value encoding -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (False, "false"),
        (0, "0"),
        (-(2**63), "-9223372036854775808"),
        (2**70, "1180591620717411303424"),
        (1.5, "1.5"),
        (0.1, "0.1"),
        (1e300, "1e+300"),
        (-0.0, "-0.0"),
        (float("nan"), '"NaN"'),
        (float("inf"), '"Infinity"'),
        (float("-inf"), '"-Infinity"'),
        ("plain", '"plain"'),
        ('quote " back \\ nl \n tab \t', '"quote \\" back \\\\ nl \\n tab \\t"'),
        ("ünïcødé ✓ \u2028", '"ünïcødé ✓ \u2028"'),  # ensure_ascii=False: written as UTF-8
        ("12345.6700", '"12345.6700"'),  # numeric arrives as text and stays exact
        (Decimal("1.50"), '"1.50"'),
        (UUID("12345678-1234-5678-1234-567812345678"), '"12345678-1234-5678-1234-567812345678"'),
        (b"", '""'),
        (b"\x00\xff\x10", '"AP8Q"'),
        (b"ab", '"YWI="'),  # padded
        (bytearray(b"ab"), '"YWI="'),
        (memoryview(b"ab"), '"YWI="'),
        (date(2024, 1, 2), '"2024-01-02"'),
        (datetime(2024, 1, 2, 3, 4, 5), '"2024-01-02T03:04:05"'),
        (datetime(2024, 1, 2, 3, 4, 5, 120), '"2024-01-02T03:04:05.000120"'),
        (datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC), '"2024-01-02T03:04:05.123456Z"'),
        (datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC), '"2024-01-02T03:04:05Z"'),
        (
            datetime(2024, 1, 2, 5, 4, 5, 7, tzinfo=timezone(timedelta(hours=2))),
            '"2024-01-02T03:04:05.000007Z"',
        ),
        (
            datetime(2024, 1, 1, 23, 0, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
            '"2024-01-02T04:30:00Z"',
        ),
        (time(3, 4, 5), '"03:04:05"'),
        (time(3, 4, 5, 600), '"03:04:05.000600"'),
        (RawJson('{"b": 1.50, "a": [1e400, null]}'), '{"b": 1.50, "a": [1e400, null]}'),
        (RawJson('"just a string"'), '"just a string"'),
        (RawJson('{\n  "a":\r\n 1}'), '{   "a":   1}'),  # raw CR/LF only as whitespace
    ],
)
def test_value_encoding(value: Any, text: str) -> None:
    assert encode_row({"c": value}) == '{"c":' + text + "}"


def test_rawjson_is_embedded_verbatim_beside_other_values() -> None:
    row = {
        "a": RawJson('{"x": 1.0}'),
        "b": "text",
        "c": RawJson("[1,2]"),
        "d": datetime(2024, 1, 2, tzinfo=UTC),
        "e": RawJson("null"),
    }
    assert encode_row(row) == (
        '{"a":{"x": 1.0},"b":"text","c":[1,2],"d":"2024-01-02T00:00:00Z","e":null}'
    )


def test_rawjson_with_nan_takes_the_slow_path_and_stays_exact() -> None:
    row = {"j": RawJson('{"k": 1.10}'), "f": float("nan"), "b": b"\x01"}
    assert encode_row(row) == '{"j":{"k": 1.10},"f":"NaN","b":"AQ=="}'


def test_data_containing_the_placeholder_cannot_corrupt_output() -> None:
    sneaky = encoding._TOKEN
    row = {"s": sneaky, "j": RawJson("[1]"), sneaky: f'x"{sneaky}'}
    text = encode_row(row)
    assert json.loads(text) == {"s": sneaky, "j": [1], sneaky: f'x"{sneaky}'}


def test_any_mapping_is_a_row() -> None:
    assert encode_row(MappingProxyType({"a": 1, "j": RawJson("[]")})) == '{"a":1,"j":[]}'


def test_unsupported_value_type_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="complex"):
        encode_row({"c": 1j})


def test_a_row_line_is_valid_json_and_one_line() -> None:
    row = {"j": RawJson('{"a":\n"b\\nc"}'), "s": "x\ny\rz"}
    text = encode_row(row)
    assert "\n" not in text and "\r" not in text
    assert json.loads(text) == {"j": {"a": "b\nc"}, "s": "x\ny\rz"}


# --- durability and resume ------------------------------------------------------------------


def test_checkpoint_acks_immediately_with_the_flushed_size(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "out.jsonl"  # parents are created
    sink = sink_at(path)
    sink.open(None)
    assert sink.acknowledged() == []
    sink.write([event(Op.CREATE, (1,), after={"id": 1})])
    first = sink.checkpoint()
    size1 = path.stat().st_size
    sink.write([event(Op.CREATE, (2,), after={"id": 2}, pos=2)])
    second = sink.checkpoint()
    assert second > first
    acks = sink.acknowledged()
    assert [a.checkpoint for a in acks] == [first, second]
    assert acks[0].resume == {"path": str(path), "offset": size1}
    assert acks[1].resume == {"path": str(path), "offset": path.stat().st_size}
    assert sink.acknowledged() == []  # drained
    sink.close()
    (final,) = sink.acknowledged()  # close checkpoints, and the ack is there before it returns
    assert final.checkpoint > second
    assert final.resume["offset"] == path.stat().st_size
    sink.close()  # a second close does nothing


def test_write_before_open_is_an_error(tmp_path: Path) -> None:
    sink = sink_at(tmp_path / "out.jsonl")
    with pytest.raises(JsonlSinkError, match="not open"):
        sink.write([event(Op.CREATE, (1,), after={"id": 1})])
    with pytest.raises(JsonlSinkError, match="not open"):
        sink.checkpoint()


def crash_after_unacked_write(path: Path) -> dict[str, Any]:
    """Write, checkpoint, write more, flush without a checkpoint and vanish; the ack's resume."""
    sink = sink_at(path)
    sink.open(None)
    sink.write([event(Op.CREATE, (1,), after={"id": 1}, pos=1)])
    sink.checkpoint()
    (ack,) = sink.acknowledged()
    sink.write([event(Op.CREATE, (2,), after={"id": 2}, pos=2)])
    assert sink._file is not None
    sink._file.flush()  # the OS has it, but it was never acknowledged
    sink._file.close()
    return dict(ack.resume)


def test_resume_cuts_the_file_back_to_the_acknowledged_offset(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    resume = crash_after_unacked_write(path)
    assert path.stat().st_size > resume["offset"]
    sink = sink_at(path)
    sink.open(resume)
    assert path.stat().st_size == resume["offset"]
    sink.write([event(Op.CREATE, (2,), after={"id": 2}, pos=2)])  # the log replays it
    sink.close()
    keys = [json.loads(line)["key"] for line in lines(path)]
    assert keys == [{"id": 1}, {"id": 2}]  # no duplicate


def test_resume_removes_a_half_line_at_the_end(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    resume = crash_after_unacked_write(path)
    with open(path, "ab") as f:
        f.write(b'{"topic":"demo.public.orders","key":{"id":3},"val')
    sink = sink_at(path)
    sink.open(resume)
    sink.close()
    assert len(lines(path)) == 1
    assert path.read_bytes().endswith(b"}\n")
    assert materialize(path, TOPIC).rows.keys() == {canonical({"id": 1})}


def test_resume_at_exactly_the_offset_keeps_everything(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = sink_at(path)
    sink.open(None)
    sink.write([event(Op.CREATE, (1,), after={"id": 1})])
    sink.close()
    (ack,) = sink.acknowledged()
    before = path.read_bytes()
    again = sink_at(path)
    again.open(ack.resume)
    again.close()
    assert path.read_bytes() == before


def test_resume_with_a_shorter_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    resume = crash_after_unacked_write(path)
    with open(path, "r+b") as f:
        f.truncate(resume["offset"] - 10)
    with pytest.raises(JsonlSinkError, match="changed by someone else"):
        sink_at(path).open(resume)


def test_resume_with_a_missing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    resume = crash_after_unacked_write(path)
    path.unlink()
    with pytest.raises(JsonlSinkError, match="is missing"):
        sink_at(path).open(resume)


def test_resume_at_offset_zero_creates_a_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = sink_at(path)
    sink.open({"path": str(path), "offset": 0})
    sink.close()
    assert path.exists() and path.stat().st_size == 0


def test_resume_without_a_line_end_at_the_offset_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    resume = crash_after_unacked_write(path)
    with pytest.raises(JsonlSinkError, match="no line end"):
        sink_at(path).open({**resume, "offset": resume["offset"] - 1})


def test_resume_for_another_path_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    resume = crash_after_unacked_write(path)
    with pytest.raises(JsonlSinkError, match="belongs to sink file"):
        sink_at(tmp_path / "other.jsonl").open(resume)


@pytest.mark.parametrize("resume", [{}, {"offset": -1}, {"offset": "10"}, {"offset": True}])
def test_resume_without_a_valid_offset_is_refused(tmp_path: Path, resume: dict[str, Any]) -> None:
    with pytest.raises(JsonlSinkError, match="no valid offset"):
        sink_at(tmp_path / "out.jsonl").open(resume)


def test_existing_file_without_state_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text("something\n")
    with pytest.raises(JsonlSinkError, match=r"exists .* no saved state.*delete it"):
        sink_at(path).open(None)
    assert path.read_text() == "something\n"  # untouched


def test_existing_empty_file_without_state_is_used(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.touch()
    sink = sink_at(path)
    sink.open(None)
    sink.write([event(Op.CREATE, (1,), after={"id": 1})])
    sink.close()
    assert len(lines(path)) == 1


# --- materialize and compare ----------------------------------------------------------------


def write_events(path: Path, events: list[ChangeEvent]) -> None:
    sink = sink_at(path)
    sink.open(None)
    sink.write(events)
    sink.close()


def test_materialize_applies_ops_per_topic_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(
        path,
        [
            event(Op.READ, (1,), after={"id": 1, "v": "a"}, pos=1),
            event(Op.READ, (2,), after={"id": 2, "v": "b"}, pos=2),
            event(Op.CREATE, ("eu", 1), after={"region": "eu", "n": 1}, table=ITEMS, pos=3),
            event(Op.UPDATE, (1,), after={"id": 1, "v": "a2"}, pos=4),
            event(Op.DELETE, (2,), before={"id": 2, "v": "b"}, pos=5),
            event(Op.TRUNCATE, None, table=ITEMS, pos=6),
            event(Op.CREATE, (3,), after={"id": 3, "v": "c"}, pos=7),
        ],
    )
    m = materialize(path, TOPIC)
    assert m.rows == {
        canonical({"id": 1}): {"id": 1, "v": "a2"},
        canonical({"id": 3}): {"id": 3, "v": "c"},
    }
    assert m.ops == {"r": 2, "u": 1, "d": 1, "c": 1}
    assert m.events == 5
    assert not m.pos_violations
    items = materialize(path, "demo.shop.items")
    assert items.rows == {} and items.ops == {"c": 1, "t": 1}


def test_truncate_clears_every_row(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(
        path,
        [
            event(Op.CREATE, (1,), after={"id": 1}, pos=1),
            event(Op.TRUNCATE, None, pos=2),
            event(Op.CREATE, (2,), after={"id": 2}, pos=3),
        ],
    )
    assert list(materialize(path, TOPIC).keys.values()) == [{"id": 2}]


def test_unavailable_value_keeps_the_previous_column_value(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(
        path,
        [
            event(Op.CREATE, (1,), after={"id": 1, "big": "long text", "v": 1}, pos=1),
            event(Op.UPDATE, (1,), after={"id": 1, "big": UNAVAILABLE_VALUE, "v": 2}, pos=2),
        ],
    )
    (row,) = materialize(path, TOPIC).rows.values()
    assert row == {"id": 1, "big": "long text", "v": 2}


def test_position_regression_per_key_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(
        path,
        [
            event(Op.READ, (1,), after={"id": 1, "v": 1}, pos=Position(5, 0, 0)),
            event(Op.UPDATE, (1,), after={"id": 1, "v": 2}, pos=Position(6, 0)),
            event(Op.READ, (2,), after={"id": 2, "v": 1}, pos=Position(5, 0, 1)),  # other key
            event(Op.READ, (1,), after={"id": 1, "v": 1}, pos=Position(5, 0, 2)),  # went back
            event(Op.DELETE, (1,), before={"id": 1, "v": 1}, pos=Position(5, 0, 2)),  # equal: ok
        ],
    )
    m = materialize(path, TOPIC)
    (violation,) = m.pos_violations
    assert violation.key == {"id": 1}
    assert violation.previous == Position(6, 0).token
    assert violation.pos == Position(5, 0, 2).token
    assert violation.line == 4
    verdict = compare(m, [{"id": 2, "v": 1}], ["id"])
    assert not verdict.ok
    assert "1 position regressions" in verdict.render()
    assert "(line 4)" in verdict.render()


def test_materialize_refuses_an_incomplete_last_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(path, [event(Op.CREATE, (1,), after={"id": 1})])
    with open(path, "ab") as f:
        f.write(b'{"topic":')
    with pytest.raises(ValueError, match=":2: the last line is incomplete"):
        materialize(path, TOPIC)


def test_compare_reports_missing_extra_and_column_diffs(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(
        path,
        [
            event(Op.READ, (1,), after={"id": 1, "amount": "1.5", "j": RawJson('{"a": 1}')}),
            event(Op.READ, (2,), after={"id": 2, "amount": "2.00", "j": RawJson("[1, 2]")}),
            event(Op.READ, (4,), after={"id": 4, "amount": "4.00", "j": None}),
        ],
    )
    table = [
        {"id": 1, "amount": "1.50", "j": RawJson('{ "a" : 1 }')},  # amount differs, j equal
        {"id": 2, "amount": "2.00", "j": RawJson("[1,2]")},  # equal as parsed JSON
        {"id": 3, "amount": "3.00", "j": None},  # missing
    ]
    verdict = compare(materialize(path, TOPIC), table, ["id"])
    assert not verdict.ok
    assert (verdict.table_rows, verdict.output_rows) == (3, 3)
    assert (verdict.missing, verdict.extra, verdict.differing) == (1, 1, 1)
    assert verdict.missing_examples == ({"id": 3},)
    assert verdict.extra_examples == ({"id": 4},)
    (diff,) = verdict.differing_examples
    assert diff.key == {"id": 1}
    assert [(c.column, c.table, c.output) for c in diff.columns] == [("amount", "1.50", "1.5")]
    text = verdict.render()
    assert text.startswith("NOT converged: 1 missing, 1 extra, 1 differ")
    assert 'key {"id": 1}: column amount: table "1.50", output "1.5"' in text


def test_compare_is_strict_about_json_types_and_absent_columns(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(path, [event(Op.READ, (1,), after={"id": 1, "flag": 1, "new": 0})])
    verdict = compare(materialize(path, TOPIC), [{"id": 1, "flag": True, "old": 0}], ["id"])
    (diff,) = verdict.differing_examples
    assert [(c.column, c.table, c.output) for c in diff.columns] == [
        ("flag", True, 1),
        ("old", 0, ABSENT),
        ("new", ABSENT, 0),
    ]
    assert "column old: table 0, output (absent)" in verdict.render()


def test_compare_converged(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    rows = [{"id": i, "v": float(i) / 3, "t": datetime(2024, 1, 1, tzinfo=UTC)} for i in range(5)]
    write_events(path, [event(Op.READ, (r["id"],), after=r, pos=i) for i, r in enumerate(rows)])
    verdict = compare(materialize(path, TOPIC), rows, ["id"])
    assert verdict.ok
    assert verdict.render() == "converged: 5 rows match"


def test_compare_refuses_a_duplicate_table_key(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    write_events(path, [])
    with pytest.raises(ValueError, match="twice"):
        compare(materialize(path, TOPIC), [{"id": 1}, {"id": 1}], ["id"])


# --- property: random events, crashes and replays -> materialize == oracle ------------------

json_docs = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)
values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.binary(max_size=8),
    st.dates(),
    st.datetimes(),
    st.datetimes(timezones=st.just(UTC)),
    st.times(),
    st.builds(
        lambda doc, indent: RawJson(json.dumps(doc, indent=indent)),
        json_docs,
        st.sampled_from([None, 1]),
    ),
)


@st.composite
def steps(draw: st.DrawFn) -> list[tuple[str, Any]]:
    """Ops on keys (int, str) of ITEMS, and now and then a crash."""
    out: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(min_value=0, max_value=30))):
        kind = draw(st.sampled_from(["upsert", "upsert", "upsert", "delete", "truncate", "crash"]))
        key = (draw(st.sampled_from(["eu", "us"])), draw(st.integers(min_value=0, max_value=3)))
        if kind == "upsert":
            row = {"region": key[0], "n": key[1], "a": draw(values), "b": draw(values)}
            out.append((draw(st.sampled_from(["c", "u", "r"])), (key, row)))
        elif kind == "delete":
            out.append(("d", key))
        else:
            out.append(("t" if kind == "truncate" else kind, None))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_random_events_materialize_to_the_oracle(tmp_path_factory: Any, plan: Any) -> None:
    path = tmp_path_factory.mktemp("prop") / "out.jsonl"
    oracle: dict[tuple[Any, ...], dict[str, Any]] = {}
    sink = sink_at(path)
    sink.open(None)
    resume: dict[str, Any] = {"path": str(path), "offset": 0}
    unacked: list[ChangeEvent] = []  # written after the last ack: replayed after a crash
    for i, (op, arg) in enumerate(plan):
        if op == "crash":
            assert sink._file is not None
            sink._file.flush()
            sink._file.close()
            sink = sink_at(path)
            sink.open(resume)
            sink.write(unacked)  # the log replays from the saved position
            continue
        if op == "t":
            ev = event(Op.TRUNCATE, None, table=ITEMS, pos=i)
            oracle.clear()
        elif op == "d":
            ev = event(Op.DELETE, arg, before={"region": arg[0], "n": arg[1]}, table=ITEMS, pos=i)
            oracle.pop(arg, None)
        else:
            key, row = arg
            ev = event(Op(op), key, after=row, table=ITEMS, pos=i)
            oracle[key] = row
        sink.write([ev])
        unacked.append(ev)
        if i % 4 == 0:
            sink.checkpoint()
            resume = dict(sink.acknowledged()[-1].resume)
            unacked = []
    sink.close()

    m = materialize(path, "demo.shop.items")
    expected = {canonical({"region": k[0], "n": k[1]}): as_json_row(r) for k, r in oracle.items()}
    assert {k: canonical(v) for k, v in m.rows.items()} == {
        k: canonical(v) for k, v in expected.items()
    }
    assert not m.pos_violations  # replays never duplicate or reorder
    verdict = compare(m, oracle.values(), ["region", "n"])
    assert verdict.ok, verdict.render()
    # Every line parses with a strict parser (no NaN tokens).
    for line in lines(path):
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


def test_a_table_scan_that_returns_a_key_twice_is_run_once_more() -> None:
    """verify: a torn scan (a key twice) is scanned again; a table that really has a key
    twice is still refused."""
    from snapshotter.verify.convergence import _compare_scanned
    from snapshotter.verify.rows import Materialized, TableKeyTwice

    output = Materialized(topic=TOPIC)
    output.put(canonical({"id": 1}), {"id": 1}, {"id": 1, "v": 1})
    scans = iter([[{"id": 1, "v": 1}, {"id": 1, "v": 1}], [{"id": 1, "v": 1}]])
    verdict = _compare_scanned(output, lambda: next(scans), ["id"])
    assert verdict.ok and verdict.table_rows == 1
    with pytest.raises(TableKeyTwice, match="twice"):
        _compare_scanned(output, lambda: [{"id": 1, "v": 1}] * 2, ["id"])
