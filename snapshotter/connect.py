"""Connections to the source through SQLAlchemy (which quotes every identifier for us)."""

from __future__ import annotations

import sqlalchemy as sa

from snapshotter.config import SourceConfig

_DRIVERS = {"postgres": "postgresql+psycopg", "mysql": "mysql+pymysql"}


def sqlalchemy_url(source: SourceConfig) -> sa.URL:
    """The source URL with the driver snapshotter uses (``postgresql://`` → psycopg 3)."""
    url = sa.make_url(source.url)
    return url.set(drivername=_DRIVERS[source.kind])


def create_engine(source: SourceConfig) -> sa.Engine:
    if source.kind == "mysql":
        return sa.create_engine(
            sqlalchemy_url(source), pool_pre_ping=True, connect_args={"charset": "utf8mb4"}
        )
    return sa.create_engine(sqlalchemy_url(source), pool_pre_ping=True)
