"""Table patterns (signals/names.py): RE2 (linear time), the schema dot rule, limits."""

from __future__ import annotations

import threading

import pytest
import re2
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from signals.names import (
    MAX_SELECTOR_CHARS,
    TableId,
    TableNameError,
    TablePattern,
    TableSet,
    parse_table_selector,
)


def pattern(text: str) -> TablePattern:
    selector = parse_table_selector(text)
    assert isinstance(selector, TablePattern), text
    return selector


def finishes(action: object, seconds: float = 20.0) -> bool:
    """Whether ``action()`` returns within ``seconds`` (a stall check, not a speed test)."""
    done = threading.Event()

    def run() -> None:
        action()  # type: ignore[operator]
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done.wait(seconds)


# --- linear time ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", [r"public\.(a+)+b", r"public\.(a|aa)*b", r"public\.(a*)*b", r"(.*a){20}"]
)
def test_catastrophic_backtracking_patterns_do_not_stall(text):
    selector = pattern(text)
    # A backtracking matcher takes exponential time on these; RE2 is linear.
    long_names = [TableId("public", "a" * n) for n in (63, 1_000, 100_000)]
    assert finishes(lambda: [selector.matches(t) for t in long_names])
    assert not any(selector.matches(t) for t in long_names if not text.startswith("(.*"))


@pytest.mark.parametrize(
    ("text", "construct"),
    [
        (r"public\.(a)\1", "backreference"),
        (r"public\.(?P<x>a)(?P=x)", "named backreference"),
        (r"public\.\k<x>", "named backreference"),
        (r"public\.(?=orders)", "lookahead"),
        (r"public\.(?!orders).*", "lookahead"),
        (r"public\.(?<=x)y", "lookbehind"),
        (r"public\.(?<!x)y", "lookbehind"),
        (r"public\.(?>a+)b", "atomic group"),
        (r"public\.a*+", "possessive"),
        (r"public\.a++", "possessive"),
        (r"public\.orders\Z", r"\Z"),
    ],
)
def test_constructs_re2_cannot_run_are_refused_by_name(text, construct):
    with pytest.raises(TableNameError) as info:
        parse_table_selector(text)
    message = str(info.value)
    assert construct in message and repr(text) in message
    assert "linear time" in message


def test_invalid_regex_still_says_regular_expression():
    with pytest.raises(TableNameError, match="not a valid regular expression: missing \\]"):
        parse_table_selector("public.[a")


def test_re2_writes_nothing_to_stderr(capfd):
    for text in (r"(a)\1", "[a", "(?=x)"):
        with pytest.raises(TableNameError):
            parse_table_selector(text)
    captured = capfd.readouterr()
    assert captured.err == "" and captured.out == ""


def test_text_length_is_capped():
    parse_table_selector("s." + "a" * (MAX_SELECTOR_CHARS - 2))
    with pytest.raises(TableNameError, match=f"at most {MAX_SELECTOR_CHARS}"):
        parse_table_selector("s." + "a" * (MAX_SELECTOR_CHARS - 1))
    with pytest.raises(TableNameError, match="characters long"):
        parse_table_selector("s.a|" * 2_000)


def test_lone_surrogates_are_refused():
    for text in ("public.a\ud800", "public\\.a\udfff.*"):
        with pytest.raises(TableNameError, match="surrogate"):
            parse_table_selector(text)


# --- the schema dot rule -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "selected", "not_selected"),
    [
        # The issue: sales.* also admitted sales_hr.salaries.
        (
            "sales.*",
            [("sales", "a"), ("sales", "salaries"), ("sales", "x.y")],
            [("sales_hr", "salaries"), ("salesx", "a"), ("xsales", "a")],
        ),
        ("sales.+", [("sales", "a")], [("sales_hr", "a"), ("sales", "")]),
        (
            r"public.orders_\d+",
            [("public", "orders_1"), ("public", "orders_2024")],
            [("publicx", "orders_1"), ("public", "orders_x"), ("public", "orders_1x")],
        ),
        ("public.orders$", [("public", "orders")], [("publicXorders", ""), ("public", "ordersx")]),
        (
            "^public.orders",
            [("public", "orders")],
            [("xpublic", "orders"), ("public", "orders_old")],
        ),
        ("^inv.(a|b)$", [("inv", "a"), ("inv", "b")], [("inv", "c"), ("invx", "a")]),
        # The table part is still a regex: its dots are wildcards.
        (
            "public.a.b+",
            [("public", "a.b"), ("public", "axbb")],
            [("public", "a"), ("publicxa", "b")],
        ),
        ("my-db.t[0-9]", [("my-db", "t1")], [("my-dbx", "t1")]),
        ("public.my$table$", [], [("public", "my$table")]),
        # Each top-level alternative by itself.
        ("public.a|inv.b", [("public", "a"), ("inv", "b")], [("public", "b"), ("publicXa", "")]),
        # Patterns that do not start with a plain name are regexes over schema.table.
        (r".*\.orders", [("public", "orders"), ("x", "orders")], [("x", "orders_1")]),
        (r"sales\..*", [("sales", "a")], [("sales_hr", "a")]),
        (r"(sales|inv)\..*", [("sales", "a"), ("inv", "b")], [("sales_hr", "a")]),
        ("(sales|inv).*", [("sales", "a"), ("sales_hr", "a"), ("inv", "b")], [("x", "y")]),
        # A flag set at the top level holds for the alternatives after it (as RE2 reads it).
        ("(?i)public.a|public.b", [("public", "A"), ("public", "B")], [("PUBLIC", "b")]),
    ],
)
def test_the_schema_dot_rule(text, selected, not_selected):
    selector = pattern(text)
    for schema, table in selected:
        assert selector.matches(TableId(schema, table)), (text, schema, table)
    for schema, table in not_selected:
        assert not selector.matches(TableId(schema, table)), (text, schema, table)


