"""What the engine asks PostgreSQL as it starts: the transactions not ended yet, and what the
server shows of their sessions (rule 4 across restarts; the argument is in
``snapshotter.core.visibility``, 1. and 3.).

In this order, on one connection:

1. an xid is assigned to the question (``pg_current_xact_id()``); in the same transaction
   the sessions holding an xid (``pg_stat_activity``) and the prepared transactions
   (``pg_prepared_xacts``) are read; then it is rolled back (it wrote nothing), which ends
   the xid;
2. in a new transaction, a snapshot is taken (``pg_current_snapshot()``): its xmax is past
   the ended xid, and the activity was read before it.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from snapshotter.core.visibility import OpenAtStart, OpenTransaction, PgSnapshot

_ASSIGN = "SELECT pg_current_xact_id()::text"
# xids as text (32 bits: xid has no cast to a number type). For a session of another role the
# engine's role sees backend_xid but not state or backend_type (NULL), unless it has
# pg_read_all_stats: such a session stays in doubt.
_SESSIONS = """
SELECT backend_xid::text AS xid, pid, state, backend_type = 'client backend' AS client,
       extract(epoch FROM clock_timestamp() - xact_start)::float8 AS age_s, NULL AS gid
  FROM pg_catalog.pg_stat_activity
 WHERE backend_xid IS NOT NULL
UNION ALL
SELECT transaction::text, NULL, NULL, false,
       extract(epoch FROM clock_timestamp() - prepared)::float8, gid
  FROM pg_catalog.pg_prepared_xacts
"""
_SNAPSHOT = "SELECT pg_current_snapshot()::text"


def open_at_start(engine: sa.Engine) -> OpenAtStart:
    with engine.connect() as conn:
        assigned = int(conn.execute(sa.text(_ASSIGN)).scalar_one())
        sessions = tuple(_session(row) for row in conn.execute(sa.text(_SESSIONS)))
        conn.rollback()  # ends the assigned xid before the snapshot below is taken
        snapshot = PgSnapshot.parse(conn.execute(sa.text(_SNAPSHOT)).scalar_one())
        conn.rollback()
    return OpenAtStart(assigned, snapshot, sessions)


def _session(row: Any) -> OpenTransaction:
    return OpenTransaction(
        xid=int(row.xid),
        pid=row.pid,
        state=row.state,
        client=bool(row.client),
        age_s=None if row.age_s is None else float(row.age_s),
        prepared=row.gid,
    )
