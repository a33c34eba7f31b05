"""Subcommands of an entry script: ``python bench/read_bench.py chunk --rows 2000`` runs
``bench.lib.reads.chunk.main(["--rows", "2000"])``; ``--help`` lists the subcommands with the
first line of each module's docstring."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping, Sequence


def dispatch(doc: str, commands: Mapping[str, str], argv: Sequence[str] | None = None) -> int:
    """Run the subcommand ``argv[0]`` (``commands`` maps its name to a module with a
    ``main(argv) -> int``) with the rest of ``argv``."""
    args = list(sys.argv[1:] if argv is None else argv)
    script = os.path.basename(sys.argv[0])
    if not args or args[0] not in commands:
        out = sys.stdout if args[:1] in (["-h"], ["--help"]) else sys.stderr
        print(f"usage: {script} {{{','.join(commands)}}} [options]\n", file=out)
        print(doc.strip() + "\n", file=out)
        for name, module in commands.items():
            first = (importlib.import_module(module).__doc__ or "").strip().split("\n\n")[0]
            print(f"  {name:<14} {' '.join(first.split())}", file=out)
        print(f"\n`{script} SUBCOMMAND --help` gives a subcommand's options.", file=out)
        return 0 if out is sys.stdout else 2
    sys.argv[0] = f"{sys.argv[0]} {args[0]}"  # argparse's prog: "read_bench.py chunk"
    main = importlib.import_module(commands[args[0]]).main
    return int(main(args[1:]))