def test_a_schema_that_contains_a_dot_is_not_mistaken():
    # The literal schema is compared as a whole, not as a prefix of schema.table.
    assert not pattern("sales.*").matches(TableId("sales.hr", "t"))
    assert pattern(r"sales\..*").matches(TableId("sales.hr", "t"))  # a whole-name regex


def test_nothing_after_the_schema_dot_is_an_error():
    with pytest.raises(TableNameError, match=r"write sales\.\* for all of its tables"):
        parse_table_selector("^sales.")


def test_schemas_a_pattern_can_select():
    assert pattern("sales.*").schemas == {"sales"}
    assert pattern("sales.a|inv.b").schemas == {"sales", "inv"}
    assert pattern(r".*\.orders").schemas is None
    assert pattern(r"sales.a|.*\.b").schemas is None


def test_patterns_can_be_pickled_and_copied():
    import copy
    import pickle

    for text in ("sales.*", r"(?i)a\..*|b.c+"):
        original = pattern(text)
        for clone in (pickle.loads(pickle.dumps(original)), copy.deepcopy(original)):
            assert clone == original
            assert clone.matches(TableId("sales", "x")) == original.matches(TableId("sales", "x"))


def test_patterns_compare_by_their_text():
    assert pattern("sales.*") == pattern("sales.*")
    assert hash(pattern("sales.*")) == hash(pattern("sales.*"))
    assert pattern("sales.*") != pattern("sales.+")


_bare = st.from_regex(r"[a-z_][a-z0-9_$-]{0,10}", fullmatch=True)
_any_name = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@settings(max_examples=300, deadline=None)
@given(schema=_bare, other=_bare, table=_any_name)
def test_schema_star_selects_exactly_that_schema(schema, other, table):
    assume("\n" not in table)  # . does not match a newline (RE2, like re)
    selector = pattern(f"{schema}.*")
    assert selector.matches(TableId(schema, table))
    assert selector.matches(TableId(other, table)) == (other == schema)
    assert not selector.matches(TableId(schema + "_hr", table))


# Patterns over a small alphabet, for the property that the alternatives split reads a
# pattern exactly as RE2 does when no alternative starts with a plain schema name.
_regex_parts = st.sampled_from(
    [
        "a",
        "b",
        "\\.",
        ".",
        "*",
        "+",
        "?",
        "|",
        "(",
        ")",
        "[ab]",
        "[|]",
        "(?i)",
        "\\|",
        "^",
        "$",
        "\\Qa|b\\E",
        "[[:alpha:]|]",
        "x{1,2}",
    ]
)


@settings(max_examples=500, deadline=None)
@given(
    parts=st.lists(_regex_parts, min_size=1, max_size=8),
    schema=st.sampled_from(["a", "b", "ab", "A", "|"]),
    table=st.sampled_from(["a", "b", "ab", "B", "a|b", ""]),
)
def test_alternatives_read_the_pattern_as_re2_does(parts, schema, table):
    text = "".join(parts)
    options = re2.Options()
    options.log_errors = False
    try:
        whole = re2.compile(text, options)
    except re2.error:
        return
    try:
        selector = parse_table_selector(text)
    except TableNameError:
        return
    assume(isinstance(selector, TablePattern))
    assume(all(a.schema is None for a in selector.alternatives))
    name = TableId(schema, table)
    assert selector.matches(name) == (whole.fullmatch(name.qualified) is not None), text


# --- many tables ---------------------------------------------------------------------------


_tables = st.lists(
    st.builds(TableId, st.sampled_from(["s", "t", "sales", "sales_hr"]), _bare), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(
    tables=_tables,
    text=st.sampled_from(["sales.*", r".*\.a.*", "s.a|t.b.*", "(?i)S.*", r"sales\..*", "t.x+"]),
)
def test_table_set_matching_equals_trying_every_table(tables, text):
    selector = pattern(text)
    known = TableSet(tables)
    assert known.matching(selector) == sorted({t for t in tables if selector.matches(t)})
    assert all(t in known for t in tables)
    assert len(known) == len(set(tables))


def test_matching_twenty_thousand_tables_does_not_stall():
    known = TableSet(TableId(f"s{i % 50}", f"t_{i}") for i in range(20_000))
    patterns = [pattern(r".*\.t_1\d*"), pattern("s7.*"), pattern(r"(a+)+b")]
    assert finishes(lambda: [known.matching(p) for p in patterns])
    assert len(known.matching(pattern("s7.*"))) == 400
