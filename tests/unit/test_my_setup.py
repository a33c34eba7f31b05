"""MySQL / MariaDB prerequisites: my_setup.check judges ServerFacts without a server."""

from __future__ import annotations

from dataclasses import replace

import pytest

from snapshotter.sources.mysql.setup import ServerFacts, check
from snapshotter.sources.setup_common import Problem

MARIADB = ServerFacts(
    version="10.11.6-MariaDB-0+deb12u1-log",
    is_mariadb=True,
    log_bin=True,
    server_id=1,
    user="snapshotter@%",
    database="shop",
    grants=(
        "GRANT ALL PRIVILEGES ON *.* TO `snapshotter`@`%` WITH GRANT OPTION",
        "GRANT SELECT, INSERT ON `test`.* TO PUBLIC",
    ),
    binlog_format="ROW",
    binlog_row_image="FULL",
    binlog_row_metadata="FULL",
    binlog_order_commits=None,
    binlog_expire_logs_seconds=0,
    expire_logs_days=0.0,
    gtid_strict_mode=False,
    log_bin_compress=False,
)

MYSQL = ServerFacts(
    version="8.4.2",
    is_mariadb=False,
    log_bin=True,
    server_id=1,
    user="snapshotter@%",
    database="shop",
    grants=(
        "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snapshotter`@`%`",
        "GRANT BACKUP_ADMIN,REPLICATION_SLAVE_ADMIN ON *.* TO `snapshotter`@`%`",
    ),
    binlog_format="ROW",
    binlog_row_image="FULL",
    binlog_row_metadata="FULL",
    binlog_order_commits=True,
    binlog_expire_logs_seconds=2_592_000,
    expire_logs_days=None,
    binlog_expire_logs_auto_purge=True,
    gtid_mode="OFF",
    binlog_row_value_options="",
    binlog_transaction_compression=False,
)

BOTH = pytest.mark.parametrize("base", [MARIADB, MYSQL], ids=["mariadb", "mysql"])


def errors(facts: ServerFacts, client_server_id: int | None = 5555) -> list[Problem]:
    return [p for p in check(facts, client_server_id=client_server_id) if p.severity == "error"]


def only_error(facts: ServerFacts, client_server_id: int | None = 5555) -> Problem:
    problems = check(facts, client_server_id=client_server_id)
    assert [p.severity for p in problems] == ["error"], problems
    return problems[0]


def only_warning(facts: ServerFacts, client_server_id: int | None = 5555) -> Problem:
    problems = check(facts, client_server_id=client_server_id)
    assert [p.severity for p in problems] == ["warning"], problems
    return problems[0]


@BOTH
@pytest.mark.parametrize("client_server_id", [None, 5555])
def test_a_good_server_has_no_problems(base: ServerFacts, client_server_id: int | None) -> None:
    assert check(base, client_server_id=client_server_id) == []


def test_version_and_monitor_privilege_name() -> None:
    assert MARIADB.version_tuple == (10, 11, 6)
    assert MARIADB.binlog_monitor_privilege == "BINLOG MONITOR"
    assert replace(MARIADB, version="10.5.1-MariaDB").binlog_monitor_privilege == (
        "REPLICATION CLIENT"
    )
    assert MYSQL.version_tuple == (8, 4, 2)
    assert MYSQL.binlog_monitor_privilege == "REPLICATION CLIENT"


# --- binlog settings -----------------------------------------------------------------------


def test_log_bin_off_mariadb() -> None:
    problem = only_error(replace(MARIADB, log_bin=False))
    assert "log_bin" in problem.what
    assert "in my.cnf under [mysqld]: log_bin = mysql-bin" in problem.fix
    assert "restart" in problem.fix
    assert "SET GLOBAL" not in problem.fix  # log_bin is not dynamic


def test_log_bin_off_mysql() -> None:
    problem = only_error(replace(MYSQL, log_bin=False))
    assert "in my.cnf under [mysqld]: log_bin = binlog" in problem.fix
    assert "skip-log-bin" in problem.fix
    assert "restart" in problem.fix


