"""MySQL / MariaDB prerequisites against a real server: gather() reads it, check() judges it,
and the GRANT fixes it prints work when run as they are."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from snapshotter.sources.mysql import setup as my_setup
from snapshotter.sources.mysql.dialect import mysql_url
from snapshotter.sources.mysql.positions import binlog_status

pytestmark = pytest.mark.integration

DEFAULT_URL = "mysql://snapshotter:snapshotter@127.0.0.1:23306/snapshotter"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _engine(url: str | sa.URL) -> sa.Engine:
    return sa.create_engine(
        mysql_url(url), poolclass=sa.NullPool, connect_args={"charset": "utf8mb4"}
    )


@pytest.fixture(scope="module")
def my_setup_engine(request: pytest.FixtureRequest) -> Iterator[sa.Engine]:
    """The shared ``mysql_url`` fixture's server when tests/conftest.py has one, else
    SNAPSHOTTER_MYSQL_URL or the dev server. Unreachable: skipped, but failed with CI=true."""
    try:
        url = str(request.getfixturevalue("mysql_url"))
    except pytest.FixtureLookupError:
        url = os.environ.get("SNAPSHOTTER_MYSQL_URL", DEFAULT_URL)
    engine = _engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except sa.exc.DBAPIError as exc:
        engine.dispose()
        message = f"MySQL/MariaDB at {sa.make_url(url)!r} is not available: {exc.orig}"
        if IN_CI:
            pytest.fail(message + " (CI=true: integration tests never skip)", pytrace=False)
        pytest.skip(message)
    yield engine
    engine.dispose()


@pytest.fixture(scope="module")
def facts(my_setup_engine: sa.Engine) -> my_setup.ServerFacts:
    with my_setup_engine.connect() as conn:
        return my_setup.gather(conn)


def _global(engine: sa.Engine, name: str) -> str:
    with engine.connect() as conn:
        row = conn.execute(sa.text(f"SHOW GLOBAL VARIABLES LIKE '{name}'")).one()
    return str(row[1])


def test_gather_reads_the_server(my_setup_engine: sa.Engine, facts: my_setup.ServerFacts) -> None:
    with my_setup_engine.connect() as conn:
        version, user, database = conn.execute(
            sa.text("SELECT VERSION(), CURRENT_USER(), DATABASE()")
        ).one()
    assert facts.version == version
    assert facts.is_mariadb == ("MariaDB" in version)
    assert facts.version_tuple >= ((10, 5, 0) if facts.is_mariadb else (8, 0, 0))
    assert (facts.user, facts.database) == (user, database)
    assert facts.log_bin is True
    assert facts.binlog_format == "ROW"
    assert facts.binlog_row_image == "FULL"
    assert facts.binlog_row_metadata == "FULL"
    assert facts.server_id == int(_global(my_setup_engine, "server_id")) >= 1
    if facts.is_mariadb:
        assert facts.binlog_order_commits is None  # MariaDB has no such variable
        assert facts.gtid_mode is None
        assert facts.gtid_strict_mode in (True, False)
        assert facts.log_bin_compress in (True, False)
    else:
        assert facts.binlog_order_commits is True
        assert facts.gtid_mode is not None
        assert facts.binlog_row_value_options is not None
    assert facts.binlog_retention_seconds is not None and facts.binlog_retention_seconds >= 0
    assert facts.grants and all(
        line.upper().startswith(("GRANT", "REVOKE", "SET")) for line in facts.grants
    )
    assert not any("PASSWORD" in line.upper() for line in facts.grants)


def test_gather_reads_global_settings_not_the_sessions(my_setup_engine: sa.Engine) -> None:
    with my_setup_engine.connect() as conn:
        conn.execute(sa.text("SET SESSION binlog_row_image = 'MINIMAL'"))
        assert my_setup.gather(conn).binlog_row_image == "FULL"


def test_the_dev_server_is_ready(facts: my_setup.ServerFacts) -> None:
    assert facts.server_id is not None
    for client_server_id in (None, facts.server_id + 1000):
        problems = my_setup.check(facts, client_server_id=client_server_id)
        assert [p for p in problems if p.severity == "error"] == []


def test_check_prerequisites_refuses_the_servers_own_id(
    my_setup_engine: sa.Engine, facts: my_setup.ServerFacts
) -> None:
    problems = my_setup.check_prerequisites(my_setup_engine, client_server_id=facts.server_id)
    assert [p.severity for p in problems if "server_id" in p.what] == ["error"]
    assert my_setup.check_prerequisites(my_setup_engine, client_server_id=None) == (
        my_setup.check(facts, client_server_id=None) + my_setup.filter_reach(facts)
    )


@pytest.fixture
def bare_user(my_setup_engine: sa.Engine) -> Iterator[sa.Engine]:
    """An engine for a new user, dropped afterwards, with INSERT on the database and no other
    privilege (without any privilege there it could not even connect to it). Created for '%'
    and 'localhost' (Debian's anonymous ''@'localhost' shadows '%' for local connections)."""
    name = f"snap_t_{secrets.token_hex(6)}"
    password = secrets.token_hex(16)
    accounts = [f"'{name}'@'%'", f"'{name}'@'localhost'"]
    database = my_setup_engine.url.database
    with my_setup_engine.begin() as conn:
        for account in accounts:
            _run(conn, f"CREATE USER {account} IDENTIFIED BY '{password}'")
            _run(conn, f"GRANT INSERT ON `{database}`.* TO {account}")
    engine = _engine(my_setup_engine.url.set(username=name, password=password))
    try:
        yield engine
    finally:
        engine.dispose()
        with my_setup_engine.begin() as conn:
            for account in accounts:
                _run(conn, f"DROP USER IF EXISTS {account}")


def _run(conn: sa.Connection, statement: str) -> None:
    conn.exec_driver_sql(statement, execution_options={"no_parameters": True})


def test_missing_privileges_and_their_fixes(
    my_setup_engine: sa.Engine, bare_user: sa.Engine, facts: my_setup.ServerFacts
) -> None:
    problems = my_setup.check_prerequisites(bare_user, client_server_id=None)
    errors = [p for p in problems if p.severity == "error"]
    assert len(errors) == 2, errors
    replication, select = errors
    assert "REPLICATION SLAVE" in replication.what
    assert facts.binlog_monitor_privilege in replication.what
    assert f"lacks SELECT on database {facts.database}" in select.what
    # The fixes run as printed, by an administrator, make the user ready.
    with my_setup_engine.begin() as conn:
        for problem in errors:
            assert problem.fix.startswith("GRANT ")
            _run(conn, problem.fix)
    problems = my_setup.check_prerequisites(bare_user, client_server_id=None)
    assert [p for p in problems if p.severity == "error"] == []
    # And the user can now do what the checks stand for.
    with bare_user.connect() as conn:
        assert my_setup.gather(conn).log_bin
        assert binlog_status(conn) is not None
