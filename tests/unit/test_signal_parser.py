"""The strict signal parser (signals/parser.py), the row form of signals, and the signal DDL."""

from __future__ import annotations

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
from signals.parser import parse_signal
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


def test_non_string_id_is_turned_into_text():
    assert parse_signal(7, "log", '{"message": "x"}') == LogSignal(id="7", message="x")


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
        (_EXEC, {"data-collections": ["order-items"]}, ["data-collections", "'order-items'"]),
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
        (_EXEC, _exec(type=None), ["type", "string"]),
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


def test_deeply_nested_json_is_an_error_not_a_crash():
    result = parse_signal("sig-1", "log", "[" * 100_000 + "]" * 100_000)
    assert isinstance(result, SignalError)
    assert result.signal_id == "sig-1"


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


@settings(max_examples=300, deadline=None)
@given(
    signal_id=st.none() | st.text(),
    signal_type=st.sampled_from([t.value for t in SignalType]) | st.text(),
    data=st.none() | st.text() | st.binary() | _json.map(json.dumps),
)
def test_parser_never_raises(signal_id, signal_type, data):
    result = parse_signal(signal_id, signal_type, data)
    if isinstance(result, SignalError):
        assert result.signal_id == ("" if signal_id is None else signal_id)
        assert result.problem
        assert "internal error" not in result.problem
    else:
        assert result.id == signal_id


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
    conditions = tuple(AdditionalCondition(t, draw(st.text(min_size=1))) for t in with_condition)
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
