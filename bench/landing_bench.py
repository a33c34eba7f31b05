"""The landing side: the spark sink's formats against the same-run pyarrow copy, sustained log
throughput, the closing compaction of ``current/``, the spark sink's time breakdown and its
landing cost per batch. Each subcommand's measurement is in ``bench/lib/landings/``.

    python bench/landing_bench.py formats --sizes 1000000 4000000 --rounds 3
    python bench/landing_bench.py sustained --seconds 60 --rate 2000
    python bench/landing_bench.py current-state --rows 1000000 --rounds 2
    python bench/landing_bench.py spark --part e2e --rows 1000000   # or --part landing
"""

import sys
from pathlib import Path

if __name__ == "__main__":  # the bootstrap (bench/README.md): import bench.lib from the repo root
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from bench.lib.cli import dispatch

COMMANDS = {
    "formats": "bench.lib.landings.formats",
    "sustained": "bench.lib.landings.sustained",
    "current-state": "bench.lib.landings.current_state",
    "spark": "bench.lib.landings.spark",
}

if __name__ == "__main__":
    sys.exit(dispatch(__doc__ or "", COMMANDS))
