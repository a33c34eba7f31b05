"""The servers the benches use and the machine they run on: URLs from the command line, the
environment or ``scripts/services``, package versions, the machine's description."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pyarrow as pa

REPO = Path(__file__).resolve().parents[2]


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def service_url(service: str, env_var: str, given: str | None) -> str:
    """``given``, else ``$env_var``, else what ``scripts/services up SERVICE`` prints last
    on stdout (it starts the server when needed, and is idempotent)."""
    if given:
        return given
    if os.environ.get(env_var):
        return os.environ[env_var]
    proc = subprocess.run(
        [str(REPO / "scripts" / "services"), "up", service],
        check=False,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        sys.exit(f"scripts/services up {service} failed ({proc.returncode}):\n{proc.stderr}")
    return lines[-1].strip()


def machine_lines() -> list[str]:
    return [
        f"- machine: {platform.platform()}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.2f} (1 min) at the start",
        f"- Python {platform.python_version()}, pyarrow {pa.__version__}, pyspark "
        f"{package_version('pyspark')}, kafka-python {package_version('kafka-python')}, "
        f"confluent-kafka {package_version('confluent-kafka')}",
    ]


def pg_url(given: str | None) -> str:
    """``--url``, else ``$SNAPSHOTTER_PG_URL``, else ``scripts/services up postgres``."""
    return service_url("postgres", "SNAPSHOTTER_PG_URL", given)


def mysql_url(given: str | None) -> str:
    """``--mysql-url``, else ``$SNAPSHOTTER_MYSQL_URL``, else ``scripts/services up mysql``."""
    return service_url("mysql", "SNAPSHOTTER_MYSQL_URL", given)


def kafka_bootstrap(given: str | None) -> str:
    """``--bootstrap``, else ``$SNAPSHOTTER_KAFKA_BOOTSTRAP``, else ``scripts/services up
    kafka``."""
    return service_url("kafka", "SNAPSHOTTER_KAFKA_BOOTSTRAP", given)
