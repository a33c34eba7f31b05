"""PostgreSQL capture setup: what ``snapshotter init`` checks and creates.

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

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.base import PGDialect

from signals.names import TableId
from snapshotter.core.values import UNAVAILABLE_VALUE
from snapshotter.sources.base import TableError
from snapshotter.sources.setup_common import Problem, SetupError

DEFAULT_SCHEMA = "public"  # where an unqualified table name lives

# A preparer that does not double "%" (the psycopg dialect's does, for its pyformat
# placeholders): the statements built here run without parameters and are shown to people.
_PREPARER = PGDialect(paramstyle="named").identifier_preparer  # type: ignore[no-untyped-call]

# Catalog storage of a column whose values can be TOASTed: variable length ("attlen = -1")
# and stored out of line when large ("x" extended, "e" external).
_TOASTABLE = "a.attlen = -1 AND a.attstorage IN ('x', 'e')"


@dataclass(frozen=True, slots=True)
class PublicationChange:
    """What :func:`ensure_publication` did."""

    publication: str
    created: bool
    added: tuple[TableId, ...] = ()
    statements: tuple[str, ...] = field(default=())

    def __str__(self) -> str:
        if self.created:
            return f"publication {self.publication}: created"
        if self.added:
            return f"publication {self.publication}: added {', '.join(map(str, self.added))}"
        return f"publication {self.publication}: already there"


SlotState = Literal["created", "existing"]

EngineOrUrl = sa.Engine | sa.URL | str


# --- quoting -------------------------------------------------------------------------------


def quote_name(name: str) -> str:
    """One identifier (role, publication, slot) quoted as PostgreSQL needs."""
    return _PREPARER.quote(name)


def quote_table(table: TableId) -> str:
    """``schema.table`` quoted as PostgreSQL needs (each part only when necessary)."""
    return _PREPARER.format_table(sa.table(table.table, schema=table.schema))


# --- connections ---------------------------------------------------------------------------


def psycopg_url(url: sa.URL | str) -> sa.URL:
    """The URL with the driver snapshotter uses (psycopg 3), whatever scheme it was given."""
    return sa.make_url(url).set(drivername="postgresql+psycopg")


@contextmanager
def _engine(engine_or_url: EngineOrUrl) -> Iterator[sa.Engine]:
    """The given engine, or a temporary one for a URL (disposed afterwards)."""
    if isinstance(engine_or_url, sa.Engine):
        yield engine_or_url
        return
    engine = sa.create_engine(psycopg_url(engine_or_url))
    try:
        yield engine
    finally:
        engine.dispose()


@contextmanager
def _connection(conn_or_engine: sa.Connection | sa.Engine) -> Iterator[sa.Connection]:
    """A connection: the caller's (who commits), or one committed here for an engine."""
    if isinstance(conn_or_engine, sa.Connection):
        yield conn_or_engine
        return
    with conn_or_engine.begin() as conn:
        yield conn


def _setting(conn: sa.Connection, name: str) -> str:
    return str(conn.execute(sa.text("SELECT current_setting(:n)"), {"n": name}).scalar_one())


def table_oid(conn: sa.Connection, table: TableId) -> int | None:
    """The table's OID by exact (case-sensitive) name, or None when there is none."""
    oid = conn.execute(
        sa.text(
            "SELECT c.oid FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :schema AND c.relname = :table"
        ),
        {"schema": table.schema, "table": table.table},
    ).scalar_one_or_none()
    return None if oid is None else int(oid)


def missing_table_error(table: TableId, user: str) -> TableError:
    return TableError(f"table {table} does not exist or is not visible to user {user}")


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


def _existing_slot(conn: sa.Connection, slot: str) -> sa.Row[Any] | None:
    return conn.execute(
        sa.text(
            "SELECT slot_type, plugin, database, current_database() AS here "
            "FROM pg_catalog.pg_replication_slots WHERE slot_name = :slot"
        ),
        {"slot": slot},
    ).one_or_none()


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


def server_version(conn: sa.Connection) -> int:
    """``server_version_num``: 180006 for 18.6."""
    return int(_setting(conn, "server_version_num"))


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


def _literal(text: str) -> str:
    """A SQL string literal, for fixes shown to people (never executed here)."""
    return "'" + text.replace("'", "''") + "'"


# --- publication ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Publication:
    all_tables: bool
    via_root: bool
    publishes: dict[str, bool]


def _publication(conn: sa.Connection, publication: str) -> _Publication | None:
    row = conn.execute(
        sa.text(
            "SELECT puballtables, pubviaroot, pubinsert, pubupdate, pubdelete, pubtruncate "
            "FROM pg_catalog.pg_publication WHERE pubname = :p"
        ),
        {"p": publication},
    ).one_or_none()
    if row is None:
        return None
    publishes = {
        "insert": row.pubinsert,
        "update": row.pubupdate,
        "delete": row.pubdelete,
        "truncate": row.pubtruncate,
    }
    return _Publication(row.puballtables, row.pubviaroot, publishes)


