"""MySQL / MariaDB capture setup: what ``snapshotter init`` checks on a MySQL-family source.

Reading changes from the binlog needs binary logging on (``log_bin``, a restart to change),
row events with every column of the whole row and the columns' names (``binlog_format =
ROW``, ``binlog_row_image = FULL``, ``binlog_row_metadata = FULL``), commits in binlog order
(MySQL's ``binlog_order_commits``; MariaDB always does), a server id that is not 0 and not the
binlog client's own, and a user allowed to read the binlog (REPLICATION SLAVE), ask where it
is (REPLICATION CLIENT, called BINLOG MONITOR on MariaDB 10.5.2+) and read the tables
(SELECT). Row events must arrive in a form the reader decodes: not PARTIAL_JSON updates, not
compressed (MySQL's ``binlog_transaction_compression``, MariaDB's ``log_bin_compress``).

:func:`gather` reads the facts (IO), :func:`check` judges them (pure), and every problem says
what to type: ``SET GLOBAL ...`` for the running server where the variable is dynamic, and
the ``my.cnf`` line under ``[mysqld]`` that keeps it across restarts. Nothing here changes a
server setting or a grant by itself.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from snapshotter.sources.setup_common import Problem

__all__ = [
    "BinlogRetention",
    "ServerFacts",
    "binary_logs",
    "binlog_retention",
    "check",
    "check_prerequisites",
    "filter_reach",
    "gather",
]

MIN_RETENTION_SECONDS = 86_400  # warn when binlogs are purged sooner than this
SUGGESTED_RETENTION_DAYS = 7
# MySqlConnector.server_id: the random client id picked when source.server_id is unset.
RANDOM_CLIENT_IDS = range(5400, 6400)

# Global variables gathered (absent ones are None in ServerFacts): what the checks need, and
# the GTID settings for information.
_VARIABLES = (
    "log_bin",
    "binlog_format",
    "binlog_row_image",
    "binlog_row_metadata",
    "binlog_order_commits",  # MySQL only
    "server_id",
    "binlog_expire_logs_seconds",  # MySQL 8, MariaDB 10.6+
    "expire_logs_days",  # MariaDB (fractional from 10.6), MySQL 8.0 (removed in 8.4)
    "binlog_expire_logs_auto_purge",  # MySQL 8.0.29+
    "gtid_mode",  # MySQL
    "gtid_strict_mode",  # MariaDB
    "binlog_row_value_options",  # MySQL
    "binlog_transaction_compression",  # MySQL 8.0.20+
    "log_bin_compress",  # MariaDB
)


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the server says about itself: global variables as reported (``None`` where the
    server has no such variable) and the grants of the connected user."""

    version: str  # SELECT VERSION(): "8.4.2", "10.11.6-MariaDB-0+deb12u1-log"
    is_mariadb: bool
    log_bin: bool
    server_id: int | None
    user: str  # CURRENT_USER(): "name@host", the account the grants belong to
    database: str | None  # DATABASE(): the source database, whose tables need SELECT
    grants: tuple[str, ...] = ()  # SHOW GRANTS lines (passwords cut out)
    binlog_format: str | None = None
    binlog_row_image: str | None = None
    binlog_row_metadata: str | None = None
    binlog_order_commits: bool | None = None  # None on MariaDB: commits in binlog order
    binlog_expire_logs_seconds: int | None = None
    expire_logs_days: float | None = None
    binlog_expire_logs_auto_purge: bool | None = None
    gtid_mode: str | None = None
    gtid_strict_mode: bool | None = None
    binlog_row_value_options: str | None = None
    binlog_transaction_compression: bool | None = None
    log_bin_compress: bool | None = None

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        """The leading ``major.minor.patch`` of :attr:`version` (missing parts are 0)."""
        return _version_tuple(self.version)

    @property
    def binlog_retention_seconds(self) -> float | None:
        """How long binlogs are kept before automatic purging, in seconds: 0 for never, None
        when the server reports neither retention variable."""
        if self.binlog_expire_logs_auto_purge is False:
            return 0
        if self.binlog_expire_logs_seconds:
            return self.binlog_expire_logs_seconds
        if self.expire_logs_days:
            return self.expire_logs_days * 86_400
        if self.binlog_expire_logs_seconds is None and self.expire_logs_days is None:
            return None
        return 0

    @property
    def binlog_monitor_privilege(self) -> str:
        """The name SHOW GRANTS uses for the privilege behind SHOW BINARY LOG STATUS /
        SHOW MASTER STATUS: MariaDB 10.5.2 renamed REPLICATION CLIENT to BINLOG MONITOR."""
        if self.is_mariadb and self.version_tuple >= (10, 5, 2):
            return "BINLOG MONITOR"
        return "REPLICATION CLIENT"


