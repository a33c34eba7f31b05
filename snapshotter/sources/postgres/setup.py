"""PostgreSQL capture setup: what ``snapshotter init`` checks (the publication and the slot
it creates: ``publications``, ``slots``).

The log reader needs logical decoding (``wal_level = logical``), a role allowed to replicate,
a free replication slot and WAL sender, a publication listing the captured tables and the
signal table, and a ``pgoutput`` slot created *after* that publication (pgoutput looks the
publication up as of each decoded change, so a slot older than its publication fails to
decode). Every check reports the exact statement that fixes it; nothing here changes server
settings or an existing publication's options by itself.

Names are quoted by SQLAlchemy's identifier preparer (never by string formatting); catalog
lookups take names as bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sources.base import TableError
from snapshotter.sources.postgres.catalog import (
    DEFAULT_SCHEMA,
    EngineOrUrl,
    _engine,
    _literal,
    _setting,
    missing_table_error,
    quote_name,
    quote_table,
    server_version,
    table_oid,
)

# Re-exported: ``init``, ``teardown``, the connector and the tests reach the setup of a
# source through this module (``pg_setup.ensure_slot``, ``pg_setup.psycopg_url``...).
from snapshotter.sources.postgres.catalog import psycopg_url as psycopg_url
from snapshotter.sources.postgres.slots import SlotFacts as SlotFacts
from snapshotter.sources.postgres.slots import (
    _check_existing_slot,
    _existing_slot,
)
from snapshotter.sources.postgres.slots import drop_slot as drop_slot
from snapshotter.sources.postgres.slots import ensure_slot as ensure_slot
from snapshotter.sources.postgres.slots import lsn_text as lsn_text
from snapshotter.sources.postgres.slots import lsn_value as lsn_value
from snapshotter.sources.postgres.slots import slot_facts as slot_facts
from snapshotter.sources.setup_common import Problem

# Catalog storage of a column whose values can be TOASTed: variable length ("attlen = -1")
# and stored out of line when large ("x" extended, "e" external).
_TOASTABLE = "a.attlen = -1 AND a.attstorage IN ('x', 'e')"


# --- prerequisites -------------------------------------------------------------------------


def check_prerequisites(
    engine_or_url: EngineOrUrl,
    tables: Sequence[TableId],
    slot: str,
    publication: str | None = None,
    failover: bool = False,
) -> list[Problem]:
    """Everything that stops (errors) or endangers (warnings) capture of ``tables`` through
    ``slot`` (and ``publication``, as it is or as ``init`` would create it), each with its
    fix. An empty list means ready."""
    with _engine(engine_or_url) as engine, engine.connect() as conn:
        problems = [
            *_check_wal_level(conn),
            *_check_role(conn),
            *check_filter_reach(conn),
            *_check_slot(conn, slot),
            *_check_failover(conn, slot, failover),
            *_check_wal_senders(conn),
            *_check_wal_keep(conn),
        ]
        gencols = publishes_generated_columns(conn, publication)
        for table in tables:
            table = table.with_default_schema(DEFAULT_SCHEMA)
            problems.extend(_check_table(conn, table, publication, gencols))
        return problems


def _restart_fix(setting: str, value: str) -> str:
    return f"ALTER SYSTEM SET {setting} = {value}; then restart PostgreSQL (a reload is not enough)"


def _check_wal_level(conn: sa.Connection) -> list[Problem]:
    level = _setting(conn, "wal_level")
    if level == "logical":
        return []
    return [
        Problem(
            f"wal_level is {level!r}; logical decoding needs 'logical'",
            _restart_fix("wal_level", "logical"),
        )
    ]


def _check_role(conn: sa.Connection) -> list[Problem]:
    user, superuser, replication = conn.execute(
        sa.text(
            "SELECT rolname, rolsuper, rolreplication FROM pg_catalog.pg_roles "
            "WHERE rolname = current_user"
        )
    ).one()
    if superuser or replication:
        return []
    return [
        Problem(
            f"role {user} may not use replication (reading the log needs REPLICATION)",
            f"ALTER ROLE {quote_name(user)} REPLICATION;  -- as a superuser",
        )
    ]


# The fix of every filter-reach warning: what the engine's role needs, and nothing more.
_DEDICATED_ROLE = (
    "run snapshotter as a role of its own that is not a superuser: LOGIN REPLICATION, SELECT "
    "on the captured tables, SELECT, INSERT, UPDATE and DELETE on the signal table "
    "(docs/sources.md: Privileges)"
)


def check_filter_reach(conn: sa.Connection) -> list[Problem]:
    """Warnings for what a snapshot filter could do beyond reading: a filter is SQL from the
    signal table, run as the engine's role in a READ ONLY transaction, and some functions
    reach past that (a superuser's file functions, dblink, postgres_fdw)."""
    row = conn.execute(
        sa.text(
            "SELECT r.rolname, r.rolsuper, "
            "  EXISTS (SELECT 1 FROM pg_catalog.pg_proc p "
            "    JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass "
            "      AND d.objid = p.oid AND d.deptype = 'e' "
            "    JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid "
            "    WHERE e.extname = 'dblink' AND p.proname IN ('dblink', 'dblink_exec') "
            "      AND has_function_privilege(p.oid, 'EXECUTE')) AS dblink, "
            "  EXISTS (SELECT 1 FROM pg_catalog.pg_foreign_server s "
            "    JOIN pg_catalog.pg_foreign_data_wrapper w ON w.oid = s.srvfdw "
            "    WHERE w.fdwname = 'postgres_fdw' "
            "      AND has_server_privilege(s.oid, 'USAGE')) AS fdw "
            "FROM pg_catalog.pg_roles r WHERE r.rolname = current_user"
        )
    ).one()
    who = "snapshot filters (SQL from the signal table) run as it"
    problems = []
    if row.rolsuper:
        problems.append(
            Problem(
                f"role {row.rolname} is a superuser, and {who}: whoever can insert into the "
                "signal table can read any table and server file (pg_read_file), write "
                "server files (lo_export) and end any connection",
                _DEDICATED_ROLE,
                "warning",
            )
        )
    if row.dblink:
        problems.append(
            Problem(
                f"dblink is installed and role {row.rolname} may call it, and {who}: a filter "
                "can run any SQL, writes included, on any server it can log in to (this one "
                "too), outside the READ ONLY transaction",
                f"{_DEDICATED_ROLE}, without EXECUTE on dblink's functions (REVOKE EXECUTE ON "
                "FUNCTION dblink(text, text), dblink_exec(text, text) FROM PUBLIC), or DROP "
                "EXTENSION dblink",
                "warning",
            )
        )
    if row.fdw:
        problems.append(
            Problem(
                f"role {row.rolname} may use a postgres_fdw foreign server, and {who}: a filter "
                "can read the foreign tables the role can read (other servers' data)",
                f"{_DEDICATED_ROLE}, without USAGE on the foreign servers",
                "warning",
            )
        )
    return problems


def _check_slot(conn: sa.Connection, slot: str) -> list[Problem]:
    row = _existing_slot(conn, slot)
    if row is not None:
        return _check_existing_slot(slot, row.slot_type, row.plugin, row.database, row.here)
    used = int(conn.execute(sa.text("SELECT count(*) FROM pg_replication_slots")).scalar_one())
    limit = int(_setting(conn, "max_replication_slots"))
    if used < limit:
        return []
    return [
        Problem(
            f"no free replication slot for {slot!r}: {used} of max_replication_slots={limit} "
            "are in use",
            f"drop an unused slot (SELECT pg_drop_replication_slot('name');) or "
            f"{_restart_fix('max_replication_slots', str(limit + 4))}",
        )
    ]


def _check_failover(conn: sa.Connection, slot: str, failover: bool) -> list[Problem]:
    """``[source] failover_slot``: PostgreSQL 17 or later; an existing slot made without it
    cannot be changed to it by SQL."""
    if not failover:
        return []
    version = server_version(conn)
    if version < 170000:
        return [
            Problem(
                f"failover_slot = true needs PostgreSQL 17 or later (failover slots); this "
                f"server is {version // 10000}",
                "set [source] failover_slot = false (after a failover: init and a new "
                "snapshot), or upgrade the server",
            )
        ]
    made = conn.execute(
        sa.text("SELECT failover FROM pg_catalog.pg_replication_slots WHERE slot_name = :s"),
        {"s": slot},
    ).scalar_one_or_none()
    if made is None or made:
        return []
    return [
        Problem(
            f"replication slot {slot!r} exists without failover, so a standby will not keep "
            "it (failover_slot = true applies to slots init creates)",
            f"teardown, then init again (a new snapshot), or SELECT pg_drop_replication_slot("
            f"{_literal(slot)}); before init",
            "warning",
        )
    ]


def _check_wal_senders(conn: sa.Connection) -> list[Problem]:
    limit = int(_setting(conn, "max_wal_senders"))
    if limit == 0:
        return [
            Problem(
                "max_wal_senders is 0; streaming the log needs a WAL sender",
                _restart_fix("max_wal_senders", "10"),
            )
        ]
    used = int(conn.execute(sa.text("SELECT count(*) FROM pg_stat_replication")).scalar_one())
    if used < limit:
        return []
    return [
        Problem(
            f"all {limit} WAL senders are in use (max_wal_senders); the log reader could not "
            "connect now",
            _restart_fix("max_wal_senders", str(limit + 4)),
            "warning",
        )
    ]


def _check_wal_keep(conn: sa.Connection) -> list[Problem]:
    if _setting(conn, "max_slot_wal_keep_size") != "-1":
        return []
    return [
        Problem(
            "max_slot_wal_keep_size is -1 (unlimited): a slot nobody reads keeps all WAL "
            "and can fill the disk",
            "ALTER SYSTEM SET max_slot_wal_keep_size = '10GB'; SELECT pg_reload_conf();",
            "warning",
        )
    ]


def _check_table(
    conn: sa.Connection, table: TableId, publication: str | None, gencols: bool
) -> list[Problem]:
    oid = table_oid(conn, table)
    if oid is None:
        user = str(conn.execute(sa.text("SELECT current_user")).scalar_one())
        return [Problem(str(missing_table_error(table, user)), "check the table name")]
    has_pk = conn.execute(
        sa.text(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint "
            "WHERE conrelid = :oid AND contype = 'p')"
        ),
        {"oid": oid},
    ).scalar_one()
    return [
        *(
            _identity_problem(table, has_pk, leaf)
            for leaf in _identity_gaps(conn, oid, has_pk, gencols)
        ),
        *_generated_columns_problem(conn, table, oid, publication, gencols),
    ]


def generated_columns(conn: sa.Connection, oid: int, published: bool = False) -> list[str]:
    """The table's generated columns the log does not carry, in table order: all of them, or
    (``published``: a publication with ``publish_generated_columns = stored``) the virtual
    ones, which no PostgreSQL version publishes."""
    rows = conn.execute(
        sa.text(
            "SELECT a.attname FROM pg_catalog.pg_attribute a WHERE a.attrelid = :oid "
            "AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated <> '' "
            "AND NOT (:published AND a.attgenerated = 's') ORDER BY a.attnum"
        ),
        {"oid": oid, "published": published},
    )
    return [str(r.attname) for r in rows]


def publishes_generated_columns(conn: sa.Connection, publication: str | None) -> bool:
    """Whether ``publication`` carries stored generated columns in the log (PostgreSQL 18's
    ``publish_generated_columns = stored``); one not created yet: whether ``init`` would
    create it so (on 18 and later it does)."""
    if server_version(conn) < 180000:
        return False
    if publication is None:
        return True
    published = conn.execute(
        sa.text("SELECT pubgencols = 's' FROM pg_catalog.pg_publication WHERE pubname = :p"),
        {"p": publication},
    ).scalar_one_or_none()
    return True if published is None else bool(published)


def _generated_columns_problem(
    conn: sa.Connection, table: TableId, oid: int, publication: str | None, gencols: bool
) -> list[Problem]:
    columns = generated_columns(conn, oid, gencols)
    if not columns:
        return []
    fix = (
        "compute them where the events are consumed, or make them plain columns filled by "
        "a trigger if the events must carry them"
    )
    virtual = set(generated_columns(conn, oid, published=True))
    if set(columns) - virtual and publication is not None and server_version(conn) >= 180000:
        fix = (
            f"stored ones: ALTER PUBLICATION {quote_name(publication)} SET "
            "(publish_generated_columns = stored); then the log and READ rows carry them"
            + (f"; virtual ones: {fix}" if virtual else "")
        )
    return [
        Problem(
            f"table {table} has generated columns ({', '.join(columns)}) that PostgreSQL's "
            "logical replication (pgoutput) does not carry, so snapshotter leaves them out "
            "of snapshot (READ) rows too: no event or landed row holds them (and a primary "
            "key that includes one cannot be snapshotted)",
            fix,
            "warning",
        )
    ]


@dataclass(frozen=True, slots=True)
class Storage:
    """A table that holds rows (the table itself, or a leaf partition of a partitioned one):
    replica identity is set per storage table and is not inherited from the parent."""

    table: TableId
    replica_identity: str  # pg_class.relreplident: d(efault), n(othing), f(ull), i(ndex)
    toast_columns: tuple[str, ...]  # columns whose values can be TOASTed, in table order

    @property
    def full(self) -> bool:
        return self.replica_identity == "f"

    @property
    def toastable(self) -> bool:
        return bool(self.toast_columns)


def storage_tables(conn: sa.Connection, oid: int, gencols: bool = True) -> list[Storage]:
    """The table itself when it is a plain table, else its leaf partitions. Their TOAST-able
    columns are those the log carries: not virtual generated ones, nor stored ones unless
    ``gencols`` (a publication that publishes them; not known: counted, to be safe)."""
    rows = conn.execute(
        sa.text(
            "SELECT n.nspname, c.relname, c.relreplident, ARRAY("
            "  SELECT CAST(a.attname AS text) FROM pg_catalog.pg_attribute a "
            "  WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped "
            f"   AND {_TOASTABLE} "
            "   AND (a.attgenerated = '' OR (:gencols AND a.attgenerated = 's')) "
            "  ORDER BY a.attnum) AS toast_columns "
            "FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind <> 'p' AND c.oid IN ("
            # pg_partition_tree lists nothing for a table outside any partition tree.
            "  SELECT t.relid FROM pg_catalog.pg_partition_tree(CAST(:oid AS regclass)) t "
            "  WHERE t.isleaf UNION ALL SELECT CAST(:oid AS oid)) "
            "ORDER BY n.nspname, c.relname"
        ),
        {"oid": oid, "gencols": gencols},
    )
    return [
        Storage(TableId(r.nspname, r.relname), r.relreplident, tuple(r.toast_columns)) for r in rows
    ]


def _identity_gaps(conn: sa.Connection, oid: int, has_pk: bool, gencols: bool) -> list[Storage]:
    """Storage that lacks REPLICA IDENTITY FULL although it needs it."""
    storage = storage_tables(conn, oid, gencols)
    return [s for s in storage if not s.full and (s.toastable or not has_pk)]


def _identity_problem(table: TableId, has_pk: bool, leaf: Storage) -> Problem:
    where = str(table) if leaf.table == table else f"partition {leaf.table} of {table}"
    reasons = []
    if leaf.toastable:
        reasons.append(
            "it has TOAST-able columns, and an UPDATE that leaves a TOASTed value unchanged "
            "logs that value only as 'unchanged' unless the whole old row is logged"
        )
    if not has_pk:
        reasons.append(
            "it has no primary key, so UPDATEs and DELETEs carry no key to match rows by"
        )
    fix = f"ALTER TABLE {quote_table(leaf.table)} REPLICA IDENTITY FULL;"
    if has_pk:
        # Only TOAST is at stake: capture still works, with Debezium's placeholder for the
        # unchanged value, which snapshotter's own consumers (verify, landing) fill from the
        # row's previous value. A warning, since FULL also makes every UPDATE log more WAL.
        return Problem(
            f"{where} should have REPLICA IDENTITY FULL: {reasons[0]}; without it such "
            f"updates carry the placeholder {UNAVAILABLE_VALUE!r} for that column, which "
            "`snapshotter verify` and snapshotter's landing resolve from the row's previous "
            "value (other consumers must do the same), and execute-snapshot of "
            f"{table} is refused (its snapshot could not converge)",
            fix,
            "warning",
        )
    return Problem(f"{where} needs REPLICA IDENTITY FULL: {'; and '.join(reasons)}", fix)


_IDENTITY_NAMES = {"d": "DEFAULT", "n": "NOTHING", "i": "USING INDEX", "f": "FULL"}


def check_toast_identity(conn: sa.Connection, table: TableId, gencols: bool = True) -> None:
    """TableError when ``table`` (or a leaf partition of it) has TOAST-able columns and its
    replica identity is not FULL: an in-window UPDATE would then carry the placeholder
    instead of the value, and replace the chunk row that held it (the chunk row is dropped
    for the log's), so the snapshot could not converge. Checked when a snapshot starts."""
    oid = table_oid(conn, table)
    if oid is None:
        user = str(conn.execute(sa.text("SELECT current_user")).scalar_one())
        raise missing_table_error(table, user)
    gaps = [s for s in storage_tables(conn, oid, gencols) if not s.full and s.toastable]
    if gaps:
        raise TableError(toast_refusal(table, gaps))


def toast_refusal(table: TableId, gaps: Sequence[Storage]) -> str:
    """Why a snapshot of ``table`` is refused (``gaps``: its storage lacking FULL with
    TOAST-able columns), and the fix."""
    columns = ", ".join(dict.fromkeys(c for s in gaps for c in s.toast_columns))
    identity = "/".join(dict.fromkeys(_IDENTITY_NAMES.get(s.replica_identity, "?") for s in gaps))
    partitions = [str(s.table) for s in gaps if s.table != table]
    where = f" (partition {', '.join(partitions)})" if partitions else ""
    fixes = " ".join(f"ALTER TABLE {quote_table(s.table)} REPLICA IDENTITY FULL;" for s in gaps)
    return (
        f"snapshot of {table} refused: it has TOAST-able columns ({columns}) and REPLICA "
        f"IDENTITY {identity}{where}, not FULL; an UPDATE that leaves a TOASTed value "
        "unchanged does not carry it in the log, so the snapshot cannot converge. Fix: "
        f"{fixes} then send execute-snapshot again"
    )
