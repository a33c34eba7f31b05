"""The publication: created and extended (``init``, a snapshot of a table it lacks), checked,
dropped (``teardown``); what it carries into the log, and which publications carry a table.

pgoutput sends only the changes of tables the publication names (itself, through its schema,
or ``FOR ALL TABLES``), only the operations it publishes, and only the rows and columns its
row filters and column lists let through (PostgreSQL 15+). A signal table dropped and
created again (by another pipeline's teardown, a demo script, a person) leaves the
publication: from then on no signal and no watermark row reaches the engine, silently. So
``run`` asks at start what is missing (``coverage_gaps``) and adds the tables back when the
role owns the publication (``add_tables``); ``status`` and ``signal`` say the same.

Names are quoted by SQLAlchemy's preparer; catalog lookups take them as bound parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.postgres.catalog import (
    DEFAULT_SCHEMA,
    EngineOrUrl,
    _connection,
    _engine,
    missing_table_error,
    quote_name,
    quote_table,
    server_version,
    table_oid,
)
from snapshotter.sources.setup_common import SetupError


def _in_schema_clause(conn: sa.Connection) -> str:
    """SQL: publication ``p`` carries table ``:oid`` through its schema (``FOR TABLES IN
    SCHEMA``, PostgreSQL 15+; nothing before)."""
    if server_version(conn) < 150000:
        return ""
    return (
        " OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace pn "
        "JOIN pg_catalog.pg_class c ON c.relnamespace = pn.pnnspid "
        "WHERE pn.pnpubid = p.oid AND c.oid = :oid)"
    )


def publications_with(conn: sa.Connection, table: TableId) -> list[str]:
    """The publications that carry ``table`` (naming it, its schema, or all tables), in name
    order; [] when it does not exist."""
    oid = table_oid(conn, table)
    if oid is None:
        return []
    in_schema = _in_schema_clause(conn)
    rows = conn.execute(
        sa.text(
            "SELECT p.pubname FROM pg_catalog.pg_publication p WHERE p.puballtables "
            "OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_rel r "
            f"WHERE r.prpubid = p.oid AND r.prrelid = :oid){in_schema} ORDER BY p.pubname"
        ),
        {"oid": oid},
    )
    return [str(r.pubname) for r in rows]


@dataclass(frozen=True, slots=True)
class Gaps:
    """What the publication does not carry that the engine needs."""

    publication: str
    exists: bool = True
    owned: bool = False  # the connected role may alter it (owns it, or is a member of its owner)
    unpublished: tuple[str, ...] = ()  # operations it does not publish (insert, update, delete)
    signal_table: TableId | None = None  # the signal table, when the publication lacks it
    tables: tuple[TableId, ...] = ()  # captured tables it lacks
    narrowed: tuple[tuple[TableId, str], ...] = ()  # a row filter or column list, and which
    no_signal_table: bool = False  # the signal table does not exist at all
    # Missing tables without a replica identity (no primary key, not FULL): in a publication
    # of updates and deletes, the application's UPDATE and DELETE on them would fail.
    unsafe: tuple[TableId, ...] = ()

    @property
    def missing(self) -> tuple[TableId, ...]:
        """Tables ``ALTER PUBLICATION ... ADD TABLE`` would add."""
        return ((self.signal_table,) if self.signal_table else ()) + self.tables

    @property
    def repairable(self) -> bool:
        """Only tables are missing, and the role may add them."""
        return (
            self.exists
            and self.owned
            and not self.unpublished
            and not self.narrowed
            and not self.no_signal_table
            and not self.unsafe
        )

    def lines(self, signal_table: TableId) -> list[str]:
        """One line per gap: what is missing, what it costs, and the fix."""
        name = self.publication
        quoted = quote_name(name)
        if not self.exists:
            return [
                f"publication {name} does not exist: no change reaches the engine (no signal, "
                "no watermark row, no change of a captured table); run `snapshotter init`"
            ]
        out = []
        if self.no_signal_table:
            out.append(
                f"the signal table {signal_table} does not exist: no signal can be sent and "
                "no snapshot can write its watermarks; run `snapshotter init` to create it"
            )
        if self.unpublished:
            out.append(
                f"publication {name} does not publish {', '.join(self.unpublished)}: those "
                f"changes are not in the log; run: ALTER PUBLICATION {quoted} SET (publish = "
                "'insert, update, delete, truncate');"
            )
        if self.signal_table is not None:
            out.append(
                f"publication {name} does not carry the signal table {signal_table} (was it "
                "dropped and created again?): signals and snapshot watermarks never reach "
                f"the engine; run: ALTER PUBLICATION {quoted} ADD TABLE "
                f"{quote_table(signal_table)}; then send the lost signals again"
            )
        if self.tables:
            shown = ", ".join(map(str, self.tables))
            out.append(
                f"publication {name} does not carry captured tables {shown}: their changes "
                f"are not in the log; run: ALTER PUBLICATION {quoted} ADD TABLE "
                f"{', '.join(quote_table(t) for t in self.tables)};"
            )
        for table in self.unsafe:
            out.append(
                f"{table} has no replica identity (no primary key, not FULL): added to "
                f"publication {name}, its UPDATEs and DELETEs would fail; run: ALTER TABLE "
                f"{quote_table(table)} REPLICA IDENTITY FULL; then ALTER PUBLICATION {quoted} "
                f"ADD TABLE {quote_table(table)};"
            )
        for table, what in self.narrowed:
            out.append(
                f"publication {name} has a {what} on {table}: some of its changes are not in "
                f"the log; run: ALTER PUBLICATION {quoted} SET TABLE ... without it, or "
                f"ALTER PUBLICATION {quoted} DROP TABLE {quote_table(table)}; then "
                f"ALTER PUBLICATION {quoted} ADD TABLE {quote_table(table)};"
            )
        return out


def coverage_gaps(
    conn: sa.Connection, publication: str, signal_table: TableId, tables: Sequence[TableId]
) -> Gaps:
    """What ``publication`` lacks of what the engine needs: the signal table (inserts), the
    captured ``tables`` (inserts, updates, deletes), whole rows. Tables that do not exist
    are left out (the snapshot reports them)."""
    row = conn.execute(
        sa.text(
            "SELECT pubinsert, pubupdate, pubdelete, "
            "pg_catalog.pg_has_role(pubowner, 'USAGE') AS owned "
            "FROM pg_catalog.pg_publication WHERE pubname = :p"
        ),
        {"p": publication},
    ).one_or_none()
    if row is None:
        return Gaps(publication, exists=False)
    unpublished = tuple(
        op
        for op, on in (
            ("insert", row.pubinsert),
            ("update", row.pubupdate),
            ("delete", row.pubdelete),
        )
        if not on
    )
    wanted = [t.with_default_schema(DEFAULT_SCHEMA) for t in (signal_table, *tables)]
    missing: list[TableId] = []
    narrowed: list[tuple[TableId, str]] = []
    for table in dict.fromkeys(wanted):
        if table_oid(conn, table) is None:
            continue
        if publication not in publications_with(conn, table):
            missing.append(table)
            continue
        narrowed.extend((table, what) for what in _narrowing(conn, publication, table))
    signal = signal_table if signal_table in missing else None
    unsafe = tuple(t for t in missing if not _has_identity(conn, t))
    return Gaps(
        publication,
        no_signal_table=table_oid(conn, signal_table) is None,
        owned=bool(row.owned),
        unpublished=unpublished,
        signal_table=signal,
        tables=tuple(t for t in missing if t != signal_table),
        narrowed=tuple(narrowed),
        unsafe=unsafe,
    )


def _has_identity(conn: sa.Connection, table: TableId) -> bool:
    """Whether UPDATE and DELETE on ``table`` can be published: replica identity FULL or an
    index, or the default with a primary key."""
    return bool(
        conn.execute(
            sa.text(
                "SELECT c.relreplident IN ('f', 'i') OR (c.relreplident = 'd' AND EXISTS ("
                "SELECT 1 FROM pg_catalog.pg_constraint k WHERE k.conrelid = c.oid "
                "AND k.contype = 'p')) FROM pg_catalog.pg_class c "
                "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :schema AND c.relname = :table"
            ),
            {"schema": table.schema, "table": table.table},
        ).scalar()
    )


def _narrowing(conn: sa.Connection, publication: str, table: TableId) -> list[str]:
    """A row filter or column list the publication puts on ``table`` (PostgreSQL 15+)."""
    if server_version(conn) < 150000:
        return []
    row = conn.execute(
        sa.text(
            "SELECT r.prqual IS NOT NULL AS filtered, r.prattrs IS NOT NULL AS columns "
            "FROM pg_catalog.pg_publication_rel r "
            "JOIN pg_catalog.pg_publication p ON p.oid = r.prpubid "
            "JOIN pg_catalog.pg_class c ON c.oid = r.prrelid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE p.pubname = :p AND n.nspname = :schema AND c.relname = :table"
        ),
        {"p": publication, "schema": table.schema, "table": table.table},
    ).one_or_none()
    if row is None:
        return []
    return [w for w, on in (("row filter", row.filtered), ("column list", row.columns)) if on]


def repair(conn: sa.Connection, gaps: Gaps) -> str | None:
    """Add the missing tables to the publication (the caller commits); the statement run,
    or None when nothing was missing."""
    return add_tables(conn, gaps.publication, gaps.missing)


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
    in_schema = _in_schema_clause(conn)
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


def drop_publication(engine_or_url: EngineOrUrl, publication: str) -> bool:
    """Drop the publication if it exists; returns whether it existed."""
    with _engine(engine_or_url) as engine, engine.begin() as conn:
        if _publication(conn, publication) is None:
            return False
        _execute_as_is(conn, f"DROP PUBLICATION {quote_name(publication)}")
        return True


def publication_exists(conn: sa.Connection, publication: str) -> bool:
    return _publication(conn, publication) is not None
