"""The jars Spark needs beyond pyspark's own: Delta Lake's, Iceberg's and the JDBC drivers.

``scripts/spark-jars`` (run by ``scripts/install``) downloads them ahead of time, never at
first use, under ``$SNAPSHOTTER_JARS`` (default ``~/.cache/snapshotter/jars``)::

    delta-<delta-spark version>-spark<Spark major.minor>/   Delta's jars and jars.txt
    iceberg-<iceberg version>-spark<Spark major.minor>/     Iceberg's runtime jar and jars.txt
    jdbc/                                                  the JDBC drivers and jars.txt

``jars.txt`` names a directory's jars, one per line (``#`` lines are comments), and is written
last, so a directory without it is incomplete. This module only reads: it never downloads.
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Literal

MARKER = "jars.txt"
JdbcKind = Literal["postgres", "mysql"]
# The driver jar's file name starts with this (the artifactId, then "-<version>.jar").
_JDBC_PREFIX: dict[str, str] = {
    "postgres": "postgresql-",
    "mysql": "mariadb-java-client-",  # MariaDB's driver speaks to MySQL too
}


class MissingJarsError(RuntimeError):
    """Jars that scripts/spark-jars provisions are not there."""


def jars_dir() -> Path:
    """Where scripts/spark-jars puts the jars: ``$SNAPSHOTTER_JARS`` or the user's cache."""
    configured = os.environ.get("SNAPSHOTTER_JARS")
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "snapshotter" / "jars"


def _installed(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        raise MissingJarsError(
            f"the Python package {package} is not installed: run scripts/install"
        ) from None


def delta_dir() -> Path:
    """The directory of Delta's jars for the installed delta-spark and pyspark."""
    spark = ".".join(_installed("pyspark").split(".")[:2])
    return jars_dir() / f"delta-{_installed('delta-spark')}-spark{spark}"


def _missing(what: str, why: str) -> MissingJarsError:
    return MissingJarsError(
        f"{what}: {why}. Run scripts/spark-jars (scripts/install does) to download them, or set "
        "SNAPSHOTTER_JARS to a directory that holds them (layout: see scripts/spark-jars)"
    )


def _listed(directory: Path, what: str) -> list[Path]:
    """The jars ``directory/jars.txt`` names, each checked to be there."""
    marker = directory / MARKER
    try:
        text = marker.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise _missing(what, f"{marker} does not exist") from None
    except OSError as exc:
        raise _missing(what, f"cannot read {marker}: {exc.strerror}") from None
    names = [s for s in (line.strip() for line in text.splitlines()) if s and not s.startswith("#")]
    if not names:
        raise _missing(what, f"{marker} names no jars")
    jars = [directory / name for name in names]
    absent = [jar.name for jar in jars if not jar.is_file()]
    if absent:
        raise _missing(what, f"{', '.join(absent)} listed in {marker} but not there")
    return jars


def delta_jars() -> list[Path]:
    """Delta Lake's jars (for ``spark.jars``) for the installed delta-spark and pyspark."""
    directory = delta_dir()
    return _listed(directory, f"Delta Lake's jars for {directory.name}")


def iceberg_jars() -> list[Path]:
    """Apache Iceberg's Spark runtime (for ``spark.jars``) for the installed pyspark: the one
    ``iceberg-*-spark<major.minor>`` directory scripts/spark-jars filled (its version is pinned
    there per Spark line)."""
    spark = ".".join(_installed("pyspark").split(".")[:2])
    found = sorted(jars_dir().glob(f"iceberg-*-spark{spark}"), key=_iceberg_version)
    if not found:
        raise _missing(
            f"Apache Iceberg's runtime for Spark {spark}",
            f"no {jars_dir() / f'iceberg-*-spark{spark}'} directory",
        )
    directory = found[-1]
    return _listed(directory, f"Apache Iceberg's runtime for {directory.name}")


def _iceberg_version(directory: Path) -> tuple[int, ...]:
    """``iceberg-1.12.0-spark4.1`` -> (1, 12, 0): the newest of several is taken."""
    version = directory.name.split("-")[1]
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def jdbc_jar(kind: JdbcKind) -> Path:
    """The JDBC driver jar for ``kind``: PostgreSQL's, or MariaDB's for MySQL and MariaDB.

    With MariaDB's driver give Spark a ``jdbc:mysql://host:port/db?permitMysqlScheme`` URL:
    Spark picks its MySQL dialect by the ``jdbc:mysql:`` prefix, and for ``jdbc:mariadb:`` it
    quotes column names in double quotes, which MySQL and MariaDB read as strings.
    """
    try:
        prefix = _JDBC_PREFIX[kind]
    except KeyError:
        raise ValueError(f"no JDBC driver for {kind!r}: one of {', '.join(_JDBC_PREFIX)}") from None
    what = f"the {kind} JDBC driver"
    found = [
        jar
        for jar in _listed(jars_dir() / "jdbc", what)
        if jar.name.startswith(prefix) and jar.name.endswith(".jar")
    ]
    if not found:
        raise _missing(what, f"no {prefix}*.jar in {jars_dir() / 'jdbc' / MARKER}")
    return found[0]
