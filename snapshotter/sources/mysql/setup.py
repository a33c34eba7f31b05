"""MySQL / MariaDB capture setup: what ``snapshotter init`` checks on a MySQL-family source.

Reading changes from the binlog needs binary logging on (``log_bin``, a restart to change),
row events with every column of the whole row and the columns' names (``binlog_format =
ROW``, ``binlog_row_image = FULL``, ``binlog_row_metadata = FULL``), commits in binlog order
(MySQL's ``binlog_order_commits``; MariaDB always does), a server id that is not 0 and not the
binlog client's own, and a user allowed to read the binlog (REPLICATION SLAVE), ask where it
is (REPLICATION CLIENT, called BINLOG MONITOR on MariaDB 10.5.2+) and read the tables
(SELECT). Row events must arrive in a form the reader decodes: not PARTIAL_JSON updates, not
compressed (MySQL's ``binlog_transaction_compression``, MariaDB's ``log_bin_compress``).

:func:`gather` reads the facts (IO; :class:`ServerFacts` in ``server_facts``), :func:`check`
judges them (pure; the user's grants in ``sources.mysql.grants``), and every problem says
what to type: ``SET GLOBAL ...`` for the running server where the variable is dynamic, and
the ``my.cnf`` line under ``[mysqld]`` that keeps it across restarts. Nothing here changes a
server setting or a grant by itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import sqlalchemy as sa

from snapshotter.sources.mysql.grants import check_privileges, filter_reach, show_grants
from snapshotter.sources.mysql.server_facts import ServerFacts
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
        grants=show_grants(conn, is_mariadb),
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
        *check_privileges(facts),
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
