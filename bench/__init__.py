"""The benchmarks (bench/README.md): entry scripts in this directory, run from the repo root as
``python bench/NAME.py`` (or ``python -m bench.NAME``), and their one library, ``bench.lib``.

The bootstrap, the same two lines at the top of every entry script: run as a file, the script
puts the repo root in place of its own directory at the head of ``sys.path``, so that
``bench.lib``, ``snapshotter`` and ``signals`` import from this checkout; nothing else in
bench/ touches ``sys.path``.
"""
