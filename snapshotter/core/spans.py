"""Key ranges of one table's snapshot: which range each chunk reads, and what progress records.

A snapshot pages its table by key, from the last durable key (``TableProgress.last_read_key``,
exclusive; the table's start on a first run) to the maximum key recorded at the start. The
plan cuts that into *spans*, consecutive key ranges ``(after, upto]``, each read by one chunk
in one DBLog window. A span is planned in one of two ways:

* OPEN (``[source] read_parallelism = 1``, as before this module): read at most
  ``chunk_size`` rows after ``after``; the span ends at the last key the read returned (or at
  the end, when it returned fewer rows). The next span can only be planned once that read
  is back.
* BOUND (``read_parallelism`` > 1): first find where the span ends (the key ``chunk_size``
  rows after ``after``, a query on the key's index, ``Dialect.chunk_bound``), then read the
  closed range whole. The next span is planned as soon as the bound is known, so several
  reads are in flight at once, each in a window of its own.

A span whose read did not complete (a lost connection, a cancelled query, a window given up
to a forged watermark row, a PostgreSQL snapshot the visibility history cannot check) is read
again as a CLOSED range, ``(after, upto]`` whole, under a new window; if its end was not known
yet, the plan simply starts again from its start.

Why closed ranges read by overlapping windows are as correct as DBLog's one-at-a-time chunks:

1. The spans partition the key space: span i is ``(after_i, upto_i]`` and
   ``after_{i+1} = upto_i``; the first starts at the durable key, the last ends at the
   maximum key. Bounds are key *values*, not rows: every key in ``(start, max]`` belongs to
   exactly one span, whatever rows are inserted, deleted or re-keyed while the snapshot runs.
   A bound found at one moment only decides where a span ends. The database compares both
   spans against the same bound value, so even a bound that no longer exists as a row (it was
   deleted since) or that is not a stored value at all leaves no key out and none twice.
2. Each span is read entirely inside its own window, by the chunk rules of
   ``snapshotter.engine.workers``: one SELECT of every row with ``after < key <= upto`` under
   the filter, in one transaction that begins after the window's open watermark committed and
   ends before its close watermark is written. Rows inserted into the range after its bound
   was found are read; rows deleted are not. So each key of the span has DBLog's guarantee
   from that window alone: its READ row is emitted at the close unless a log event of the key
   lies between the watermarks; events before the open were visible to the SELECT (on
   PostgreSQL the visibility history drops what its snapshot missed); events after the close
   reach the sink after the READ row.
3. Windows of different spans overlap in time; that is fine because a window's drops are per
   key and every log event of the table is fed to every open window. A key change from
   ``k1`` (span A) to ``k2`` (span B) drops ``k1`` from A's window and ``k2`` from B's if they
   are open; a window that opens later reads the row under its new key after the change; one
   that closed before emitted its READ row before the change reaches the sink.
4. Output order: each window's READ batch is emitted at its own close watermark (the output
   barrier), so batches of different spans leave in the order their closes are in the log,
   not in key order. They hold disjoint keys, so no key's events change order.
5. Memory: a closed range read whole could have grown without bound (inserts between its
   bound and its read). The read takes at most ``range_read_limit(chunk_size)`` rows, in key
   order; if it returned that many, the span covered only up to the last key it returned
   (every row up to there was read), and the rest, ``(last, upto]``, becomes a span of its
   own, read later in its own window.
6. Progress only advances over the contiguous prefix of spans whose batches were emitted
   (``closed`` returns them in key order): a span whose window closed before an earlier
   one's waits. State saved at any checkpoint therefore names a key below which every span's
   READ rows are in the sink; after a crash the spans beyond it are read again (READ rows
   emitted twice, the later copy read later: output still converges), never skipped. How
   far reads may run ahead of the durable key is bounded (``max_ahead`` spans), so one slow
   read cannot make a crash cost more than that many chunks read again.

Pure logic: no IO; the engine drives it from its thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from snapshotter.core.keys import Key

# A closed range is read whole, up to this many times ``chunk_size`` rows (see 5. above).
RANGE_READ_FACTOR = 2


def range_read_limit(chunk_size: int) -> int:
    """The most rows one read of a closed range takes (see the module docstring, 5.)."""
    return RANGE_READ_FACTOR * chunk_size


class SpanRead(StrEnum):
    """How a span's chunk is read."""

    OPEN = "open"  # at most chunk_size rows after ``after``; the read's last key ends it
    BOUND = "bound"  # find the key chunk_size rows on first, then read that range whole
    CLOSED = "closed"  # the range (after, upto] whole (its end known)


