"""Connections to the source through SQLAlchemy (which quotes every identifier for us)."""

from __future__ import annotations

import sqlalchemy as sa

from snapshotter.config import SourceConfig
from snapshotter.sources.connector import connector_for


def create_engine(source: SourceConfig) -> sa.Engine:
    """An engine on the source with the driver snapshotter uses (``postgresql://`` →
    psycopg 3, ``mysql://`` → pymysql) and the arguments it needs."""
    connector = connector_for(source)
    return sa.create_engine(
        connector.sqlalchemy_url(), pool_pre_ping=True, connect_args=connector.connect_args()
    )
