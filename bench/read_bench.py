"""The read side: how fast a chunk SELECT becomes Arrow per client library, whether the values
equal the log's, snapshots with 1-3 chunk SELECTs in flight, chunks read on Spark's executors,
a Spanner snapshot. Each subcommand's measurement is in ``bench/lib/reads/``.

    python bench/read_bench.py chunk --source both --rows 200000   # per client library
    python bench/read_bench.py mysql --rows 1000000                # MySQL readers, values
    python bench/read_bench.py parallelism --rows 200000 --rounds 5
    python bench/read_bench.py executor --rows 1000000             # the standalone cluster
    python bench/read_bench.py spanner --rows 100000               # the emulator
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # the bootstrap (bench/README.md): import bench.lib from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.lib.cli import dispatch

COMMANDS = {
    "chunk": "bench.lib.reads.chunk",
    "mysql": "bench.lib.reads.mysql",
    "parallelism": "bench.lib.reads.parallelism",
    "executor": "bench.lib.reads.executor",
    "spanner": "bench.lib.reads.spanner",
}

if __name__ == "__main__":
    sys.exit(dispatch(__doc__ or "", COMMANDS))
