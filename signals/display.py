"""Showing untrusted text (signal ids, messages, table names from signal rows) safely.

Anyone who can insert into the signal table chooses that text. Written raw into a log line,
the ``status`` table or an error, a newline forges a line of its own, an ANSI escape
rewrites the terminal, and a bidi control reorders what the reader sees. ``printable``
escapes every such character the way Python writes it in a literal (``\\n``, ``\\x1b``,
``\\u202e``), so the text stays on its line and reads as what it is; the rest is unchanged.
"""

from __future__ import annotations

import logging
import unicodedata
from functools import lru_cache

# Controls (C0, DEL, C1), format characters (bidi embeddings, overrides and isolates,
# zero-width characters, the BOM), line and paragraph separators, and lone surrogates
# (which cannot even be encoded).
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


@lru_cache(maxsize=4096)
def _escape(ch: str) -> str:
    if ch in _SHORT:
        return _SHORT[ch]
    if unicodedata.category(ch) not in _ESCAPED_CATEGORIES:
        return ch
    code = ord(ch)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object, limit: int | None = None) -> str:
    """``text`` (``str()`` of it) with control, format and separator characters escaped,
    cut to ``limit`` characters (before escaping) with a note of how much was left out."""
    value = text if isinstance(text, str) else str(text)
    cut = ""
    if limit is not None and len(value) > limit:
        cut = f"... ({len(value) - limit} more characters)"
        value = value[:limit]
    if value.isprintable():  # the common case: nothing to escape (spaces are printable)
        return value + cut
    return "".join(_escape(ch) for ch in value) + cut


class EscapeControls(logging.Filter):
    """A logging filter that escapes control characters in the finished message, so no
    argument (a signal id, a message, a table name) can forge or hide log lines. Attach it
    to a logger whose messages are one line each; tracebacks are not touched."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.isprintable():
            record.msg = printable(message)
            record.args = None
        return True
