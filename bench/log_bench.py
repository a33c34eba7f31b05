"""The log side: the engine's log path on PostgreSQL (a stream under a writer, a backlog, a
cProfile of one snapshot) and binlog decoding on MariaDB, setting by setting. Each
subcommand's measurement is in ``bench/lib/logs/``.

    python bench/log_bench.py stream --rows 200000 --profile
    python bench/log_bench.py binlog --captured 50000 --other 50000
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # the bootstrap (bench/README.md): import bench.lib from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.lib.cli import dispatch

COMMANDS = {"stream": "bench.lib.logs.stream", "binlog": "bench.lib.logs.binlog"}

if __name__ == "__main__":
    sys.exit(dispatch(__doc__ or "", COMMANDS))
