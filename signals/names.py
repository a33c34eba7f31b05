"""Table names as signals and ``source.tables`` spell them: names, quoted parts, patterns.

A name made only of identifier parts names exactly one table: ``schema.table``, or ``table``
(resolved later against the source's default schema). A part is bare (any run of characters
other than ``.``, quotes, whitespace and the pattern characters, so ``2024_orders``,
``my-db`` and ``my$table`` are parts) or quoted with ``"`` or a backtick, where a doubled
quote stands for itself. Names are case-sensitive, as in Debezium: they are matched against
the catalog's stored spelling, which for PostgreSQL is lower case unless the table was created
with a quoted name.

Anything else is a pattern: text with a pattern character ``* + ? [ ] ( ) { } | \\`` outside
quotes, or ``^`` at the very start or ``$`` at the very end (regex anchors; elsewhere ``^``
and ``$`` are part of a name). Patterns are RE2 regular expressions (Python ``re`` syntax
without backreferences, lookaround, atomic groups and possessive quantifiers; ``\\d`` and
``\\w`` are ASCII), matched in time linear in the name's length, so no pattern can stall the
engine: a pattern RE2 cannot compile is refused, naming the construct.

The schema dot rule. Each top-level alternative of a pattern (``a|b``) that starts with a
plain schema name followed by a dot (optionally after a ``^`` anchor) has that dot as the
literal separator: the schema must equal that name exactly, and the rest is a regex the table
name must match as a whole. If the rest starts with a quantifier (``*``, ``+``, ``?``,
``{n}``), the dot is also the "any character" it repeats. So ``sales.*`` selects every table
of schema ``sales`` (and not ``sales_hr.salaries``), ``public.orders_\\d+`` the tables
``orders_<digits>`` of schema ``public``, ``^inv.(a|b)$`` tables ``a`` and ``b`` of ``inv``.
An alternative that does not start with a plain name (``.*\\.orders``, ``(a|b)\\..*``,
``sales\\..*``) is a regex over the whole unquoted ``schema.table``: write ``\\.`` there for a
literal dot. This applies alike to ``source.tables`` and to signals' ``data-collections``.

Limits: a name or pattern is at most ``MAX_SELECTOR_CHARS`` characters long.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import re2

# Characters that can only mean a pattern. A dot alone cannot (``public.orders`` is a name),
# and ``^`` and ``$`` are anchors only at the very start and the very end of the text.
_PATTERN_CHARS = frozenset("*+?[](){}|\\")
_QUOTES = '"`'

# Longer text is refused before any parsing: no table name comes close (PostgreSQL and MySQL
# cap an identifier at 63 bytes and 64 characters), and a pattern listing many tables as
# alternatives still fits. RE2 bounds the compiled pattern's memory on top of that.
MAX_SELECTOR_CHARS = 4096


class TableNameError(ValueError):
    """A table name or pattern that cannot be parsed; the message says why."""


def _is_bare_char(ch: str) -> bool:
    """Whether ``ch`` may appear in a bare part (``^`` and ``$`` have position rules too)."""
    return ch != "." and ch not in _QUOTES and ch not in _PATTERN_CHARS and not ch.isspace()


def _is_pattern(text: str) -> bool:
    """Whether stripped ``text`` holds a pattern character (quoted or not)."""
    return any(ch in _PATTERN_CHARS for ch in text) or text.startswith("^") or text.endswith("$")


def quote_part(part: str) -> str:
    """Quote one name part for display, only when it needs it (no SQL is built from this).

    A part stays bare only if it reads back as the same bare part wherever it stands in
    ``schema.table``, so a leading ``^`` or a trailing ``$`` (anchors at the ends of the
    text) is quoted too.
    """
    if (
        part
        and all(_is_bare_char(ch) for ch in part)
        and not part.startswith("^")
        and not part.endswith("$")
    ):
        return part
    return '"' + part.replace('"', '""') + '"'


@dataclass(frozen=True, slots=True, order=True)
class TableId:
    """One table: ``schema`` is None until resolved against the source's default schema."""

    schema: str | None
    table: str

    def __str__(self) -> str:
        if self.schema is None:
            return quote_part(self.table)
        return f"{quote_part(self.schema)}.{quote_part(self.table)}"

    def with_default_schema(self, schema: str) -> TableId:
        return self if self.schema is not None else TableId(schema, self.table)

    @property
    def qualified(self) -> str:
        """``schema.table`` unquoted, the string whole-name patterns are matched against."""
        if self.schema is None:
            raise TableNameError(f"table {self} has no schema yet")
        return f"{self.schema}.{self.table}"


