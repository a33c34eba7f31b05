"""How the simulation unwinds: a crash, a stop, a failed property. All BaseExceptions, so that
no ``except Exception`` of the engine or of a chunk task (``run_task``) catches them: each may
be raised deep inside a task's phase hook, where the scheduler runs other actions."""

from __future__ import annotations


class Crash(BaseException):
    """The engine's process dies here: nothing of it runs after this point."""


class Stopped(BaseException):
    """The engine stopped itself (SourceUnavailableError): unwound to the scheduler's top,
    which shuts it down and resumes it, as ``snapshotter resume`` would."""


class SimFailure(BaseException):
    """A property of the simulation does not hold."""


def check(ok: bool, message: str) -> None:
    if not ok:
        raise SimFailure(message)
