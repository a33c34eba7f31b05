"""The demo's "application": creates the orders table and keeps writing to it.

    python scripts/demo_app.py setup [--rows N]     # a database of its own, with N orders
    python scripts/demo_app.py write --seconds S     # random inserts, updates, deletes and
                                                     # primary-key changes for S seconds
The server comes from $SNAPSHOTTER_PG_URL, which may be a server of your own: `setup` never
touches a table it did not make. It works in a database of its own ($DEMO_DATABASE,
snapshotter_demo by default), created here and marked as the demo's (a comment on it); it
drops and creates that database again on each run, and refuses to touch a database of that
name the demo did not make, or a replication slot of the demo's name in another database.
It prints the demo database's URL as its last line; `write` runs against the URL it is given
in $SNAPSHOTTER_PG_URL (scripts/demo passes the demo database's).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import psycopg.conninfo
from psycopg import sql

REGIONS = ("apac", "eu", "us")


MARK = "made by snapshotter's scripts/demo: dropped and created again by each demo run"


def _refuse(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def demo_database(conn: psycopg.Connection, name: str, slot: str) -> None:
    """Drop the demo's database and slot of an earlier run (only those it made), and create
    the database again, marked as the demo's."""
    row = conn.execute(
        "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s",
        (name,),
    ).fetchone()
    if row is not None and row[0] != MARK:
        _refuse(
            f"database {name} exists and was not made by scripts/demo, which drops and "
            "creates its database again on each run: set DEMO_DATABASE to a name that is "
            "free (nothing was changed)"
        )
    found = conn.execute(
        "SELECT database FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    ).fetchone()
    if found is not None and found[0] != name:
        _refuse(
            f"replication slot {slot} exists in database {found[0]}, not the demo's: it is "
            "another pipeline's; nothing was changed"
        )
    if found is not None:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    database = sql.Identifier(name)
    if row is not None:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(database))
    conn.execute(sql.SQL("CREATE DATABASE {}").format(database))
    conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(database, sql.Literal(MARK)))


def setup(conn: psycopg.Connection, rows: int) -> None:
    """The orders table in the demo's own (new, empty) database."""
    conn.execute(
        """create table public.orders (
             region text not null, id bigint not null, amount numeric(12, 2) not null,
             placed_at timestamptz not null default now(), note text,
             primary key (region, id))"""
    )
    # Updates that leave a long note unchanged still log it (see docs/sources.md: TOAST).
    conn.execute("alter table public.orders replica identity full")
    conn.execute(
        """insert into public.orders (region, id, amount, note)
           select (array['eu', 'us', 'apac'])[1 + g %% 3], g, (g %% 1000) / 10.0, 'order ' || g
           from generate_series(1, %s) g""",
        (rows,),
    )
    conn.execute("analyze public.orders")
    print(f"public.orders: {rows} rows (composite key: region, id)", file=sys.stderr)


def write(conn: psycopg.Connection, seconds: float) -> None:
    rng = random.Random()
    top = conn.execute("select coalesce(max(id), 0) from public.orders").fetchone()[0]
    counts = {"insert": 0, "update": 0, "delete": 0, "key change": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with conn.transaction():
            for _ in range(rng.randint(1, 5)):
                kind = rng.choices(list(counts), weights=(3, 5, 1, 1))[0]
                region, some_id = rng.choice(REGIONS), rng.randint(1, top)
                if kind == "insert":
                    top += 1
                    conn.execute(
                        "insert into public.orders (region, id, amount, note) "
                        "values (%s, %s, %s, %s)",
                        (region, top, rng.randint(1, 99999) / 100, f"new order {top}"),
                    )
                elif kind == "update":
                    conn.execute(
                        "update public.orders set amount = amount + 1, note = %s "
                        "where region = %s and id = %s",
                        (f"updated {time.time():.3f}", region, some_id),
                    )
                elif kind == "delete":
                    conn.execute(
                        "delete from public.orders where region = %s and id = %s",
                        (region, some_id),
                    )
                else:
                    top += 1
                    conn.execute(
                        "update public.orders set id = %s where region = %s and id = %s",
                        (top, region, some_id),
                    )
                counts[kind] += 1
        time.sleep(0.002)
    print("application wrote: " + ", ".join(f"{n} {k}s" for k, n in counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--rows", type=int, default=100_000)
    s.add_argument("--slot", default="demo")
    s.add_argument("--publication", default="demo")  # in the demo's database: made there
    w = sub.add_parser("write")
    w.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    url = os.environ["SNAPSHOTTER_PG_URL"]
    if args.command == "write":
        with psycopg.connect(url, autocommit=True) as conn:
            write(conn, args.seconds)
        return
    name = os.environ.get("DEMO_DATABASE") or "snapshotter_demo"
    with psycopg.connect(url, autocommit=True) as conn:
        demo_database(conn, name, args.slot)
    demo_url = psycopg.conninfo.make_conninfo(url, dbname=name)
    with psycopg.connect(demo_url, autocommit=True) as conn:
        setup(conn, args.rows)
    info = psycopg.conninfo.conninfo_to_dict(demo_url)
    where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}"
    print(f"database {name} on {where}: the demo's own", file=sys.stderr)
    print(_as_url(url, name))


def _as_url(url: str, database: str) -> str:
    """``url`` (a postgresql:// URL, as snapshotter's config takes) naming ``database``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(database)))


if __name__ == "__main__":
    main()
