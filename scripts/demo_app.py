"""The demo's "application": creates the orders table and keeps writing to it.

    python scripts/demo_app.py setup [--rows N]     # (re)create public.orders with N rows
    python scripts/demo_app.py write --seconds S     # random inserts, updates, deletes and
                                                     # primary-key changes for S seconds
The URL comes from $SNAPSHOTTER_PG_URL.
"""

from __future__ import annotations

import argparse
import os
import random
import time

import psycopg

REGIONS = ("apac", "eu", "us")


def setup(conn: psycopg.Connection, rows: int, slot: str, publication: str) -> None:
    conn.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
        (slot,),
    )
    conn.execute(f'DROP PUBLICATION IF EXISTS "{publication}"')
    conn.execute("DROP TABLE IF EXISTS public.orders, public.debezium_signal")
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
    print(f"public.orders: {rows} rows (composite key: region, id)")


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
    s.add_argument("--publication", default="demo")
    w = sub.add_parser("write")
    w.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    with psycopg.connect(os.environ["SNAPSHOTTER_PG_URL"], autocommit=True) as conn:
        if args.command == "setup":
            setup(conn, args.rows, args.slot, args.publication)
        else:
            write(conn, args.seconds)


if __name__ == "__main__":
    main()
