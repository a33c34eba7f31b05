"""``python -m snapshotter.app.cli``: the same as the ``snapshotter`` command."""

import sys

from snapshotter.app.cli.parser import main

sys.exit(main())
