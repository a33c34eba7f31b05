"""The engine's commits and the end of the WAL, whatever the server's ``synchronous_commit``.

With ``synchronous_commit = off`` (for the server, a database or a role) a commit returns
before its WAL is flushed; the WAL writer flushes it within about 3 x ``wal_writer_delay``
(200 ms by default). Logical decoding reads flushed WAL only, so:

* A watermark committed that way comes back through the log only after the WAL writer has
  run: each chunk window stays open 0.1-0.5 s longer for nothing (a snapshot ran 3-4x
  slower). The engine's own commits ask for a local flush (``synchronous_commit = local``,
  for that transaction only): back in the log at once, and never waiting for a synchronous
  standby either (``on`` would, and a standby that never answers would hold every window).
* ``pg_current_wal_flush_lsn()`` can be before a commit that has returned: a caught-up
  target taken there stops before it (measured: none of 10,000 committed updates landed).
  The target is the WAL insert position instead, taken in a transaction whose commit is
  flushed locally: every transaction committed before the call is before the target, and
  that flush puts the whole target in the log at once (else the stream would wait for the
  WAL writer or, for WAL that no commit flushes, for the next standby snapshot, ~15 s).
"""

from __future__ import annotations

import sqlalchemy as sa

# For the current transaction only (``SET LOCAL``), in one statement with what follows.
_FLUSH_LOCALLY = "pg_catalog.set_config('synchronous_commit', 'local', true)"


def flush_at_commit(conn: sa.Connection) -> None:
    """Make the open transaction's commit wait for its local WAL flush (and nothing more)."""
    conn.execute(sa.text(f"SELECT {_FLUSH_LOCALLY}"))


def committed_end(engine: sa.Engine) -> int:
    """A WAL position at or after the commit of every transaction committed before the
    call, flushed (so decodable) by the time this returns: the insert position, read in a
    transaction whose commit is flushed locally. PostgreSQL flushes at commit only a
    transaction that wrote WAL: it writes a transactional logical decoding message (prefix
    ``snapshotter``, empty; pgoutput sends it inside an empty transaction, which the
    engine's decoder ignores and other consumers may see)."""
    with engine.begin() as conn:
        lsn = conn.execute(
            sa.text(
                f"SELECT {_FLUSH_LOCALLY}, "
                "pg_catalog.pg_current_wal_insert_lsn() - CAST('0/0' AS pg_lsn), "
                "pg_catalog.pg_logical_emit_message(true, 'snapshotter', '')"
            )
        ).one()[1]
    return int(lsn)


def wal_end(engine: sa.Engine) -> int:
    """The WAL insert position (read only): where the log ends, async commits included."""
    with engine.connect() as conn:
        lsn = conn.execute(
            sa.text("SELECT pg_catalog.pg_current_wal_insert_lsn() - CAST('0/0' AS pg_lsn)")
        ).scalar_one()
    return int(lsn)