@BOTH
@pytest.mark.parametrize(
    ("field", "bad", "expected_fix"),
    [
        (
            "binlog_format",
            "MIXED",
            "SET GLOBAL binlog_format = 'ROW'; and in my.cnf under [mysqld]: binlog_format = ROW",
        ),
        (
            "binlog_format",
            "STATEMENT",
            "SET GLOBAL binlog_format = 'ROW'; and in my.cnf under [mysqld]: binlog_format = ROW",
        ),
        (
            "binlog_row_image",
            "MINIMAL",
            "SET GLOBAL binlog_row_image = 'FULL'; "
            "and in my.cnf under [mysqld]: binlog_row_image = FULL",
        ),
        (
            "binlog_row_image",
            "NOBLOB",
            "SET GLOBAL binlog_row_image = 'FULL'; "
            "and in my.cnf under [mysqld]: binlog_row_image = FULL",
        ),
        (
            "binlog_row_metadata",
            "MINIMAL",
            "SET GLOBAL binlog_row_metadata = 'FULL'; "
            "and in my.cnf under [mysqld]: binlog_row_metadata = FULL",
        ),
        (
            "binlog_row_metadata",
            "NO_LOG",
            "SET GLOBAL binlog_row_metadata = 'FULL'; "
            "and in my.cnf under [mysqld]: binlog_row_metadata = FULL",
        ),
    ],
)
def test_row_event_settings(base: ServerFacts, field: str, bad: str, expected_fix: str) -> None:
    problem = only_error(replace(base, **{field: bad}))
    assert f"{field} is {bad}" in problem.what
    assert expected_fix in problem.fix
    assert "sessions opened after it" in problem.fix  # the SET GLOBAL caveat


def test_settings_compare_case_insensitively() -> None:
    assert (
        check(replace(MYSQL, binlog_format="row", binlog_row_image="full"), client_server_id=7)
        == []
    )


def test_no_binlog_row_metadata_means_a_server_too_old() -> None:
    problem = only_error(replace(MARIADB, version="10.4.30-MariaDB", binlog_row_metadata=None))
    assert "no binlog_row_metadata" in problem.what
    assert "upgrade" in problem.fix


def test_binlog_order_commits_off_on_mysql() -> None:
    problem = only_error(replace(MYSQL, binlog_order_commits=False))
    assert "binlog_order_commits is OFF" in problem.what
    assert problem.fix == (
        "SET GLOBAL binlog_order_commits = ON; "
        "and in my.cnf under [mysqld]: binlog_order_commits = ON"
    )


def test_mariadb_has_no_binlog_order_commits_and_needs_none() -> None:
    assert MARIADB.binlog_order_commits is None
    assert check(MARIADB, client_server_id=None) == []


@BOTH
def test_server_id_zero(base: ServerFacts) -> None:
    problem = only_error(replace(base, server_id=0))
    assert "server_id is 0" in problem.what
    assert problem.fix == "SET GLOBAL server_id = 1; and in my.cnf under [mysqld]: server_id = 1"
    # The suggested id is not the client's own.
    fix = only_error(replace(base, server_id=0), client_server_id=1).fix
    assert "SET GLOBAL server_id = 2;" in fix


@BOTH
def test_client_server_id_equal_to_the_servers(base: ServerFacts) -> None:
    problem = only_error(replace(base, server_id=42), client_server_id=42)
    assert "source.server_id is 42" in problem.what
    assert "set source.server_id" in problem.fix
    assert check(replace(base, server_id=42), client_server_id=43) == []


def test_random_client_ids_may_hit_the_servers_own() -> None:
    problem = only_warning(replace(MYSQL, server_id=5800), client_server_id=None)
    assert "5400..6399" in problem.what
    assert "set source.server_id" in problem.fix
    assert check(replace(MYSQL, server_id=5800), client_server_id=7) == []
    assert check(replace(MYSQL, server_id=6400), client_server_id=None) == []


