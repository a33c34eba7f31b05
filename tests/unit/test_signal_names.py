"""Table names as signals spell them (signals/names.py): exact names, quoting, patterns."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signals.names import (
    TableId,
    TableNameError,
    TablePattern,
    parse_table_name,
    parse_table_selector,
    quote_part,
)

# --- exact names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("public.orders", TableId("public", "orders")),
        ("orders", TableId(None, "orders")),
        ("_private._t1", TableId("_private", "_t1")),
        ("  public.orders  ", TableId("public", "orders")),
        # Case is kept as written: names are matched against the catalog's stored spelling.
        ("Public.Orders", TableId("Public", "Orders")),
        # Quoted parts, which may hold dots, spaces, hyphens and pattern characters.
        ('"public"."My.Table"', TableId("public", "My.Table")),
        ('"My.Table"', TableId(None, "My.Table")),
        ('"my schema"."order-items"', TableId("my schema", "order-items")),
        ('public."My.Table"', TableId("public", "My.Table")),
        ('"public".orders', TableId("public", "orders")),
        # Backticks (MySQL style), and a mix of both quote styles.
        ("`inventory`.`order.items`", TableId("inventory", "order.items")),
        ("`a b`", TableId(None, "a b")),
        ('`db`."t"', TableId("db", "t")),
        # A doubled quote inside a quoted part stands for itself.
        ('"a""b"', TableId(None, 'a"b')),
        ('"s"."a""b"""', TableId("s", 'a"b"')),
        ("`a``b`", TableId(None, "a`b")),
        # The other quote character needs no doubling.
        ('"a`b"', TableId(None, "a`b")),
        ('`a"b`', TableId(None, 'a"b')),
        # Unicode bare identifiers.
        ("öffentlich.größe", TableId("öffentlich", "größe")),
        ("公共.表", TableId("公共", "表")),
        ("схема.таблица", TableId("схема", "таблица")),
        # Bare parts are any run of characters other than dots, quotes, whitespace and
        # pattern characters, as MySQL and Debezium allow: a leading digit, a hyphen, ...
        ("inventory.2024_orders", TableId("inventory", "2024_orders")),
        ("1orders", TableId(None, "1orders")),
        ("my-db.orders", TableId("my-db", "orders")),
        ("order-items", TableId(None, "order-items")),
        ("o'brien.t@x", TableId("o'brien", "t@x")),
        ("public.orders;", TableId("public", "orders;")),
        # ... and $ and ^ anywhere but at the very end and the very start of the text.
        ("public.my$table", TableId("public", "my$table")),
        ("$x.y", TableId("$x", "y")),
        ("x$.y", TableId("x$", "y")),
        ("a^b", TableId(None, "a^b")),
        ("s.^x", TableId("s", "^x")),
        ("s.x^", TableId("s", "x^")),
        ("  my$table  ", TableId(None, "my$table")),
    ],
)
def test_exact_names(text, expected):
    assert parse_table_selector(text) == expected
    assert parse_table_name(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Pattern characters inside a quoted part do not make a pattern: this is how
        # str(TableId) writes such a name, so it must read back as that name.
        ('public."a$b"', TableId("public", "a$b")),
        ('public."price (usd)"', TableId("public", "price (usd)")),
        ('s."*"', TableId("s", "*")),
        ('"^weird|name"', TableId(None, "^weird|name")),
        ('"a\\b"."c"', TableId("a\\b", "c")),
    ],
)
def test_quoted_parts_with_pattern_characters_are_names(text, expected):
    assert parse_table_selector(text) == expected


# --- patterns ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        r"public\..*",
        r"inventory\.(orders|items)",
        r".*\.orders",
        r"s\.t[0-9]+",
        r"^public\.x$",
        # A leading ^ or a trailing $ is an anchor, so the text is a pattern.
        "^public.orders",
        "public.orders$",
        "^orders$",
        "public.my$table$",
        "$",
        "^",
        "public.a|public.b",
    ],
)
def test_patterns(text):
    selector = parse_table_selector(text)
    assert isinstance(selector, TablePattern)
    assert selector.pattern == text
    assert str(selector) == text


def test_pattern_is_stripped():
    selector = parse_table_selector("  public\\..*  ")
    assert isinstance(selector, TablePattern)
    assert selector.pattern == "public\\..*"


def test_pattern_with_a_literal_quote_stays_a_pattern():
    selector = parse_table_selector('public\\."x.*')
    assert isinstance(selector, TablePattern)
    assert selector.matches(TableId("public", '"xyz'))


