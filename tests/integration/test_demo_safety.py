"""`scripts/demo` on a server of your own never drops a table it did not make (issue 26): its
setup used to run ``DROP TABLE IF EXISTS public.orders, public.debezium_signal`` in the
database SNAPSHOTTER_PG_URL names. It now works in a database of its own, and refuses a
database of that name (or a slot of the demo's name elsewhere) it did not make."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import sql

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def _admin(url: str, statement: sql.Composable | str) -> list[tuple[object, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(statement)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


@pytest.fixture
def databases(pg_url: str) -> Iterator[dict[str, str]]:
    """A database standing for the user's (with their orders and signal table), and the
    name the demo is told to use; both dropped afterwards, with the demo's slot."""
    tag = uuid.uuid4().hex[:10]
    names = {"user": f"t_user_{tag}", "demo": f"t_demo_{tag}", "slot": f"demo_{tag}"}
    _admin(pg_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(names["user"])))
    user_url = sa.make_url(pg_url).set(database=names["user"])
    names["user_url"] = user_url.render_as_string(hide_password=False)
    _admin(names["user_url"], "CREATE TABLE public.orders (id int PRIMARY KEY, note text)")
    _admin(names["user_url"], "INSERT INTO public.orders VALUES (1, 'mine'), (2, 'also mine')")
    _admin(
        names["user_url"],
        "CREATE TABLE public.debezium_signal (id varchar(42) PRIMARY KEY, "
        "type varchar(32) NOT NULL, data text)",
    )
    _admin(names["user_url"], "INSERT INTO public.debezium_signal VALUES ('s1', 'log', NULL)")
    try:
        yield names
    finally:
        _admin(
            pg_url,
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            f"WHERE slot_name = '{names['slot']}'",
        )
        for key in ("user", "demo"):
            _admin(
                pg_url,
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(names[key])
                ),
            )


def _setup(url: str, demo: str, slot: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SNAPSHOTTER_PG_URL": url, "DEMO_DATABASE": demo}
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "demo_app.py"),
            "setup",
            "--rows",
            "20",
            "--slot",
            slot,
            "--publication",
            slot,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )


def test_the_demo_never_drops_the_users_tables(databases: dict[str, str]) -> None:
    user_url = databases["user_url"]
    done = _setup(user_url, databases["demo"], databases["slot"])
    assert done.returncode == 0, done.stderr
    # The user's tables and rows are as they were.
    assert _admin(user_url, "SELECT id, note FROM public.orders ORDER BY id") == [
        (1, "mine"),
        (2, "also mine"),
    ]
    assert _admin(user_url, "SELECT id FROM public.debezium_signal") == [("s1",)]
    # The demo's table is in the demo's own database, whose URL is the last line.
    demo_url = done.stdout.strip().splitlines()[-1]
    assert sa.make_url(demo_url).database == databases["demo"]
    assert _admin(demo_url, "SELECT count(*) FROM public.orders") == [(20,)]
    # A second run makes its own database again, still leaving the user's alone.
    again = _setup(user_url, databases["demo"], databases["slot"])
    assert again.returncode == 0, again.stderr
    assert len(_admin(user_url, "SELECT id FROM public.orders")) == 2


def test_the_demo_refuses_a_database_it_did_not_make(databases: dict[str, str]) -> None:
    # The user's database has the demo database's name: refused, nothing dropped.
    done = _setup(databases["user_url"], databases["user"], databases["slot"])
    assert done.returncode == 2, done.stderr
    assert "was not made by scripts/demo" in done.stderr and "DEMO_DATABASE" in done.stderr
    assert len(_admin(databases["user_url"], "SELECT id FROM public.orders")) == 2
    # A slot of the demo's name in another database is another pipeline's: refused too.
    _admin(
        databases["user_url"],
        f"SELECT pg_create_logical_replication_slot('{databases['slot']}', 'pgoutput')",
    )
    refused = _setup(databases["user_url"], databases["demo"], databases["slot"])
    assert refused.returncode == 2 and "another pipeline" in refused.stderr, refused.stderr
    slots = _admin(
        databases["user_url"],
        f"SELECT database FROM pg_replication_slots WHERE slot_name = '{databases['slot']}'",
    )
    assert slots == [(databases["user"],)]
