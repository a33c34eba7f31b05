"""A guard for ``additional-conditions`` filters, which are SQL by design.

The engine appends a filter to its chunk query as ``AND (<filter>)``, so that an ``OR`` inside
it cannot widen the key range. ``check_filter`` refuses a filter that could reach outside
those parentheses or chain statements: a ``)`` that closes more than the filter opened, an
unclosed ``(``, ``;``, a comment (``--``, ``/*``, ``*/``, ``#``) outside quoted text, an
unterminated quote, or a filter that is only whitespace. It prevents accidental widening; it
is not a sandbox: an accepted filter still runs as snapshotter's database user (read-only).

Quoted text is skipped as both PostgreSQL and MySQL read it:

* ``'...'`` strings, with ``''`` for a quote. A backslash escapes the next character, as in
  MySQL by default; PostgreSQL reads a backslash as itself, so the two disagree about where
  ``'it\\'s'`` ends. Such a filter is refused (write ``'it''s'``), so both read it alike.
* ``"..."`` with ``""`` for a quote (an identifier, or a string in MySQL's default mode, where
  backslash escapes apply: the same rule as above).
* backtick-quoted identifiers (MySQL), with a doubled backtick for one.
* PostgreSQL dollar quotes ``$$...$$`` and ``$tag$...$tag$``. Right after a name or number
  character (``a$$``) PostgreSQL may read ``$`` as part of the name, so a dollar quote there is
  refused as ambiguous. MySQL has no dollar quotes (``$`` is a name character there): pass
  ``dollar_quotes=False`` to check a filter the way MySQL reads it.
"""

from __future__ import annotations

from collections.abc import Iterator


class FilterError(ValueError):
    """A filter the guard refuses; the message says why."""


_QUOTE_NAMES = {"'": "' string", '"': '" quoted name', "`": "` quoted name"}
# Forbidden outside quoted text, each with why.
_FORBIDDEN = {
    ";": "would end the statement: a filter is one condition",
    "--": "starts a comment; a filter must not contain comments",
    "/*": "starts a comment; a filter must not contain comments",
    "*/": "ends a comment; a filter must not contain comments",
    "#": "starts a comment in MySQL; a filter must not contain comments",
}


def _is_name_char(ch: str) -> bool:
    """A character PostgreSQL may continue a name (or number) with: ``$`` included."""
    return not ch.isascii() or ch.isalnum() or ch in "_$"


def _is_tag_start(ch: str) -> bool:
    return not ch.isascii() or ch.isalpha() or ch == "_"


def _is_tag_char(ch: str) -> bool:
    return not ch.isascii() or ch.isalnum() or ch == "_"


def _quote_end(sql: str, start: int) -> int:
    """The index just past the ``'``, ``"`` or backtick quoted text that starts at ``start``."""
    quote = sql[start]
    i, n = start + 1, len(sql)
    while i < n:
        ch = sql[i]
        if ch == quote:
            if i + 1 < n and sql[i + 1] == quote:
                i += 2
                continue
            return i + 1
        if ch == "\\" and quote != "`":
            if i + 1 < n and sql[i + 1] == quote:
                raise FilterError(
                    f"backslash before {quote} at character {i + 1}: MySQL reads it as an "
                    f"escaped quote, PostgreSQL as the end of the quoted text; write the "
                    f"quote twice ({quote}{quote}) instead"
                )
            i += 2
            continue
        i += 1
    raise FilterError(f"unterminated {_QUOTE_NAMES[quote]} starting at character {start + 1}")


def _dollar_delimiter(sql: str, start: int, code_start: int) -> str | None:
    """The ``$tag$`` that opens a dollar quote at ``start``, or None if none opens there."""
    i, n = start + 1, len(sql)
    if i < n and _is_tag_start(sql[i]):
        i += 1
        while i < n and _is_tag_char(sql[i]):
            i += 1
    if i >= n or sql[i] != "$":
        return None
    delimiter = sql[start : i + 1]
    word = start
    while word > code_start and _is_name_char(sql[word - 1]):
        word -= 1
    if word == start:
        return delimiter
    if _is_tag_start(sql[word]):
        return None  # ``a$$``: PostgreSQL reads one name, as MySQL does.
    # After a number or a parameter (``1$$``, ``$1$$``) PostgreSQL versions disagree.
    raise FilterError(
        f"{delimiter} at character {start + 1} directly follows {sql[word:start]!r}, so it may "
        "be read as a dollar quote or as part of it; put a space before the dollar quote"
    )


def unquoted_spans(sql: str, *, dollar_quotes: bool = True) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` slices of ``sql`` outside quoted text, in order, one at a time.

    Raises ``FilterError``, once the slices before it are out, at an unterminated quote, or a
    quote that PostgreSQL and MySQL would end in different places.
    """
    i = code_start = 0
    n = len(sql)
    while i < n:
        ch = sql[i]
        delimiter = None
        if ch == "$" and dollar_quotes:
            try:
                delimiter = _dollar_delimiter(sql, i, code_start)
            except FilterError:
                if code_start < i:
                    yield code_start, i
                raise
        if ch not in _QUOTE_NAMES and delimiter is None:
            i += 1
            continue
        # The code before the quote first, so that its problems are reported first.
        if code_start < i:
            yield code_start, i
        if delimiter is None:
            end = _quote_end(sql, i)
        else:
            close = sql.find(delimiter, i + len(delimiter))
            if close < 0:
                raise FilterError(
                    f"unterminated dollar quote {delimiter} starting at character {i + 1}"
                )
            end = close + len(delimiter)
        i = code_start = end
    if code_start < n:
        yield code_start, n


def check_filter(sql: str, *, dollar_quotes: bool = True) -> None:
    """Raise ``FilterError`` unless ``AND (<sql>)`` keeps ``sql`` inside its parentheses."""
    if not sql.strip():
        raise FilterError("the filter is empty")
    opened: list[int] = []
    # Span by span, so that the problem reported is the first in the text.
    for start, end in unquoted_spans(sql, dollar_quotes=dollar_quotes):
        for i in range(start, end):
            ch = sql[i]
            if ch == "(":
                opened.append(i)
            elif ch == ")":
                if not opened:
                    raise FilterError(
                        f"')' at character {i + 1} closes a parenthesis the filter did not "
                        "open; the filter is wrapped as AND (<filter>) and must stay inside"
                    )
                opened.pop()
            for text, why in _FORBIDDEN.items():
                if sql.startswith(text, i) and i + len(text) <= end:
                    raise FilterError(f"{text!r} at character {i + 1} {why}")
    if opened:
        raise FilterError(f"'(' at character {opened[-1] + 1} is never closed")
