"""How a run ends, whatever it is doing: a stop asked for (SIGTERM, SIGINT), a failure, or a
background thread that died.

* ``StopFlag``: set by SIGTERM/SIGINT (or a test, or a thread's failure); the engine checks it
  between reads and stops at a transaction boundary with its state saved.
* ``ShutdownBound`` (``snapshotter run``/``resume`` only): once a stop has begun, the process
  exits within ``[state] shutdown_timeout_s`` even if something it waits for never answers
  (a Spark call, a join, a network read); a second signal exits at once. It learns of
  signals through ``signal.set_wakeup_fd``, written by the C-level handler, so it hears
  them even while the main thread is stuck in a call that never returns to Python. Exiting
  there is safe: state is written atomically and only ever records what the sink
  acknowledged (the crash tests kill the process at every step); what was not saved is
  done again by the next run.
* ``ThreadFailures``: an exception that ends any thread (``threading.excepthook``) stops the
  engine with the thread's name and the error, instead of leaving it to run on without
  that thread's work.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

from snapshotter.common.errors import first_line

log = logging.getLogger("snapshotter.shutdown")

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_TIMED_OUT = 1
_ARMED = b"\0"  # written to the bound's pipe when a stop begins without a signal


class StopFlag:
    """Set by SIGINT/SIGTERM (or by a test); the engine checks it between reads."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str | None = None  # set when something other than a signal stopped it
        self._bound: ShutdownBound | None = None
        self._handlers: dict[int, object] = {}

    def set(self, reason: str | None = None) -> None:
        if reason is not None and self.reason is None:
            self.reason = reason
        self._event.set()
        if self._bound is not None:
            self._bound.arm()

    def __call__(self) -> bool:
        return self._event.is_set()

    def install(self, timeout_s: float | None = None) -> None:
        """SIGINT and SIGTERM set the flag; with ``timeout_s``, a ``ShutdownBound`` ends the
        process that long after the first one (at once after a second) until
        ``uninstall``. Main thread only."""
        for signum in SIGNALS:
            self._handlers[signum] = signal.signal(signum, lambda *_: self._event.set())
        if timeout_s is not None:
            self._bound = ShutdownBound(self, timeout_s)
            self._bound.start()

    def uninstall(self) -> None:
        """The handlers there were before ``install``; the bound ends (the run is over: a
        process that called ``main`` in-process, a test, goes on)."""
        if self._bound is not None:
            self._bound.close()
            self._bound = None
        for signum, handler in self._handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._handlers.clear()


class ShutdownBound:
    """Ends the process ``timeout_s`` after a stop began (see the module's docstring)."""

    def __init__(
        self,
        stop: StopFlag,
        timeout_s: float,
        *,
        exit_now: Callable[[int], object] = os._exit,
    ) -> None:
        self._stop = stop
        self._timeout_s = timeout_s
        self._exit_now = exit_now
        self._deadline: float | None = None
        self._signals = 0
        self._closed = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._previous_fd = -1
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="shutdown-bound", daemon=True)

    def start(self) -> None:
        self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        self._thread.start()

    def arm(self) -> None:
        """A stop began without a signal (a failure, a thread that died): bound it too."""
        self._poke(_ARMED)

    def close(self) -> None:
        self._closed = True
        signal.set_wakeup_fd(self._previous_fd)
        self._poke(_ARMED)
        self._thread.join(5)
        os.close(self._read)
        os.close(self._write)

    def _poke(self, byte: bytes) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write, byte)

    def _watch(self) -> None:
        while not self._closed:
            wait = None if self._deadline is None else self._deadline - time.monotonic()
            if wait is not None and wait <= 0:
                self._give_up(
                    f"the engine did not stop within {self._timeout_s:g} s of the stop "
                    f"([state] shutdown_timeout_s){self._doing()}",
                    EXIT_TIMED_OUT,
                )
                return
            ready, _, _ = select.select([self._read], [], [], wait)
            if ready and not self._closed:
                for byte in os.read(self._read, 64):
                    self._heard(byte)

    def _heard(self, byte: int) -> None:
        if byte in SIGNALS:
            self._signals += 1
            self._stop.set()
            name = signal.Signals(byte).name
            if self._signals > 1:
                self._give_up(f"{name} again while stopping", 128 + byte)
                return
            log.info("%s: stopping (within %g s; a second one exits now)", name, self._timeout_s)
        elif byte != _ARMED[0]:
            return  # another signal with a Python handler: not ours to act on
        if self._deadline is None:
            self._deadline = time.monotonic() + self._timeout_s

    def _doing(self) -> str:
        """Where the main thread waits: the innermost call of this program on its stack."""
        frame: FrameType | None = sys._current_frames().get(self._main or -1)
        while frame is not None:
            module = str(frame.f_globals.get("__name__", ""))
            if module.startswith("snapshotter."):
                return f", waiting in {module}.{frame.f_code.co_name}"
            frame = frame.f_back
        return ""

    def _give_up(self, why: str, code: int) -> None:
        if self._closed:
            return
        text = (
            f"error: {why}; exiting now. State is saved as of the last checkpoint: `snapshotter "
            "resume` goes on from there and does again what came after it\n"
        )
        try:
            for handler in logging.getLogger().handlers + logging.getLogger("snapshotter").handlers:
                with contextlib.suppress(Exception):
                    handler.flush()
            sys.stderr.write(text)
            sys.stderr.flush()
        finally:
            self._exit_now(code)


class ThreadFailures:
    """While entered: the first exception that ends a thread is kept (``failure``) and
    ``on_failure`` is called, so the engine stops with it."""

    def __init__(self, on_failure: Callable[[str], None]) -> None:
        self.failure: str | None = None
        self._on_failure = on_failure
        self._previous: Callable[[threading.ExceptHookArgs], object] | None = None

    def __enter__(self) -> ThreadFailures:
        self._previous = threading.excepthook
        threading.excepthook = self._hook
        return self

    def __exit__(self, *_: object) -> None:
        threading.excepthook = self._previous or threading.__excepthook__

    def _hook(self, args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        name = args.thread.name if args.thread is not None else "a background"
        error = args.exc_value
        said = first_line(str(error)) if error is not None else ""
        reason = f"the {name} thread failed: {args.exc_type.__name__}{': ' if said else ''}{said}"
        log.error("%s; stopping the engine", reason)
        if error is not None:
            log.debug("%s", reason, exc_info=error)
        if self.failure is None:
            self.failure = reason
        self._on_failure(reason)


__all__ = ["ShutdownBound", "StopFlag", "ThreadFailures"]
