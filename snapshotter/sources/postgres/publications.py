"""What the publication carries into the log, and which publications carry a table.

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
from dataclasses import dataclass

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.postgres.setup import (
    DEFAULT_SCHEMA,
    add_tables,
    quote_name,
    quote_table,
    table_oid,
)


def _server_version(conn: sa.Connection) -> int:
    return int(conn.execute(sa.text("SELECT current_setting('server_version_num')")).scalar_one())


def publications_with(conn: sa.Connection, table: TableId) -> list[str]:
    """The publications that carry ``table`` (naming it, its schema, or all tables), in name
    order; [] when it does not exist."""
    oid = table_oid(conn, table)
    if oid is None:
        return []
    in_schema = ""
    if _server_version(conn) >= 150000:
        in_schema = (
            " OR EXISTS (SELECT 1 FROM pg_catalog.pg_publication_namespace pn "
            "JOIN pg_catalog.pg_class c ON c.relnamespace = pn.pnnspid "
            "WHERE pn.pnpubid = p.oid AND c.oid = :oid)"
        )
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
    if _server_version(conn) < 150000:
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