def test_partial_json_is_an_error() -> None:
    problem = only_error(replace(MYSQL, binlog_row_value_options="PARTIAL_JSON"))
    assert "PARTIAL_JSON" in problem.what
    assert (
        "SET GLOBAL binlog_row_value_options = ''; "
        "and in my.cnf under [mysqld]: binlog_row_value_options = ''"
    ) in problem.fix


def test_compressed_binlogs_are_errors() -> None:
    problem = only_error(replace(MYSQL, binlog_transaction_compression=True))
    assert "SET GLOBAL binlog_transaction_compression = OFF;" in problem.fix
    assert "my.cnf under [mysqld]: binlog_transaction_compression = OFF" in problem.fix
    problem = only_error(replace(MARIADB, log_bin_compress=True))
    assert problem.fix == (
        "SET GLOBAL log_bin_compress = OFF; and in my.cnf under [mysqld]: log_bin_compress = OFF"
    )


def test_a_default_mariadb_lists_every_problem() -> None:
    default = replace(
        MARIADB,
        log_bin=False,
        binlog_format="MIXED",
        binlog_row_metadata="NO_LOG",
        grants=("GRANT USAGE ON *.* TO `snapshotter`@`%`",),
    )
    whats = [p.what for p in errors(default)]
    assert len(whats) == 5, whats  # log_bin, format, metadata, replication privileges, SELECT


# --- privileges ----------------------------------------------------------------------------


@BOTH
def test_separate_grants(base: ServerFacts) -> None:
    monitor = base.binlog_monitor_privilege
    grants = (
        "GRANT USAGE ON *.* TO `snapshotter`@`%`",
        "GRANT REPLICATION SLAVE ON *.* TO `snapshotter`@`%`",
        f"grant {monitor.lower()} on *.* to 'snapshotter'@'%'",
        "GRANT SELECT ON `shop`.* TO `snapshotter`@`%`",
    )
    assert check(replace(base, grants=grants), client_server_id=7) == []


def test_missing_replication_slave() -> None:
    facts = replace(
        MYSQL,
        user="cdc@10.0.%",
        grants=("GRANT SELECT, REPLICATION CLIENT ON *.* TO `cdc`@`10.0.%`",),
    )
    problem = only_error(facts)
    assert "lacks REPLICATION SLAVE" in problem.what
    assert problem.fix.startswith("GRANT REPLICATION SLAVE ON *.* TO 'cdc'@'10.0.%';")


def test_missing_both_replication_privileges_mariadb() -> None:
    facts = replace(MARIADB, grants=("GRANT SELECT ON *.* TO `snapshotter`@`%`",))
    problem = only_error(facts)
    assert "REPLICATION SLAVE" in problem.what and "BINLOG MONITOR" in problem.what
    assert problem.fix.startswith(
        "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'snapshotter'@'%';"
    )


def test_missing_client_privilege_on_old_mariadb_names_replication_client() -> None:
    facts = replace(
        MARIADB,
        version="10.5.1-MariaDB",
        grants=("GRANT SELECT, REPLICATION SLAVE ON *.* TO `snapshotter`@`%`",),
    )
    assert only_error(facts).fix.startswith("GRANT REPLICATION CLIENT ON *.* TO")


def test_mariadb_binlog_monitor_and_replica_alias() -> None:
    grants = (
        "GRANT REPLICATION REPLICA, BINLOG MONITOR ON *.* TO `snapshotter`@`%`",
        "GRANT SELECT ON `shop`.* TO `snapshotter`@`%`",
    )
    assert check(replace(MARIADB, grants=grants), client_server_id=7) == []


def test_super_covers_the_binlog_position_not_the_binlog() -> None:
    grants = ("GRANT SELECT, SUPER ON *.* TO `snapshotter`@`%`",)
    problem = only_error(replace(MYSQL, grants=grants))
    assert problem.fix.startswith("GRANT REPLICATION SLAVE ON *.* TO")


