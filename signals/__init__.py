"""The signal protocol: Debezium-compatible signal rows, parsed strictly into typed signals.

This package is pure (no database imports) except ``signals.table``, which holds the DDL and
the insert and cleanup helpers and needs SQLAlchemy.
"""

from signals.model import (
    USER_SIGNAL_TYPES,
    AdditionalCondition,
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    Signal,
    SignalError,
    SignalType,
    SnapshotType,
    StopSnapshot,
    Watermark,
    WatermarkKind,
    to_row,
)
from signals.names import (
    TableId,
    TableNameError,
    TablePattern,
    TableSelector,
    parse_table_name,
    parse_table_selector,
)
from signals.parser import parse_signal
from signals.sqlguard import FilterError, check_filter

__all__ = [
    "USER_SIGNAL_TYPES",
    "AdditionalCondition",
    "ExecuteSnapshot",
    "FilterError",
    "LogSignal",
    "PauseSnapshot",
    "ResumeSnapshot",
    "Signal",
    "SignalError",
    "SignalType",
    "SnapshotType",
    "StopSnapshot",
    "TableId",
    "TableNameError",
    "TablePattern",
    "TableSelector",
    "Watermark",
    "WatermarkKind",
    "check_filter",
    "parse_signal",
    "parse_table_name",
    "parse_table_selector",
    "to_row",
]