def _in_publication(conn: sa.Connection, publication: str, oid: int) -> bool:
    """Whether the publication names the table itself or its schema (``FOR TABLES IN
    SCHEMA``, PostgreSQL 15+). Checked in pg_publication_rel rather than the
    pg_publication_tables view: the view lists leaf partitions instead of a partitioned
    root unless publish_via_partition_root is on."""
    in_schema = ""
    if int(_setting(conn, "server_version_num")) >= 150000:
        in_schema = (
            " OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace pn "
            "JOIN pg_catalog.pg_class c ON c.relnamespace = pn.pnnspid "
            "WHERE pn.pnpubid = p.oid AND c.oid = :oid)"
        )
    return bool(
        conn.execute(
            sa.text(
                "SELECT p.puballtables OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r "
                f"WHERE r.prpubid = p.oid AND r.prrelid = :oid){in_schema} "
                "FROM pg_catalog.pg_publication p WHERE p.pubname = :p"
            ),
            {"p": publication, "oid": oid},
        ).scalar_one()
    )


def _table_oids(conn: sa.Connection, tables: Sequence[TableId]) -> dict[TableId, int]:
    out: dict[TableId, int] = {}
    for table in tables:
        oid = table_oid(conn, table)
        if oid is None:
            user = str(conn.execute(sa.text("SELECT current_user")).scalar_one())
            raise missing_table_error(table, user)
        out[table] = oid
    return out


def missing_from_publication(
    conn: sa.Connection, publication: str, tables: Sequence[TableId]
) -> list[TableId]:
    """The tables (each once, in order) the existing publication does not carry yet."""
    if _publication(conn, publication) is None:
        raise SetupError(
            f"publication {publication} does not exist; run `snapshotter init` to create it "
            "(before the replication slot)"
        )
    oids = _table_oids(conn, list(dict.fromkeys(tables)))
    return [t for t, oid in oids.items() if not _in_publication(conn, publication, oid)]


def _execute_as_is(conn: sa.Connection, statement: str) -> None:
    """Run ``statement`` with no parameters at all, so the driver sends it as written (with
    parameters, even none, psycopg would read a "%" in a quoted name as a placeholder)."""
    conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


def add_tables(conn: sa.Connection, publication: str, tables: Sequence[TableId]) -> str | None:
    """``ALTER PUBLICATION ... ADD TABLE`` for ``tables``; returns the statement run."""
    if not tables:
        return None
    statement = (
        f"ALTER PUBLICATION {quote_name(publication)} "
        f"ADD TABLE {', '.join(quote_table(t) for t in tables)}"
    )
    _execute_as_is(conn, statement)
    return statement


def ensure_publication(
    conn_or_engine: sa.Connection | sa.Engine, publication: str, tables: Sequence[TableId]
) -> PublicationChange:
    """Create the publication for ``tables`` (with ``publish_via_partition_root``, so a
    partitioned table's changes are logged under its own name), or add those it lacks.

    With a connection the caller commits; with an engine this commits. An existing
    publication's options are never changed: if they do not fit, SetupError says how to.
    """
    tables = list(dict.fromkeys(t.with_default_schema(DEFAULT_SCHEMA) for t in tables))
    with _connection(conn_or_engine) as conn:
        existing = _publication(conn, publication)
        if existing is None:
            return _create_publication(conn, publication, tables)
        _check_publication(conn, publication, existing, tables)
        missing = missing_from_publication(conn, publication, tables)
        statement = add_tables(conn, publication, missing)
        return PublicationChange(
            publication, False, tuple(missing), (statement,) if statement else ()
        )


def _create_publication(
    conn: sa.Connection, publication: str, tables: Sequence[TableId]
) -> PublicationChange:
    _table_oids(conn, tables)  # a clear error for a missing table
    members = f" FOR TABLE {', '.join(quote_table(t) for t in tables)}" if tables else ""
    # PostgreSQL 18 can log stored generated columns: then READ rows carry them too.
    gencols = ", publish_generated_columns = stored" if server_version(conn) >= 180000 else ""
    statement = (
        f"CREATE PUBLICATION {quote_name(publication)}{members} "
        f"WITH (publish_via_partition_root = true{gencols})"
    )
    _execute_as_is(conn, statement)
    return PublicationChange(publication, True, tuple(tables), (statement,))


def _check_publication(
    conn: sa.Connection, publication: str, pub: _Publication, tables: Sequence[TableId]
) -> None:
    quoted = quote_name(publication)
    silent = [op for op in ("insert", "update", "delete") if not pub.publishes[op]]
    if silent:
        raise SetupError(
            f"publication {publication} does not publish {', '.join(silent)}, so the log "
            f"would miss those changes; run: ALTER PUBLICATION {quoted} "
            "SET (publish = 'insert, update, delete, truncate');"
        )
    if pub.via_root:
        return
    partitioned = [t for t in tables if _is_partitioned(conn, t)]
    if partitioned:
        raise SetupError(
            f"publication {publication} logs changes of {', '.join(map(str, partitioned))} "
            "under their partitions' names (publish_via_partition_root is off); run: "
            f"ALTER PUBLICATION {quoted} SET (publish_via_partition_root = true);"
        )


def _is_partitioned(conn: sa.Connection, table: TableId) -> bool:
    return bool(
        conn.execute(
            sa.text(
                "SELECT c.relkind = 'p' FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :schema AND c.relname = :table"
            ),
            {"schema": table.schema, "table": table.table},
        ).scalar()
    )


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


def drop_publication(engine_or_url: EngineOrUrl, publication: str) -> bool:
    """Drop the publication if it exists; returns whether it existed."""
    with _engine(engine_or_url) as engine, engine.begin() as conn:
        if _publication(conn, publication) is None:
            return False
        _execute_as_is(conn, f"DROP PUBLICATION {quote_name(publication)}")
        return True


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


def publication_exists(conn: sa.Connection, publication: str) -> bool:
    return _publication(conn, publication) is not None