# --- gathering (IO) ------------------------------------------------------------------------


def check_prerequisites(engine: sa.Engine, *, client_server_id: int | None) -> list[Problem]:
    """Everything that stops (errors) or endangers (warnings) binlog capture from this
    server, each with its fix, and what a snapshot filter could reach (``filter_reach``).
    An empty list means ready. ``client_server_id`` is the configured ``source.server_id``
    (None: a random one per run)."""
    with engine.connect() as conn:
        facts = gather(conn)
    return [*check(facts, client_server_id=client_server_id), *filter_reach(facts)]


def gather(conn: sa.Connection) -> ServerFacts:
    """Read the server's version, global binlog settings and the user's grants."""
    version, user, database = conn.execute(
        sa.text("SELECT VERSION(), CURRENT_USER(), DATABASE()")
    ).one()
    version = str(version)
    is_mariadb = "mariadb" in version.lower()
    values = _global_variables(conn)

    def text(name: str) -> str | None:
        return values.get(name)

    def flag(name: str) -> bool | None:
        value = values.get(name)
        return None if value is None else _truthy(value)

    def number(name: str) -> float | None:
        value = values.get(name)
        try:
            return None if value is None or value == "" else float(value)
        except ValueError:
            return None

    def integer(name: str) -> int | None:
        value = number(name)
        return None if value is None else int(value)

    return ServerFacts(
        version=version,
        is_mariadb=is_mariadb,
        log_bin=bool(flag("log_bin")),
        server_id=integer("server_id"),
        user=str(user),
        database=None if database is None else str(database),
        grants=_grants(conn, is_mariadb),
        binlog_format=text("binlog_format"),
        binlog_row_image=text("binlog_row_image"),
        binlog_row_metadata=text("binlog_row_metadata"),
        binlog_order_commits=flag("binlog_order_commits"),
        binlog_expire_logs_seconds=integer("binlog_expire_logs_seconds"),
        expire_logs_days=number("expire_logs_days"),
        binlog_expire_logs_auto_purge=flag("binlog_expire_logs_auto_purge"),
        gtid_mode=text("gtid_mode"),
        gtid_strict_mode=flag("gtid_strict_mode"),
        binlog_row_value_options=text("binlog_row_value_options"),
        binlog_transaction_compression=flag("binlog_transaction_compression"),
        log_bin_compress=flag("log_bin_compress"),
    )


def _truthy(value: str) -> bool:
    return value.strip().upper() in ("ON", "1", "TRUE", "YES")


def _global_variables(conn: sa.Connection) -> dict[str, str]:
    """The variables of :data:`_VARIABLES` the server has (SHOW lists only existing ones,
    so a variable one server lacks is simply absent, never an error)."""
    rows = conn.execute(
        sa.text("SHOW GLOBAL VARIABLES WHERE Variable_name IN :names").bindparams(
            sa.bindparam("names", expanding=True)
        ),
        {"names": list(_VARIABLES)},
    )
    return {str(name).lower(): "" if value is None else str(value) for name, value in rows}


def _grants(conn: sa.Connection, is_mariadb: bool) -> tuple[str, ...]:
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


# --- checking (pure) -----------------------------------------------------------------------


def check(facts: ServerFacts, *, client_server_id: int | None) -> list[Problem]:
    """The problems with ``facts`` for binlog capture by a client registering as
    ``client_server_id`` (None: a random id in 5400..6399 per run). No IO."""
    return [
        *_check_log_bin(facts),
        *_check_row_events(facts),
        *_check_order_commits(facts),
        *_check_server_id(facts, client_server_id),
        *_check_decodable(facts),
        *_check_privileges(facts),
        *_check_retention(facts),
    ]


_NEW_SESSIONS = (
    " (SET GLOBAL applies only to sessions opened after it: reconnect or restart the "
    "applications that write to the captured tables)"
)


def _sql_value(value: str) -> str:
    if value.upper() in ("ON", "OFF") or value.isdigit():
        return value
    return "'" + value.replace("'", "''") + "'"


def _setting_fix(variable: str, value: str, *, new_sessions: bool = False) -> str:
    """``SET GLOBAL`` for the running server plus the my.cnf line that survives a restart."""
    cnf_value = value if value else "''"
    fix = (
        f"SET GLOBAL {variable} = {_sql_value(value)}; and in my.cnf under [mysqld]: "
        f"{variable} = {cnf_value}"
    )
    return fix + _NEW_SESSIONS if new_sessions else fix


