"""The demo's "application": creates the orders table and keeps writing to it.

    python scripts/demo_app.py setup [--rows N]     # a database of its own, with N orders
    python scripts/demo_app.py write --seconds S [--counts F]   # random inserts, updates,
                                 # deletes and primary-key changes for S seconds; F: the rows
                                 # each kind changed, as JSON, for the demo's reconciliation
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
import json
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


def write(conn: psycopg.Connection, seconds: float, counts_path: str | None) -> None:
    """Random statements for ``seconds``; counts the rows they changed (most updates and
    deletes pick a key that is not there and change nothing), which is what the log carries."""
    rng = random.Random()
    top = conn.execute("select coalesce(max(id), 0) from public.orders").fetchone()[0]
    kinds = ("insert", "update", "delete", "key change")
    statements = dict.fromkeys(kinds, 0)
    rows = dict.fromkeys(kinds, 0)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with conn.transaction():
            for _ in range(rng.randint(1, 5)):
                kind = rng.choices(kinds, weights=(3, 5, 1, 1))[0]
                region, some_id = rng.choice(REGIONS), rng.randint(1, top)
                if kind == "insert":
                    top += 1
                    cur = conn.execute(
                        "insert into public.orders (region, id, amount, note) "
                        "values (%s, %s, %s, %s)",
                        (region, top, rng.randint(1, 99999) / 100, f"new order {top}"),
                    )
                elif kind == "update":
                    cur = conn.execute(
                        "update public.orders set amount = amount + 1, note = %s "
                        "where region = %s and id = %s",
                        (f"updated {time.time():.3f}", region, some_id),
                    )
                elif kind == "delete":
                    cur = conn.execute(
                        "delete from public.orders where region = %s and id = %s",
                        (region, some_id),
                    )
                else:
                    top += 1
                    cur = conn.execute(
                        "update public.orders set id = %s where region = %s and id = %s",
                        (top, region, some_id),
                    )
                statements[kind] += 1
                rows[kind] += cur.rowcount
        time.sleep(0.002)
    print(
        "application changed rows: "
        + ", ".join(f"{rows[k]} {k}s" for k in kinds)
        + f" ({sum(statements.values())} statements; an update or delete of a key that is "
        "not there changes nothing)"
    )
    if counts_path:
        with open(counts_path, "w", encoding="utf-8") as out:
            json.dump(rows, out)


def expected_events(rows: dict[str, int]) -> dict[str, int]:
    """The change events per op the application's rows make: a key change is a delete of
    the old key and a create of the new one (Debezium's rule, and snapshotter's)."""
    return {
        "c": rows["insert"] + rows["key change"],
        "u": rows["update"],
        "d": rows["delete"] + rows["key change"],
    }


def reconcile(counts_path: str, landed: dict[str, int]) -> bool:
    """Print what the application changed against the change events that landed, per op;
    whether they agree."""
    with open(counts_path, encoding="utf-8") as f:
        rows = json.load(f)
    expected = expected_events(rows)
    print("== reconciliation: the application's changed rows against the landed events")
    print(f"   {'op':<3} {'application':>12} {'landed':>8}")
    why = {
        "c": f"{rows['insert']} inserts + {rows['key change']} key changes",
        "u": f"{rows['update']} updates",
        "d": f"{rows['delete']} deletes + {rows['key change']} key changes",
    }
    for op, count in expected.items():
        print(f"   {op:<3} {count:>12} {landed.get(op, 0):>8}   ({why[op]})")
    agree = all(landed.get(op, 0) == count for op, count in expected.items())
    print("   every change landed once" if agree else "   MISMATCH: see .demo/run.log")
    return agree


def _landed_jsonl(path: str) -> dict[str, int]:
    """Change events per op in a JSONL output (READ rows, op r, are the snapshot's)."""
    landed: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            op = (json.loads(line).get("value") or {}).get("op")  # a tombstone: no value
            if op in ("c", "u", "d"):
                landed[op] = landed.get(op, 0) + 1
    return landed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("setup")
    s.add_argument("--rows", type=int, default=100_000)
    s.add_argument("--slot", default="demo")
    s.add_argument("--publication", default="demo")  # in the demo's database: made there
    w = sub.add_parser("write")
    w.add_argument("--seconds", type=float, default=20)
    w.add_argument("--counts", help="write the rows changed per kind here (JSON)")
    r = sub.add_parser("reconcile")  # against a JSONL output (demo_query.py: Spark's)
    r.add_argument("--counts", required=True)
    r.add_argument("--jsonl", required=True)
    args = parser.parse_args()
    if args.command == "reconcile":
        sys.exit(0 if reconcile(args.counts, _landed_jsonl(args.jsonl)) else 1)
    url = os.environ["SNAPSHOTTER_PG_URL"]
    if args.command == "write":
        with psycopg.connect(url, autocommit=True) as conn:
            write(conn, args.seconds, args.counts)
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
