"""The grants of the user a MySQL / MariaDB source connects as: SHOW GRANTS read (IO), its
lines parsed and judged (pure): what binlog capture and the snapshot lack (REPLICATION SLAVE,
REPLICATION CLIENT / BINLOG MONITOR, SELECT on the database), each with the GRANT that fixes
it, and what a snapshot filter could reach past that (FILE, SUPER, ALL)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from snapshotter.sources.mysql.server_facts import ServerFacts
from snapshotter.sources.setup_common import Problem

# --- reading (IO) --------------------------------------------------------------------------


def show_grants(conn: sa.Connection, is_mariadb: bool) -> tuple[str, ...]:
    """SHOW GRANTS of the current user. MariaDB's includes the grants of the active role;
    MySQL's lists role grants only by name, so with active roles ask again ``USING`` them
    (a binlog connection of this user has the same default roles)."""
    statement = "SHOW GRANTS"
    if not is_mariadb:
        try:
            roles = conn.execute(sa.text("SELECT CURRENT_ROLE()")).scalar()
        except sa.exc.DBAPIError:
            roles = None
        if roles and str(roles).upper() != "NONE":
            statement = f"SHOW GRANTS FOR CURRENT_USER() USING {roles}"
    try:
        rows = _run_as_is(conn, statement)
    except sa.exc.DBAPIError:
        if statement == "SHOW GRANTS":
            raise
        rows = _run_as_is(conn, "SHOW GRANTS")
    return tuple(_without_password(str(row[0])) for row in rows)


def _run_as_is(conn: sa.Connection, statement: str) -> list[sa.Row[tuple[object, ...]]]:
    """Run ``statement`` without parameters, so a "%" in it (a host) is sent as written."""
    return list(conn.exec_driver_sql(statement, execution_options={"no_parameters": True}))


_IDENTIFIED = re.compile(r"\s+IDENTIFIED\s+(?:BY|VIA|WITH)\b.*$", re.IGNORECASE | re.DOTALL)


def _without_password(line: str) -> str:
    """A SHOW GRANTS line without MariaDB's ``IDENTIFIED BY PASSWORD '<hash>'`` tail."""
    return _IDENTIFIED.sub("", line)


# --- judging (pure) ------------------------------------------------------------------------

_ALL = frozenset({"ALL", "ALL PRIVILEGES"})
_READ_BINLOG = frozenset({"REPLICATION SLAVE", "REPLICATION REPLICA"})
# SHOW BINARY LOG STATUS / SHOW MASTER STATUS / SHOW BINARY LOGS: REPLICATION CLIENT (MySQL,
# MariaDB before 10.5.2), BINLOG MONITOR (its MariaDB 10.5.2+ name), or SUPER (deprecated).
_BINLOG_MONITOR = frozenset({"REPLICATION CLIENT", "BINLOG MONITOR", "SUPER"})


@dataclass(frozen=True, slots=True)
class _Grant:
    """One SHOW GRANTS line that grants (or, MySQL's partial revokes, revokes) privileges on
    ``database``.``table`` (None for ``*``)."""

    revoke: bool
    privileges: frozenset[str]  # upper case, single spaces: "REPLICATION SLAVE"
    column_level: frozenset[str]  # privileges granted on some columns only
    database: str | None
    table: str | None

    def gives(self, wanted: Iterable[str]) -> bool:
        return bool(self.privileges & (_ALL | frozenset(wanted)))


