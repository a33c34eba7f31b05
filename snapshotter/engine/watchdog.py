"""What the log no longer carries, watched while the engine runs.

A source's log can stop carrying what the engine needs while it runs: a Spanner change
stream altered to watch fewer tables, a publication that lost a table. Then a captured
table's changes are missing without a word, or, when the signal table is the one lost, no
watermark arrives and a snapshot waits forever. The engine asks the source
(``Connector.log_coverage_problems``, through :class:`LogCoverage`):

* every ``CHECK_EVERY_S`` seconds, on a thread of its own (the stream never waits for it);
* as soon as a chunk window has waited ``overdue_after(chunk_timeout_s)`` for its close
  watermark after the worker wrote it (for every source, also one that checks nothing).

A problem stops the engine with the source's lines (:class:`LogCoverageError`): the state
keeps the last checkpoint, nothing past what the sink has. No problem, and a window still
overdue: a warning naming the window, its table and how long it has waited, and the engine
keeps waiting (a slow or far-behind log is not an error).

:class:`Watchdog` decides when to ask and what an answer means, and does no IO (unit-tested
with a clock of its own); :class:`CoverageWatch` runs the asking.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from signals.names import TableId
from snapshotter.engine.scheduler import Flight
from snapshotter.sources.log import LogReaderError
from snapshotter.sources.positions import error_reason, name_config

log = logging.getLogger("snapshotter.engine")

CHECK_EVERY_S = 45.0  # how often the source is asked while the engine runs
OVERDUE_MIN_S = 60.0  # a close watermark waited for this long, at least, is overdue


def overdue_after(chunk_timeout_s: float) -> float:
    """How long a window may wait for its close watermark once the worker has written it:
    a minute, or as long as a chunk query may run, whichever is longer."""
    return max(OVERDUE_MIN_S, chunk_timeout_s)


class LogCoverageError(LogReaderError):
    """The log no longer carries what the engine needs; the message says what and the fix."""

    def for_config(self, config: str) -> str:
        """The message naming the config file where it says ``-c CONF``."""
        return name_config(str(self), config)


def coverage_message(problems: Sequence[str], found: str | None) -> str:
    """The error's text, one problem a line; ``found``: what made the running engine ask
    (None: the check before streaming)."""
    lines = "\n".join(f"  {p}" for p in problems)
    if found is None:
        return f"the source's log does not carry what the engine needs; not starting:\n{lines}"
    return (
        f"the source's log no longer carries what the engine needs ({found}); stopped, with "
        f"the state at the last checkpoint:\n{lines}"
    )


class LogCoverage(Protocol):
    """What the engine asks (``snapshotter.app.coverage`` builds it from the connector)."""

    def problems(self) -> list[str]:
        """The source's coverage problems, one line each; [] when there are none. Runs on
        the watch's thread; may raise (the source is unreachable: asked again later)."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Overdue:
    """A window that has waited too long for its close watermark."""

    window_id: str
    table: TableId
    waited_s: float

    def found(self) -> str:
        return (
            f"chunk window {self.window_id} of {self.table} waited {self.waited_s:.0f} s for "
            "its close watermark"
        )

    def warning(self, asked: bool) -> str:
        """``asked``: whether the source answered (and reported nothing missing)."""
        source = (
            "the source reports nothing missing from its log"
            if asked
            else "the source could not be asked what its log lacks"
        )
        return (
            f"chunk window {self.window_id} of {self.table} has waited {self.waited_s:.0f} s "
            f"for its close watermark in the log, and {source}; still waiting (the log may "
            "be slow or far behind)"
        )


@dataclass(frozen=True, slots=True)
class CoverageVerdict:
    stop: str | None = None  # the reason to stop the engine with
    warnings: list[str] = field(default_factory=list)


