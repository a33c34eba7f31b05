"""The replication slot as the stream position: whether the saved LSN can still be streamed
from, what ``status`` warns about, and what ``reset-stream`` and ``teardown`` do to the slot.

A slot can be dropped, invalidated (``wal_status = lost``, past ``max_slot_wal_keep_size``),
or dropped and created again, or moved on by another consumer. Either way the changes after
the saved LSN cannot be read any more, and starting anyway would skip them without a word:
PostgreSQL starts a slot at its own confirmed position, whatever position the client asks
for. The decisions and messages are pure functions of :class:`SlotFacts`; the functions that
take an engine gather the facts (``setup.slot_facts``) first.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from snapshotter.core.position import Position
from snapshotter.sources.positions import (
    CONF,
    MB,
    NewStart,
    error_reason,
    gone,
    size_text,
    to_go_on,
)
from snapshotter.sources.postgres import publications as pg_publications
from snapshotter.sources.postgres import setup as pg_setup
from snapshotter.sources.postgres.setup import SlotFacts, lsn_text
from snapshotter.sources.setup_common import SetupError


def position_text(resume: Mapping[str, Any]) -> str | None:
    """The saved LSN as people read it; None when ``resume`` holds none."""
    lsn = resume.get("lsn")
    if isinstance(lsn, int) and lsn:
        return f"LSN {lsn_text(lsn)}"
    return None


def has_saved_position(resume: Mapping[str, Any]) -> bool:
    """Whether state holds an LSN to resume from (else a first run starts at the slot)."""
    lsn = resume.get("lsn")
    return isinstance(lsn, int) and lsn > 0


def slot_problem(slot: str, facts: SlotFacts | None, saved_lsn: int) -> str | None:
    """Why ``slot`` cannot stream from ``saved_lsn``; None when it can."""
    if facts is None:
        return (
            f"replication slot {slot!r} does not exist: it was dropped (or the database was "
            "restored, or failed over to a server without it)"
        )
    if facts.invalidated:
        if facts.invalidation_reason in (None, "wal_removed") and not facts.conflicting:
            reason = (
                "the WAL it needed was removed (it retained more than max_slot_wal_keep_size "
                f"= {facts.max_slot_wal_keep_size})"
            )
        elif facts.invalidation_reason is not None:
            reason = f"invalidation_reason = {facts.invalidation_reason}"
        else:
            reason = "a recovery conflict on this standby"
        return f"replication slot {slot!r} was invalidated (wal_status = lost): {reason}"
    confirmed = facts.confirmed_flush_lsn
    if confirmed is not None and confirmed > saved_lsn:
        return (
            f"replication slot {slot!r} starts at LSN {lsn_text(confirmed)}, after the "
            "state's position: it was dropped and created again (by `snapshotter init`?) or "
            "moved on by another consumer, and PostgreSQL would start streaming there, "
            "skipping what lies in between"
        )
    return None


def slot_warnings(
    slot: str,
    facts: SlotFacts | None,
    resume: Mapping[str, Any],
    threshold_mb: int,
    config: str = CONF,
) -> list[str]:
    """What ``status`` warns about the slot (facts: None when it does not exist)."""
    quoted = shlex.quote(config)
    saved = has_saved_position(resume)
    if facts is None:
        if saved:
            return [
                f"replication slot {slot!r} does not exist, so the state's position "
                f"({position_text(resume)}) is gone and `snapshotter run` will refuse "
                f"to start: {to_go_on(config)}"
            ]
        return [
            f"replication slot {slot!r} does not exist: run `snapshotter init -c {quoted}` "
            "to create it"
        ]
    warnings = []
    problem = slot_problem(slot, facts, int(resume["lsn"])) if saved else None
    if problem is None and facts.invalidated:  # no saved position: init's slot is lost
        problem = slot_problem(slot, facts, 0)
    if problem is not None:
        warnings.append(f"{problem}; `snapshotter run` will refuse to start: {to_go_on(config)}")
    elif facts.wal_status == "unreserved":
        warnings.append(
            f"replication slot {slot!r} has wal_status = unreserved: it needs more WAL than "
            f"max_slot_wal_keep_size = {facts.max_slot_wal_keep_size} keeps, and the next "
            "checkpoint invalidates it unless the engine reads on; run `snapshotter run -c "
            f"{quoted}` now (once it is lost, the tables must be snapshotted again)"
        )
    retained = facts.retained_bytes
    if retained is not None and retained > threshold_mb * MB and not facts.invalidated:
        if facts.max_slot_wal_keep_size.strip() == "-1":
            limit = "max_slot_wal_keep_size = -1, so nothing bounds it and the disk can fill up"
        else:
            limit = (
                f"past max_slot_wal_keep_size = {facts.max_slot_wal_keep_size} PostgreSQL "
                "invalidates the slot and its position is lost"
            )
        unconfirmed = facts.unconfirmed_bytes
        if unconfirmed is not None and unconfirmed <= threshold_mb * MB:
            cause = (
                f"the engine has confirmed all but {size_text(unconfirmed)} of it, so a "
                "transaction open for long (pg_stat_activity.xact_start) holds the slot's "
                "restart point back"
            )
        else:
            state = "streaming from it but behind" if facts.active else "not running"
            cause = f"it is kept until the engine confirms past it, and the engine is {state}"
        warnings.append(
            f"replication slot {slot!r} holds {size_text(retained)} of WAL on the database "
            f"server's disk (more than source.backlog_warn_mb = {threshold_mb}): {cause}; "
            f"{limit}. Run `snapshotter run -c {quoted}` to catch up; if this capture is not "
            f"wanted any more, `snapshotter teardown -c {quoted}` drops the slot"
        )
    return warnings


# --- IO: the slot ---------------------------------------------------------------------------


def slot_facts(engine: sa.Engine, slot: str) -> SlotFacts | None:
    with engine.connect() as conn:
        return pg_setup.slot_facts(conn, slot)


def problem_now(engine: sa.Engine, slot: str, resume: Mapping[str, Any]) -> str | None:
    """Why the slot cannot stream from the saved LSN now; None when it can."""
    return slot_problem(slot, slot_facts(engine, slot), int(resume["lsn"]))


def move_to_log_end(
    engine: sa.Engine, slot: str, publication: str, failover: bool = False
) -> NewStart:
    """Drop the slot if it exists (never an active one), create it again (after the
    publication, which must exist): the stream starts at the WAL's current end."""
    with engine.connect() as conn:
        if not pg_publications.publication_exists(conn, publication):
            raise SetupError(
                f"publication {publication} does not exist: run `snapshotter init` "
                "first (it creates the publication, then the slot), then reset-stream"
            )
        facts = pg_setup.slot_facts(conn, slot)
    done = []
    if facts is not None:
        refuse_active(slot, facts)
        if facts.invalidated:
            why = "it was invalidated"
        elif facts.confirmed_flush_lsn is not None:
            why = f"it was at LSN {lsn_text(facts.confirmed_flush_lsn)}"
        else:
            why = "it had no position"
        drop_slot(engine, slot)
        done.append(f"replication slot {slot}: dropped ({why})")
    pg_setup.ensure_slot(engine, slot, failover)
    created = slot_facts(engine, slot)
    if created is None or created.confirmed_flush_lsn is None:
        raise SetupError(f"replication slot {slot} was created but has no position")
    lsn = created.confirmed_flush_lsn
    done.append(f"replication slot {slot}: created at LSN {lsn_text(lsn)}")
    # Every transaction the new slot sends commits at or after lsn: (lsn,) sorts first.
    return NewStart({"lsn": lsn}, Position(lsn), done)


