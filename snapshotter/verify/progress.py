"""Progress lines for a long ``verify``: one every few seconds, so a large file or table is
not minutes of silence (reading a 1.5M-event file takes minutes on a small machine)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

log = logging.getLogger("snapshotter.verify")

T = TypeVar("T")

EVERY_S = 5.0  # seconds between lines
CHECK_EVERY = 10_000  # items between looks at the clock (a clock read per item costs)


class Ticker:
    """Counts items; logs ``what`` with the count and the rate every ``EVERY_S``."""

    def __init__(
        self,
        what: str,
        total_bytes: int | None = None,
        done_bytes: Callable[[], int] | None = None,
    ) -> None:
        """``done_bytes``: how far into the file the reading is (its ``tell``), asked only
        when a line is logged: nothing per item beyond the count."""
        self.what = what
        self.total_bytes = total_bytes
        self.done_bytes = done_bytes
        self.items = 0
        self.started = self.last = time.monotonic()

    def tick(self) -> None:
        self.items += 1
        if self.items % CHECK_EVERY:
            return
        now = time.monotonic()
        if now - self.last < EVERY_S:
            return
        self.last = now
        rate = self.items / max(now - self.started, 1e-9)
        share = ""
        if self.done_bytes is not None and self.total_bytes:
            share = f", {100 * self.done_bytes() / self.total_bytes:.0f}% of the file"
        log.info("verify: %s %d so far (%.0f/s%s)", self.what, self.items, rate, share)


def ticking(items: Iterable[T], what: str) -> Iterator[T]:
    """``items``, with a progress line every few seconds."""
    ticker = Ticker(what)
    for item in items:
        ticker.tick()
        yield item