@dataclass(frozen=True, slots=True)
class SpanDone:
    """What progress records for one span, in key order (``TableProgress.chunk_done``)."""

    number: int
    last_key: Key | None  # where the next span starts; None only for an empty last span
    selected: int
    emitted: int
    final: bool


@dataclass(slots=True)
class Span:
    number: int  # the chunk number, for logs and phase hooks
    after: Key | None  # exclusive; None: from the table's start
    upto: Key | None = None  # inclusive; known once ``bounded``
    bounded: bool = False
    final: bool = False  # the last span: it ends at the maximum key
    window: str | None = None  # the window reading it now; None: waiting to be read (again)
    read: SpanRead = SpanRead.OPEN  # how its current (or last) read goes
    done: SpanDone | None = None  # its window closed and its batch was emitted


class SpanPlan:
    """The spans of one table's snapshot from ``start`` (see the module docstring).

    ``take`` hands out the span to read next; ``bounded`` (a BOUND span's end, found before
    its read; an OPEN span's end, learnt from its read), ``closed`` (the window's batch was
    emitted) and ``void`` (its read will not complete) follow what happened to it."""

    def __init__(
        self,
        start: Key | None,
        first_number: int,
        max_key: Key,
        chunk_size: int,
        *,
        bound_ahead: bool,
        max_ahead: int = 16,
    ) -> None:
        if max_ahead < 1:
            raise ValueError("max_ahead must be at least 1")
        self.max_key = max_key
        self.chunk_size = chunk_size
        self.bound_ahead = bound_ahead
        self.max_ahead = max_ahead  # spans not yet recorded, at most (module docstring, 6.)
        self._spans: list[Span] = []  # in key order; those before are recorded in progress
        self._frontier = start  # where the next new span starts
        self._frontier_open = True  # False while the newest span's end is unknown
        self.exhausted = False  # the last span (up to the maximum key) is planned
        self.next_number = first_number

    # --- queries --------------------------------------------------------------------------

    def span_of(self, window_id: str) -> Span | None:
        for span in self._spans:
            if span.window == window_id:
                return span
        return None

    # --- what happens to spans ------------------------------------------------------------

    def take(self, window_id: str) -> Span | None:
        """The span to read next under the window ``window_id``: the first one waiting to be
        read again, else a new span at the frontier (when its start is known, the end not
        reached, and fewer than ``max_ahead`` spans wait to be recorded); None when none can
        be read now."""
        for span in self._spans:
            if span.window is None and span.done is None:
                span.window = window_id
                # Its end is known (a span whose end was not is dropped when voided); only an
                # empty last OPEN span has none: read it open again.
                span.read = SpanRead.CLOSED if span.upto is not None else SpanRead.OPEN
                return span
        if not self._frontier_open or self.exhausted or len(self._spans) >= self.max_ahead:
            return None
        span = Span(
            self.next_number,
            self._frontier,
            window=window_id,
            read=SpanRead.BOUND if self.bound_ahead else SpanRead.OPEN,
        )
        self.next_number += 1
        self._spans.append(span)
        self._frontier_open = False
        return span

    def bounded(self, window_id: str, upto: Key | None, final: bool) -> None:
        """The end of the newest span is known: ``upto`` (None only for an empty last OPEN
        span), ``final`` when it is the last one. A span already bounded (an OPEN span whose
        close came before its read's answer) or no longer planned is left alone."""
        span = self.span_of(window_id)
        if span is None or span.bounded:
            return
        if upto is None and not final:
            raise ValueError(f"span {span.number}: only the last span may end without a key")
        if span is not self._spans[-1]:
            raise ValueError(f"span {span.number} is bounded but is not the newest span")
        span.upto, span.final, span.bounded = upto, final, True
        self._frontier = upto
        self._frontier_open = True
        self.exhausted = final

    def read_open(self, window_id: str, selected: int, last_key: Key | None) -> None:
        """An OPEN span's read returned ``selected`` rows ending at ``last_key``: that ends
        the span; the last one when fewer rows than asked came back, or it reached the
        maximum key (equality only: keys are never ordered in Python)."""
        final = selected < self.chunk_size or last_key is None or last_key == self.max_key
        self.bounded(window_id, last_key, final)

    def closed(
        self,
        window_id: str,
        *,
        selected: int,
        emitted: int,
        last_key: Key | None,
        covered: Key | None = None,
    ) -> list[SpanDone]:
        """The window's close watermark was handled and its batch emitted (``selected`` rows
        read, ``emitted`` survived, ``last_key`` the last key read). ``covered``: the read
        says itself that it covered the span only up to this key (a read split into
        sub-ranges, one of which reached its limit); the rest becomes a span of its own.
        Returns what progress may record now: the spans at the head of the plan whose
        batches are all emitted, in key order (empty when an earlier span is still being
        read)."""
        span = self.span_of(window_id)
        if span is None or span.done is not None:
            raise ValueError(f"window {window_id} reads no span of this plan")
        if not span.bounded:
            if span.read is not SpanRead.OPEN:
                # Its bound was sent before its open watermark was written: the engine takes
                # it in before it handles the close.
                raise ValueError(
                    f"span {span.number}: a {span.read.value} span must be bounded before "
                    "its window closes"
                )
            # An OPEN read whose answer has not come yet (the log was faster): the batch
            # tells the same.
            self.read_open(window_id, selected, last_key)
        elif span.read is not SpanRead.OPEN and (
            (covered is not None and covered != span.upto)
            or (
                covered is None
                and selected >= range_read_limit(self.chunk_size)
                and last_key is not None
                and last_key != span.upto
            )
        ):
            # The range grew past the read's limit: this read covered it up to its last
            # key; the rest is a span of its own (module docstring, 5.).
            end = covered if covered is not None else last_key
            assert end is not None
            rest = Span(self.next_number, end, span.upto, bounded=True, final=span.final)
            self.next_number += 1
            self._spans.insert(self._spans.index(span) + 1, rest)
            span.upto, span.final = end, False
        recorded = last_key if span.read is SpanRead.OPEN else span.upto
        span.done = SpanDone(span.number, recorded, selected, emitted, span.final)
        span.window = None
        out: list[SpanDone] = []
        while self._spans and self._spans[0].done is not None:
            done = self._spans.pop(0).done
            assert done is not None
            out.append(done)
        return out

    def void(self, window_id: str) -> bool:
        """The window's read will not complete (or its window was given up): its span is
        read again under a new window, or, if its end was not known yet, planned again from
        its start. False when the window reads no span (already voided, or its close was
        handled: nothing to read again)."""
        span = self.span_of(window_id)
        if span is None or span.done is not None:
            return False
        span.window = None
        if not span.bounded:
            # Only the newest span can be without an end (the next is planned from it).
            self._spans.remove(span)
            self._frontier = span.after
            self._frontier_open = True
            if span.number == self.next_number - 1:
                self.next_number -= 1  # the same number again, as before parallel reads
        return True

    @property
    def finished(self) -> bool:
        """Every span up to the maximum key is recorded."""
        return self.exhausted and not self._spans