_TOKEN = re.compile(
    r"""\s*(?:
        `(?P<bt>(?:[^`]|``)*)`
      | "(?P<dq>(?:[^"]|"")*)"
      | '(?P<sq>(?:[^'\\]|''|\\.)*)'
      | (?P<word>[\w$%*]+)
      | (?P<punct>\S)
    )""",
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    quoted: bool

    def keyword(self) -> str:
        return "" if self.quoted else self.text.upper()


def _tokens(line: str) -> list[_Token]:
    out = []
    for match in _TOKEN.finditer(line):
        if match.group("bt") is not None:
            out.append(_Token(match.group("bt").replace("``", "`"), True))
        elif match.group("dq") is not None:
            out.append(_Token(match.group("dq").replace('""', '"'), True))
        elif match.group("sq") is not None:
            out.append(_Token(match.group("sq").replace("''", "'"), True))
        elif match.group("word") is not None:
            out.append(_Token(match.group("word"), False))
        elif match.group("punct") is not None:
            out.append(_Token(match.group("punct"), False))
    return out


def _parse_grant(line: str) -> _Grant | None:
    """A GRANT/REVOKE line on ``*.*``, ``db.*`` or ``db.table``; None for anything else
    (role grants, PROXY, routines, SET DEFAULT ROLE)."""
    tokens = _tokens(line)
    if not tokens or tokens[0].keyword() not in ("GRANT", "REVOKE"):
        return None
    revoke = tokens[0].keyword() == "REVOKE"
    privileges: set[str] = set()
    column_level: set[str] = set()
    words: list[str] = []
    depth = 0
    columns = False
    i = 1
    while i < len(tokens):
        token = tokens[i]
        if token.text == "(" and not token.quoted:
            depth += 1
            columns = True
        elif token.text == ")" and not token.quoted:
            depth -= 1
        elif depth == 0 and token.keyword() in (",", "ON"):
            if words:
                (column_level if columns else privileges).add(" ".join(words).upper())
            words, columns = [], False
            if token.keyword() == "ON":
                break
        elif depth == 0:
            words.append(token.text)
        i += 1
    else:
        return None  # no ON: a role grant ("GRANT `role` TO `user`")
    rest = tokens[i + 1 :]
    if rest and rest[0].keyword() == "TABLE":
        rest = rest[1:]
    if not rest or rest[0].keyword() in ("FUNCTION", "PROCEDURE", "PACKAGE"):
        return None
    # Only "db.table" forms: SHOW GRANTS always names the database ("ON *" would mean the
    # default database at grant time).
    if len(rest) < 3 or rest[1].text != "." or rest[1].quoted:
        return None
    database, table = _name(rest[0]), _name(rest[2])
    if database is None and table is not None:
        return None
    return _Grant(revoke, frozenset(privileges), frozenset(column_level), database, table)


def _name(token: _Token) -> str | None:
    return None if token.text == "*" and not token.quoted else token.text


def _like(pattern: str, name: str) -> bool:
    """Whether a database-level grant's name (a LIKE pattern: ``%``, ``_``, ``\\`` escapes)
    covers ``name``; case-insensitively, to never report a grant that works as missing."""
    regex = []
    escaped = False
    for char in pattern:
        if escaped:
            regex.append(re.escape(char))
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "%":
            regex.append(".*")
        elif char == "_":
            regex.append(".")
        else:
            regex.append(re.escape(char))
    return re.fullmatch("".join(regex), name, re.IGNORECASE | re.DOTALL) is not None


def _quote_account(user: str) -> str:
    """``name@host`` (CURRENT_USER()) as ``'name'@'host'`` for a GRANT statement."""
    name, at, host = user.rpartition("@")
    if not at:
        name, host = user, "%"
    return f"{_string(name)}@{_string(host)}"


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _quote_database(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def check_privileges(facts: ServerFacts) -> list[Problem]:
    grants = [g for g in map(_parse_grant, facts.grants) if g is not None]
    given = [g for g in grants if not g.revoke]
    account = _quote_account(facts.user)
    problems = []
    global_ = [g for g in given if g.database is None and g.table is None]
    missing = []
    if not any(g.gives(_READ_BINLOG) for g in global_):
        missing.append(("REPLICATION SLAVE", "to read the binlog"))
    if not any(g.gives(_BINLOG_MONITOR) for g in global_):
        missing.append((facts.binlog_monitor_privilege, "to ask for the binlog position"))
    if missing:
        names = ", ".join(name for name, _ in missing)
        role_hint = ""
        if any(_is_role_grant(line) for line in facts.grants):
            role_hint = (
                " (privileges of roles that are not active by default do not count: the "
                "binlog connection has only the default roles)"
            )
        problems.append(
            Problem(
                f"user {facts.user} lacks "
                + " and ".join(f"{name} ({why})" for name, why in missing)
                + " on *.*"
                + role_hint,
                f"GRANT {names} ON *.* TO {account};  -- as an administrator",
            )
        )
    if facts.database is not None:
        problems.extend(_check_select(facts, grants, account))
    return problems


# Global privileges past what the engine needs that a snapshot filter would run with.
_FILTER_REACH = {
    "ALL PRIVILEGES": "read every database and the server's files (LOAD_FILE)",
    "FILE": "read the server's files (LOAD_FILE)",
    "SUPER": "use an administrator's privilege (SUPER) in any function it calls",
}


def filter_reach(facts: ServerFacts) -> list[Problem]:
    """A warning when the user holds FILE, SUPER or ALL on ``*.*``: a snapshot filter is
    SQL from the signal table, run as this user (in a READ ONLY transaction)."""
    held: list[str] = []
    for grant in map(_parse_grant, facts.grants):
        if grant is None or grant.revoke or grant.database is not None:
            continue
        if grant.privileges & _ALL:
            held.append("ALL PRIVILEGES")
        held.extend(p for p in ("FILE", "SUPER") if p in grant.privileges)
    held = list(dict.fromkeys(held))
    if not held:
        return []
    can = "; ".join(_FILTER_REACH[p] for p in held)
    return [
        Problem(
            f"user {facts.user} holds {', '.join(held)} on *.*, and snapshot filters (SQL from "
            f"the signal table) run as it: whoever can insert into the signal table can {can}",
            "run snapshotter as a user of its own with only REPLICATION SLAVE, "
            f"{facts.binlog_monitor_privilege} on *.*, SELECT on the database and INSERT, "
            "UPDATE, DELETE on the signal table (docs/sources.md: Privileges)",
            "warning",
        )
    ]


def _is_role_grant(line: str) -> bool:
    tokens = _tokens(line)
    return (
        bool(tokens)
        and tokens[0].keyword() == "GRANT"
        and all(t.keyword() != "ON" for t in tokens)
        and any(t.keyword() == "TO" for t in tokens)
    )


def _check_select(facts: ServerFacts, grants: Sequence[_Grant], account: str) -> list[Problem]:
    database = facts.database
    assert database is not None
    select = ("SELECT",)
    # MySQL's partial revokes ("REVOKE SELECT ON `db`.* FROM ...") take a database out of a
    # global grant.
    revoked = any(
        g.revoke and g.table is None and g.database and _like(g.database, database)
        for g in grants
        if g.gives(select)
    )
    for g in grants:
        if g.revoke or g.table is not None or not g.gives(select):
            continue
        if g.database is None and not revoked:
            return []
        if g.database is not None and _like(g.database, database):
            return []
    fix = f"GRANT SELECT ON {_quote_database(database)}.* TO {account};  -- as an administrator"
    partial = sorted(
        {
            g.table
            for g in grants
            if not g.revoke
            and g.table is not None
            and g.database is not None
            and _like(g.database, database)
            and (g.gives(select) or "SELECT" in g.column_level)
        }
    )
    if partial:
        return [
            Problem(
                f"user {facts.user} may SELECT only some tables of database {database} "
                f"({', '.join(partial)}): every captured table and the "
                "signal table need SELECT",
                fix + " (or grant SELECT on each captured table)",
                "warning",
            )
        ]
    return [
        Problem(
            f"user {facts.user} lacks SELECT on database {database} (the snapshot reads "
            "the tables)",
            fix,
        )
    ]
