"""The replication slot: created (``init``), checked, dropped (``teardown``), and what the
catalog says of its health (``run``'s check, ``status``, ``reset-stream``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa

from snapshotter.sources.postgres.catalog import (
    EngineOrUrl,
    _engine,
    _literal,
)
from snapshotter.sources.setup_common import Problem, SetupError

SlotState = Literal["created", "existing"]


def _existing_slot(conn: sa.Connection, slot: str) -> sa.Row[Any] | None:
    return conn.execute(
        sa.text(
            "SELECT slot_type, plugin, database, current_database() AS here "
            "FROM pg_catalog.pg_replication_slots WHERE slot_name = :slot"
        ),
        {"slot": slot},
    ).one_or_none()


def _check_existing_slot(
    slot: str, slot_type: str, plugin: str | None, database: str | None, here: str
) -> list[Problem]:
    if slot_type == "logical" and plugin == "pgoutput" and database == here:
        return []
    found = f"a {slot_type} slot" + (f" for plugin {plugin}" if plugin else "")
    if database and database != here:
        found += f" in database {database}"
    return [
        Problem(
            f"replication slot {slot!r} exists but is {found}; snapshotter needs a logical "
            f"pgoutput slot in database {here}",
            f"SELECT pg_drop_replication_slot({_literal(slot)});  -- if nothing else uses it; "
            "or configure another slot name",
        )
    ]


# --- replication slot ----------------------------------------------------------------------


def ensure_slot(engine_or_url: EngineOrUrl, slot: str, failover: bool = False) -> SlotState:
    """Create the logical ``pgoutput`` slot unless it exists (``failover``: one a standby
    that syncs slots keeps, PostgreSQL 17+). Create the publication first.

    Creating a slot waits for transactions already running to finish (it needs a consistent
    starting point), so a long-open transaction delays it.
    """
    with _engine(engine_or_url) as engine:
        with engine.connect() as conn:
            row = _existing_slot(conn, slot)
        if row is not None:
            wrong = _check_existing_slot(slot, row.slot_type, row.plugin, row.database, row.here)
            if wrong:
                raise SetupError(f"{wrong[0].what}; {wrong[0].fix}")
            return "existing"
        # A slot cannot be created in a transaction that has written anything: autocommit.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            # 17's signature: (name, plugin, temporary, twophase, failover).
            created = (
                "SELECT pg_create_logical_replication_slot(:slot, 'pgoutput', false, false, true)"
                if failover
                else "SELECT pg_create_logical_replication_slot(:slot, 'pgoutput')"
            )
            conn.execute(sa.text(created), {"slot": slot})
        return "created"


def drop_slot(engine_or_url: EngineOrUrl, slot: str) -> bool:
    """Drop the slot if it exists (it must not be in use); returns whether it existed."""
    with (
        _engine(engine_or_url) as engine,
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
    ):
        dropped = conn.execute(
            sa.text(
                "SELECT pg_drop_replication_slot(slot_name) "
                "FROM pg_catalog.pg_replication_slots WHERE slot_name = :slot"
            ),
            {"slot": slot},
        ).all()
        return bool(dropped)


# --- slot health (run's check, status, reset-stream, teardown) ----------------------------


def lsn_value(text: str) -> int:
    """``'16/B374D848'`` as an integer."""
    high, _, low = text.partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(value: int) -> str:
    """An LSN as PostgreSQL writes it: ``16/B374D848``."""
    return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"


@dataclass(frozen=True, slots=True)
class SlotFacts:
    """What ``pg_replication_slots`` says of a slot (columns a server version lacks are
    None), with the WAL it holds back and the setting that bounds that."""

    name: str
    slot_type: str | None = None
    plugin: str | None = None
    active: bool = False
    active_pid: int | None = None
    wal_status: str | None = None  # reserved, extended, unreserved, lost (PostgreSQL 13+)
    restart_lsn: int | None = None
    confirmed_flush_lsn: int | None = None
    invalidation_reason: str | None = None  # PostgreSQL 17+
    conflicting: bool | None = None  # PostgreSQL 16+: invalidated by a recovery conflict
    safe_wal_size: int | None = None  # bytes still writable before the slot is unreserved
    # pg_current_wal_lsn() - restart_lsn: the WAL the slot keeps on disk (None on a standby
    # or for an invalidated slot).
    retained_bytes: int | None = None
    # pg_current_wal_lsn() - confirmed_flush_lsn: what the slot's consumer has not confirmed.
    unconfirmed_bytes: int | None = None
    max_slot_wal_keep_size: str = "-1"

    @property
    def invalidated(self) -> bool:
        """The slot can no longer be read (its WAL is gone, or a standby's conflict)."""
        return (
            self.wal_status == "lost"
            or self.invalidation_reason is not None
            or self.conflicting is True
        )

    @classmethod
    def from_catalog(
        cls,
        row: Mapping[str, Any],
        retained: int | None = None,
        keep: str = "-1",
        unconfirmed: int | None = None,
    ) -> SlotFacts:
        """From ``to_jsonb(pg_replication_slots row)`` (LSNs as text)."""

        def lsn(name: str) -> int | None:
            value = row.get(name)
            return None if value is None else lsn_value(str(value))

        def integer(name: str) -> int | None:
            value = row.get(name)
            return None if value is None else int(value)

        conflicting = row.get("conflicting")
        return cls(
            name=str(row.get("slot_name")),
            slot_type=row.get("slot_type"),
            plugin=row.get("plugin"),
            active=bool(row.get("active")),
            active_pid=integer("active_pid"),
            wal_status=row.get("wal_status"),
            restart_lsn=lsn("restart_lsn"),
            confirmed_flush_lsn=lsn("confirmed_flush_lsn"),
            invalidation_reason=row.get("invalidation_reason"),
            conflicting=None if conflicting is None else bool(conflicting),
            safe_wal_size=integer("safe_wal_size"),
            retained_bytes=retained,
            unconfirmed_bytes=unconfirmed,
            max_slot_wal_keep_size=keep,
        )


def slot_facts(conn: sa.Connection, slot: str) -> SlotFacts | None:
    """The slot as the catalog describes it now, or None when there is no such slot. Reads
    the whole row as JSON, so it works on every version (wal_status is 13+, conflicting 16+,
    invalidation_reason 17+)."""
    row = conn.execute(
        sa.text(
            "SELECT to_jsonb(s) AS slot, w.now - s.restart_lsn AS retained, "
            "w.now - s.confirmed_flush_lsn AS unconfirmed, "
            "current_setting('max_slot_wal_keep_size') AS keep "
            "FROM pg_catalog.pg_replication_slots s CROSS JOIN (SELECT CASE WHEN "
            "pg_catalog.pg_is_in_recovery() THEN NULL ELSE pg_catalog.pg_current_wal_lsn() "
            "END AS now) w WHERE s.slot_name = :slot"
        ),
        {"slot": slot},
    ).one_or_none()
    if row is None:
        return None

    def size(value: Any) -> int | None:
        return None if value is None else int(value)

    return SlotFacts.from_catalog(
        row.slot, size(row.retained), str(row.keep), size(row.unconfirmed)
    )