def refuse_active(slot: str, facts: SlotFacts) -> None:
    """Refuse to drop a slot an engine streams from, or one that is not ours to drop (a
    physical slot of a standby, another plugin's: the same name by accident)."""
    if (facts.slot_type not in (None, "logical")) or (facts.plugin not in (None, "pgoutput")):
        raise SetupError(
            f"replication slot {slot} is a {facts.slot_type or '?'} slot of plugin "
            f"{facts.plugin or '-'}, not the logical pgoutput slot snapshotter creates: "
            "something else uses that name; set [source] slot to snapshotter's slot"
        )
    if facts.active:
        pid = f" (process {facts.active_pid})" if facts.active_pid else ""
        raise SetupError(
            f"replication slot {slot} is in use{pid}: an engine is streaming from it; stop "
            "that engine first"
        )


def refuse_active_slot(engine: sa.Engine, slot: str) -> None:
    """Raise SetupError when an engine streams from ``slot`` (or it is not ours)."""
    facts = slot_facts(engine, slot)
    if facts is not None:
        refuse_active(slot, facts)


def drop_slot(engine: sa.Engine, slot: str) -> bool:
    try:
        return pg_setup.drop_slot(engine, slot)
    except sa.exc.DBAPIError as exc:  # became active meanwhile
        raise SetupError(f"cannot drop replication slot {slot}: {error_reason(exc)}") from None


def drop_capture(engine: sa.Engine, slot: str, publication: str | None) -> list[str]:
    """Drop the slot (never an active one), then the publication (unless None); one line
    per object, "dropped" or "already gone"."""
    facts = slot_facts(engine, slot)
    if facts is not None:
        refuse_active(slot, facts)
    dropped = facts is not None and drop_slot(engine, slot)
    lines = [f"replication slot {slot}: {gone(dropped)}"]
    if publication is None:
        return lines
    dropped = pg_publications.drop_publication(engine, publication)
    lines.append(f"publication {publication}: {gone(dropped)}")
    return lines
