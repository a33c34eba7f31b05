"""Starting Spark within a bound, or failing with the address and the fix.

Left to itself, Spark waits a long time on a wrong address or a busy cluster: a Spark
Connect client retries an unreachable server for ten minutes or more, a driver retries an
unreachable master for a minute and then says only "Py4J", and a job on a cluster whose
cores other applications hold waits forever ("Initial job has not accepted any
resources"). Here each start is bounded (``[spark] start_timeout_s``):

* the master's or Connect server's port is tried first (a TCP connect, a few seconds): a
  wrong address fails at once;
* the session is made, and one small job run, on a thread of its own, waited for at most
  the bound: a session that never comes, or a cluster that runs no task, fails naming the
  address, what was being waited for and the fix.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from snapshotter.common.errors import first_line
from snapshotter.config import SparkConfig

log = logging.getLogger(__name__)
S = TypeVar("S")  # the session
# The longest a TCP connect to the master or Connect server may take (a host that drops
# packets answers nothing; a closed port answers at once).
PROBE_S = 5.0
# Each application's first job, run to see that an executor takes work: two tasks.
PROBE_JOB_GROUP = "snapshotter-start"
SPARK_PORT = 7077
CONNECT_PORT = 15002
# host:port of a spark:// master list or an sc:// URL ([::1]:7077 for IPv6).
_HOST_PORT = re.compile(r"^(\[[^\]]+\]|[^:/;\[\]]+)(?::(\d+))?$")
# A Java exception's line in a Py4J error ("java.lang.IllegalStateException: ...").
_JAVA_LINE = re.compile(r"^\s*(?:Caused by: )?([\w$]+\.)+[\w$]*(?:Exception|Error)\b.*$")


class SparkStartError(RuntimeError):
    """Spark could not be started; the message names the address and the fix."""


def shown(config: SparkConfig) -> str:
    """Where Spark runs, as said in messages: a Connect URL without its parameters (a
    ``;token=`` is a secret)."""
    url = config.url
    return url.split("/;", 1)[0].split(";", 1)[0] if url.startswith("sc://") else url


def _setting(config: SparkConfig) -> str:
    return "[spark] remote" if config.remote is not None else "[spark] master"


def addresses(config: SparkConfig) -> list[tuple[str, int]]:
    """The (host, port) pairs to try before starting: a standalone master's (each of an HA
    list) or a Connect server's; none for local mode, yarn or k8s."""
    url = config.url
    if url.startswith("sc://"):
        hosts, default = [url.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]], CONNECT_PORT
    elif url.startswith("spark://"):
        hosts, default = url.removeprefix("spark://").split("/", 1)[0].split(","), SPARK_PORT
    else:
        return []
    found: list[tuple[str, int]] = []
    for part in hosts:
        match = _HOST_PORT.match(part.strip())
        if match is not None:
            found.append((match.group(1).strip("[]"), int(match.group(2) or default)))
    return found


def probe(config: SparkConfig, timeout: float = PROBE_S) -> None:
    """Fail at once when nothing listens at the master's (any of them) or Connect server's
    address."""
    places = addresses(config)
    if not places:
        return
    reasons: list[str] = []
    for host, port in places:
        try:
            socket.create_connection((host, port), timeout=min(timeout, PROBE_S)).close()
            return
        except OSError as exc:
            reasons.append(exc.strerror or str(exc) or type(exc).__name__)
    where = shown(config)
    if config.remote is not None:
        fix = (
            "start the Spark Connect server there (sbin/start-connect-server.sh), or set "
            "[spark] remote to where it listens"
        )
        what = "the Spark Connect server"
    else:
        fix = "start the master there, or set [spark] master to where it listens"
        what = "the Spark master"
    raise SparkStartError(f"cannot reach {what} at {where} ({reasons[-1]}); {fix}")


@dataclass
class _Start:
    """What the start thread did so far (read by the waiting thread)."""

    phase: str = "starting the session"
    session: Any = None
    value: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


