"""Shared fixtures. Integration tests get real servers from scripts/services.

Outside CI a server that cannot be started skips its tests with the reason; with CI=true it
fails them: a missing server must never look like a pass.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(what: str, detail: str) -> None:
    message = f"{what} is not available: {detail.strip()}"
    if IN_CI:
        pytest.fail(message + " (CI=true: integration tests never skip)", pytrace=False)
    pytest.skip(message)


def _service_url(service: str, env_var: str) -> str:
    if os.environ.get(env_var):
        return os.environ[env_var]
    launcher = REPO / "scripts" / "services"
    result = subprocess.run(
        [str(launcher), "up", service], capture_output=True, text=True, timeout=600, check=False
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        _unavailable(service, f"scripts/services up {service} failed:\n{result.stderr}")
    return lines[-1]  # the URL is the last line on stdout


@pytest.fixture(scope="session")
def pg_url() -> str:
    url = _service_url("postgres", "SNAPSHOTTER_PG_URL")
    try:
        with psycopg.connect(url, connect_timeout=10) as conn:
            conn.execute("select 1")
    except psycopg.Error as exc:
        _unavailable("postgres", str(exc))
    return url


@pytest.fixture(scope="session")
def pg_engine(pg_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(sa.make_url(pg_url).set(drivername="postgresql+psycopg"))
    yield engine
    engine.dispose()


@pytest.fixture
def pg_schema(pg_engine: sa.Engine) -> Iterator[str]:
    """A fresh schema per test, so tests never see each other's tables."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with pg_engine.begin() as conn:
        conn.execute(sa.schema.CreateSchema(name))
    yield name
    with pg_engine.begin() as conn:
        conn.execute(sa.schema.DropSchema(name, cascade=True))


@pytest.fixture
def capture(pg_url: str, pg_schema: str, tmp_path: Path) -> Iterator[Any]:
    """A factory of engine setups on this test's schema (tests/integration/engine_harness)."""
    from tests.integration.engine_harness import Capture

    made: list[Capture] = []

    def make(**kwargs: Any) -> Capture:
        directory = tmp_path / f"capture{len(made)}"
        directory.mkdir(parents=True, exist_ok=True)
        cap = Capture(pg_url, pg_schema, directory, **kwargs)
        made.append(cap)
        return cap

    yield make
    for cap in made:
        cap.cleanup()


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """MySQL or MariaDB with binlog CDC settings (scripts/services up mysql)."""
    import pymysql

    url = _service_url("mysql", "SNAPSHOTTER_MYSQL_URL")
    parsed = sa.make_url(url)
    try:
        pymysql.connect(
            host=parsed.host or "127.0.0.1",
            port=parsed.port or 3306,
            user=parsed.username or "",
            password=parsed.password or "",
            connect_timeout=10,
        ).close()
    except pymysql.err.Error as exc:
        _unavailable("mysql", str(exc))
    return url


