"""The strict signal parser (signals/parser.py), the row form of signals, and the signal DDL."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import postgresql

from signals.model import (
    AdditionalCondition,
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    SignalError,
    SignalType,
    SnapshotType,
    StopSnapshot,
    Watermark,
    WatermarkKind,
    to_row,
)
from signals.names import TableId, TablePattern, TableSelector, parse_table_selector
from signals.parser import _SHOWN_CHARS, parse_signal
from signals.sqlguard import FilterError, check_filter, unquoted_spans
from signals.table import signal_table_ddl

ORDERS = TableId("public", "orders")
ITEMS = TableId("public", "items")


def _data(data: Any) -> Any:
    """Dicts and lists become JSON text; anything else is passed through as the raw column."""
    return json.dumps(data) if isinstance(data, dict | list) else data


def parse_ok(signal_type: str, data: Any, signal_id: str = "sig-1") -> Any:
    result = parse_signal(signal_id, signal_type, _data(data))
    assert not isinstance(result, SignalError), str(result)
    return result


def parse_error(signal_type: str, data: Any, signal_id: str = "sig-1") -> SignalError:
    result = parse_signal(signal_id, signal_type, _data(data))
    assert isinstance(result, SignalError), f"expected an error, got {result!r}"
    assert result.signal_id == signal_id
    assert result.problem
    return result


def assert_problem(error: SignalError, *words: str) -> None:
    for word in words:
        assert word.lower() in error.problem.lower(), f"{word!r} not in {error.problem!r}"


def sel(text: str) -> TableSelector:
    return parse_table_selector(text)


# --- execute-snapshot ----------------------------------------------------------------------


def test_execute_snapshot_minimal():
    signal = parse_ok("execute-snapshot", {"data-collections": ["public.orders"]})
    assert signal == ExecuteSnapshot(id="sig-1", data_collections=(ORDERS,))
    assert signal.type is SignalType.EXECUTE_SNAPSHOT
    assert signal.snapshot_type is SnapshotType.INCREMENTAL
    assert signal.additional_conditions == ()
    assert signal.surrogate_key is None


def test_execute_snapshot_keeps_the_order_and_kind_of_selectors():
    signal = parse_ok(
        "execute-snapshot",
        {"data-collections": ["public.orders", "items", '"public"."My.Table"', r"inv\..*"]},
    )
    assert signal.data_collections[:3] == (
        ORDERS,
        TableId(None, "items"),
        TableId("public", "My.Table"),
    )
    pattern = signal.data_collections[3]
    assert isinstance(pattern, TablePattern)
    assert pattern.pattern == r"inv\..*"


@pytest.mark.parametrize(
    ("signal_type", "data"),
    [
        ("execute-snapshot", {"data-collections": ["public.orders"], "type": None}),
        ("stop-snapshot", {"type": None}),
        ("pause-snapshot", {"type": None}),
        ("resume-snapshot", {"type": None}),
    ],
)
def test_null_snapshot_type_means_incremental(signal_type, data):
    # Debezium: Optional.ofNullable(getString("type")).orElse(INCREMENTAL).
    signal = parse_ok(signal_type, data)
    assert signal.snapshot_type is SnapshotType.INCREMENTAL
    assert signal == parse_ok(signal_type, {k: v for k, v in data.items() if k != "type"})


@pytest.mark.parametrize("snapshot_type", ["incremental", "INCREMENTAL", "Incremental"])
def test_execute_snapshot_type_is_case_insensitive(snapshot_type):
    signal = parse_ok(
        "execute-snapshot", {"data-collections": ["public.orders"], "type": snapshot_type}
    )
    assert signal.snapshot_type is SnapshotType.INCREMENTAL


def test_execute_snapshot_with_every_field():
    signal = parse_ok(
        "execute-snapshot",
        {
            "data-collections": ["public.orders", "public.items"],
            "type": "INCREMENTAL",
            "additional-conditions": [
                {"data-collection": "public.orders", "filter": "status = 'open'"},
                {"data-collection": '"public"."items"', "filter": "qty > 0"},
            ],
            "surrogate-key": "created_at",
        },
    )
    assert signal == ExecuteSnapshot(
        id="sig-1",
        data_collections=(ORDERS, ITEMS),
        additional_conditions=(
            AdditionalCondition(ORDERS, "status = 'open'"),
            AdditionalCondition(ITEMS, "qty > 0"),
        ),
        surrogate_key="created_at",
    )


def test_condition_may_name_a_pattern_or_an_unqualified_table():
    # Those can only be checked once names are resolved against the catalog.
    signal = parse_ok(
        "execute-snapshot",
        {
            "data-collections": ["orders", r"inv\..*"],
            "additional-conditions": [
                {"data-collection": "orders", "filter": "a = 1"},
                {"data-collection": r"inv\..*", "filter": "b = 2"},
            ],
        },
    )
    assert [c.data_collection for c in signal.additional_conditions] == [
        TableId(None, "orders"),
        sel(r"inv\..*"),
    ]


def test_condition_on_a_qualified_table_is_accepted_when_a_pattern_may_cover_it():
    signal = parse_ok(
        "execute-snapshot",
        {
            "data-collections": [r"inventory\..*"],
            "additional-conditions": [{"data-collection": "inventory.items", "filter": "x"}],
        },
    )
    assert signal.additional_conditions == (
        AdditionalCondition(TableId("inventory", "items"), "x"),
    )


def test_condition_on_a_qualified_table_is_accepted_when_a_table_is_unqualified():
    signal = parse_ok(
        "execute-snapshot",
        {
            "data-collections": ["public.orders", "items"],
            "additional-conditions": [{"data-collection": "public.items", "filter": "x"}],
        },
    )
    assert signal.additional_conditions[0].data_collection == ITEMS


def test_empty_additional_conditions_list_is_fine():
    signal = parse_ok(
        "execute-snapshot", {"data-collections": ["public.orders"], "additional-conditions": []}
    )
    assert signal.additional_conditions == ()


def test_execute_snapshot_ignores_surrounding_whitespace_in_data():
    signal = parse_ok("execute-snapshot", '  \n{"data-collections": ["public.orders"]}\n ')
    assert signal.data_collections == (ORDERS,)


# --- stop / pause / resume / log -----------------------------------------------------------


@pytest.mark.parametrize(
    "data", [None, "", "{}", "null", {"type": "incremental"}, {"data-collections": []}]
)
def test_stop_snapshot_without_tables_means_all(data):
    signal = parse_ok("stop-snapshot", data)
    assert signal == StopSnapshot(id="sig-1")
    assert signal.data_collections == ()


def test_stop_snapshot_of_some_tables():
    signal = parse_ok(
        "stop-snapshot", {"data-collections": ["public.orders", r"inv\..*"], "type": "INCREMENTAL"}
    )
    assert signal == StopSnapshot(id="sig-1", data_collections=(ORDERS, sel(r"inv\..*")))
    assert signal.type is SignalType.STOP_SNAPSHOT


@pytest.mark.parametrize(
    "data", [None, "", "   ", "{}", "null", {"type": "incremental"}, {"type": "INCREMENTAL"}]
)
def test_pause_snapshot(data):
    signal = parse_ok("pause-snapshot", data)
    assert signal == PauseSnapshot(id="sig-1")
    assert signal.type is SignalType.PAUSE_SNAPSHOT


@pytest.mark.parametrize(
    "data", [None, "", "   ", "{}", "null", {"type": "incremental"}, {"type": "INCREMENTAL"}]
)
def test_resume_snapshot(data):
    signal = parse_ok("resume-snapshot", data)
    assert signal == ResumeSnapshot(id="sig-1")
    assert signal.type is SignalType.RESUME_SNAPSHOT


@pytest.mark.parametrize("message", ["hello", "", "ünïcødé ✓", 'with "quotes"\nand lines'])
def test_log(message):
    signal = parse_ok("log", {"message": message})
    assert signal == LogSignal(id="sig-1", message=message)
    assert signal.type is SignalType.LOG


# --- watermarks ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signal_type", "kind"),
    [("snapshot-window-open", WatermarkKind.OPEN), ("snapshot-window-close", WatermarkKind.CLOSE)],
)
@pytest.mark.parametrize("data", [None, "", "{}"])
def test_watermark(signal_type, kind, data):
    window = str(uuid.uuid4())
    signal_id = f"{window}-{kind.value}"
    signal = parse_ok(signal_type, data, signal_id=signal_id)
    assert signal == Watermark(window_id=window, kind=kind)
    assert signal.id == signal_id
    assert signal.type.value == signal_type


def test_a_close_watermark_id_fits_the_id_column():
    watermark = Watermark(str(uuid.uuid4()), WatermarkKind.CLOSE)
    assert len(watermark.id) == 42


@pytest.mark.parametrize(
    ("signal_id", "signal_type", "words"),
    [
        ("abc-close", "snapshot-window-open", "<window>-open"),
        ("abc-open", "snapshot-window-close", "<window>-close"),
        ("abc", "snapshot-window-open", "<window>-open"),
        ("-open", "snapshot-window-open", "<window>-open"),
        ("-close", "snapshot-window-close", "<window>-close"),
        ("abc-OPEN", "snapshot-window-open", "<window>-open"),
    ],
)
def test_bad_watermark_ids(signal_id, signal_type, words):
    error = parse_error(signal_type, None, signal_id=signal_id)
    assert error.signal_type == signal_type
    assert_problem(error, signal_type, words)


# --- row data given in other Python types --------------------------------------------------


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_data_as_utf8_bytes(wrap):
    signal = parse_ok("log", wrap(json.dumps({"message": "héllo ✓"}).encode("utf-8")))
    assert signal == LogSignal(id="sig-1", message="héllo ✓")


def test_data_as_non_ascii_json_bytes():
    raw = '{"message": "größe"}'.encode()
    assert parse_ok("log", raw) == LogSignal(id="sig-1", message="größe")


def test_empty_bytes_are_empty_data():
    assert parse_ok("pause-snapshot", b"") == PauseSnapshot(id="sig-1")


def test_data_as_invalid_utf8_bytes():
    error = parse_error("log", b'{"message": "\xff\xfe"}')
    assert_problem(error, "UTF-8")


@pytest.mark.parametrize(
    ("data", "type_name"), [(5, "int"), (1.5, "float"), (True, "bool"), (object(), "object")]
)
def test_data_of_a_wrong_python_type(data, type_name):
    error = parse_error("log", data)
    assert_problem(error, "data must be text", type_name)


def test_data_as_a_python_dict_is_not_accepted():
    # A dict is not a column value; only JSON text (or its bytes) is.
    error = parse_signal("sig-1", "log", {"message": "hi"})
    assert isinstance(error, SignalError)
    assert_problem(error, "data must be text", "dict")


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_id_and_type_as_utf8_bytes(wrap):
    # Decoded like data, not turned into "b'...'" by str().
    signal = parse_signal(wrap("sïg-1".encode()), wrap(b"log"), wrap(b'{"message": "x"}'))
    assert signal == LogSignal(id="sïg-1", message="x")


def test_watermark_with_bytes_columns():
    window = str(uuid.uuid4())
    signal = parse_signal(f"{window}-open".encode(), b"snapshot-window-open", b"")
    assert signal == Watermark(window_id=window, kind=WatermarkKind.OPEN)


@pytest.mark.parametrize("field", ["id", "type", "data"])
def test_invalid_utf8_is_an_error_naming_the_column(field):
    row = {"id": b"sig-1", "type": b"log", "data": b'{"message": "x"}'}
    row[field] = b"\xff\xfe"
    error = parse_signal(row["id"], row["type"], row["data"])
    assert isinstance(error, SignalError)
    assert error.problem == f"{field} is not UTF-8 text"


def test_an_undecodable_id_is_shown_with_escapes():
    error = parse_signal(b"sig-\xff", "log", '{"message": "x"}')
    assert isinstance(error, SignalError)
    assert error.signal_id == "sig-\\xff"


def test_an_integer_id_is_its_decimal_text():
    # MySQL users sometimes key the signal table by integer.
    assert parse_signal(7, "log", '{"message": "x"}') == LogSignal(id="7", message="x")
    assert parse_signal(-12, "log", '{"message": "x"}') == LogSignal(id="-12", message="x")
    error = parse_signal(0, "execute-snapshot", "{}")
    assert isinstance(error, SignalError)
    assert error.signal_id == "0"


@pytest.mark.parametrize(
    ("signal_id", "type_name"), [(True, "bool"), (1.5, "float"), (object(), "object")]
)
def test_id_of_a_wrong_python_type(signal_id, type_name):
    error = parse_signal(signal_id, "log", '{"message": "x"}')
    assert isinstance(error, SignalError)
    assert error.problem == f"id must be text, not {type_name}"
    assert error.signal_type == "log"


@pytest.mark.parametrize(("signal_type", "type_name"), [(5, "int"), (True, "bool"), ([], "list")])
def test_type_of_a_wrong_python_type(signal_type, type_name):
    error = parse_signal("sig-1", signal_type, '{"message": "x"}')
    assert isinstance(error, SignalError)
    assert error.signal_id == "sig-1"
    assert error.problem == f"type must be text, not {type_name}"


def test_an_integer_id_too_large_for_text_is_an_error():
    error = parse_signal(10**5000, "log", '{"message": "x"}')
    assert isinstance(error, SignalError)
    assert_problem(error, "too large")


# --- bad rows ------------------------------------------------------------------------------

_EXEC = "execute-snapshot"
_ONE = ["public.orders"]


def _exec(**extra: Any) -> dict[str, Any]:
    return {"data-collections": _ONE, **extra}


@pytest.mark.parametrize(
    ("signal_type", "data", "words"),
    [
        # Not JSON, or not a JSON object.
        (_EXEC, "{not json", ["not valid JSON", "line 1"]),
        (_EXEC, '{"data-collections": ["a"],}', ["not valid JSON"]),
        ("log", "'single quotes'", ["not valid JSON"]),
        (_EXEC, "[1, 2]", ["JSON object", "list"]),
        (_EXEC, "42", ["JSON object", "int"]),
        (_EXEC, "4.5", ["JSON object", "float"]),
        (_EXEC, '"public.orders"', ["JSON object", "str"]),
        ("pause-snapshot", "true", ["JSON object", "bool"]),
        # data-collections.
        (_EXEC, None, ["data-collections", "required"]),
        (_EXEC, "", ["data-collections", "required"]),
        (_EXEC, {}, ["data-collections", "required"]),
        (_EXEC, {"type": "incremental"}, ["data-collections", "required"]),
        (_EXEC, {"data-collections": []}, ["data-collections", "at least 1"]),
        (_EXEC, {"data-collections": "public.orders"}, ["data-collections", "list"]),
        (_EXEC, {"data-collections": {"t": "public.orders"}}, ["data-collections", "list"]),
        (_EXEC, {"data-collections": None}, ["data-collections", "list"]),
        (_EXEC, {"data-collections": ["public.orders", 3]}, ["data-collections.1", "string"]),
        (_EXEC, {"data-collections": [None]}, ["data-collections.0", "string"]),
        (_EXEC, {"data-collections": [["public.orders"]]}, ["data-collections.0", "string"]),
        (_EXEC, {"data-collections": [""]}, ["data-collections.0", "at least 1 character"]),
        (_EXEC, {"data-collections": ["  "]}, ["data-collections", "empty table name"]),
        (
            _EXEC,
            {"data-collections": ["public.orders", "public.orders"]},
            ["data-collections", "'public.orders' is listed twice"],
        ),
        (
            _EXEC,
            {"data-collections": ["public.orders", '"public"."orders"']},
            ["data-collections", "listed twice"],
        ),
        (_EXEC, {"data-collections": [r"s\..*", r"s\..*"]}, ["listed twice"]),
        (_EXEC, {"data-collections": ["db.public.orders"]}, ["data-collections", "3 parts"]),
        (_EXEC, {"data-collections": ['public."orders"x']}, ["data-collections", "neither"]),
        (_EXEC, {"data-collections": ["my table"]}, ["data-collections", "'my table'"]),
        (_EXEC, {"data-collections": ['"public.orders']}, ["data-collections", "unterminated"]),
        (_EXEC, {"data-collections": ['"".orders']}, ["data-collections", "empty quoted part"]),
        (
            _EXEC,
            {"data-collections": ["public.(orders"]},
            ["data-collections", "not a valid regular expression"],
        ),
        ("stop-snapshot", {"data-collections": ["a.b.c"]}, ["data-collections", "3 parts"]),
        ("stop-snapshot", {"data-collections": "a"}, ["data-collections", "list"]),
        ("stop-snapshot", {"data-collections": ["a", "a"]}, ["listed twice"]),
        # Unknown and misspelt fields.
        (
            _EXEC,
            {"data-colections": ["public.orders"]},
            ["unknown field 'data-colections'", "data-collections"],
        ),
        (
            _EXEC,
            {"data-collection": ["public.orders"]},
            ["unknown field 'data-collection'", "did you mean 'data-collections'"],
        ),
        (_EXEC, {"data_collections": _ONE}, ["unknown field 'data_collections'"]),
        (_EXEC, _exec(extra=1), ["unknown field 'extra'"]),
        (
            _EXEC,
            _exec(**{"additional-condition": "status = 'open'"}),
            [
                "unknown field 'additional-condition'",
                "additional-conditions",
                "data-collection",
                "filter",
            ],
        ),
        ("stop-snapshot", {"surrogate-key": "k"}, ["unknown field 'surrogate-key'"]),
        ("pause-snapshot", {"data-collections": _ONE}, ["unknown field 'data-collections'"]),
        ("resume-snapshot", {"foo": 1}, ["unknown field 'foo'"]),
        ("log", {"message": "x", "level": "info"}, ["unknown field 'level'"]),
        # additional-conditions.
        (
            _EXEC,
            _exec(**{"additional-conditions": "status = 'open'"}),
            ["additional-conditions", "list"],
        ),
        (
            _EXEC,
            _exec(**{"additional-conditions": {"data-collection": "public.orders", "filter": "x"}}),
            ["additional-conditions", "list"],
        ),
        (_EXEC, _exec(**{"additional-conditions": ["x = 1"]}), ["additional-conditions.0"]),
        (
            _EXEC,
            _exec(**{"additional-conditions": [{"data-collection": "public.orders"}]}),
            ["additional-conditions.0.filter", "required"],
        ),
        (
            _EXEC,
            _exec(**{"additional-conditions": [{"filter": "x = 1"}]}),
            ["additional-conditions.0.data-collection", "required"],
        ),
        (
            _EXEC,
            _exec(
                **{"additional-conditions": [{"data-collection": "public.orders", "filter": ""}]}
            ),
            ["additional-conditions.0.filter", "at least 1 character"],
        ),
        (
            _EXEC,
            _exec(**{"additional-conditions": [{"data-collection": "public.orders", "filter": 1}]}),
            ["additional-conditions.0.filter", "string"],
        ),
        (
            _EXEC,
            _exec(
                **{
                    "additional-conditions": [
                        {"data-collection": "public.orders", "filter": "x", "where": "y"}
                    ]
                }
            ),
            ["unknown field 'additional-conditions.0.where'"],
        ),
        (
            _EXEC,
            _exec(
                **{
                    "additional-conditions": [
                        {"data-collection": "public.orders", "filter": "a = 1"},
                        {"data-collection": '"public"."orders"', "filter": "b = 2"},
                    ]
                }
            ),
            ["additional-conditions", "two filters", "AND"],
        ),
        (
            _EXEC,
            _exec(
                **{
                    "additional-conditions": [
                        {"data-collection": "public.items", "filter": "a = 1"},
                    ]
                }
            ),
            ["additional-conditions", "'public.items'", "not one of the data-collections"],
        ),
        (
            _EXEC,
            _exec(
                **{
                    "additional-conditions": [
                        {"data-collection": "public.orders.x", "filter": "a = 1"},
                    ]
                }
            ),
            ["additional-conditions", "3 parts"],
        ),
        (
            _EXEC,
            _exec(
                **{
                    "additional-conditions": [
                        {"data-collection": "public.(", "filter": "a = 1"},
                    ]
                }
            ),
            ["additional-conditions", "regular expression"],
        ),
        # surrogate-key.
        (_EXEC, _exec(**{"surrogate-key": ""}), ["surrogate-key", "at least 1 character"]),
        (_EXEC, _exec(**{"surrogate-key": 3}), ["surrogate-key", "string"]),
        (_EXEC, _exec(**{"surrogate-key": ["a", "b"]}), ["surrogate-key", "string"]),
        # Snapshot types.
        (_EXEC, _exec(type="snapshot"), ["unknown snapshot type 'snapshot'", "incremental"]),
        (_EXEC, _exec(type=""), ["type", "at least 1 character"]),
        (_EXEC, _exec(type=1), ["type", "string"]),
        (_EXEC, _exec(type=["incremental"]), ["type", "string"]),
        ("pause-snapshot", {"type": 0}, ["type", "string"]),
        (_EXEC, _exec(type="blocking"), ["blocking", "not supported", "incremental"]),
        (_EXEC, _exec(type="BLOCKING"), ["blocking", "not supported"]),
        ("stop-snapshot", {"type": "blocking"}, ["blocking", "not supported"]),
        ("pause-snapshot", {"type": "full"}, ["unknown snapshot type 'full'"]),
        ("resume-snapshot", {"type": "blocking"}, ["blocking", "not supported"]),
        # log.
        ("log", None, ["message", "required"]),
        ("log", {}, ["message", "required"]),
        ("log", {"msg": "hi"}, ["message", "required", "unknown field 'msg'"]),
        ("log", {"message": 5}, ["message", "string"]),
        ("log", {"message": None}, ["message", "string"]),
        ("log", {"message": ["a"]}, ["message", "string"]),
    ],
)
def test_bad_rows(signal_type, data, words):
    error = parse_error(signal_type, data)
    assert error.signal_type == signal_type
    assert_problem(error, *words)


@pytest.mark.parametrize(
    "signal_type", ["", "snapshot", "execute_snapshot", "EXECUTE-SNAPSHOT", " log", "stop"]
)
def test_unknown_signal_type(signal_type):
    error = parse_error(signal_type, {"data-collections": _ONE})
    assert_problem(error, "unknown signal type", repr(signal_type), "execute-snapshot", "log")
    assert error.signal_type == (signal_type or "?")


def test_unknown_signal_type_is_reported_before_the_data_is_read():
    error = parse_error("nope", "{not json")
    assert_problem(error, "unknown signal type 'nope'")


@pytest.mark.parametrize("signal_id", ["", None])
def test_empty_id(signal_id):
    error = parse_signal(signal_id, "log", '{"message": "hi"}')
    assert isinstance(error, SignalError)
    assert error.signal_id == ""
    assert_problem(error, "empty id")


def test_missing_type():
    error = parse_signal("sig-1", None, "{}")
    assert isinstance(error, SignalError)
    assert error.signal_type == "?"
    assert_problem(error, "unknown signal type")


def test_several_problems_are_all_reported():
    error = parse_error(_EXEC, {"data-colections": _ONE, "surrogate-key": 1})
    assert_problem(error, "data-collections", "data-colections", "surrogate-key")


def test_error_str_names_id_type_and_problem():
    error = parse_error(_EXEC, {"data-colections": _ONE}, signal_id="ad-hoc-42")
    text = str(error)
    assert "ad-hoc-42" in text
    assert "execute-snapshot" in text
    assert error.problem in text


@pytest.mark.parametrize(
    "data",
    [
        # Deeper than the JSON decoder recurses, within the data size limit.
        "[" * 30_000 + "]" * 30_000,
        '{"message": ' + "[" * 30_000 + "]" * 30_000 + "}",
        '{"a": ' * 9_000 + "1" + "}" * 9_000,
        "[" * 60_000,
    ],
)
def test_deeply_nested_json_is_an_error_not_a_crash(data):
    result = parse_signal("sig-1", "log", data)
    assert isinstance(result, SignalError)
    assert result.signal_id == "sig-1"
    assert result.problem == "data is nested too deeply"


@pytest.mark.parametrize(
    ("signal_type", "data", "key"),
    [
        ("log", '{"message": "a", "message": "b"}', "message"),
        (_EXEC, '{"data-collections": ["a.b"], "data-collections": ["c.d"]}', "data-collections"),
        (_EXEC, '{"data-collections": ["a.b"], "type": null, "type": "incremental"}', "type"),
        (
            _EXEC,
            '{"data-collections": ["public.orders"], "additional-conditions": ['
            '{"data-collection": "public.orders", "filter": "a = 1", "filter": "1 = 1"}]}',
            "filter",
        ),
        # At any depth, even inside a value no field reads.
        ("log", '{"message": "a", "x": [{"y": {"z": 1, "z": 2}}]}', "z"),
        ("pause-snapshot", '{"": 1, "": 2}', ""),
    ],
)
def test_duplicate_fields_are_errors(signal_type, data, key):
    error = parse_error(signal_type, data)
    assert_problem(error, f"duplicate field {key!r}")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "data-collections",
                    "type",
                    "additional-conditions",
                    "surrogate-key",
                    "message",
                    "data-collection",
                    "filter",
                    "x",
                ]
            )
            | st.text(),
            inner,
            max_size=4,
        )
    ),
    max_leaves=8,
)


_types = st.sampled_from([t.value for t in SignalType]) | st.text()


@settings(max_examples=300, deadline=None)
@given(
    signal_id=st.none() | st.text() | st.binary() | st.integers(),
    signal_type=_types | _types.map(str.encode) | st.binary() | st.integers(),
    data=st.none() | st.text() | st.binary() | _json.map(json.dumps),
)
def test_parser_never_raises(signal_id, signal_type, data):
    result = parse_signal(signal_id, signal_type, data)
    if isinstance(signal_id, bytes):
        expected_id = signal_id.decode("utf-8", "backslashreplace")
    else:
        expected_id = "" if signal_id is None else str(signal_id)
    if isinstance(result, SignalError):
        # A long id of a refused signal is shown clipped (its length said), never whole.
        shown = _SHOWN_CHARS
        clipped = f"{expected_id[:shown]}... ({len(expected_id)} characters)"
        assert result.signal_id == (expected_id if len(expected_id) <= shown else clipped)
        assert result.problem
        assert "internal error" not in result.problem
    else:
        assert result.id == expected_id


# --- additional-conditions filter guard (signals/sqlguard.py) -------------------------------


def _with_filter(sql: str) -> dict[str, Any]:
    return _exec(**{"additional-conditions": [{"data-collection": "public.orders", "filter": sql}]})


@pytest.mark.parametrize(
    "sql",
    [
        "status = 'open' OR id < 5",
        "name = 'it''s (not) a paren'",
        '"we;ird" = 1',
        "body = $$ ) ; -- $$",
        "x IN (1, 2, (3))",
        "note LIKE '%--%'",
        "path LIKE 'C:\\\\%'",
        "`od)d` = 1 AND `a``b` > 0",
        "t = $tag$ it's ( $$ $tag$",
        "a = '' AND b = ''''",
        "a = 'x'';'",
        "my$col = 1 AND a$b$c > 0",
        "x = $1",
        "a - -1 > 0 AND b / 2 * 3 > 1",
        "'a'$$)$$ = 'a)'",
        "  status = 'open'  ",
        "a = 1\nAND b = 2",
        "ü = 'ok'",
    ],
)
def test_filters_the_guard_accepts(sql):
    check_filter(sql)
    signal = parse_ok(_EXEC, _with_filter(sql))
    assert signal.additional_conditions == (AdditionalCondition(ORDERS, sql),)


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("a=1) OR (1=1", ["')' at character 4", "did not open", "AND (<filter>)"]),
        ("a=1; delete from t", ["';' at character 4", "one condition"]),
        ("a=1 -- x", ["'--' at character 5", "comment"]),
        ("a = 1 /* x */", ["'/*' at character 7", "comment"]),
        ("a = 1 */", ["'*/'", "comment"]),
        ("a = 1 # x", ["'#'", "comment"]),
        ("(a=1", ["'(' at character 1 is never closed"]),
        ("(a=1) AND ((b=2)", ["'(' at character 11 is never closed"]),
        ("(a) ) OR ( (b)", ["')' at character 5"]),
        ("   ", ["empty"]),
        ("\n\t", ["empty"]),
        ("a = 'open", ["unterminated ' string", "character 5"]),
        ('"a = 1', ['unterminated " quoted name']),
        ("`a = 1", ["unterminated ` quoted name"]),
        ("a = $$open", ["unterminated dollar quote $$"]),
        ("a = $t$open$$", ["unterminated dollar quote $t$"]),
        ("a = 'x'';", ["unterminated"]),
        # A backslash before a quote ends the string in PostgreSQL but not in MySQL: the
        # PostgreSQL reading of this one widens the snapshot.
        ("a = '\\' ) OR (1=1 -- '\n", ["backslash", "PostgreSQL", "('')"]),
        ("name = 'it\\'s'", ["backslash", "('')"]),
        ('a = "\\" " ) OR (1=1 -- "\n', ["backslash", '("")']),
        # "x$$" is a name in PostgreSQL, so what follows is not quoted.
        ("x$$ ) OR (1=1 OR y$$ = 1", ["')' at character 5"]),
        # After a number, PostgreSQL versions disagree about a following $$.
        ("x = 1$$ ' $$ ) OR (1=1 -- '", ["$$", "directly follows '1'"]),
        # What is outside the quotes still counts.
        ("note LIKE '%' -- '", ["'--'"]),
        ("'a' ; 'b'", ["';'"]),
        ("$$x$$) OR ($$y$$", ["')'"]),
    ],
)
def test_filters_the_guard_refuses(sql, words):
    with pytest.raises(FilterError) as info:
        check_filter(sql)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {str(info.value)!r}"
    error = parse_error(_EXEC, _with_filter(sql))
    assert_problem(error, "additional-conditions", "filter for 'public.orders'", *words)


def test_a_filter_error_is_a_value_error():
    with pytest.raises(ValueError):
        check_filter("a = 1)")


def test_the_guard_checks_every_condition():
    error = parse_error(
        _EXEC,
        {
            "data-collections": ["public.orders", "public.items"],
            "additional-conditions": [
                {"data-collection": "public.orders", "filter": "a = 1"},
                {"data-collection": "public.items", "filter": "b = 2) OR (1 = 1"},
            ],
        },
    )
    assert_problem(error, "filter for 'public.items'", "')'")


def test_dollar_quotes_can_be_turned_off_for_mysql():
    # MySQL has no dollar quotes: "$$" is a name there, and @$$ a user variable.
    sql = "a = @$$ ) OR (1=1 OR @$$ IS NULL"
    check_filter(sql)
    with pytest.raises(FilterError, match="closes a parenthesis"):
        check_filter(sql, dollar_quotes=False)
    check_filter("my$$col = 1", dollar_quotes=False)


def test_unquoted_spans():
    assert list(unquoted_spans("")) == []
    assert list(unquoted_spans("a = 1")) == [(0, 5)]
    assert list(unquoted_spans("a = 'x'")) == [(0, 4)]
    assert list(unquoted_spans("'x' = a")) == [(3, 7)]
    assert list(unquoted_spans("a = 'x' || \"y\" || `z` || $$w$$ || $t$v$t$")) == [
        (0, 4),
        (7, 11),
        (14, 18),
        (21, 25),
        (30, 34),
    ]
    assert list(unquoted_spans("$$a$$", dollar_quotes=False)) == [(0, 5)]


def _sql_quote(text: str, quote: str) -> str:
    """``text`` quoted so that PostgreSQL and MySQL both read it back whole."""
    return quote + text.replace("\\", "\\\\").replace(quote, quote * 2) + quote


# Filters the guard must accept: conditions, parentheses and quoted text of any content.
_dollar_body = st.text().filter(lambda t: "$" not in t)
_filter_atoms = st.one_of(
    st.sampled_from(["a = 1", "b IS NULL", "x IN (1, 2)", "my$col > 0", "c <> -1", "f(x, y)"]),
    st.text().map(lambda t: "v = " + _sql_quote(t, "'")),
    st.text().map(lambda t: _sql_quote(t, '"') + " = 1"),
    st.text().map(lambda t: "`" + t.replace("`", "``") + "` = 1"),
    _dollar_body.map(lambda t: "v = $$" + t + "$$"),
    _dollar_body.map(lambda t: "v = $tag_1$" + t + "$tag_1$"),
)
_safe_filters = st.recursive(
    _filter_atoms,
    lambda inner: st.one_of(
        inner.map(lambda f: f"({f})"),
        inner.map(lambda f: f"NOT ({f})"),
        st.tuples(inner, st.sampled_from([" AND ", " OR ", "\nAND "]), inner).map("".join),
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(sql=_safe_filters)
def test_the_guard_accepts_well_formed_filters(sql):
    check_filter(sql)


# Filters the guard may or may not accept: well-formed ones with a stray piece of SQL
# syntax inserted anywhere, and runs of such pieces.
_quoting = ["'", "''", '"', "`", "$$", "$t$", "$1", "\\", "\\\\", "E'", "@"]
_syntax = ["(", ")", "--", "-", "/*", "*/", "*", "/", ";", "#", "a", "1", " ", "\n", "x = 1"]
_pieces = st.sampled_from([*_quoting, *_syntax])


def _insert(sql: str, at: int, piece: str) -> str:
    at %= len(sql) + 1
    return sql[:at] + piece + sql[at:]


_any_filters = st.one_of(
    st.builds(_insert, _safe_filters, st.integers(min_value=0), _pieces),
    st.lists(_pieces, min_size=1, max_size=12).map("".join),
    st.text(st.sampled_from("()'\"`$;-/*#\\ a1E\n"), min_size=1),
)


def _wrapped_stays_inside(sql: str, *, dollar_quotes: bool) -> bool:
    """Scan ``AND (<sql>)`` with the guard's tokenizer: depth 0 exactly at the end."""
    wrapped = f"AND ({sql})"
    spans = list(unquoted_spans(wrapped, dollar_quotes=dollar_quotes))
    if not spans or spans[-1][1] != len(wrapped):
        return False  # the closing parenthesis would be quoted
    depth = 0
    for start, end in spans:
        for i in range(start, end):
            depth += {"(": 1, ")": -1}.get(wrapped[i], 0)
            if depth <= 0 and i >= len("AND (") and i != len(wrapped) - 1:
                return False
    return depth == 0