class Watchdog:
    """When to ask the source, and what its answer means (pure: times are passed in)."""

    def __init__(self, *, every_s: float, overdue_after_s: float) -> None:
        self.every_s = every_s
        self.overdue_after_s = overdue_after_s
        self._last_asked: float | None = None
        self._waiting: dict[str, tuple[TableId, float]] = {}  # window -> table, since when
        self._reported: dict[str, float] = {}  # window -> how long it had waited when asked

    def tick(self, now: float, waiting: Mapping[str, TableId]) -> list[Overdue] | None:
        """Note the windows ``waiting`` for their close watermark (their worker wrote it);
        whether to ask the source now: the windows newly overdue (each again every
        ``overdue_after_s``), [] for the periodic check, None not to ask."""
        for window_id in list(self._waiting):
            if window_id not in waiting:
                del self._waiting[window_id]
                self._reported.pop(window_id, None)
        overdue = []
        for window_id, table in waiting.items():
            _, since = self._waiting.setdefault(window_id, (table, now))
            waited = now - since
            last = self._reported.get(window_id, 0.0)
            if waited >= self.overdue_after_s and waited - last >= self.overdue_after_s:
                overdue.append(Overdue(window_id, table, waited))
        if self._last_asked is None:
            self._last_asked = now  # the start of the run checked already
        if overdue:
            return overdue
        return [] if now - self._last_asked >= self.every_s else None

    def asking(self, now: float, overdue: Sequence[Overdue]) -> None:
        """The source is being asked now, about ``overdue`` too."""
        self._last_asked = now
        for item in overdue:
            self._reported[item.window_id] = item.waited_s

    def answered(
        self, problems: Sequence[str] | None, overdue: Sequence[Overdue]
    ) -> CoverageVerdict:
        """What to do with the source's answer (None: it could not be asked) about the
        windows ``overdue`` when asked."""
        if problems:
            found = (
                "; ".join(o.found() for o in overdue)
                if overdue
                else f"found by the check every {self.every_s:.0f} s"
            )
            return CoverageVerdict(stop=coverage_message(problems, found))
        return CoverageVerdict(warnings=[o.warning(asked=problems is not None) for o in overdue])


class CoverageWatch:
    """Runs a :class:`Watchdog` for the engine: asks ``coverage`` on a thread of its own,
    and stops the engine (:class:`LogCoverageError`) when it reports a problem. Without a
    ``coverage`` (a source that checks nothing, a simulation), overdue windows are only
    warned about."""

    def __init__(self, watchdog: Watchdog, coverage: LogCoverage | None) -> None:
        self._watchdog = watchdog
        self._coverage = coverage
        self._thread: threading.Thread | None = None
        self._answer: tuple[list[str] | None, list[Overdue]] | None = None
        self._lock = threading.Lock()
        self._closing = threading.Event()

    def poll(self, now: float, waiting: Mapping[str, TableId]) -> None:
        """Take a finished answer (raise LogCoverageError on a problem, log warnings), then
        start asking again when the watchdog says so. Called by the engine's loop."""
        with self._lock:
            answer, self._answer = self._answer, None
        if answer is not None:
            verdict = self._watchdog.answered(*answer)
            if verdict.stop is not None:
                raise LogCoverageError(verdict.stop)
            for warning in verdict.warnings:
                log.warning("%s", warning)
        overdue = self._watchdog.tick(now, waiting)
        if overdue is None or (self._thread is not None and self._thread.is_alive()):
            return
        self._watchdog.asking(now, overdue)
        if self._coverage is None:
            for warning in self._watchdog.answered(None, overdue).warnings:
                log.warning("%s", warning)
            return
        self._thread = threading.Thread(
            target=self._ask, args=(self._coverage, overdue), name="log-coverage", daemon=True
        )
        self._thread.start()

    def _ask(self, coverage: LogCoverage, overdue: list[Overdue]) -> None:
        problems: list[str] | None
        try:
            problems = coverage.problems()
        except Exception as exc:  # the source is down or slow: asked again later
            if not self._closing.is_set():
                log.warning("could not ask the source what its log lacks: %s", error_reason(exc))
            problems = None
        with self._lock:
            self._answer = (problems, overdue)

    def close(self) -> None:
        """Let a check in progress end on its own (its answer is dropped), then close."""
        if self._coverage is None:
            return
        self._closing.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=2)
        self._coverage.close()


def log_watch(coverage: LogCoverage | None, chunk_timeout_s: float) -> CoverageWatch:
    """The engine's watch, with the default timings."""
    watchdog = Watchdog(every_s=CHECK_EVERY_S, overdue_after_s=overdue_after(chunk_timeout_s))
    return CoverageWatch(watchdog, coverage)


def waiting_for_close(flights: Iterable[Flight]) -> dict[str, TableId]:
    """The windows whose worker has written the close watermark (their rows are in), by id:
    only the log is awaited now."""
    return {f.task.window.window_id: f.task.table for f in flights if f.task.window.filled}
