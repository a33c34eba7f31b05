"""What a MySQL / MariaDB server says about itself, as ``snapshotter init`` gathers it
(``sources.mysql.setup.gather``) and judges it (its settings in ``setup``, the user's grants
in ``sources.mysql.grants``)."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the server says about itself: global variables as reported (``None`` where the
    server has no such variable) and the grants of the connected user."""

    version: str  # SELECT VERSION(): "8.4.2", "10.11.6-MariaDB-0+deb12u1-log"
    is_mariadb: bool
    log_bin: bool
    server_id: int | None
    user: str  # CURRENT_USER(): "name@host", the account the grants belong to
    database: str | None  # DATABASE(): the source database, whose tables need SELECT
    grants: tuple[str, ...] = ()  # SHOW GRANTS lines (passwords cut out)
    binlog_format: str | None = None
    binlog_row_image: str | None = None
    binlog_row_metadata: str | None = None
    binlog_order_commits: bool | None = None  # None on MariaDB: commits in binlog order
    binlog_expire_logs_seconds: int | None = None
    expire_logs_days: float | None = None
    binlog_expire_logs_auto_purge: bool | None = None
    gtid_mode: str | None = None
    gtid_strict_mode: bool | None = None
    binlog_row_value_options: str | None = None
    binlog_transaction_compression: bool | None = None
    log_bin_compress: bool | None = None

    @property
    def version_tuple(self) -> tuple[int, int, int]:
        """The leading ``major.minor.patch`` of :attr:`version` (missing parts are 0)."""
        return _version_tuple(self.version)

    @property
    def binlog_retention_seconds(self) -> float | None:
        """How long binlogs are kept before automatic purging, in seconds: 0 for never, None
        when the server reports neither retention variable."""
        if self.binlog_expire_logs_auto_purge is False:
            return 0
        if self.binlog_expire_logs_seconds:
            return self.binlog_expire_logs_seconds
        if self.expire_logs_days:
            return self.expire_logs_days * 86_400
        if self.binlog_expire_logs_seconds is None and self.expire_logs_days is None:
            return None
        return 0

    @property
    def binlog_monitor_privilege(self) -> str:
        """The name SHOW GRANTS uses for the privilege behind SHOW BINARY LOG STATUS /
        SHOW MASTER STATUS: MariaDB 10.5.2 renamed REPLICATION CLIENT to BINLOG MONITOR."""
        if self.is_mariadb and self.version_tuple >= (10, 5, 2):
            return "BINLOG MONITOR"
        return "REPLICATION CLIENT"


def _version_tuple(version: str) -> tuple[int, int, int]:
    match = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", version)
    if match is None:
        return (0, 0, 0)
    major, minor, patch = match.groups()
    return (int(major), int(minor or 0), int(patch or 0))