def _name_char(ch: str) -> bool:
    return not ch.isascii() or ch.isalnum() or ch in "_$"


def _reading(sql: str, *, mysql: bool) -> str:
    """How PostgreSQL or MySQL (default settings) lex ``AND (<sql>)``, written apart from the
    guard: "inside" if the filter stays inside the parentheses, "escapes" if a parenthesis, a
    statement end or a comment reaches outside them, "error" if the server refuses it."""
    text = f"AND ({sql})"
    n = len(text)
    depth = i = 0
    escape_string = False  # PostgreSQL E'...' strings take backslash escapes
    while i < n:
        ch = text[i]
        if ch in "'\"" or (mysql and ch == "`"):
            backslashes = ch != "`" and (mysql or (ch == "'" and escape_string))
            j = i + 1
            while True:
                if j >= n:
                    return "error"  # unterminated: the statement does not parse
                if (backslashes and text[j] == "\\") or text[j : j + 2] == ch * 2:
                    j += 2
                elif text[j] == ch:
                    break
                else:
                    j += 1
            i = j + 1
            escape_string = False
            continue
        escape_string = False
        if not mysql:
            if ch == "`":
                return "error"  # not PostgreSQL syntax
            if ch.isalpha() or ch == "_" or not ch.isascii():
                start = i
                while i < n and _name_char(text[i]):
                    i += 1  # one name, $ included: "a$$" is a name
                escape_string = text[start:i] in ("E", "e") and i < n and text[i] == "'"
                continue
            if ch.isdigit() or (ch == "$" and text[i + 1 : i + 2].isdigit()):
                i += 1
                while i < n and text[i].isdigit():
                    i += 1  # a number or a parameter, then maybe a dollar quote
                continue
            dollar = re.match(
                r"\$([A-Za-z_\x80-\U0010ffff][A-Za-z_0-9\x80-\U0010ffff]*)?\$", text[i:]
            )
            if dollar:
                close = text.find(dollar.group(), i + len(dollar.group()))
                if close < 0:
                    return "error"
                i = close + len(dollar.group())
                continue
        if text.startswith(("--", "/*", ";"), i) or (mysql and ch == "#"):
            return "escapes"
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0 and i != n - 1:
                return "escapes"
        i += 1
    return "inside" if depth == 0 else "error"


