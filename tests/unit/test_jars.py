"""snapshotter.sinks.spark.jars: finds the jars scripts/spark-jars provisioned, or says what
to do."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from snapshotter.sinks.spark import jars
from snapshotter.sinks.spark.jars import (
    MissingJarsError,
    delta_jars,
    iceberg_jars,
    jars_dir,
    jdbc_jar,
)

VERSIONS = {"delta-spark": "4.4.1", "pyspark": "4.2.0"}
DELTA = ["delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"]


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SNAPSHOTTER_JARS", str(tmp_path))

    def version(package: str) -> str:
        if package not in VERSIONS:
            raise metadata.PackageNotFoundError(package)
        return VERSIONS[package]

    monkeypatch.setattr(jars.metadata, "version", version)
    return tmp_path


def provision(directory: Path, names: list[str], header: str = "# want: something") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_bytes(b"PK")
    (directory / "jars.txt").write_text("\n".join([header, *names, ""]), encoding="utf-8")


def test_jars_dir_from_the_environment_or_the_user_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SNAPSHOTTER_JARS", str(tmp_path / "x"))
    assert jars_dir() == tmp_path / "x"
    monkeypatch.delenv("SNAPSHOTTER_JARS")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert jars_dir() == tmp_path / ".cache" / "snapshotter" / "jars"
    monkeypatch.setenv("SNAPSHOTTER_JARS", "")  # empty: as if unset
    assert jars_dir() == tmp_path / ".cache" / "snapshotter" / "jars"


def test_delta_jars_for_the_installed_versions(root):
    provision(root / "delta-4.4.1-spark4.2", DELTA)
    provision(root / "delta-4.4.0-spark4.2", ["other-1.0.jar"])  # another version: not used
    assert delta_jars() == [root / "delta-4.4.1-spark4.2" / name for name in DELTA]


def test_delta_jars_follow_pyspark_major_minor(root):
    versions_41 = {"delta-spark": "4.4.1", "pyspark": "4.1.2"}
    provision(root / "delta-4.4.1-spark4.1", DELTA[:1])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jars.metadata, "version", versions_41.__getitem__)
        assert delta_jars() == [root / "delta-4.4.1-spark4.1" / DELTA[0]]


def test_no_delta_jars_says_what_to_do(root):
    with pytest.raises(MissingJarsError, match=r"delta-4\.4\.1-spark4\.2") as info:
        delta_jars()
    assert isinstance(info.value, RuntimeError)
    message = str(info.value)
    assert "scripts/spark-jars" in message and "SNAPSHOTTER_JARS" in message


def test_jars_without_the_marker_are_incomplete(root):
    directory = root / "delta-4.4.1-spark4.2"
    directory.mkdir()
    (directory / DELTA[0]).write_bytes(b"PK")  # a download that stopped before jars.txt
    with pytest.raises(MissingJarsError, match=r"jars\.txt does not exist"):
        delta_jars()


def test_a_listed_jar_that_is_gone(root):
    provision(root / "delta-4.4.1-spark4.2", DELTA)
    (root / "delta-4.4.1-spark4.2" / DELTA[1]).unlink()
    with pytest.raises(
        MissingJarsError, match=r"delta-storage-4\.4\.0\.jar listed in .* not there"
    ):
        delta_jars()


def test_a_marker_naming_no_jars(root):
    provision(root / "delta-4.4.1-spark4.2", [])
    with pytest.raises(MissingJarsError, match="names no jars"):
        delta_jars()


def test_delta_spark_not_installed(root, monkeypatch):
    monkeypatch.delitem(VERSIONS, "delta-spark")
    with pytest.raises(MissingJarsError, match=r"delta-spark is not installed.*scripts/install"):
        delta_jars()


def test_jdbc_jar_by_kind(root):
    provision(root / "jdbc", ["mariadb-java-client-3.5.11.jar", "postgresql-42.7.14.jar"])
    assert jdbc_jar("postgres") == root / "jdbc" / "postgresql-42.7.14.jar"
    assert jdbc_jar("mysql") == root / "jdbc" / "mariadb-java-client-3.5.11.jar"


def test_jdbc_jar_missing(root):
    with pytest.raises(MissingJarsError, match=r"postgres JDBC driver.*scripts/spark-jars"):
        jdbc_jar("postgres")
    provision(root / "jdbc", ["postgresql-42.7.14.jar"])
    with pytest.raises(MissingJarsError, match=r"no mariadb-java-client-\*\.jar"):
        jdbc_jar("mysql")


def test_jdbc_jar_unknown_kind(root):
    with pytest.raises(ValueError, match="one of postgres, mysql"):
        jdbc_jar("oracle")  # type: ignore[arg-type]


def test_provisioned_for_real():
    """With the jars scripts/install provisioned, the real lookup finds them (no Spark)."""
    try:
        found = delta_jars()
    except MissingJarsError as exc:
        pytest.skip(str(exc))
    assert any(p.name.startswith("delta-spark_") for p in found)
    assert all(p.is_file() for p in found)


ICEBERG = ["iceberg-spark-runtime-4.2_2.13-1.12.0.jar"]


def test_iceberg_jars_for_the_installed_pyspark_the_newest_version(root):
    provision(root / "iceberg-1.9.2-spark4.2", ["old.jar"])
    provision(root / "iceberg-1.12.0-spark4.2", ICEBERG)  # 1.12 > 1.9, not as text
    provision(root / "iceberg-1.13.0-spark4.1", ["other-line.jar"])  # another Spark line
    assert iceberg_jars() == [root / "iceberg-1.12.0-spark4.2" / ICEBERG[0]]


def test_missing_iceberg_jars_say_what_to_run(root):
    with pytest.raises(MissingJarsError, match=r"Iceberg.*Spark 4\.2.*scripts/spark-jars"):
        iceberg_jars()
    provision(root / "iceberg-1.12.0-spark4.2", ICEBERG)
    (root / "iceberg-1.12.0-spark4.2" / ICEBERG[0]).unlink()
    with pytest.raises(MissingJarsError, match=r"listed in .* but not there"):
        iceberg_jars()