def test_anchored_patterns_match_like_regexes():
    start = parse_table_selector("^public.orders")
    end = parse_table_selector("public.orders$")
    assert isinstance(start, TablePattern)
    assert isinstance(end, TablePattern)
    for pattern in (start, end):
        assert pattern.matches(TableId("public", "orders"))
        assert not pattern.matches(TableId("public", "orders_old"))
        assert not pattern.matches(TableId("xpublic", "orders"))
    # Quoting a part with a trailing $ makes it a name again.
    assert parse_table_selector('public."orders$"') == TableId("public", "orders$")
    assert parse_table_selector('"^public".orders') == TableId("^public", "orders")


def test_pattern_matches_any_table_of_a_schema():
    pattern = parse_table_selector(r"public\..*")
    assert isinstance(pattern, TablePattern)
    assert pattern.matches(TableId("public", "orders"))
    assert pattern.matches(TableId("public", "My.Table"))
    assert not pattern.matches(TableId("inventory", "orders"))
    # fullmatch: a schema that merely starts or ends with "public" is not public.
    assert not pattern.matches(TableId("public_archive", "orders"))
    assert not pattern.matches(TableId("not_public", "orders"))


def test_pattern_uses_fullmatch_on_schema_dot_table():
    pattern = parse_table_selector(r"inventory\.(orders|items)")
    assert isinstance(pattern, TablePattern)
    assert pattern.matches(TableId("inventory", "orders"))
    assert pattern.matches(TableId("inventory", "items"))
    # re.search would accept all of these; fullmatch must not.
    assert not pattern.matches(TableId("inventory", "orders_old"))
    assert not pattern.matches(TableId("inventory", "old_orders"))
    assert not pattern.matches(TableId("xinventory", "orders"))
    assert not pattern.matches(TableId("inventory", "customers"))
    # Names are case-sensitive.
    assert not pattern.matches(TableId("Inventory", "orders"))


def test_pattern_matches_the_unquoted_qualified_name():
    pattern = parse_table_selector(r"s\.a\.b")
    assert isinstance(pattern, TablePattern)
    assert pattern.matches(TableId("s", "a.b"))
    assert not pattern.matches(TableId("s", "a_b"))


def test_pattern_needs_a_resolved_schema():
    pattern = parse_table_selector(r".*\.orders")
    assert isinstance(pattern, TablePattern)
    with pytest.raises(TableNameError, match="no schema"):
        pattern.matches(TableId(None, "orders"))
    assert pattern.matches(TableId(None, "orders").with_default_schema("public"))


def test_parse_table_name_refuses_a_pattern():
    with pytest.raises(TableNameError, match="pattern"):
        parse_table_name(r"public\..*")


# --- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("a.b.c", "3 parts"),
        ('"a"."b"."c"', "3 parts"),
        ("db.public.orders.x", "4 parts"),
        ('"public.orders', "unterminated"),
        ('public."orders', "unterminated"),
        ("`orders", "unterminated"),
        ('"a""', "unterminated"),
        ('"".orders', "empty quoted part"),
        ('public.""', "empty quoted part"),
        ("``", "empty quoted part"),
        ("public.my table", "neither"),
        ("my table", "neither"),
        ("public.", "neither"),
        (".orders", "neither"),
        ("public..orders", "neither"),
        ("public. orders", "neither"),
        ("public .orders", "neither"),
        ('"a".b$', "neither"),
        ('"a"b', "neither"),
        ('"a" . "b"', "neither"),
        ("public.(orders", "regular expression"),
        ("[", "regular expression"),
        ("*orders", "regular expression"),
        (r"public\.(?P<x", "regular expression"),
    ],
)
def test_bad_names(text, words):
    with pytest.raises(TableNameError, match=re.escape(words)):
        parse_table_selector(text)


def test_table_name_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_table_selector("a.b.c")


def test_the_error_message_quotes_the_name():
    with pytest.raises(TableNameError) as info:
        parse_table_selector("order items")
    assert "'order items'" in str(info.value)


# --- display -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "shown"),
    [
        ("orders", "orders"),
        ("_x9", "_x9"),
        ("größe", "größe"),
        ("Orders", "Orders"),
        ("order-items", "order-items"),
        ("9lives", "9lives"),
        ("2024_orders", "2024_orders"),
        ("a$b", "a$b"),
        ("$a", "$a"),
        ("a^b", "a^b"),
        ("a^", "a^"),
        ("o'brien", "o'brien"),
        # Dots, whitespace, quotes, pattern characters, a leading ^ and a trailing $ (anchors
        # at the ends of the text) are quoted, and so is the empty part.
        ("My.Table", '"My.Table"'),
        ("a b", '"a b"'),
        ("a\tb", '"a\tb"'),
        ("a\u3000b", '"a\u3000b"'),
        ('a"b', '"a""b"'),
        ("a`b", '"a`b"'),
        ("a*b", '"a*b"'),
        ("a(b", '"a(b"'),
        ("a\\b", '"a\\b"'),
        ("^a", '"^a"'),
        ("a$", '"a$"'),
        ("$", '"$"'),
        ("^", '"^"'),
        ("", '""'),
    ],
)
def test_quote_part(part, shown):
    assert quote_part(part) == shown