def _check_log_bin(facts: ServerFacts) -> list[Problem]:
    if facts.log_bin:
        return []
    if facts.is_mariadb:
        cnf = "in my.cnf under [mysqld]: log_bin = mysql-bin"
    else:
        cnf = (
            "in my.cnf under [mysqld]: log_bin = binlog (and remove any skip-log-bin or "
            "disable-log-bin line)"
        )
    return [
        Problem(
            "binary logging is off (log_bin = OFF): there is no binlog to read changes from",
            f"{cnf}; then restart the server (log_bin cannot be changed while it runs)",
        )
    ]


def _check_row_events(facts: ServerFacts) -> list[Problem]:
    problems = []
    wanted = (
        ("binlog_format", facts.binlog_format, "ROW", "changes must be logged as row events"),
        (
            "binlog_row_image",
            facts.binlog_row_image,
            "FULL",
            "UPDATE and DELETE events must carry every column of the row",
        ),
        (
            "binlog_row_metadata",
            facts.binlog_row_metadata,
            "FULL",
            "without it the binlog's row events carry no column names, so columns would "
            "arrive unnamed",
        ),
    )
    for variable, value, expected, why in wanted:
        if value is None:
            if variable == "binlog_row_metadata":
                problems.append(
                    Problem(
                        f"this server ({facts.version}) has no binlog_row_metadata: the "
                        "binlog's row events carry no column names",
                        "upgrade to MySQL 8.0 or later, or MariaDB 10.5 or later",
                    )
                )
            continue
        if value.upper() != expected:
            problems.append(
                Problem(
                    f"{variable} is {value}; it must be {expected}: {why}",
                    _setting_fix(variable, expected, new_sessions=True),
                )
            )
    return problems


def _check_order_commits(facts: ServerFacts) -> list[Problem]:
    if facts.binlog_order_commits is not False:  # None: MariaDB commits in binlog order
        return []
    return [
        Problem(
            "binlog_order_commits is OFF: transactions may become visible in another order "
            "than the binlog's, which the snapshot window relies on",
            _setting_fix("binlog_order_commits", "ON"),
        )
    ]


def _check_server_id(facts: ServerFacts, client_server_id: int | None) -> list[Problem]:
    server_id = facts.server_id
    if server_id is None:
        return []
    if server_id == 0:
        new_id = "2" if client_server_id == 1 else "1"
        return [
            Problem(
                "server_id is 0: a server with server_id 0 refuses binlog clients",
                _setting_fix("server_id", new_id),
            )
        ]
    if client_server_id == server_id:
        return [
            Problem(
                f"source.server_id is {client_server_id}, the server's own server_id: the "
                "binlog client must register with an id no server or other replica uses",
                f"set source.server_id in the snapshotter configuration to another number "
                f"than {server_id} (unique among this server's replicas and binlog clients), "
                "or remove it for a random one in 5400..6399",
            )
        ]
    if client_server_id is None and server_id in RANDOM_CLIENT_IDS:
        return [
            Problem(
                f"source.server_id is unset, so each run picks a random id in 5400..6399, "
                f"which can be the server's own server_id {server_id}",
                f"set source.server_id in the snapshotter configuration to a number other "
                f"than {server_id}, unique among this server's replicas and binlog clients",
                "warning",
            )
        ]
    return []


def _check_decodable(facts: ServerFacts) -> list[Problem]:
    problems = []
    options = facts.binlog_row_value_options
    if options is not None and "PARTIAL_JSON" in options.upper():
        problems.append(
            Problem(
                f"binlog_row_value_options is {options}: JSON updates would be logged as "
                "partial diffs, which the binlog decoder cannot rebuild into whole values",
                _setting_fix("binlog_row_value_options", "", new_sessions=True),
            )
        )
    if facts.binlog_transaction_compression:
        problems.append(
            Problem(
                "binlog_transaction_compression is ON: compressed transactions are logged as "
                "Transaction_payload events, which the binlog reader cannot decode (their "
                "row changes would be missed)",
                _setting_fix("binlog_transaction_compression", "OFF", new_sessions=True),
            )
        )
    if facts.log_bin_compress:
        problems.append(
            Problem(
                "log_bin_compress is ON: MariaDB logs larger row events compressed, which "
                "the binlog reader cannot decode (their row changes would be missed)",
                _setting_fix("log_bin_compress", "OFF"),
            )
        )
    return problems


