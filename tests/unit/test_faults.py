"""Fault points: the spec is parsed strictly, and a point kills the process (SIGKILL), or
raises, exactly at its N-th reach, after setting the moment up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from snapshotter.common.faults import POINTS, FaultSpecError, parse


def test_a_spec_names_points_and_counts() -> None:
    assert parse("window.close@4, state.write@1") == {
        "window.close": (4, False),
        "state.write": (1, False),
    }
    assert parse("spark.lander@2:raise") == {"spark.lander": (2, True)}
    assert parse("") == {}


@pytest.mark.parametrize(
    "spec",
    [
        "window.close",
        "window.close@",
        "window.close@0",
        "window.close@x",
        "nope@1",
        "window.close@1:",
        "window.close@1:kill",
    ],
)
def test_a_bad_spec_is_refused_with_the_points_known(spec: str) -> None:
    with pytest.raises(FaultSpecError) as error:
        parse(spec)
    assert "SNAPSHOTTER_FAULTS" in str(error.value)


def _run(spec: str, body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(body)],
        env={**os.environ, "SNAPSHOTTER_FAULTS": spec},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_point_kills_the_process_at_its_nth_reach_after_setting_the_moment_up() -> None:
    done = _run(
        "sink.flush@3",
        """
        from snapshotter.common.faults import failpoint
        for i in range(1, 6):
            print("reach", i, flush=True)
            failpoint("sink.flush", before=lambda: print("half written", flush=True))
            failpoint("state.write")
        """,
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split("\n") == [
        "reach 1",
        "reach 2",
        "reach 3",
        "half written",
        "",
    ]
    assert "fault sink.flush@3: killing the process" in done.stderr


def test_a_raising_point_raises_at_its_nth_reach_and_the_process_goes_on() -> None:
    done = _run(
        "spark.lander@2:raise",
        """
        from snapshotter.common.faults import InjectedFault, failpoint
        for i in range(1, 4):
            try:
                failpoint("spark.lander")
                print("passed", i, flush=True)
            except InjectedFault as exc:
                print("raised", i, exc, flush=True)
        """,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "passed 1",
        "raised 2 injected fault at spark.lander (reached 2 times)",
        "passed 3",
    ]
    assert "fault spark.lander@2: raising" in done.stderr


def test_a_run_that_ends_first_says_how_often_each_point_was_reached() -> None:
    done = _run(
        "spark.land@9",
        """
        from snapshotter.common.faults import failpoint
        for _ in range(2):
            failpoint("window.close")
        failpoint("spark.land")
        """,
    )
    assert done.returncode == 0
    assert "fault points reached: spark.land 1, window.close 2" in done.stderr


def test_points_cost_nothing_when_unset() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SNAPSHOTTER_FAULTS"}
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "from snapshotter.common.faults import failpoint, POINTS\n"
            "for p in POINTS: failpoint(p, before=lambda: 1 / 0)",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0 and not done.stderr
    assert len(POINTS) == 16


def test_every_point_is_in_the_fault_matrix_and_the_module_docstring() -> None:
    """docs/fault-matrix.md lists where each point kills the engine; faults.py says too."""
    from pathlib import Path

    import snapshotter.common.faults as faults

    doc = (Path(__file__).resolve().parents[2] / "docs" / "fault-matrix.md").read_text("utf-8")
    assert [p for p in POINTS if f"| `{p}` |" not in doc] == []
    assert [p for p in POINTS if f"``{p}``" not in (faults.__doc__ or "")] == []
