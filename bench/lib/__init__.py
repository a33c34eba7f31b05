"""The benches' one library (bench/README.md): every entry script in bench/ builds on it.

- ``servers``: the servers' URLs (command line, environment, ``scripts/services``), versions,
  the machine's description
- ``tables``: the end-to-end table on PostgreSQL and MariaDB (create, fill, drop), the plain
  read A (the pyarrow baseline), the ticker; ``mysql``: MySQL connections, a bench database
  and the older benches' ``items`` table
- ``runs``: an engine run in a child process (config, init, signal, timing, checks) and the
  timed sink inside it (``child``); ``inprocess``: the engine in this process (a thread)
- ``stats``: medians, percentiles, results and their ratios, /proc readings; ``configs``:
  config text, ``--set``; ``profiling``: cProfile over every thread
- ``report``: the end-to-end bench's markdown tables; ``kafka``: topics and the broker
- ``cli``: the entry scripts' subcommands; ``reads``, ``landings``, ``logs``: the measurements
  behind the subcommands of ``read_bench.py``, ``landing_bench.py`` and ``log_bench.py``
"""
