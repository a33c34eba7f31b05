"""The one SparkSession of the process, built from ``[spark]`` (and Delta's or Iceberg's jars
for ``format = "delta"`` / ``"iceberg"``).

Starting Spark costs about ten seconds, so the session is made once and kept: every landing
and every ``verify`` of the process uses it. Delta's jars are provisioned ahead of time by
``scripts/spark-jars`` (``snapshotter.sinks.spark.jars``), never fetched at first use.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snapshotter.config import SparkConfig
from snapshotter.sinks.spark.start import bound_retries, bounded_start, probe, shown

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_lock = threading.Lock()
_session: SparkSession | None = None
_with_delta = False
_with_iceberg = False
_where = ""  # _where_of the session's config

# Defaults the user's [spark] conf may override.
BASE_CONF = {
    # Event times land in UTC and are shown in UTC, whatever the machine's zone.
    "spark.sql.session.timeZone": "UTC",
    # Parquet timestamps as INT64 microseconds (not the legacy INT96).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.ui.showConsoleProgress": "false",
}
LOCAL_CONF = {
    # Batches are small next to what Spark's 200 shuffle partitions are sized for.
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    # Local mode talks only to itself: no guessing which interface the host name maps to.
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
# The JVM's first optimizing tier only, in local mode: Spark's jobs here are short
# (compactions, verify), and the second tier's compiler threads cost ~6 JVM CPU-seconds per
# process before they pay off (measured: a first compaction of 400k rows 15.8 -> 9.7 s, a
# warm one of 1.2M rows 7.3 -> 7.1 s).
LOCAL_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1",)
# The driver's log4j configuration (WARN, and at ERROR the lines every start prints): off
# with debug logging (-v), which leaves Spark its own defaults.
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
CLUSTER_HERE_CONF = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A column added at the source reaches the current-state table through MERGE.
    "spark.databricks.delta.schema.autoMerge.enabled": "true",
}


ICEBERG_EXTENSION = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"


def _delta_provisioned() -> bool:
    from snapshotter.sinks.spark.jars import MissingJarsError, delta_jars

    try:
        delta_jars()
    except MissingJarsError:
        return False
    return True


def _iceberg_provisioned() -> bool:
    from snapshotter.sinks.spark.jars import MissingJarsError, iceberg_jars

    try:
        iceberg_jars()
    except MissingJarsError:
        return False
    return True


def _delta_note(required: bool, loaded: bool) -> str:
    """What the start message says of Delta: needed (format = "delta"), or only loaded
    because its jars are there (a Parquet landing does not use it)."""
    if required:
        return " with Delta Lake"
    if loaded:
        return "; Delta Lake's jars are provisioned, so they are loaded too"
    return ""


def spark_session(
    config: SparkConfig, *, delta: bool = False, iceberg: bool = False
) -> SparkSession:
    """The process's session, made on first use.

    With ``delta`` (``iceberg``), Delta's (Iceberg's) jars must be there. Without it, the
    session still loads them when they are provisioned: there is one session per process,
    and jars and SQL extensions cannot be added to a running one, so a later Delta or
    Iceberg landing or verify in the same process works. (Iceberg's catalogs are set at run
    time, by the lander: ``formats.iceberg``.)"""
    global _session, _with_delta, _with_iceberg, _where
    where = _where_of(config)
    with _lock:
        if _session is not None and _where != where:
            # Another Spark than the one asked for (a process lands to one Spark; tests and
            # benches move between local mode, a cluster and Spark Connect): a JVM holds one
            # SparkContext, so the old session goes first.
            log.info("stopping the Spark session on %s for one on %s", _where, where)
            _session.stop()
            _session = None
            _forget_connect()
        if _session is not None:
            if delta and not _with_delta:
                raise RuntimeError(
                    "the Spark session of this process was started without Delta; Delta needs "
                    "its jars at session start"
                )
            if iceberg and not _with_iceberg:
                raise RuntimeError(
                    "the Spark session of this process was started without Iceberg; Iceberg "
                    "needs its jars at session start"
                )
            return _session
        from pyspark.sql import SparkSession

        required = delta
        delta = delta or _delta_provisioned()
        if iceberg:
            from snapshotter.sinks.spark.jars import iceberg_jars

            iceberg_jars()  # missing jars fail here, with the fix
        iceberg = iceberg or _iceberg_provisioned()
        if config.remote is not None:
            return _connect(config)
        builder = SparkSession.builder.appName(config.app_name).master(config.master)
        conf = dict(BASE_CONF)
        if config.master.startswith("local"):
            conf.update(LOCAL_CONF)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        elif not config.runs_elsewhere:
            # A cluster on this machine (scripts/services up spark): its executors reach the
            # driver on the loopback interface, whatever the host name maps to.
            conf.update(CLUSTER_HERE_CONF)
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        java_options = driver_java_options(
            local=config.master.startswith("local"), debug=log.isEnabledFor(logging.DEBUG)
        )
        if java_options:
            conf["spark.driver.extraJavaOptions"] = java_options
        if delta:
            from snapshotter.sinks.spark.jars import delta_jars

            conf.update(DELTA_CONF)
            if config.master.startswith("local"):
                # Delta's log replay defaults to 50 partitions: 50 tasks per MERGE for nothing.
                conf["spark.databricks.delta.snapshotPartitions"] = "2"
            conf["spark.jars"] = ",".join(str(p) for p in delta_jars())
        if iceberg:
            from snapshotter.sinks.spark.jars import iceberg_jars

            extensions = [conf.get("spark.sql.extensions"), ICEBERG_EXTENSION]
            conf["spark.sql.extensions"] = ",".join(e for e in extensions if e)
            jars = [conf.get("spark.jars"), *(str(p) for p in iceberg_jars())]
            conf["spark.jars"] = ",".join(j for j in jars if j)
        for key, value in config.conf.items():
            if key in ("spark.jars", "spark.sql.extensions") and key in conf:
                conf[key] = f"{conf[key]},{value}"  # the user's come after ours
            else:
                conf[key] = value
        for key, value in conf.items():
            builder = builder.config(key, value)
        log.info("starting Spark (master %s)%s", config.master, _delta_note(required, delta))
        local = config.master.startswith("local")
        if not local:
            probe(config)  # a wrong address fails here at once, not after Spark's retries
        # On a thread of its own, within [spark] start_timeout_s (start.py). PySpark sets
        # its own SIGINT handler only when it starts on the main thread, so ours stays.
        session: SparkSession = bounded_start(
            config, builder.getOrCreate, first_job=not local, configure=_quiet
        )
        _session, _with_delta, _with_iceberg, _where = session, delta, iceberg, where
        return session


def driver_java_options(*, local: bool, debug: bool) -> str:
    """The driver JVM's options (this process starts it, in local and client mode alike)."""
    options = list(LOCAL_JAVA_OPTIONS) if local else []
    if not debug:
        options.append(f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}")
    return " ".join(options)


