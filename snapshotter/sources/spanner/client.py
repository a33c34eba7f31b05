"""Opening a Spanner database with Google's client library, and what its errors mean.

Cloud Spanner is reached with the credentials Google's libraries find (Application Default
Credentials); the emulator (``emulator_host`` or ``SPANNER_EMULATOR_HOST``) without any, over
plain gRPC. Read-write transactions (watermark rows, signals) go through
``Database.run_in_transaction``, which retries a transaction Spanner aborted: the emulator
runs one read-write transaction at a time and aborts the others, so retries are the norm
there.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from google.api_core import exceptions as gexc

from snapshotter.config import SpannerSource

# The client's multiplexed sessions for read-write transactions: with them the emulator
# fails a second concurrent transaction with FailedPrecondition ("Transaction ID must be >=
# N"), which the client does not retry (measured, client 3.71 + emulator 1.5.28); pooled
# sessions get Aborted, which it retries. Off for the emulator only.
_MULTIPLEXED_RW = "GOOGLE_CLOUD_SPANNER_MULTIPLEXED_SESSIONS_FOR_RW"
EMULATOR_ENV = "SPANNER_EMULATOR_HOST"
_REQUEST_ID = re.compile(r",\s*request_id\s*=\s*[\w.]+\s*$")


class SpannerDialectKind(StrEnum):
    """A database's SQL dialect (``information_schema`` and the change stream's read
    function differ)."""

    GOOGLESQL = "googlesql"
    POSTGRESQL = "postgresql"


@dataclass(frozen=True, slots=True)
class SpannerTarget:
    """One database: where it is, and how to reach it."""

    project: str
    instance: str
    database: str
    emulator_host: str | None  # None: Cloud Spanner itself

    @property
    def path(self) -> str:
        return f"projects/{self.project}/instances/{self.instance}/databases/{self.database}"

    def __str__(self) -> str:
        where = f" on the emulator at {self.emulator_host}" if self.emulator_host else ""
        return f"{self.path}{where}"


def target_of(source: SpannerSource) -> SpannerTarget:
    """The database a ``[source]`` section of kind "spanner" names."""
    path = source.spanner_path
    host = source.emulator_host or os.environ.get(EMULATOR_ENV) or None
    return SpannerTarget(path["project"], path["instance"], path["database"], host)


def open_database(target: SpannerTarget) -> Any:
    """The client library's ``Database`` of ``target`` (no RPC is made yet)."""
    from google.cloud import spanner

    if target.emulator_host:
        from google.auth.credentials import AnonymousCredentials

        os.environ.setdefault(_MULTIPLEXED_RW, "false")
        client = spanner.Client(
            project=target.project,
            credentials=AnonymousCredentials(),
            client_options={"api_endpoint": target.emulator_host},
            # The client exports its own metrics to Cloud Monitoring, which an emulator
            # user has no project in (and may not reach): its exporter would log errors.
            disable_builtin_metrics=True,
        )
    else:
        client = spanner.Client(project=target.project)
    return client.instance(target.instance).database(target.database)


def dialect_of(database: Any) -> SpannerDialectKind:
    """The database's dialect, from ``information_schema.database_options`` (a query both
    dialects read alike; the emulator's admin API reports every database's dialect as
    unspecified); NotFound when the database does not exist."""
    with database.snapshot() as snapshot:
        rows = list(
            snapshot.execute_sql(
                "SELECT option_value FROM information_schema.database_options "
                "WHERE option_name = 'database_dialect'"
            )
        )
    if rows and str(rows[0][0]).upper() == "POSTGRESQL":
        return SpannerDialectKind.POSTGRESQL
    return SpannerDialectKind.GOOGLESQL


# Errors of the service or the network, not of what was asked: retry later.
_TRANSIENT = (
    gexc.ServiceUnavailable,
    gexc.DeadlineExceeded,
    gexc.InternalServerError,
    gexc.Aborted,
    gexc.ResourceExhausted,
    gexc.RetryError,
)


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` means Spanner (or the way to it) failed for now."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, _TRANSIENT):
            return True
        if isinstance(seen, gexc.GoogleAPICallError):
            return False
        seen = seen.__cause__
    return isinstance(exc, ConnectionError)


def reason(exc: BaseException) -> str:
    """The first line of what Spanner said."""
    said = exc.message if isinstance(exc, gexc.GoogleAPICallError) else None
    text = (said or str(exc)).strip()
    # The client appends its own request id to what Spanner said: noise to a reader.
    text = _REQUEST_ID.sub("", text.splitlines()[0]) if text else ""
    return text or type(exc).__name__
