"""What the engine counts while it runs, for observers in the same process (metrics,
``status``-like reports): plain counters the engine bumps on its own thread and observers
read from theirs (an int read is atomic in CPython; a reader may see a value one step old,
which is all a scrape needs). Nothing here is saved: durable progress lives in state."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field


@dataclass
class EngineStats:
    started_at: float = field(default_factory=time.time)  # wall clock, seconds
    log_changes: int = 0  # data change events handed over (signal-table rows excluded)
    log_transactions: int = 0  # commits handed over
    last_commit_ts_ms: int = 0  # the source's commit time of the newest commit handed over
    last_commit_seen_at: float = 0.0  # wall clock when that commit reached the engine
    chunks_closed: int = 0
    # Errors by kind: "signal" (a signal the engine could not act on), "snapshot" (a table's
    # snapshot failed), "source_retry" (a transient source failure retried).
    errors: Counter[str] = field(default_factory=Counter)

    def commit_seen(self, ts_ms: int) -> None:
        self.log_transactions += 1
        if ts_ms:
            self.last_commit_ts_ms = ts_ms
        self.last_commit_seen_at = time.time()