def _quiet(session: Any) -> None:
    session.sparkContext.setLogLevel("WARN")


def _forget_connect() -> None:
    """PySpark marks a process that made a Spark Connect session as Connect-only (an
    environment variable, and the builder's options, which outlive the session): undone
    when that session is gone, so a classic session can follow."""
    from pyspark.sql import SparkSession

    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
    SparkSession.builder._options.pop("spark.remote", None)


def _where_of(config: SparkConfig) -> str:
    """Which Spark a session of ``config`` runs on: any local mode is one."""
    return "local" if config.remote is None and config.master.startswith("local") else config.url


def _connect(config: SparkConfig) -> SparkSession:
    """A Spark Connect session (``remote``). The server was started with its own jars and
    static settings: only session settings (``spark.sql.*``) can be given here, and Delta is
    there if the server loaded it."""
    global _session, _with_delta, _with_iceberg, _where
    from pyspark.sql import SparkSession

    remote = config.remote
    assert remote is not None
    conf = {k: v for k, v in BASE_CONF.items() if k.startswith("spark.sql.")}
    static = sorted(k for k in config.conf if not k.startswith("spark.sql."))
    if static:
        raise RuntimeError(
            f"[spark] conf {', '.join(static)}: a Spark Connect session takes only session "
            f"settings (spark.sql.*); set the others where the server at {shown(config)} starts"
        )
    conf.update(config.conf)
    log.info("connecting to Spark Connect at %s", shown(config))
    probe(config)  # the client would retry an unreachable server for ten minutes

    def configure(session: Any) -> None:
        bound_retries(session, config.start_timeout_s)
        for key, value in conf.items():
            session.conf.set(key, value)

    try:
        session: SparkSession = bounded_start(
            config,
            lambda: SparkSession.builder.remote(remote).getOrCreate(),
            first_job=True,
            configure=configure,
        )
    except ImportError as exc:
        raise RuntimeError(
            f"Spark Connect needs its client libraries ({exc}); install snapshotter[connect]"
        ) from None
    # Whether Delta and Iceberg work is the server's to say.
    _session, _with_delta, _with_iceberg, _where = session, True, True, _where_of(config)
    return session