@settings(max_examples=1000, deadline=None)
@given(sql=_any_filters)
def test_an_accepted_filter_stays_inside_its_parentheses(sql):
    for dollar_quotes, mysql in ((True, False), (False, True)):
        try:
            check_filter(sql, dollar_quotes=dollar_quotes)
        except FilterError:
            continue
        # The guard's own reading of the wrapped text, and an independent reading as the
        # server lexes it (PostgreSQL with dollar quotes, MySQL without).
        assert _wrapped_stays_inside(sql, dollar_quotes=dollar_quotes)
        assert _reading(sql, mysql=mysql) != "escapes"


# The shortest ways out are a few tokens long: '\')' on PostgreSQL if the guard read a
# backslash only as MySQL does, a$$)$$ if it took any $$ for a dollar quote. Random text
# rarely hits them, so try every filter of up to five of the tokens that matter.
_TOKENS = ["'", "\\", ")", "(", "$$", "a", '"', "\n", "--", "1", "`", "E"]


def test_every_short_accepted_filter_stays_inside_its_parentheses():
    for length in range(1, 6):
        for tokens in itertools.product(_TOKENS, repeat=length):
            sql = "".join(tokens)
            for dollar_quotes, mysql in ((True, False), (False, True)):
                try:
                    check_filter(sql, dollar_quotes=dollar_quotes)
                except FilterError:
                    continue
                assert _wrapped_stays_inside(sql, dollar_quotes=dollar_quotes), sql
                assert _reading(sql, mysql=mysql) != "escapes", (sql, mysql)