def bounded_start(
    config: SparkConfig,
    build: Callable[[], S],
    *,
    first_job: bool,
    configure: Callable[[S], None] | None = None,
) -> S:
    """``build()``'s session, made on a thread of its own within ``start_timeout_s``; with
    ``first_job``, once it has run a small job (an executor took work). ``configure`` runs
    on the session before that job. Raises SparkStartError naming the address and the fix."""
    start = _Start()

    def run() -> None:
        try:
            session = build()
            start.session = session
            if configure is not None:
                start.phase = "setting the session up"
                configure(session)
            if first_job:
                start.phase = "running a first task"
                _first_job(session)
            start.value = session
        except BaseException as exc:  # handed to the waiting thread
            start.error = exc
        finally:
            start.done.set()

    began = time.monotonic()
    threading.Thread(target=run, name="spark-start", daemon=True).start()
    timeout = config.start_timeout_s
    if not start.done.wait(timeout):
        _abandon(start.session)
        raise SparkStartError(_timeout_message(config, start.phase, timeout))
    if start.error is not None:
        if isinstance(start.error, SparkStartError | ImportError):
            raise start.error
        raise SparkStartError(_failure_message(config, start.error)) from start.error
    log.info("Spark started at %s in %.1f s", shown(config), time.monotonic() - began)
    value: S = start.value
    return value


def _first_job(session: Any) -> None:
    """Two tasks that must run on executors: a cluster that runs none is found here, at
    start, and not at the first landing."""
    context = getattr(session, "sparkContext", None) if not _is_connect(session) else None
    if context is not None:
        context.setJobGroup(PROBE_JOB_GROUP, "snapshotter: a first task", True)
    else:
        session.addTag(PROBE_JOB_GROUP)
    try:
        session.range(0, 2, 1, 2).selectExpr("sum(id)").collect()
    finally:
        if context is None:
            session.removeTag(PROBE_JOB_GROUP)


def bound_retries(session: Any, timeout_s: float) -> None:
    """A Spark Connect client retries a server that is unavailable for ten minutes and more
    (PySpark's DefaultPolicy: 15 retries, backoff x4 up to 60 s): bounded here by about
    ``timeout_s`` per call, so a server that went away fails the call (a landing: retried,
    then the engine stops naming the server) rather than hanging it."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    budget_ms, waited, backoff, retries = timeout_s * 1000, 0.0, 50.0, 0
    while retries < 15 and waited + min(backoff, 60_000) + 500 <= budget_ms:
        waited += min(backoff, 60_000) + 500  # the backoff and its largest jitter
        backoff *= 4
        retries += 1
    policy = DefaultPolicy(max_retries=max(1, retries), max_server_retry_delay=int(budget_ms))
    session.client.set_retry_policies([policy])


def _is_connect(session: Any) -> bool:
    return type(session).__module__.startswith("pyspark.sql.connect")


def _abandon(session: Any) -> None:
    """After a start that took too long: cancel its first job and let the session go, on a
    thread of its own (those calls may wait too)."""
    if session is None:
        return

    def stop() -> None:
        try:
            if _is_connect(session):
                session.client.close()  # ends the client's retries
            else:
                session.sparkContext.cancelJobGroup(PROBE_JOB_GROUP)
        except Exception:  # the process is on its way out, or starts another session
            return

    threading.Thread(target=stop, name="spark-start-abandon", daemon=True).start()


def _timeout_message(config: SparkConfig, phase: str, timeout: float) -> str:
    where = shown(config)
    if phase == "running a first task":
        return (
            f"Spark at {where} ran no task within {timeout:g} s ([spark] start_timeout_s): "
            "no executor took the work, as when other applications hold every core of the "
            'cluster (Spark\'s log: "Initial job has not accepted any resources"); free '
            "cores (stop the other application), cap each application with "
            '[spark] conf "spark.cores.max", or add workers'
        )
    return (
        f"Spark at {where} did not start within {timeout:g} s ({phase}; [spark] "
        f"start_timeout_s): check that {_setting(config)} names a running "
        f"{'Spark Connect server' if config.remote is not None else 'master'} and that it "
        "answers (its log), or raise start_timeout_s"
    )


def _failure_message(config: SparkConfig, exc: BaseException) -> str:
    text = str(exc)
    java = next((m.group(0).strip() for m in map(_JAVA_LINE.match, text.splitlines()) if m), "")
    reason = first_line(java.removeprefix("Caused by: ")) or first_line(text)
    if config.remote is None and config.master.startswith("local"):
        fix = "check that Java runs here (JAVA_HOME) and Spark's log"
    else:
        running = "Spark Connect server" if config.remote is not None else "master"
        fix = f"check {_setting(config)} (a running {running} of this Spark version?) and its log"
    return f"starting Spark at {shown(config)} failed: {reason or type(exc).__name__}; {fix}"


__all__ = ["SparkStartError", "addresses", "bound_retries", "bounded_start", "probe", "shown"]
