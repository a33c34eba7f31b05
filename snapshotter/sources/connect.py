"""Connections to an SQL source through SQLAlchemy (which quotes every identifier for us)."""

from __future__ import annotations

import sqlalchemy as sa

from snapshotter.config import SourceConfig
from snapshotter.sources.connector import connector_for
from snapshotter.sources.sql_connector import SqlConnector


def create_engine(source: SourceConfig) -> sa.Engine:
    """An engine on an SQL source with the driver snapshotter uses (``postgresql://`` →
    psycopg 3, ``mysql://`` → pymysql) and the arguments it needs."""
    connector = connector_for(source)
    if not isinstance(connector, SqlConnector):
        raise ValueError(f"a {source.kind} source has no SQLAlchemy engine")
    return connector.engine()