def test_grants_on_a_database_do_not_give_global_privileges() -> None:
    grants = ("GRANT ALL PRIVILEGES ON `shop`.* TO `snapshotter`@`%`",)
    problem = only_error(replace(MARIADB, grants=grants))
    assert "REPLICATION SLAVE" in problem.what  # SELECT on shop is there


def test_active_role_grants_count_and_role_lines_are_skipped() -> None:
    # MariaDB lists the active role's grants after the user's own.
    grants = (
        "GRANT `cdc_role` TO `snapshotter`@`%`",
        "GRANT USAGE ON *.* TO `snapshotter`@`%`",
        "GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cdc_role`",
        "GRANT SELECT ON `shop`.* TO `cdc_role`",
        "SET DEFAULT ROLE `cdc_role` FOR `snapshotter`@`%`",
        "GRANT PROXY ON ''@'%' TO 'snapshotter'@'%' WITH GRANT OPTION",
    )
    assert check(replace(MARIADB, grants=grants), client_server_id=7) == []
    # Without the role's grants: both errors, the privileges one mentioning roles.
    problems = errors(replace(MARIADB, grants=grants[:2]))
    assert len(problems) == 2
    assert "roles" in problems[0].what


def test_missing_select() -> None:
    grants = ("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snapshotter`@`%`",)
    problem = only_error(replace(MYSQL, grants=grants))
    assert "lacks SELECT on database shop" in problem.what
    assert problem.fix.startswith("GRANT SELECT ON `shop`.* TO 'snapshotter'@'%';")


@pytest.mark.parametrize(
    "line",
    [
        "GRANT SELECT ON `shop`.* TO `snapshotter`@`%`",
        "GRANT SELECT ON shop.* TO snapshotter@'%'",
        'GRANT SELECT ON "shop".* TO "snapshotter"@"%"',  # ANSI_QUOTES
        "GRANT SELECT ON `sh%`.* TO `snapshotter`@`%`",  # a wildcard database grant
        "GRANT SELECT ON `sho_`.* TO `snapshotter`@`%`",  # _ matches one character
        "GRANT ALL ON `shop`.* TO `snapshotter`@`%`",
        "GRANT SELECT ON *.* TO `snapshotter`@`%`",
    ],
)
def test_select_grant_forms(line: str) -> None:
    grants = ("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snapshotter`@`%`", line)
    assert check(replace(MYSQL, grants=grants), client_server_id=7) == []


@pytest.mark.parametrize(
    "line",
    [
        "GRANT SELECT ON `other`.* TO `snapshotter`@`%`",
        "GRANT SELECT ON `sho\\_`.* TO `snapshotter`@`%`",  # the escaped _ is literal
        "GRANT INSERT ON `shop`.* TO `snapshotter`@`%`",
    ],
)
def test_select_grants_that_do_not_cover_the_database(line: str) -> None:
    grants = ("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snapshotter`@`%`", line)
    assert "lacks SELECT" in only_error(replace(MYSQL, grants=grants)).what


def test_select_on_some_tables_is_a_warning() -> None:
    grants = (
        "GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snapshotter`@`%`",
        "GRANT SELECT, INSERT ON `shop`.`orders` TO `snapshotter`@`%`",
        "GRANT SELECT (`id`, `name`), UPDATE ON `shop`.`custo``mers` TO `snapshotter`@`%`",
    )
    problem = only_warning(replace(MYSQL, grants=grants))
    assert "custo`mers, orders" in problem.what
    assert "GRANT SELECT ON `shop`.* TO 'snapshotter'@'%';" in problem.fix


def test_mysql_partial_revoke_takes_the_database_out() -> None:
    grants = (
        "GRANT SELECT, REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snapshotter`@`%`",
        "REVOKE SELECT ON `shop`.* FROM `snapshotter`@`%`",
    )
    assert "lacks SELECT" in only_error(replace(MYSQL, grants=grants)).what


def test_privilege_check_skipped_without_a_database() -> None:
    grants = ("GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `snapshotter`@`%`",)
    assert check(replace(MYSQL, grants=grants, database=None), client_server_id=7) == []


