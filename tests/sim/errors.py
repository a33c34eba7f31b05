"""How the simulation unwinds: a crash, a stop, a failed property. All BaseExceptions, so that
no ``except Exception`` of the engine or of a chunk task (``run_task``) catches them: each may
be raised deep inside a task's phase hook, where the scheduler runs other actions.

A failure names the property that broke (``Property``), so that a mutation test can tell a
broken rule of the algorithm from an engine that merely raised (``ENGINE_RAISED``)."""

from __future__ import annotations

from enum import StrEnum


class Property(StrEnum):
    """What a simulation checks, by name (tests/sim/README.md says each in words)."""

    # As it runs (tests.sim.watch, tests.sim.source, tests.sim.sink):
    STALE_READ = "stale-read"  # a READ row that is not the row the log had at its close
    TASK_FAILED = "task-failed"  # a chunk task failed, not by a cancel or a connection loss
    READ_TWICE = "read-twice"  # a key range read twice for one snapshot in one run
    READ_BELOW_DURABLE = "read-below-durable"  # a resumed run read below its durable key
    RESUMED_BEHIND_OUTPUT = "resumed-behind-output"  # the durable key lags the output's chunks
    CONFIRMED_BACKWARDS = "confirmed-backwards"  # the engine confirmed the log backwards
    RESUMED_BEFORE_SLOT = "resumed-before-slot"  # the state resumes before the slot's point
    SINK_OFFSET = "sink-offset"  # the state names output the sink does not durably hold
    # At the end (tests.sim.checks):
    NOT_DURABLE = "not-durable"  # output not durable at the end
    SNAPSHOT_NOT_DONE = "snapshot-not-done"  # a table's newest snapshot did not finish
    POSITIONS_BACKWARDS = "positions-backwards"  # a key's events go back in position
    SNAPSHOT_GAP = "snapshot-gap"  # a finished snapshot left the output unlike its table
    SNAPSHOT_RECORD = "snapshot-record"  # a finished snapshot lost its start time or estimate
    OUTPUT_NOT_TABLE = "output-not-table"  # applying the output does not give the table
    BAD_EVENT = "bad-event"  # an event of an unexpected kind
    NOT_CAUGHT_UP = "not-caught-up"  # the final phase never caught up
    # Not a property of the algorithm: the engine's own code raised (a bug, or a mutation
    # that does not fit what it replaces). A mutation test never accepts it as a catch.
    ENGINE_RAISED = "engine-raised"


class Crash(BaseException):
    """The engine's process dies here: nothing of it runs after this point."""


class Stopped(BaseException):
    """The engine stopped itself (SourceUnavailableError): unwound to the scheduler's top,
    which shuts it down and resumes it, as ``snapshotter resume`` would."""


class SimFailure(BaseException):
    """A property of the simulation does not hold."""

    def __init__(self, broken: Property, message: str) -> None:
        super().__init__(f"[{broken}] {message}")
        self.broken = broken
        self.message = message


def check(ok: bool, broken: Property, message: str) -> None:
    if not ok:
        raise SimFailure(broken, message)