@pytest.mark.parametrize(
    ("table", "shown"),
    [
        (TableId("public", "orders"), "public.orders"),
        (TableId(None, "orders"), "orders"),
        (TableId("public", "My.Table"), 'public."My.Table"'),
        (TableId("my schema", "orders"), '"my schema".orders'),
        (TableId(None, 'a"b'), '"a""b"'),
        (TableId("s", "*"), 's."*"'),
        (TableId("my-db", "2024_orders"), "my-db.2024_orders"),
        (TableId("public", "my$table"), "public.my$table"),
        (TableId("s", "x$"), 's."x$"'),
        (TableId("^s", "t"), '"^s".t'),
        (TableId("s^", "$t"), "s^.$t"),
    ],
)
def test_str_quotes_only_when_needed_and_round_trips(table, shown):
    assert str(table) == shown
    assert parse_table_selector(shown) == table


def test_qualified_and_default_schema():
    assert TableId("public", "My.Table").qualified == "public.My.Table"
    bare = TableId(None, "orders")
    with pytest.raises(TableNameError):
        _ = bare.qualified
    assert bare.with_default_schema("public") == TableId("public", "orders")
    qualified = TableId("inventory", "orders")
    assert qualified.with_default_schema("public") is qualified


def test_table_ids_are_hashable_and_ordered():
    ids = {TableId("b", "x"), TableId("a", "y"), TableId("a", "x"), TableId("a", "x")}
    assert sorted(ids) == [TableId("a", "x"), TableId("a", "y"), TableId("b", "x")]


# --- properties ----------------------------------------------------------------------------

# Any unicode text, mixed with identifiers and with texts made of the characters that matter
# (quotes, dots, pattern characters, spaces), which plain st.text() rarely combines.
_parts = st.one_of(
    st.text(min_size=1),
    st.from_regex(r"[^\W\d]\w*", fullmatch=True),
    st.text(st.sampled_from("ab_.\"`$^*()|\\ \t\u3000-é9'"), min_size=1),
)


@settings(max_examples=300, deadline=None)
@given(schema=_parts, table=_parts)
def test_str_round_trips_for_any_text(schema, table):
    table_id = TableId(schema, table)
    assert parse_table_selector(str(table_id)) == table_id
    assert parse_table_name(str(table_id)) == table_id


@settings(max_examples=200, deadline=None)
@given(table=_parts)
def test_str_round_trips_without_schema(table):
    table_id = TableId(None, table)
    assert parse_table_selector(str(table_id)) == table_id


# Patterns are stripped like names, so leave out whitespace and control characters here.
_visible = st.text(st.characters(exclude_categories=("Z", "C")), min_size=1)


@settings(max_examples=200, deadline=None)
@given(schema=st.sampled_from(["public", "s", "inventory"]), table=_visible)
def test_escaped_pattern_matches_exactly_its_table(schema, table):
    pattern = parse_table_selector(re.escape(schema) + r"\." + re.escape(table))
    assert isinstance(pattern, TablePattern)
    assert pattern.matches(TableId(schema, table))
    assert not pattern.matches(TableId(schema, table + "x"))
    assert not pattern.matches(TableId("x" + schema, table))


# Characters a bare part may hold: anything but dots, quotes, whitespace and the pattern
# characters (^ and $ included here; their position rules are checked below).
_bare_chars = st.characters(
    blacklist_characters='."`*+?[](){}|\\', blacklist_categories=("Cs",)
).filter(lambda ch: not ch.isspace())
_bare_parts = st.text(_bare_chars, min_size=1)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_bare_parts, min_size=1, max_size=2))
def test_bare_parts_parse_as_exact_names(parts):
    text = ".".join(parts)
    expected = TableId(None, parts[0]) if len(parts) == 1 else TableId(parts[0], parts[1])
    selector = parse_table_selector(text)
    if text.startswith("^") or text.endswith("$"):
        # An anchor makes the text a pattern (or an error, if it is not a valid regex).
        assert isinstance(selector, TablePattern)
    else:
        assert selector == expected
    # Either way, the quoted spelling names the table exactly.
    assert parse_table_selector(str(expected)) == expected


@settings(max_examples=300, deadline=None)
@given(part=_bare_parts)
def test_quote_part_leaves_bare_only_what_reads_back_bare(part):
    shown = quote_part(part)
    if part.startswith("^") or part.endswith("$"):
        assert shown.startswith('"')
    else:
        assert shown == part
        # Bare in either position, and as the whole text.
        assert parse_table_selector(f"s.{shown}") == TableId("s", part)
        assert parse_table_selector(f"{shown}.t") == TableId(part, "t")
        assert parse_table_selector(shown) == TableId(None, part)
