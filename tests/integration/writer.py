"""A background writer for convergence tests: random inserts, updates, deletes and primary-key
changes against a live table while a snapshot runs.

Generic over key shapes: the caller says which columns form the key and supplies
``new_key()`` (a fresh key tuple, values of the types psycopg loads for those columns, so
they compare equal to keys read back) and ``new_row(key)`` (the other columns for a row with
that key; key columns in it are ignored). The writer keeps a cache of the keys in the table,
loaded once at start and updated as it commits, and picks existing keys from it, optionally
from a small hot set so the same rows change again and again (the case the DBLog window has
to get right).

Changes go in small transactions of 1 to ``max_statements`` statements. A transaction that
fails on a unique violation (another writer got there first) is rolled back, counted under
``conflicts`` and the cache reloaded. A lost connection (the server restarted, shut down or
is unreachable) is retried: the writer connects again with a backoff, reloads the cache (a
transaction cut off at COMMIT may or may not have committed) and goes on, counted under
``reconnects``, until it has failed for ``reconnect_for`` seconds in a row. Any other error
stops the thread and is re-raised by ``stop()`` or ``wait()``.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import psycopg
import pymysql
from psycopg import errors, sql

from signals.names import TableId

Key = tuple[Any, ...]

KINDS = ("insert", "update", "delete", "key_change")
DEFAULT_WEIGHTS: Mapping[str, float] = {"insert": 3, "update": 4, "delete": 2, "key_change": 1}


class RandomWriter:
    def __init__(
        self,
        conninfo: str,
        table: TableId,
        key_columns: Sequence[str],
        new_key: Callable[[], Key],
        new_row: Callable[[Key], Mapping[str, Any]],
        *,
        changes: int | None = 5000,
        rate: float | None = None,
        weights: Mapping[str, float] = DEFAULT_WEIGHTS,
        hot_keys: int = 0,
        hot_share: float = 0.5,
        max_statements: int = 5,
        seed: int | None = None,
        reconnect_for: float = 120.0,
    ) -> None:
        """``changes``: statements to run before the thread ends by itself (None: until
        ``stop()``). ``rate``: at most this many statements per second (None: as fast as
        the server allows). ``hot_keys``: the size of the hot set (0: none), from which a
        share ``hot_share`` of updates, deletes and key changes pick their row."""
        if table.schema is None:
            raise ValueError(f"table {table} needs a schema")
        unknown = set(weights) - set(KINDS)
        if unknown or not any(weights.get(k, 0) > 0 for k in KINDS):
            raise ValueError(f"weights must give some of {KINDS} a positive weight")
        self.conninfo = conninfo
        self.table = table
        self.key_columns = tuple(key_columns)
        self.new_key = new_key
        self.new_row = new_row
        self.changes = changes
        self.rate = rate
        self.hot_keys = hot_keys
        self.hot_share = hot_share
        self.max_statements = max_statements
        self.reconnect_for = reconnect_for
        self._last_ok = time.monotonic()  # the last connect or commit that worked
        self.seed = seed if seed is not None else random.randrange(2**32)
        self._rng = random.Random(self.seed)
        self._kinds = [k for k in KINDS if weights.get(k, 0) > 0]
        self._weights = [weights[k] for k in self._kinds]
        # Committed work: one per statement, plus "transactions" and "conflicts".
        self.counts: Counter[str] = Counter()
        self._keys: list[Key] = []
        self._index: dict[Key, int] = {}
        self._hot: list[Key] = []
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="random-writer", daemon=True)
        self._mysql = conninfo.startswith(("mysql:", "mysql+", "mariadb:"))
        self._target = sql.Identifier(table.schema, table.table)
        self._where = sql.SQL(" AND ").join(
            sql.SQL("{} = %s").format(sql.Identifier(c)) for c in self.key_columns
        )
        self._sql_cache: dict[tuple[str, tuple[str, ...]], Any] = {}

    # --- control ----------------------------------------------------------------------------

    def start(self) -> RandomWriter:
        self._thread.start()
        return self

    def wait(self, timeout: float | None = None) -> None:
        """Wait until ``changes`` statements ran (or the thread failed); re-raise its error."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the writer did not finish within {timeout} s: {self.counts}")
        self._raise()

    def stop(self) -> None:
        """Stop after the current transaction, join, and re-raise an error of the thread."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._raise()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    @property
    def total(self) -> int:
        return sum(self.counts[k] for k in KINDS)

    def __enter__(self) -> RandomWriter:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
        else:  # do not hide the test's own failure behind the writer's
            self._stop.set()
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"random writer (seed {self.seed}) failed") from self._error

    # --- the thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._last_ok = time.monotonic()
            delay = 0.1
            while True:
                try:
                    self._session()
                    return  # done, or stopped
                except Exception as exc:
                    if not _connection_lost(exc) or self._stop.is_set():
                        raise
                    if time.monotonic() - self._last_ok > self.reconnect_for:
                        raise
                    self.counts["reconnects"] += 1
                    self._stop.wait(delay)
                    delay = min(delay * 2, 1.0)
                    if self._stop.is_set():
                        return
        except BaseException as exc:  # handed to the caller by stop() / wait()
            self._error = exc

    def _session(self) -> None:
        """One connection's worth of work: connect, load the key cache, write."""
        if self._mysql:
            conn = _MySqlConnection(self.conninfo)
            try:
                self._load_keys(conn)
                self._last_ok = time.monotonic()
                self._loop(conn)
            finally:
                conn.close()
            return
        with psycopg.connect(self.conninfo) as pg:
            self._load_keys(pg)
            self._last_ok = time.monotonic()
            self._loop(pg)

    def _loop(self, conn: Any) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            remaining = None if self.changes is None else self.changes - self.total
            if remaining is not None and remaining <= 0:
                return
            n = self._rng.randint(1, self.max_statements)
            if remaining is not None:
                n = min(n, remaining)
            done: Counter[str] = Counter()
            try:
                with conn.transaction():
                    for _ in range(n):
                        done[self._one(conn)] += 1
            except (errors.UniqueViolation, errors.SerializationFailure, _MySqlConflict):
                self.counts["conflicts"] += 1
                self._load_keys(conn)  # the cache saw the rolled-back statements
                continue
            self.counts.update(done)
            self.counts["transactions"] += 1
            self._last_ok = time.monotonic()
            if self.rate:
                # Pace to the rate on average, so a slow transaction is made up later.
                ahead = self.total / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self._stop.wait(ahead)

    def _one(self, conn: Any) -> str:
        kind = self._rng.choices(self._kinds, self._weights)[0] if self._keys else "insert"
        if kind == "insert":
            key = self._fresh_key()
            row = {**self._values(key), **dict(zip(self.key_columns, key, strict=True))}
            columns = tuple(row)
            conn.execute(self._sql("insert", columns), list(row.values()))
            self._add(key)
        elif kind == "update":
            key = self._pick()
            values = self._values(key)
            if values:
                conn.execute(self._sql("update", tuple(values)), [*values.values(), *key])
            else:  # a table of key columns only: touch the row anyway
                conn.execute(self._sql("update", self.key_columns), [*key, *key])
        elif kind == "delete":
            key = self._pick()
            conn.execute(self._sql("delete", ()), list(key))
            self._remove(key)
        else:
            key = self._pick()
            new = self._fresh_key()
            conn.execute(self._sql("update", self.key_columns), [*new, *key])
            self._remove(key)
            self._add(new)
        return kind

    def _values(self, key: Key) -> dict[str, Any]:
        return {c: v for c, v in self.new_row(key).items() if c not in self.key_columns}

    def _sql(self, kind: str, columns: tuple[str, ...]) -> Any:
        cached = self._sql_cache.get((kind, columns))
        if cached is not None:
            return cached
        if self._mysql:
            text = _mysql_statement(kind, self.table, columns, self.key_columns)
            self._sql_cache[(kind, columns)] = text
            return text
        idents = [sql.Identifier(c) for c in columns]
        if kind == "insert":
            query = sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                self._target,
                sql.SQL(", ").join(idents),
                sql.SQL(", ").join(sql.Placeholder() * len(columns)),
            )
        elif kind == "update":
            query = sql.SQL("UPDATE {} SET {} WHERE {}").format(
                self._target,
                sql.SQL(", ").join(sql.SQL("{} = %s").format(i) for i in idents),
                self._where,
            )
        else:
            query = sql.SQL("DELETE FROM {} WHERE {}").format(self._target, self._where)
        self._sql_cache[(kind, columns)] = query
        return query

    # --- the key cache ----------------------------------------------------------------------

    def _load_keys(self, conn: Any) -> None:
        if self._mysql:
            self._keys = conn.keys(self.table, self.key_columns)
            self._index = {k: i for i, k in enumerate(self._keys)}
            self._hot = self._keys[: self.hot_keys]
            return
        query = sql.SQL("SELECT {} FROM {}").format(
            sql.SQL(", ").join(sql.Identifier(c) for c in self.key_columns), self._target
        )
        with conn.transaction():
            self._keys = [tuple(r) for r in conn.execute(query)]
        self._index = {k: i for i, k in enumerate(self._keys)}
        self._hot = self._keys[: self.hot_keys]

    def _add(self, key: Key) -> None:
        self._index[key] = len(self._keys)
        self._keys.append(key)

    def _remove(self, key: Key) -> None:
        # Swap with the last key: O(1), and order does not matter for random picks.
        i = self._index.pop(key)
        last = self._keys.pop()
        if i < len(self._keys):
            self._keys[i] = last
            self._index[last] = i

    def _pick(self) -> Key:
        if self._hot and self._rng.random() < self.hot_share:
            slot = self._rng.randrange(len(self._hot))
            if self._hot[slot] not in self._index:  # deleted or re-keyed: another row is hot
                self._hot[slot] = self._rng.choice(self._keys)
            return self._hot[slot]
        return self._rng.choice(self._keys)

    def _fresh_key(self) -> Key:
        for _ in range(100):
            key = tuple(self.new_key())
            if key not in self._index:
                return key
        raise RuntimeError("new_key() returned 100 keys already in the table")


