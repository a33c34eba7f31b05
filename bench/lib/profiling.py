"""cProfile over every thread of a run, and its report with short file names."""

from __future__ import annotations

import contextlib
import cProfile
import io
import os
import pstats
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from bench.lib.servers import REPO


@contextlib.contextmanager
def profile_threads() -> Iterator[dict[str, cProfile.Profile]]:
    """cProfile in this thread and in every thread started inside the block (Python 3.11
    has no ``threading.setprofile_all_threads``: each new thread enables its own profiler
    from its first profile event)."""
    profiles: dict[str, cProfile.Profile] = {}

    def bootstrap(frame: FrameType, event: str, arg: object) -> None:
        profiler = cProfile.Profile()
        profiles[threading.current_thread().name] = profiler
        sys.setprofile(None)
        profiler.enable()

    main = cProfile.Profile()
    profiles[threading.current_thread().name] = main
    threading.setprofile(bootstrap)
    main.enable()
    try:
        yield profiles
    finally:
        main.disable()
        threading.setprofile(None)


def shorten_paths(text: str) -> str:
    """pstats prints absolute file names: make them relative to the repo or site-packages."""
    text = text.replace(str(REPO) + os.sep, "")
    for entry in sorted(set(sys.path), key=len, reverse=True):
        if entry and entry.rstrip(os.sep) != str(REPO) and os.path.isdir(entry):
            text = text.replace(entry.rstrip(os.sep) + os.sep, "")
    return text


def top_functions(profiler: cProfile.Profile, top: int, sort: str = "cumulative") -> list[str]:
    """pstats' table of the ``top`` functions by ``sort``, from its column titles on, with
    short file names."""
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats(sort).print_stats(top)
    body = shorten_paths(text.getvalue()).strip().splitlines()
    # Drop pstats' header lines down to the column titles.
    start = next((i for i, line in enumerate(body) if "ncalls" in line), 0)
    return body[start:]


def per_thread(profiles: dict[str, cProfile.Profile], top: int) -> list[str]:
    """Per profiled thread that ran anything: its name, seconds profiled and the ``top``
    functions by cumulative time, in a markdown code block."""
    out: list[str] = []
    for name, profiler in profiles.items():
        stats = pstats.Stats(profiler)
        if not stats.stats:  # type: ignore[attr-defined]
            continue
        total = stats.total_tt  # type: ignore[attr-defined]
        body = top_functions(profiler, top)
        out += [f"\nthread {name} ({total:.2f} s profiled):", "```", *body, "```"]
    return out