def _check_retention(facts: ServerFacts) -> list[Problem]:
    seconds = facts.binlog_retention_seconds
    if not seconds or seconds >= MIN_RETENTION_SECONDS:  # 0: never purged
        return []
    days = SUGGESTED_RETENTION_DAYS
    if facts.binlog_expire_logs_seconds:
        source = f"binlog_expire_logs_seconds = {facts.binlog_expire_logs_seconds}"
    else:
        source = f"expire_logs_days = {_number(facts.expire_logs_days or 0)}"
    if facts.binlog_expire_logs_seconds is None:  # MariaDB before 10.6: days only
        fix = _setting_fix("expire_logs_days", str(days))
    else:
        fix = _setting_fix("binlog_expire_logs_seconds", str(days * 86_400))
        if facts.expire_logs_days and not facts.is_mariadb:
            # MySQL 8.0 refuses to set one of the two while the other is not 0.
            fix = f"SET GLOBAL expire_logs_days = 0; {fix} (and remove expire_logs_days)"
    return [
        Problem(
            f"binlogs are purged after {_duration(seconds)} ({source}): a snapshotter "
            "stopped for longer than that cannot resume, its binlog position being gone",
            f"{fix} ({days} days; more if the snapshotter may be stopped longer)",
            "warning",
        )
    ]


# --- binlog files and retention (run's check, status) -----------------------------------


def binary_logs(conn: sa.Connection) -> list[tuple[str, int]]:
    """``SHOW BINARY LOGS``: each binlog file the server still has, oldest first, with its
    size in bytes (the current file's size so far). Needs REPLICATION CLIENT / BINLOG
    MONITOR; fails when binary logging is off."""
    rows = conn.exec_driver_sql("SHOW BINARY LOGS").all()
    return [(str(name), int(size)) for name, size, *_ in rows]


@dataclass(frozen=True, slots=True)
class BinlogRetention:
    """How long the server keeps binlog files, and the setting that says so."""

    seconds: float | None  # 0: never purged automatically; None: not reported
    setting: str  # "binlog_expire_logs_seconds = 172800", as the server reports it

    def __str__(self) -> str:
        if self.seconds is None:
            return "the server reports no binlog retention setting"
        if self.seconds == 0:
            return f"the server never purges binlogs by itself ({self.setting})"
        return f"the server purges binlogs after {_duration(self.seconds)} ({self.setting})"


def binlog_retention(conn: sa.Connection) -> BinlogRetention:
    """The retention settings of the server (read as :func:`gather` reads them)."""
    values = _global_variables(conn)
    auto_purge = values.get("binlog_expire_logs_auto_purge")
    seconds_text = values.get("binlog_expire_logs_seconds")
    days_text = values.get("expire_logs_days")
    facts = ServerFacts(
        version="",
        is_mariadb=False,
        log_bin=True,
        server_id=None,
        user="",
        database=None,
        binlog_expire_logs_seconds=_as_int(seconds_text),
        expire_logs_days=_as_float(days_text),
        binlog_expire_logs_auto_purge=None if auto_purge is None else _truthy(auto_purge),
    )
    if facts.binlog_expire_logs_auto_purge is False:
        setting = "binlog_expire_logs_auto_purge = OFF"
    elif facts.binlog_expire_logs_seconds or (days_text is None and seconds_text is not None):
        setting = f"binlog_expire_logs_seconds = {seconds_text}"
    elif days_text is not None:
        setting = f"expire_logs_days = {_number(facts.expire_logs_days or 0)}"
    else:
        setting = "no binlog_expire_logs_seconds or expire_logs_days"
    return BinlogRetention(facts.binlog_retention_seconds, setting)


def _as_float(value: str | None) -> float | None:
    try:
        return None if value is None or value == "" else float(value)
    except ValueError:
        return None


def _as_int(value: str | None) -> int | None:
    number = _as_float(value)
    return None if number is None else int(number)


def _duration(seconds: float) -> str:
    whole = round(seconds)
    for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
        if whole >= size and whole % size == 0:
            count = whole // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{whole} second{'s' if whole != 1 else ''}"


def _number(value: float) -> str:
    return str(int(value)) if math.isclose(value, round(value)) else f"{value:g}"


# --- privileges ----------------------------------------------------------------------------

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


def _check_privileges(facts: ServerFacts) -> list[Problem]:
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


def _version_tuple(version: str) -> tuple[int, int, int]:
    match = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    if match is None:
        return (0, 0, 0)
    major, minor, patch = match.groups()
    return (int(major), int(minor or 0), int(patch or 0))
