"""Untrusted signal text shown safely (signals/display.py)."""

from __future__ import annotations

import logging
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from signals.display import EscapeControls, printable


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, ünïcödé, 表, emoji 🎉", "plain text, ünïcödé, 表, emoji 🎉"),
        ("two\nlines", "two\\nlines"),
        ("cr\rlf\r\n", "cr\\rlf\\r\\n"),
        ("tab\there", "tab\\there"),
        ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
        ("bell\x07 nul\x00 del\x7f", "bell\\x07 nul\\x00 del\\x7f"),
        ("c1 \x85 \x9b", "c1 \\x85 \\x9b"),
        ("bidi \u202eevil\u202c \u2066x\u2069", "bidi \\u202eevil\\u202c \\u2066x\\u2069"),
        (
            "rlm\u200f lrm\u200e zwsp\u200b bom\ufeff",
            "rlm\\u200f lrm\\u200e zwsp\\u200b bom\\ufeff",
        ),
        ("line sep\u2028para\u2029", "line sep\\u2028para\\u2029"),
        ("lone \ud800", "lone \\ud800"),
        ("no-break\u00a0space", "no-break\u00a0space"),
    ],
)
def test_printable(text, shown):
    assert printable(text) == shown


def test_printable_cuts_long_text():
    assert printable("x" * 10, limit=4) == "xxxx... (6 more characters)"
    assert printable("a\nb", limit=10) == "a\\nb"


def test_printable_takes_any_object():
    assert printable(42) == "42"


_UNSAFE = {"Cc", "Cf", "Zl", "Zp", "Cs"}


@settings(max_examples=500, deadline=None)
@given(st.text())
def test_printable_leaves_no_unsafe_character(text):
    shown = printable(text)
    assert not any(unicodedata.category(ch) in _UNSAFE for ch in shown)
    if text.isprintable():
        assert shown == text


def test_the_log_filter_escapes_the_finished_message(caplog):
    logger = logging.getLogger("test.display")
    logger.addFilter(EscapeControls())
    caplog.set_level(logging.INFO, logger="test.display")
    logger.info("log signal %s: %s", "id\n2025 ERROR forged", "\x1b[2Jcleared")
    logger.info("plain %d", 5)
    assert caplog.messages == [
        "log signal id\\n2025 ERROR forged: \\x1b[2Jcleared",
        "plain 5",
    ]
    assert len(caplog.text.splitlines()) == 2  # no forged third line
