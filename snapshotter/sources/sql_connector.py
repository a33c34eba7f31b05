"""What the SQL sources' connectors (PostgreSQL, MySQL / MariaDB) share: the source handle
is an SQLAlchemy engine, and the signal table is read and written through SQLAlchemy
(``signals.table``), which quotes every name."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from signals.model import Signal, Watermark
from signals.names import TableId
from signals.table import create_signal_table, insert_signal, signal_table
from snapshotter.sources.connector import ConnectError
from snapshotter.sources.setup_common import drop_table_if_exists


class SqlConnector:
    """The base of the SQL connectors; they give ``sqlalchemy_url`` and ``connect_args``."""

    errors: tuple[type[Exception], ...] = (sa.exc.SQLAlchemyError,)
    source: Any

    def sqlalchemy_url(self) -> sa.URL:
        raise NotImplementedError

    def connect_args(self) -> dict[str, Any]:
        return {}

    def engine(self, timeout_s: float | None = None) -> sa.Engine:
        """An engine on the source with the driver snapshotter uses (not connected yet)."""
        if timeout_s is None:
            return sa.create_engine(
                self.sqlalchemy_url(), pool_pre_ping=True, connect_args=self.connect_args()
            )
        args = {"connect_timeout": max(1, int(timeout_s)), **self.connect_args()}
        return sa.create_engine(self.sqlalchemy_url(), connect_args=args, poolclass=sa.NullPool)

    def connect(self, timeout_s: float | None = None) -> sa.Engine:
        from snapshotter.common.errors import explain

        engine = self.engine(timeout_s)
        try:
            with engine.connect():
                pass
        except sa.exc.DBAPIError as exc:
            engine.dispose()
            raise ConnectError(explain(exc, self.source.url).text) from exc
        return engine

    def dispose(self, handle: Any) -> None:
        handle.dispose()

    @property
    def _signal_table(self) -> TableId:
        table: TableId = self.source.signal_table_id
        return table

    def create_signal_table(self, handle: Any) -> bool:
        with handle.begin() as conn:
            return create_signal_table(conn, self._signal_table)

    def insert_signal(self, handle: Any, signal: Signal | Watermark) -> str:
        with handle.begin() as conn:
            return insert_signal(conn, self._signal_table, signal)

    def signal_rows(self, handle: Any) -> list[tuple[Any, Any, Any]]:
        table = signal_table(self._signal_table)
        query = sa.select(table.c.id, table.c.type, table.c.data).order_by(table.c.id)
        with handle.connect() as conn:
            return [(r.id, r.type, r.data) for r in conn.execute(query)]

    def drop_signal_table(self, handle: Any) -> bool:
        return drop_table_if_exists(handle, signal_table(self._signal_table))

    def handle_user(self, handle: Any) -> str:
        return str(handle.url.username or "the configured user")
