"""How a run ends (snapshotter.app.shutdown): a stop is bounded by shutdown_timeout_s even when
the main thread waits on something that never ends, a second signal exits at once, and a
thread that dies is never silent.

Issue 26: with a wrong Spark Connect address, `run` ignored SIGTERM and SIGINT (the main
thread joined a thread that waited on Spark); only SIGKILL ended it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from snapshotter.app.shutdown import StopFlag, ThreadFailures

# The main thread stuck as it was in issue 26: joining a thread that never ends (Python
# runs the signal handler, then goes back to waiting).
STUCK = """
import sys, threading, time
from snapshotter.app.shutdown import StopFlag
stop = StopFlag()
stop.install({timeout})
print("ready", flush=True)
never = threading.Thread(target=time.sleep, args=(1000,), name="never", daemon=True)
never.start()
def stuck_in_close():
    never.join()
stuck_in_close()
"""


def _spawn(body: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(body)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_a_stop_the_main_thread_cannot_finish_ends_the_process_within_the_bound() -> None:
    proc = _spawn(STUCK.format(timeout=2))
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 1, err
    assert 2 <= took < 2 + 10, took  # the bound, plus a loaded machine's start-up slack
    assert "error: the engine did not stop within 2 s of the stop" in err, err
    assert "[state] shutdown_timeout_s" in err and "snapshotter resume" in err, err


def test_a_second_signal_exits_at_once() -> None:
    proc = _spawn(STUCK.format(timeout=600))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 10
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "error: SIGTERM again while stopping" in err, err


def test_after_uninstall_a_stop_no_longer_ends_the_process() -> None:
    """``main`` run in-process (tests) goes on after ``run``: the bound ends with the run."""
    proc = _spawn(
        """
        import time
        from snapshotter.app.shutdown import StopFlag
        stop = StopFlag()
        stop.install(0.5)
        print("ready", flush=True)
        stop.set("the engine failed")
        stop.uninstall()
        time.sleep(1.5)
        print("alive", flush=True)
        """
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "alive"


def test_a_thread_that_dies_is_named_with_its_error_and_stops_the_run() -> None:
    stop = StopFlag()
    before = threading.excepthook

    def work() -> None:
        raise OverflowError("timeout value is too large")

    with ThreadFailures(stop.set) as failures:
        thread = threading.Thread(target=work, name="lander")
        thread.start()
        thread.join()
        quiet = threading.Thread(target=sys.exit, name="quits")  # SystemExit: not a failure
        quiet.start()
        quiet.join()
    assert stop() and stop.reason == failures.failure
    assert failures.failure == "the lander thread failed: OverflowError: timeout value is too large"
    assert threading.excepthook is before  # restored