# --- RE2 -----------------------------------------------------------------------------------


def _options() -> Any:
    options = re2.Options()
    # RE2 logs every pattern it cannot compile to stderr itself; the error is reported here.
    options.log_errors = False
    options.never_capture = True  # only whether it matches is asked
    return options


_OPTIONS = _options()
_FULL = re2._Anchor.ANCHOR_BOTH
_NO_MATCH = (-1, -1)

# What RE2 refuses that Python's re (and so Debezium's Java regexes) accept, by the start of
# RE2's error message, with the construct's name.
_UNSUPPORTED = (
    (re.compile(r"invalid escape sequence: \\[1-9]"), "a backreference (\\1)"),
    (re.compile(r"invalid escape sequence: \\k"), "a named backreference (\\k<name>)"),
    # RE2 names only "(?P" for (?P=name) (it reads (?P<name> fine).
    (re.compile(r"invalid perl operator: \(\?P(=|$)"), "a named backreference ((?P=name))"),
    (re.compile(r"invalid perl operator: \(\?[=!]"), "a lookahead ((?=...) or (?!...))"),
    (re.compile(r"invalid perl operator: \(\?<[=!]"), "a lookbehind ((?<=...) or (?<!...))"),
    (re.compile(r"invalid perl operator: \(\?>"), "an atomic group ((?>...))"),
    (re.compile(r"invalid perl operator: \(\?#"), "a comment group ((?#...))"),
    (re.compile(r"bad repetition operator: [*+?}]\+"), "a possessive quantifier (*+, ++, ?+)"),
    (re.compile(r"invalid escape sequence: \\Z"), "\\Z (write \\z or $)"),
)


class _Regex:
    """One RE2 regex, asked only whether it matches a whole text (in linear time)."""

    __slots__ = ("_compiled", "_low")

    def __init__(self, pattern: str, shown: str) -> None:
        try:
            self._compiled = re2.compile(pattern, _OPTIONS)
        except re2.error as exc:
            raise TableNameError(_compile_error(shown, exc)) from None
        # The public fullmatch builds a match object (~3 µs); the compiled RE2 answers the same
        # question directly (~0.6 µs), which matters when a pattern meets thousands of tables.
        self._low = getattr(self._compiled, "_regexp", None)

    def fullmatch(self, text: str) -> bool:
        if self._low is None:  # pragma: no cover - another google-re2 layout
            return self._compiled.fullmatch(text) is not None
        data = text.encode("utf-8", "surrogatepass")
        return bool(self._low.Match(_FULL, data, 0, len(data))[0] != _NO_MATCH)


def _compile_error(shown: str, exc: Exception) -> str:
    raw = exc.args[0] if exc.args else str(exc)
    reason = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    for pattern, construct in _UNSUPPORTED:
        if pattern.match(reason):
            return (
                f"{shown!r} is not a usable pattern: {construct} is not supported (patterns "
                "are RE2 regular expressions, matched in linear time: no backreferences, "
                "lookaround, atomic groups or possessive quantifiers)"
            )
    return f"{shown!r} is not a valid regular expression: {reason}"


# --- patterns ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Alternative:
    """One top-level alternative: a literal schema and a regex over the table name, or
    (``schema`` None) a regex over the whole ``schema.table``."""

    schema: str | None
    regex: _Regex

    def matches(self, table: TableId) -> bool:
        if self.schema is None:
            return self.regex.fullmatch(table.qualified)
        return table.schema == self.schema and self.regex.fullmatch(table.table)