# --- MySQL / MariaDB -------------------------------------------------------------------------


def _connection_lost(exc: BaseException) -> bool:
    """The connection, not the statement, failed: the server went away or refused us."""
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return not isinstance(exc, errors.QueryCanceled)
    if isinstance(exc, pymysql.err.InterfaceError):
        return True
    if isinstance(exc, pymysql.err.OperationalError):
        return bool(exc.args) and exc.args[0] in _MYSQL_CONNECTION_LOST
    return False


# Can't connect, gone away, lost, lost (extended), too many connections, shutdown in
# progress, connection killed (MariaDB), disconnected for inactivity (MySQL).
_MYSQL_CONNECTION_LOST = {2002, 2003, 2006, 2013, 2055, 1040, 1053, 1927, 4031}


class _MySqlConflict(Exception):
    """A duplicate key (under a case-insensitive collation 'abc' and 'ABC' collide), a
    deadlock or a lock wait timeout: roll back, reload the keys, go on."""


_MYSQL_CONFLICTS = {1062, 1213, 1205}


def _bq(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _mysql_statement(
    kind: str, table: TableId, columns: tuple[str, ...], key: tuple[str, ...]
) -> str:
    target = f"{_bq(table.schema or '')}.{_bq(table.table)}"
    # Plain "=": under a case-insensitive collation only one of 'abc' and 'ABC' can be in
    # the table, so it finds the row whichever spelling the cache holds.
    where = " AND ".join(f"{_bq(c)} = %s" for c in key)
    if kind == "insert":
        marks = ", ".join(["%s"] * len(columns))
        return f"INSERT INTO {target} ({', '.join(map(_bq, columns))}) VALUES ({marks})"
    if kind == "update":
        sets = ", ".join(f"{_bq(c)} = %s" for c in columns)
        return f"UPDATE {target} SET {sets} WHERE {where}"
    return f"DELETE FROM {target} WHERE {where}"


class _MySqlConnection:
    """Just what the writer uses of a psycopg connection, on pymysql."""

    def __init__(self, url: str) -> None:
        from tests.integration.engine_harness import mysql_connect

        self._conn = mysql_connect(url)  # UTC session: TIMESTAMP values are given in UTC

    def close(self) -> None:
        with contextlib.suppress(pymysql.err.Error):  # already lost
            self._conn.close()

    def keys(self, table: TableId, columns: tuple[str, ...]) -> list[Key]:
        with self._conn.cursor() as cur:
            cur.execute(
                f"SELECT {', '.join(map(_bq, columns))} FROM {_bq(table.schema or '')}."
                f"{_bq(table.table)}"
            )
            return [tuple(r) for r in cur.fetchall()]

    def transaction(self) -> _MySqlTransaction:
        return _MySqlTransaction(self._conn)

    def execute(self, statement: str, params: Sequence[Any]) -> None:
        try:
            with self._conn.cursor() as cur:
                cur.execute(statement, [_mysql_value(v) for v in params])
        except (pymysql.err.IntegrityError, pymysql.err.OperationalError) as exc:
            if exc.args and exc.args[0] in _MYSQL_CONFLICTS:
                raise _MySqlConflict(str(exc)) from exc
            raise


def _mysql_value(value: Any) -> Any:
    import json

    if isinstance(value, dict | list):
        return json.dumps(value)
    return value


class _MySqlTransaction:
    def __init__(self, conn: pymysql.connections.Connection[Any]) -> None:
        self._conn = conn

    def __enter__(self) -> None:
        self._conn.begin()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self._conn.commit()
            return
        try:
            self._conn.rollback()
        except pymysql.err.Error:
            if not _connection_lost(exc):
                raise
            # The connection is gone with the transaction: the original error says so.