@pytest.fixture(scope="session")
def mysql_engine(mysql_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(
        sa.make_url(mysql_url).set(drivername="mysql+pymysql"),
        connect_args={"charset": "utf8mb4"},
    )
    yield engine
    engine.dispose()


@pytest.fixture
def mysql_db(mysql_engine: sa.Engine) -> Iterator[str]:
    """A fresh database per test (MySQL's schema), dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    quoted = mysql_engine.dialect.identifier_preparer.quote(name)
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE DATABASE {quoted} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci"
        )
    yield name
    with mysql_engine.begin() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """A single-node Kafka broker's bootstrap address (scripts/services up kafka)."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    bootstrap = _service_url("kafka", "SNAPSHOTTER_KAFKA_BOOTSTRAP")
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
        try:
            admin.list_topics()
        finally:
            admin.close()
    except KafkaError as exc:
        _unavailable("kafka", str(exc))
    return bootstrap


@pytest.fixture(scope="session")
def spark_master() -> str:
    """A standalone Spark cluster's master URL, spark://HOST:PORT (scripts/services up spark:
    a master and two 1-core workers on this machine)."""
    return _service_url("spark", "SNAPSHOTTER_STANDALONE_MASTER")


@pytest.fixture(scope="session")
def spark_remote(spark_master: str) -> str:
    """The Spark Connect server of scripts/services up spark, sc://HOST:PORT (its work runs on
    the cluster of ``spark_master``)."""
    import socket

    url = os.environ.get("SNAPSHOTTER_CONNECT_URL", "")
    if not url:
        result = subprocess.run(
            [str(REPO / "scripts" / "services"), "url", "spark-connect"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        url = (result.stdout.strip().splitlines() or [""])[-1]
    host, _, port = url.removeprefix("sc://").partition(":")
    try:
        socket.create_connection((host, int(port.split("/")[0])), timeout=5).close()
    except (OSError, ValueError) as exc:
        _unavailable("spark connect", f"{url or 'no URL'}: {exc}")
    return url


# The Cloud Spanner emulator's fixed names (scripts/services up spanner creates the instance).
SPANNER_PROJECT = "test-project"
SPANNER_INSTANCE = "test-instance"
SPANNER_INSTANCE_CONFIG = f"projects/{SPANNER_PROJECT}/instanceConfigs/emulator-config"


def _spanner_client() -> Any:
    """A client for the emulator SPANNER_EMULATOR_HOST names (set by ``spanner_emulator``)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import spanner

    return spanner.Client(project=SPANNER_PROJECT, credentials=AnonymousCredentials())


@pytest.fixture(scope="session")
def spanner_emulator() -> Iterator[str]:
    """The Cloud Spanner emulator's host:port (scripts/services up spanner), with the instance
    ``test-instance`` in project ``test-project``.

    For the session it sets SPANNER_EMULATOR_HOST (the client libraries then talk to the
    emulator, without credentials) and, unless already set,
    GOOGLE_CLOUD_SPANNER_MULTIPLEXED_SESSIONS_FOR_RW=false: on the emulator, read-write
    transactions on multiplexed sessions (the client's default) kill each other with
    FailedPrecondition, which the client does not retry; pooled sessions get Aborted and retry.
    """
    from google.api_core.exceptions import AlreadyExists, GoogleAPICallError, RetryError

    host = _service_url("spanner", "SNAPSHOTTER_SPANNER_EMULATOR_HOST")
    name, _, port = host.rpartition(":")
    try:  # a closed port fails here at once; the client would retry it for minutes
        socket.create_connection((name.strip("[]"), int(port)), timeout=5).close()
    except (OSError, ValueError) as exc:
        _unavailable("spanner", f"{host}: {exc}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPANNER_EMULATOR_HOST", host)
        if "GOOGLE_CLOUD_SPANNER_MULTIPLEXED_SESSIONS_FOR_RW" not in os.environ:
            mp.setenv("GOOGLE_CLOUD_SPANNER_MULTIPLEXED_SESSIONS_FOR_RW", "false")
        # The emulator keeps nothing across restarts: make sure the instance is there (an
        # emulator given by SNAPSHOTTER_SPANNER_EMULATOR_HOST may not have been set up by
        # scripts/services).
        client = _spanner_client()
        try:
            instance = client.instance(
                SPANNER_INSTANCE,
                configuration_name=SPANNER_INSTANCE_CONFIG,
                display_name="snapshotter tests",
                node_count=1,
            )
            if not instance.exists():
                with contextlib.suppress(AlreadyExists):
                    instance.create().result(60)
        except (GoogleAPICallError, RetryError) as exc:
            _unavailable("spanner", f"{host}: {exc}")
        finally:
            client.close()
        yield host


SpannerDialect = Literal["googlesql", "postgresql"]


@dataclass(frozen=True)
class SpannerDatabase:
    """A database of ``spanner_database``: its ids, dialect, and the client's Database
    (``google.cloud.spanner_v1.database.Database``)."""

    project: str
    instance: str
    database_id: str
    dialect: SpannerDialect
    database: Any

    @property
    def name(self) -> str:
        """projects/P/instances/I/databases/D"""
        return f"projects/{self.project}/instances/{self.instance}/databases/{self.database_id}"


@pytest.fixture
def spanner_database(spanner_emulator: str) -> Iterator[Callable[..., SpannerDatabase]]:
    """A factory of fresh databases on the emulator, dropped after the test:
    ``spanner_database("googlesql", ddl)`` or ``spanner_database("postgresql", ddl)``, with an
    optional list of DDL statements in that dialect (tables, change streams)."""
    from google.api_core.exceptions import GoogleAPICallError
    from google.cloud.spanner_admin_database_v1 import DatabaseDialect

    client = _spanner_client()
    instance = client.instance(SPANNER_INSTANCE)
    made: list[Any] = []

    def make(dialect: SpannerDialect = "googlesql", ddl: Sequence[str] = ()) -> SpannerDatabase:
        # Database ids: a lowercase letter first, then [a-z0-9_-], 2 to 30 characters.
        database_id = f"t_{uuid.uuid4().hex[:16]}"
        if dialect == "googlesql":  # DDL may come with the CREATE DATABASE
            database = instance.database(database_id, ddl_statements=list(ddl))
            operation = database.create()
            made.append(database)
            operation.result(120)
        elif dialect == "postgresql":  # PostgreSQL: no DDL at create, only afterwards
            database = instance.database(database_id, database_dialect=DatabaseDialect.POSTGRESQL)
            operation = database.create()
            made.append(database)
            operation.result(120)
            if ddl:
                database.update_ddl(list(ddl)).result(120)
        else:
            raise ValueError(f"dialect must be 'googlesql' or 'postgresql', not {dialect!r}")
        return SpannerDatabase(SPANNER_PROJECT, SPANNER_INSTANCE, database_id, dialect, database)

    yield make
    for database in made:
        with contextlib.suppress(GoogleAPICallError):  # already dropped (or never created)
            database.drop()
    client.close()
