"""Forged and out-of-order watermark rows (core/window.py ChunkWindow.judge)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from signals import parse_signal
from signals.model import Watermark, WatermarkKind, to_row
from signals.names import TableId
from snapshotter.core.position import Position
from snapshotter.core.window import ChunkWindow, WatermarkVerdict

OPEN, CLOSE = WatermarkKind.OPEN, WatermarkKind.CLOSE


def window() -> ChunkWindow:
    return ChunkWindow(str(uuid.uuid4()), TableId("s", "t"), ["id"])


def forged(w: ChunkWindow, kind: WatermarkKind, token: str | None = None) -> Watermark:
    return Watermark(w.window_id, kind, token)


def _pos(n: int) -> Position:
    return Position(n, 0)


def test_own_rows_in_order_are_acted_on():
    w = window()
    assert w.judge(w.watermark(OPEN)) == (WatermarkVerdict.OWN, "")
    w.open(_pos(1))
    w.fill(pa.table({"id": [1, 2]}))
    assert w.judge(w.watermark(CLOSE)) == (WatermarkVerdict.OWN, "")


def test_own_rows_survive_the_signal_table_round_trip():
    w = window()
    for kind in (OPEN, CLOSE):
        parsed = parse_signal(*to_row(w.watermark(kind)))
        assert isinstance(parsed, Watermark)
        assert parsed == w.watermark(kind)


def test_tokens_are_secret_per_window_and_row():
    a, b = window(), window()
    tokens = {a.watermark(OPEN).token, a.watermark(CLOSE).token, b.watermark(OPEN).token}
    assert len(tokens) == 3 and all(t and len(t) == 32 for t in tokens)


@pytest.mark.parametrize("token", [None, "", "0" * 32, "guess", "é" * 32])
def test_a_forged_close_before_the_rows_are_buffered_blocks_the_window(token):
    w = window()
    w.open(_pos(1))
    verdict, why = w.judge(forged(w, CLOSE, token))
    assert verdict is WatermarkVerdict.BLOCKING and "did not write" in why


def test_a_forged_close_after_the_rows_are_buffered_is_not_acted_on_either():
    # Its log position says nothing about when the chunk SELECT ran (core.window).
    w = window()
    w.open(_pos(1))
    w.fill(pa.table({"id": [1]}))
    assert w.judge(forged(w, CLOSE))[0] is WatermarkVerdict.BLOCKING
    assert w.judge(forged(w, CLOSE, w.watermark(OPEN).token))[0] is WatermarkVerdict.BLOCKING


def test_a_close_before_the_open_blocks_the_window():
    w = window()
    assert w.judge(forged(w, CLOSE))[0] is WatermarkVerdict.BLOCKING
    # Even with the right token the window cannot complete in order.
    verdict, why = w.judge(w.watermark(CLOSE))
    assert verdict is WatermarkVerdict.BLOCKING and "before its open row" in why


def test_a_forged_open_before_the_own_one_blocks_the_window():
    w = window()
    verdict, why = w.judge(forged(w, OPEN, "x"))
    assert verdict is WatermarkVerdict.BLOCKING and "did not write" in why


def test_an_open_twice_is_a_stray():
    w = window()
    w.open(_pos(1))
    for row in (w.watermark(OPEN), forged(w, OPEN)):
        verdict, why = w.judge(row)
        assert verdict is WatermarkVerdict.STRAY and "already open" in why