@pytest.mark.parametrize(
    ("sql", "mysql"),
    [
        ("a = 1) OR (1=1", False),
        ("a = 1) OR (1=1", True),
        ("a = '\\' ) OR (1=1 -- '\n", False),
        ('a = "\\" " ) OR (1=1 -- "\n', True),
        ("a = @$$ ) OR (1=1 OR @$$ IS NULL", True),
        ("x = E'\\'' ) OR (1=1 OR ''=''", False),
    ],
)
def test_the_independent_reading_sees_escapes(sql, mysql):
    # The property above can fail: these reach outside the parentheses as the server reads them.
    assert _reading(sql, mysql=mysql) == "escapes"


# --- round trip ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signal",
    [
        ExecuteSnapshot(id="a", data_collections=(ORDERS,)),
        ExecuteSnapshot(
            id="b",
            data_collections=(
                ORDERS,
                TableId(None, "items"),
                TableId("s", 'My."Odd".Table'),
                sel(r"inv\.(orders|items)"),
            ),
            additional_conditions=(
                AdditionalCondition(ORDERS, "status = 'open' AND note <> '\"x\"'"),
                AdditionalCondition(sel(r"inv\.(orders|items)"), "qty > 0"),
            ),
            surrogate_key="created_at",
        ),
        StopSnapshot(id="c"),
        StopSnapshot(id="d", data_collections=(ORDERS, sel(r"public\..*"))),
        PauseSnapshot(id="e"),
        ResumeSnapshot(id="f"),
        LogSignal(id="g", message="hello, wörld"),
        LogSignal(id="h", message=""),
        Watermark(window_id=str(uuid.uuid4()), kind=WatermarkKind.OPEN),
        Watermark(window_id=str(uuid.uuid4()), kind=WatermarkKind.CLOSE),
    ],
    ids=lambda s: type(s).__name__,
)
def test_round_trip(signal):
    row = to_row(signal)
    assert row[0] == signal.id
    assert row[1] == signal.type.value
    assert parse_signal(*row) == signal


