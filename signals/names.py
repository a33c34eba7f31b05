"""Table names as signals spell them: ``schema.table``, ``table``, quoted parts, regex patterns.

A name made only of identifier parts names exactly one table; anything else is a regular
expression matched against the whole ``schema.table`` name, as Debezium matches
``data-collections``. A part is bare (any run of characters other than ``.``, quotes,
whitespace and the pattern characters, so ``2024_orders``, ``my-db`` and ``my$table`` are
parts) or quoted with ``"`` or a backtick, where a doubled quote stands for itself. The
pattern characters are ``* + ? [ ] ( ) { } | \\``, plus ``^`` at the very start of the text and
``$`` at the very end (regex anchors); elsewhere ``^`` and ``$`` are part of a name. Names are
case-sensitive, as in Debezium: they are matched against the catalog's stored spelling, which
for PostgreSQL is lower case unless the table was created with a quoted name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Characters that can only mean a pattern. A dot alone cannot (``public.orders`` is a name),
# and ``^`` and ``$`` are anchors only at the very start and the very end of the text.
_PATTERN_CHARS = frozenset("*+?[](){}|\\")
_QUOTES = '"`'


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
        """``schema.table`` unquoted, the string patterns are matched against."""
        if self.schema is None:
            raise TableNameError(f"table {self} has no schema yet")
        return f"{self.schema}.{self.table}"


@dataclass(frozen=True, slots=True)
class TablePattern:
    """A regular expression that must match the whole unquoted ``schema.table``."""

    pattern: str
    regex: re.Pattern[str]

    def matches(self, table: TableId) -> bool:
        return self.regex.fullmatch(table.qualified) is not None

    def __str__(self) -> str:
        return self.pattern


TableSelector = TableId | TablePattern


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


def parse_table_selector(text: str) -> TableSelector:
    """Parse a ``data-collections`` entry into an exact name or a pattern."""
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
    try:
        regex = re.compile(stripped)
    except re.error as exc:
        raise TableNameError(f"{text!r} is not a valid regular expression: {exc}") from None
    return TablePattern(stripped, regex)
