"""The table privileges the engine uses, checked by ``init`` before anything runs, and a
privilege the source refuses during a run said in one line with the GRANT that fixes it.

What each table needs (docs/sources.md lists the same, and tests/integration/
test_privileges.py grants exactly that to a fresh role):

* a captured table: SELECT (chunk reads);
* the signal table: SELECT, INSERT, UPDATE, DELETE (signals and watermark rows are inserted;
  a watermark row is written with ``INSERT ... ON CONFLICT DO UPDATE`` / ``ON DUPLICATE KEY
  UPDATE``, which needs UPDATE and, on PostgreSQL, SELECT; the cleanup deletes them);
* the notification table (``[notifications] channels`` with "table"): INSERT.

PostgreSQL answers through ``has_table_privilege`` (and ``has_schema_privilege`` for the
schema's USAGE). MySQL and MariaDB have no such function: each privilege is tried with an
``EXPLAIN`` of a statement that needs only it, which the server checks as it would the
statement, without running it (roles, partial revokes and column grants included).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import sqlalchemy as sa

from signals.names import TableId
from snapshotter.sources.setup_common import Problem, Severity

SIGNAL_TABLE_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


@dataclass(frozen=True, slots=True)
class Need:
    """Privileges the engine needs on one table, and what for (in messages)."""

    table: TableId
    privileges: tuple[str, ...]
    why: str
    severity: Severity = "error"


class PrivilegeError(Exception):
    """The source refused a statement for a privilege its user lacks; the message names the
    GRANT that fixes it (one line)."""


def needs_of(
    tables: Sequence[TableId], signal_table: TableId, notification_table: TableId | None
) -> list[Need]:
    """What the engine needs on the captured ``tables``, the signal table and (with the
    table notification channel) the notification table."""
    needs = [Need(t, ("SELECT",), "snapshot chunks read it") for t in tables]
    needs.append(
        Need(
            signal_table,
            SIGNAL_TABLE_PRIVILEGES,
            "signals and snapshot watermark rows are written there: a watermark row is an "
            "upsert, which needs INSERT, UPDATE and SELECT, and DELETE removes them later",
        )
    )
    if notification_table is not None:
        needs.append(Need(notification_table, ("INSERT",), "the table notification channel"))
    return needs


def missing_privileges(engine: sa.Engine, needs: Sequence[Need]) -> list[Problem]:
    """One problem per table whose privileges the connected user lacks, naming the GRANT
    (identifiers quoted). Tables that do not exist are left to the callers' own checks."""
    with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            return _postgres(conn, needs)
        return _mysql(conn, needs)


def _problem(need: Need, missing: Sequence[str], user: str, grant: str) -> Problem:
    return Problem(
        f"user {user} lacks {', '.join(missing)} on {need.table} ({need.why})",
        f"{grant};  -- as the table's owner or an administrator",
        need.severity,
    )


# --- PostgreSQL ----------------------------------------------------------------------------


def _postgres(conn: sa.Connection, needs: Sequence[Need]) -> list[Problem]:
    from snapshotter.sources.postgres.catalog import quote_name, quote_table, table_oid

    user = str(conn.execute(sa.text("SELECT current_user")).scalar_one())
    problems = []
    schemas: dict[str, None] = {}
    for need in needs:
        oid = table_oid(conn, need.table)
        if oid is None:
            continue
        schemas.setdefault(str(need.table.schema))
        missing = [
            p
            for p in need.privileges
            if not conn.execute(
                sa.text("SELECT has_table_privilege(:oid, :p)"), {"oid": oid, "p": p}
            ).scalar_one()
        ]
        if missing:
            grant = f"GRANT {', '.join(missing)} ON {quote_table(need.table)} TO {quote_name(user)}"
            problems.append(_problem(need, missing, user, grant))
    for schema in schemas:
        usable = conn.execute(
            sa.text("SELECT has_schema_privilege(:s, 'USAGE')"), {"s": schema}
        ).scalar_one()
        if not usable:
            problems.append(
                Problem(
                    f"user {user} lacks USAGE on schema {schema} (its tables cannot be reached)",
                    f"GRANT USAGE ON SCHEMA {quote_name(schema)} TO {quote_name(user)};  -- as "
                    "the schema's owner or an administrator",
                )
            )
    return problems