def test_to_row_writes_compact_json():
    assert to_row(LogSignal(id="1", message="hi")) == ("1", "log", '{"message":"hi"}')
    assert to_row(PauseSnapshot(id="2")) == ("2", "pause-snapshot", '{"type":"incremental"}')
    assert to_row(StopSnapshot(id="3")) == ("3", "stop-snapshot", '{"type":"incremental"}')
    sid, stype, data = to_row(ExecuteSnapshot(id="4", data_collections=(ORDERS,)))
    assert (sid, stype) == ("4", "execute-snapshot")
    assert json.loads(data) == {"data-collections": ["public.orders"], "type": "incremental"}


_text = st.one_of(
    st.text(min_size=1),
    st.from_regex(r"[^\W\d]\w*", fullmatch=True),
    st.text(st.sampled_from('ab_."`$*()|\\ -é9'), min_size=1),
)
_table_ids = st.builds(TableId, st.none() | _text, _text)
_patterns = st.sampled_from([r"public\..*", r"inv\.(orders|items)", r".*\.t[0-9]+", r"s\.x?"])
_selectors = st.lists(
    _table_ids | _patterns.map(parse_table_selector), min_size=1, max_size=5, unique=True
)


@st.composite
def _execute_snapshots(draw: st.DrawFn) -> ExecuteSnapshot:
    tables = draw(_selectors)
    with_condition = draw(st.lists(st.sampled_from(tables), unique=True))
    conditions = tuple(AdditionalCondition(t, draw(_safe_filters)) for t in with_condition)
    return ExecuteSnapshot(
        id=draw(st.text(min_size=1)),
        data_collections=tuple(tables),
        additional_conditions=conditions,
        surrogate_key=draw(st.none() | st.text(min_size=1)),
    )


