"""The end-to-end benchmark's parts (``bench/e2e_bench.py`` runs them): sources and their
plain reads, the engine in a child process of its own, the timed sink inside that child,
and the report."""