@dataclass(frozen=True, slots=True)
class TablePattern:
    """A pattern as written, with its compiled alternatives (see the module docstring)."""

    pattern: str
    alternatives: tuple[_Alternative, ...] = field(compare=False, repr=False)

    def matches(self, table: TableId) -> bool:
        if table.schema is None:
            raise TableNameError(f"table {table} has no schema yet")
        return any(a.matches(table) for a in self.alternatives)

    @property
    def schemas(self) -> frozenset[str] | None:
        """The only schemas this pattern can select, or None when it may select any."""
        if any(a.schema is None for a in self.alternatives):
            return None
        return frozenset(a.schema for a in self.alternatives if a.schema is not None)

    def __str__(self) -> str:
        return self.pattern

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Compiled RE2 objects cannot be pickled or copied: compile the text again.
        return _pattern, (self.pattern,)


TableSelector = TableId | TablePattern

_FLAGS = re.compile(r"\(\?[imsU-]+\)")  # a flag group that sets flags until the group's end


def _alternatives(text: str) -> list[tuple[str, str]]:
    """Split a regex at its top-level ``|``, as RE2 reads it, into ``(inherited flags,
    alternative)``: flag groups such as ``(?i)`` set at the top level also hold for the
    alternatives after them, so those carry them."""
    parts: list[tuple[str, str]] = []
    flags = ""  # top-level flag groups seen so far, for the alternatives that follow
    carried = ""  # what the current alternative inherited
    depth = start = i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if text.startswith("\\Q", i):  # literal text up to \E
            end = text.find("\\E", i + 2)
            i = n if end < 0 else end + 2
        elif ch == "\\":
            i += 2
        elif ch == "[":
            i = _class_end(text, i)
        elif ch == "(":
            flag = _FLAGS.match(text, i) if depth == 0 else None
            if flag is not None:
                flags += flag.group()
                i = flag.end()
            else:
                depth += 1
                i += 1
        elif ch == ")":
            depth = max(0, depth - 1)
            i += 1
        elif ch == "|" and depth == 0:
            parts.append((carried, text[start:i]))
            carried = flags
            start = i = i + 1
        else:
            i += 1
    parts.append((carried, text[start:]))
    return parts


def _class_end(text: str, start: int) -> int:
    """The index just past the character class ``[...]`` opening at ``start``."""
    i, n = start + 1, len(text)
    if i < n and text[i] == "^":
        i += 1
    if i < n and text[i] == "]":  # a ] first in the class stands for itself
        i += 1
    while i < n:
        if text[i] == "\\":
            i += 2
        elif text.startswith("[:", i):  # [:alpha:] inside a class
            end = text.find(":]", i + 2)
            i = n if end < 0 else end + 2
        elif text[i] == "]":
            return i + 1
        else:
            i += 1
    return n


def _schema_prefix(alternative: str) -> tuple[str, str] | None:
    """``(schema, table regex)`` when the alternative starts with a plain name and a dot."""
    i = 1 if alternative.startswith("^") else 0
    start = i
    while i < len(alternative) and _is_bare_char(alternative[i]):
        i += 1
    if i == start or i >= len(alternative) or alternative[i] != ".":
        return None
    rest = alternative[i + 1 :]
    # ``sales.*``: the dot is the separator and also what the quantifier repeats.
    if rest[:1] in ("*", "+", "?") or re.match(r"\{\d", rest):
        rest = "." + rest
    return alternative[start:i], rest


def _pattern(text: str) -> TablePattern:
    _Regex(text, text)  # the whole pattern first: its error names the pattern as written
    compiled: list[_Alternative] = []
    for inherited, alternative in _alternatives(text):
        prefixed = _schema_prefix(alternative)
        if prefixed is None:
            compiled.append(_Alternative(None, _Regex(inherited + alternative, text)))
            continue
        schema, rest = prefixed
        if not rest:
            raise TableNameError(
                f"{text!r}: nothing follows the dot after schema {schema!r}; write "
                f"{schema}.* for all of its tables"
            )
        compiled.append(_Alternative(schema, _Regex(inherited + rest, text)))
    return TablePattern(text, tuple(compiled))


# --- parsing -------------------------------------------------------------------------------


