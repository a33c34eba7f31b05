"""The ``snapshotter`` command. Commands parse arguments and print; the work is elsewhere.

``parser`` builds the arguments and runs a command (``main``, the console entry point);
the commands live by group: ``setup`` (init, reset-stream, teardown), ``run`` (run,
resume), ``signals`` (signal, signals), ``reports`` (status, verify); ``common`` holds what
they share (the consoles, ``CliError``, the ``Session`` that loads the config)."""

from snapshotter.app.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