# --- MySQL / MariaDB -----------------------------------------------------------------------

# A statement per privilege that needs only that privilege (no column is read), tried with
# EXPLAIN: the server checks the privileges and runs nothing.
_PROBES = {
    "SELECT": "EXPLAIN SELECT * FROM {t} LIMIT 0",
    "INSERT": "EXPLAIN INSERT INTO {t} () VALUES ()",
    "UPDATE": "EXPLAIN UPDATE {t} SET {c} = NULL WHERE 1 = 0",
    "DELETE": "EXPLAIN DELETE FROM {t} WHERE 1 = 0",
}


def _mysql(conn: sa.Connection, needs: Sequence[Need]) -> list[Problem]:
    from snapshotter.common.errors import is_privilege_error

    quote = conn.dialect.identifier_preparer.quote
    account = str(conn.execute(sa.text("SELECT CURRENT_USER()")).scalar_one())
    inspector = sa.inspect(conn)
    problems = []
    for need in needs:
        if not inspector.has_table(need.table.table, schema=need.table.schema):
            continue
        table = f"{quote(str(need.table.schema))}.{quote(need.table.table)}"
        first = inspector.get_columns(need.table.table, schema=need.table.schema)[0]["name"]
        missing = []
        for privilege in need.privileges:
            probe = _PROBES[privilege].format(t=table, c=quote(first))
            try:  # a refused statement does not end a MySQL transaction
                conn.exec_driver_sql(probe, execution_options={"no_parameters": True})
            except sa.exc.DBAPIError as exc:
                if not is_privilege_error(exc):
                    raise
                missing.append(privilege)
        if missing:
            grant = f"GRANT {', '.join(missing)} ON {table} TO {mysql_account(account)}"
            problems.append(_problem(need, missing, account, grant))
    return problems


def mysql_account(user: str) -> str:
    """``name@host`` (CURRENT_USER()) as ``'name'@'host'`` for a GRANT statement."""
    name, at, host = user.rpartition("@")
    if not at:
        name, host = user, "%"

    def string(text: str) -> str:
        return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"

    return f"{string(name)}@{string(host)}"


# --- a privilege refused during a run -------------------------------------------------------


def grant_for(engine: sa.Engine, table: TableId, privileges: Sequence[str]) -> str:
    """The GRANT of ``privileges`` on ``table`` to the engine's user (quoted), read from the
    server (CURRENT_USER) when it answers, else from the URL."""
    user = engine.url.username or "the configured user"
    try:
        with engine.connect() as conn:
            user = str(conn.execute(sa.text("SELECT CURRENT_USER")).scalar_one())
            dialect = conn.dialect
    except sa.exc.SQLAlchemyError:
        dialect = engine.dialect
    if dialect.name == "postgresql":
        from snapshotter.sources.postgres.catalog import quote_name, quote_table

        return f"GRANT {', '.join(privileges)} ON {quote_table(table)} TO {quote_name(user)}"
    quote = dialect.identifier_preparer.quote
    target = f"{quote(str(table.schema))}.{quote(table.table)}"
    return f"GRANT {', '.join(privileges)} ON {target} TO {mysql_account(user)}"


@contextmanager
def granted(
    engine: sa.Engine, table: TableId, privileges: Sequence[str], what: str
) -> Iterator[None]:
    """Run the block; a privilege the source refuses becomes a :class:`PrivilegeError` of one
    line naming ``what`` was refused and the GRANT that fixes it (never SQLAlchemy's dump of
    the statement and its parameters)."""
    from snapshotter.common.errors import is_privilege_error, source_reason

    try:
        yield
    except sa.exc.DBAPIError as exc:
        if not is_privilege_error(exc):
            raise
        reason = source_reason(exc)
        grant = grant_for(engine, table, privileges)
        raise PrivilegeError(
            f"{what} was refused ({reason}); run as an administrator: {grant}"
        ) from exc