def test_account_quoting() -> None:
    facts = replace(MYSQL, user="o'brien@local@host", grants=())
    fix = errors(facts)[0].fix
    assert "TO 'o''brien@local'@'host';" in fix


# --- binlog retention ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "shown"), [(3600, "1 hour"), (43_200, "12 hours"), (86_399, "86399 seconds")]
)
def test_short_retention_mysql(seconds: int, shown: str) -> None:
    problem = only_warning(replace(MYSQL, binlog_expire_logs_seconds=seconds))
    assert f"purged after {shown} (binlog_expire_logs_seconds = {seconds})" in problem.what
    assert problem.fix.startswith(
        "SET GLOBAL binlog_expire_logs_seconds = 604800; "
        "and in my.cnf under [mysqld]: binlog_expire_logs_seconds = 604800"
    )


@pytest.mark.parametrize("seconds", [0, 86_400, 2_592_000])
def test_long_or_no_expiry_is_fine(seconds: int) -> None:
    assert check(replace(MYSQL, binlog_expire_logs_seconds=seconds), client_server_id=7) == []


def test_auto_purge_off_means_never_purged() -> None:
    facts = replace(MYSQL, binlog_expire_logs_seconds=600, binlog_expire_logs_auto_purge=False)
    assert facts.binlog_retention_seconds == 0
    assert check(facts, client_server_id=7) == []


def test_fractional_days_on_mariadb() -> None:
    # MariaDB 10.6+: both variables, kept in step; expire_logs_days may be fractional.
    facts = replace(MARIADB, binlog_expire_logs_seconds=43_200, expire_logs_days=0.5)
    assert facts.binlog_retention_seconds == 43_200
    problem = only_warning(facts)
    assert "12 hours" in problem.what
    assert "SET GLOBAL binlog_expire_logs_seconds = 604800;" in problem.fix
    assert "expire_logs_days = 0" not in problem.fix  # aliases on MariaDB: no conflict


def test_days_only_on_mariadb_10_5() -> None:
    facts = replace(
        MARIADB, version="10.5.22-MariaDB", binlog_expire_logs_seconds=None, expire_logs_days=0.25
    )
    assert facts.binlog_retention_seconds == 21_600
    problem = only_warning(facts)
    assert "purged after 6 hours (expire_logs_days = 0.25)" in problem.what
    assert problem.fix.startswith(
        "SET GLOBAL expire_logs_days = 7; and in my.cnf under [mysqld]: expire_logs_days = 7"
    )
    # Whole days are days, not seconds: 1 day is enough.
    assert check(replace(facts, expire_logs_days=1), client_server_id=7) == []
    assert check(replace(facts, expire_logs_days=0), client_server_id=7) == []


def test_mysql_8_0_retention_from_expire_logs_days() -> None:
    # MySQL 8.0 uses expire_logs_days when binlog_expire_logs_seconds is 0; days is an integer
    # there, so it is never under a day unless 0 (never). A fix to seconds must zero it first.
    facts = replace(MYSQL, version="8.0.36", binlog_expire_logs_seconds=0, expire_logs_days=3)
    assert facts.binlog_retention_seconds == 3 * 86_400
    assert check(facts, client_server_id=7) == []
    short = replace(facts, binlog_expire_logs_seconds=0, expire_logs_days=0.5)
    problem = only_warning(short)
    assert problem.fix.startswith(
        "SET GLOBAL expire_logs_days = 0; SET GLOBAL binlog_expire_logs_seconds = 604800;"
    )


def test_unknown_retention_gives_no_warning() -> None:
    facts = replace(MYSQL, binlog_expire_logs_seconds=None, expire_logs_days=None)
    assert facts.binlog_retention_seconds is None
    assert check(facts, client_server_id=7) == []


def test_problems_print_like_pg_setup_problems() -> None:
    problem = only_error(replace(MYSQL, server_id=0))
    assert str(problem).startswith("error: server_id is 0")
    assert "\n  fix: SET GLOBAL server_id = 1;" in str(problem)