@settings(max_examples=200, deadline=None)
@given(signal=_execute_snapshots())
def test_execute_snapshot_round_trip_property(signal):
    assert parse_signal(*to_row(signal)) == signal


@settings(max_examples=100, deadline=None)
@given(
    signal_id=st.text(min_size=1),
    tables=st.lists(_table_ids, max_size=4, unique=True),
    message=st.text(),
)
def test_other_signals_round_trip_property(signal_id, tables, message):
    for signal in (
        StopSnapshot(id=signal_id, data_collections=tuple(tables)),
        PauseSnapshot(id=signal_id),
        ResumeSnapshot(id=signal_id),
        LogSignal(id=signal_id, message=message),
    ):
        assert parse_signal(*to_row(signal)) == signal


# --- DDL -----------------------------------------------------------------------------------

SIGNALS = TableId("public", "debezium_signal")


def _flat(ddl: str) -> str:
    return " ".join(ddl.split())


@pytest.mark.parametrize("dialect", ["postgresql", "mysql", "mariadb"])
def test_signal_table_ddl(dialect):
    ddl = _flat(signal_table_ddl(SIGNALS, dialect))
    assert ddl.startswith("CREATE TABLE public.debezium_signal (")
    assert "id VARCHAR(42)" in ddl
    assert "type VARCHAR(32) NOT NULL" in ddl
    assert re.search(r"\bdata TEXT\s*,", ddl), ddl  # nullable: no NOT NULL
    assert "PRIMARY KEY (id)" in ddl


def test_signal_table_ddl_without_schema():
    ddl = _flat(signal_table_ddl(TableId(None, "debezium_signal"), "postgresql"))
    assert ddl.startswith("CREATE TABLE debezium_signal (")


def test_signal_table_ddl_accepts_a_dialect_object():
    assert signal_table_ddl(SIGNALS, postgresql.dialect()) == signal_table_ddl(
        SIGNALS, "postgresql"
    )


@pytest.mark.parametrize(
    ("dialect", "quoted"),
    [
        ("postgresql", '"My Schema"."Signal-Table"'),
        ("mysql", "`My Schema`.`Signal-Table`"),
    ],
)
def test_signal_table_ddl_quotes_names_that_need_it(dialect, quoted):
    ddl = _flat(signal_table_ddl(TableId("My Schema", "Signal-Table"), dialect))
    assert ddl.startswith(f"CREATE TABLE {quoted} (")


def test_signal_table_ddl_unknown_dialect():
    with pytest.raises(ValueError, match="oracle") as info:
        signal_table_ddl(SIGNALS, "oracle")
    assert "postgresql" in str(info.value)
    assert "mysql" in str(info.value)