def _split_parts(text: str) -> list[str] | None:
    """Split ``a."b.c".`d```  into parts; None if the text is not a plain dotted name."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] in _QUOTES:
            quote = text[i]
            i += 1
            part: list[str] = []
            while True:
                if i >= n:
                    raise TableNameError(f"unterminated {quote} quote in table name {text!r}")
                if text[i] == quote:
                    if i + 1 < n and text[i + 1] == quote:
                        part.append(quote)
                        i += 2
                        continue
                    i += 1
                    break
                part.append(text[i])
                i += 1
            if not part:
                raise TableNameError(f"empty quoted part in table name {text!r}")
            parts.append("".join(part))
        else:
            start = i
            while (
                i < n
                and _is_bare_char(text[i])
                and not (i == 0 and text[i] == "^")
                and not (i == n - 1 and text[i] == "$")
            ):
                i += 1
            if i == start:
                return None
            parts.append(text[start:i])
        if i == n:
            return parts
        if text[i] != ".":
            return None
        i += 1


def parse_table_name(text: str) -> TableId:
    """Parse an exact table name; raises TableNameError for patterns or bad names."""
    selector = parse_table_selector(text)
    if isinstance(selector, TablePattern):
        raise TableNameError(f"{text!r} is a pattern, but an exact table name is needed here")
    return selector


def _check_text(text: str) -> None:
    if len(text) > MAX_SELECTOR_CHARS:
        raise TableNameError(
            f"{text[:40]!r}... is {len(text)} characters long; a table name or pattern has at "
            f"most {MAX_SELECTOR_CHARS}"
        )
    if any("\ud800" <= ch <= "\udfff" for ch in text):
        raise TableNameError(f"{text!r} holds a lone surrogate, which is not valid Unicode text")


def parse_table_selector(text: str) -> TableSelector:
    """Parse a ``data-collections`` (or ``source.tables``) entry into a name or a pattern."""
    _check_text(text)
    stripped = text.strip()
    if not stripped:
        raise TableNameError("empty table name")
    # Whatever spells a plain dotted name is one, even with pattern characters inside its
    # quoted parts (``public."a$b"``, as ``str(TableId)`` writes it); the rest is a pattern.
    must_be_name = stripped[0] in _QUOTES or not _is_pattern(stripped)
    try:
        parts = _split_parts(stripped)
    except TableNameError:
        if must_be_name:
            raise
        parts = None  # a pattern with a literal quote in it, such as ``public\."x.*``
    if must_be_name or parts is not None:
        if parts is None:
            raise TableNameError(
                f'{text!r} is neither a table name (schema.table, with "quoted" parts where '
                "needed) nor a pattern"
            )
        if len(parts) == 1:
            return TableId(None, parts[0])
        if len(parts) == 2:
            return TableId(parts[0], parts[1])
        raise TableNameError(
            f"{text!r} has {len(parts)} parts; use schema.table (quote a part that contains "
            'a dot: "public"."My.Table")'
        )
    return _pattern(stripped)


# --- many tables at once -------------------------------------------------------------------


class TableSet:
    """Known tables (a catalog listing), for resolving many selectors in one go: membership
    is a hash lookup, and a pattern whose alternatives all name a schema is tried only on
    that schema's tables."""

    def __init__(self, tables: Iterable[TableId]) -> None:
        self._tables = frozenset(tables)
        self._sorted = sorted(t for t in self._tables if t.schema is not None)
        by_schema: defaultdict[str, list[TableId]] = defaultdict(list)
        for table in self._sorted:
            by_schema[table.schema or ""].append(table)
        self._by_schema = dict(by_schema)

    def __contains__(self, table: object) -> bool:
        return table in self._tables

    def __len__(self) -> int:
        return len(self._tables)

    def __iter__(self) -> Iterator[TableId]:
        return iter(self._sorted)

    def matching(self, pattern: TablePattern) -> list[TableId]:
        """The tables ``pattern`` selects, sorted."""
        schemas = pattern.schemas
        if schemas is None:
            candidates: Iterable[TableId] = self._sorted
        else:
            candidates = sorted(t for s in schemas for t in self._by_schema.get(s, ()))
        return [t for t in candidates if pattern.matches(t)]
