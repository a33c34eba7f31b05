"""Resolving an execute-snapshot against the catalog (signals/plan.py), and the size caps of
the parser (signals/parser.py) that bound the work one signal row can cause."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence

import pytest

from signals import ExecuteSnapshot, SignalError, parse_signal
from signals.model import AdditionalCondition, Watermark, WatermarkKind, to_row
from signals.names import TableId, TableSet, parse_table_selector
from signals.parser import MAX_DATA_CHARS, MAX_ID_CHARS, MAX_PATTERNS, MAX_TABLES
from signals.plan import (
    MAX_TABLES_PER_SIGNAL,
    MAX_UNFINISHED,
    Selectors,
    plan_snapshot,
)

SIGNAL_TABLE = TableId("public", "debezium_signal")
KNOWN = TableSet(
    [
        TableId("public", "orders"),
        TableId("public", "items"),
        SIGNAL_TABLE,
        TableId("sales", "a"),
        TableId("sales", "b"),
        TableId("sales_hr", "salaries"),
        TableId("secret", "t"),
    ]
)
CONFIG_TABLES = ["public.*", "sales.*", "sales_hr.*"]


def execute(*tables: str, conditions: Sequence[tuple[str, str]] = ()) -> ExecuteSnapshot:
    return ExecuteSnapshot(
        id="sig",
        data_collections=tuple(parse_table_selector(t) for t in tables),
        additional_conditions=tuple(
            AdditionalCondition(parse_table_selector(t), f) for t, f in conditions
        ),
    )


class Kinds:
    """describe_missing: records each call."""

    def __init__(self, kinds: Mapping[TableId, str] | None = None) -> None:
        self.kinds = kinds or {}
        self.calls: list[list[TableId]] = []

    def __call__(self, tables: Sequence[TableId]) -> Mapping[TableId, str]:
        self.calls.append(list(tables))
        return {t: k for t, k in self.kinds.items() if t in tables}


def plan(
    signal: ExecuteSnapshot,
    known: TableSet = KNOWN,
    config: Sequence[str] = CONFIG_TABLES,
    unfinished: Mapping[TableId, str] | None = None,
    kinds: Kinds | None = None,
    own: Mapping[TableId, str] | None = None,
):
    return plan_snapshot(
        signal,
        known=known,
        captured=Selectors(map(parse_table_selector, config), "public"),
        signal_table=SIGNAL_TABLE,
        default_schema="public",
        unfinished=unfinished or {},
        describe_missing=kinds or Kinds(),
        own_tables=own,
    )


def test_exact_names_and_patterns_are_queued_once_in_order():
    result = plan(execute("orders", "sales.*", "sales.a", "public.items"))
    assert result.queue == [
        (TableId("public", "orders"), None),
        (TableId("sales", "a"), None),
        (TableId("sales", "b"), None),
        (TableId("public", "items"), None),
    ]
    assert result.refused == [] and result.problems == [] and result.error is None


def test_the_dot_rule_keeps_sales_hr_out():
    result = plan(execute("sales.*"))
    assert [t for t, _ in result.queue] == [TableId("sales", "a"), TableId("sales", "b")]


def test_refusals_name_the_reason():
    kinds = Kinds({TableId("public", "v"): "is a view: only tables can be snapshotted"})
    notification = TableId("public", "debezium_notification")
    result = plan(
        execute("public.ghost", "public.v", "secret.ghost", "public.debezium_signal", "public.n"),
        kinds=kinds,
        own={TableId("public", "n"): "the notification table ([notifications] table)"},
    )
    reasons = dict(result.refused)
    assert "does not exist" in reasons[TableId("public", "ghost")]
    assert reasons[TableId("public", "v")] == ("public.v is a view: only tables can be snapshotted")
    # A name that exists nowhere stays an error, captured or not.
    assert "does not exist" in reasons[TableId("secret", "ghost")]
    assert "signal table" in reasons[SIGNAL_TABLE]
    assert "notification table" in reasons[TableId("public", "n")]
    assert "never snapshotted" in reasons[TableId("public", "n")]
    assert result.queue == [] and result.skipped == [] and notification not in reasons
    # One lookup for every missing name, not one per name.
    assert kinds.calls == [
        [TableId("public", "ghost"), TableId("public", "v"), TableId("secret", "ghost")]
    ]


def test_tables_of_other_pipelines_are_skipped_not_refused():
    """Several pipelines may read one signal table: a table this one does not capture but
    that exists is another's, skipped as Debezium skips it (no failed snapshot, no signal
    problem); also one only another user may read, or a view outside source.tables."""
    kinds = Kinds(
        {
            TableId("secret", "hidden"): "exists, but the source user cannot read it: ...",
            TableId("secret", "v"): "is a view: only tables can be snapshotted",
        }
    )
    result = plan(
        execute("orders", "secret.t", "secret.hidden", "secret.v"),
        kinds=kinds,
    )
    assert result.queue == [(TableId("public", "orders"), None)]
    assert result.skipped == [
        TableId("secret", "t"),
        TableId("secret", "hidden"),
        TableId("secret", "v"),
    ]
    assert result.refused == [] and result.problems == []


def test_a_pattern_selects_only_captured_tables():
    result = plan(execute(r".*\.t", r"secret\..*", "sales.*"), config=["sales.*"])
    assert [t for t, _ in result.queue] == [TableId("sales", "a"), TableId("sales", "b")]
    assert result.refused == []
    # Patterns that match only other pipelines' tables are skipped; one that matches no
    # table at all is a problem.
    assert [str(p) for p in result.skipped] == [r".*\.t", r"secret\..*"]
    assert result.problems == []
    assert plan(execute("nothing_here.*")).problems == [
        "pattern nothing_here.* matches no captured table, nor any other"
    ]


def test_patterns_never_select_the_engines_own_tables():
    own = {TableId("public", "items"): "the notification table ([notifications] table)"}
    result = plan(execute("public.*"), own=own)
    assert [t for t, _ in result.queue] == [TableId("public", "orders")]
    assert plan(execute(r"public\.(items|debezium_signal)"), own=own).problems == [
        r"pattern public\.(items|debezium_signal) matches no captured table, nor any other"
    ]


def test_a_busy_table_is_a_problem_not_a_refusal():
    result = plan(
        execute("orders", "items"),
        unfinished={TableId("public", "orders"): "signal old, running"},
    )
    assert result.queue == [(TableId("public", "items"), None)]
    assert result.problems == [
        "public.orders is already being snapshotted (signal old, running); stop that snapshot "
        "first to start it over"
    ]


def test_the_first_condition_that_selects_a_table_is_its_filter():
    result = plan(
        execute(
            "sales.*",
            "orders",
            conditions=[("sales.b", "x = 1"), ("sales.*", "y = 2"), ("orders", "z = 3")],
        )
    )
    assert dict(result.queue) == {
        TableId("sales", "a"): "y = 2",
        TableId("sales", "b"): "x = 1",
        TableId("public", "orders"): "z = 3",
    }


def test_a_signal_selecting_too_many_tables_is_refused_whole():
    known = TableSet(TableId("big", f"t{i}") for i in range(MAX_TABLES_PER_SIGNAL + 1))
    result = plan(execute("big.*"), known=known, config=["big.*"])
    assert result.queue == [] and result.refused == [] and result.problems == []
    assert result.error is not None and f"at most {MAX_TABLES_PER_SIGNAL}" in result.error
    ok = plan(
        execute("big.*"), known=TableSet(list(known)[:MAX_TABLES_PER_SIGNAL]), config=["big.*"]
    )
    assert len(ok.queue) == MAX_TABLES_PER_SIGNAL and ok.error is None


def test_too_many_unfinished_snapshots_refuse_the_signal():
    unfinished = {TableId("u", f"t{i}"): "signal x, pending" for i in range(MAX_UNFINISHED)}
    result = plan(execute("orders"), unfinished=unfinished)
    assert result.error is not None and str(MAX_UNFINISHED) in result.error
    assert result.queue == []


def test_a_thousand_missing_tables_cost_one_lookup():
    kinds = Kinds()
    names = [f"public.ghost_{i}" for i in range(MAX_TABLES)]
    result = plan(execute(*names), kinds=kinds)
    assert len(result.refused) == MAX_TABLES and len(kinds.calls) == 1


def test_selectors():
    chosen = Selectors(map(parse_table_selector, ["orders", "sales.*"]), "public")
    assert chosen.selects(TableId("public", "orders"))
    assert chosen.selects(TableId("sales", "x"))
    assert not chosen.selects(TableId("sales_hr", "x"))
    assert chosen and not Selectors([], "public")


# --- parser caps ---------------------------------------------------------------------------


def parse_execute(data: object, signal_id: str = "sig") -> object:
    return parse_signal(signal_id, "execute-snapshot", json.dumps(data))


def test_data_size_is_capped():
    result = parse_signal("sig", "log", json.dumps({"message": "x" * MAX_DATA_CHARS}))
    assert isinstance(result, SignalError)
    assert f"at most {MAX_DATA_CHARS}" in result.problem
    fits = parse_signal("sig", "log", json.dumps({"message": "x" * (MAX_DATA_CHARS - 20)}))
    assert not isinstance(fits, SignalError)


def test_twenty_thousand_tables_are_refused_at_once():
    # The signal: 20,000 nonexistent tables. Compact names so it fits the data cap
    # would still be refused for its count.
    names = [f"t{i}" for i in range(20_000)]
    result = parse_signal("sig", "execute-snapshot", json.dumps({"data-collections": names}))
    assert isinstance(result, SignalError)
    assert "characters long" in result.problem or "at most 1000" in result.problem
    few = [f"t{i}" for i in range(MAX_TABLES + 1)]
    result = parse_execute({"data-collections": few})
    assert isinstance(result, SignalError)
    assert f"has {MAX_TABLES + 1} entries; a signal may name at most {MAX_TABLES}" in (
        result.problem
    )
    assert isinstance(parse_execute({"data-collections": few[:MAX_TABLES]}), ExecuteSnapshot)


def test_patterns_per_signal_are_capped():
    patterns = [f"s{i}.*" for i in range(MAX_PATTERNS + 1)]
    result = parse_execute({"data-collections": patterns})
    assert isinstance(result, SignalError) and f"at most {MAX_PATTERNS}" in result.problem
    assert isinstance(parse_execute({"data-collections": patterns[:-1]}), ExecuteSnapshot)
    conditions = [{"data-collection": p, "filter": "a = 1"} for p in patterns]
    result = parse_execute({"data-collections": ["s0.*"], "additional-conditions": conditions})
    assert isinstance(result, SignalError) and f"at most {MAX_PATTERNS}" in result.problem


def test_id_length_is_capped_and_an_error_shows_it_cut():
    long_id = "i" * (MAX_ID_CHARS + 1)
    result = parse_signal(long_id, "log", '{"message": "x"}')
    assert isinstance(result, SignalError)
    assert f"at most {MAX_ID_CHARS}" in result.problem
    assert len(result.signal_id) < 120 and result.signal_id.endswith(
        f"({MAX_ID_CHARS + 1} characters)"
    )
    assert not isinstance(parse_signal("i" * MAX_ID_CHARS, "log", '{"message": "x"}'), SignalError)
    huge_type = parse_signal("sig", "t" * 10_000, None)
    assert isinstance(huge_type, SignalError) and len(huge_type.problem) < 400


def test_a_lone_surrogate_in_data_is_an_error():
    result = parse_signal("sig", "log", '{"message": "a\\ud800b"}')
    assert isinstance(result, SignalError) and "surrogate" in result.problem
    result = parse_signal("sig", "execute-snapshot", '{"data-collections": ["t\\udc00"]}')
    assert isinstance(result, SignalError) and "surrogate" in result.problem


# --- watermark tokens ----------------------------------------------------------------------


def test_a_watermark_token_round_trips():
    watermark = Watermark(str(uuid.uuid4()), WatermarkKind.CLOSE, "f00d")
    assert to_row(watermark)[2] == '{"token":"f00d"}'
    assert parse_signal(*to_row(watermark)) == watermark


@pytest.mark.parametrize(
    "data", [None, "{}", '{"closeWindowTimestamp": "2024-01-01"}', '{"token": 5}']
)
def test_a_watermark_without_a_usable_token_reads_as_none(data):
    window = str(uuid.uuid4())
    parsed = parse_signal(f"{window}-close", "snapshot-window-close", data)
    assert parsed == Watermark(window, WatermarkKind.CLOSE, None)
