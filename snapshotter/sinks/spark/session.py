"""The one SparkSession of the process, built from ``[spark]`` (and Delta's jars for
``format = "delta"``).

Starting Spark costs about ten seconds, so the session is made once and kept: every landing
and every ``verify`` of the process uses it. Delta's jars are provisioned ahead of time by
``scripts/spark-jars`` (``snapshotter.sinks.spark.jars``), never fetched at first use.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import TYPE_CHECKING

from snapshotter.config import SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

_lock = threading.Lock()
_session: SparkSession | None = None
_with_delta = False

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
    # The JVM's first optimizing tier only: Spark's jobs here are short (compactions,
    # verify), and the second tier's compiler threads cost ~6 JVM CPU-seconds per process
    # before they pay off (issue 16: a first compaction of 400k rows 15.8 -> 9.7 s, a
    # warm one of 1.2M rows 7.3 -> 7.1 s).
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
}
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # A column added at the source reaches the current-state table through MERGE.
    "spark.databricks.delta.schema.autoMerge.enabled": "true",
}


def _delta_provisioned() -> bool:
    from snapshotter.sinks.spark.jars import MissingJarsError, delta_jars

    try:
        delta_jars()
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


def spark_session(config: SparkConfig, *, delta: bool = False) -> SparkSession:
    """The process's session, made on first use.

    With ``delta``, Delta's jars must be there. Without it, the session still loads Delta
    when its jars are provisioned: there is one session per process, and Delta cannot be
    added to a running one, so a later Delta landing or verify in the same process works."""
    global _session, _with_delta
    with _lock:
        if _session is not None:
            if delta and not _with_delta:
                raise RuntimeError(
                    "the Spark session of this process was started without Delta; Delta needs "
                    "its jars at session start"
                )
            return _session
        from pyspark.sql import SparkSession

        required = delta
        delta = delta or _delta_provisioned()
        builder = SparkSession.builder.appName(config.app_name)
        conf = dict(BASE_CONF)
        if config.master.startswith("sc://"):
            builder = builder.remote(config.master)
        else:
            builder = builder.master(config.master)
            if config.master.startswith("local"):
                conf.update(LOCAL_CONF)
                os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        if delta:
            from snapshotter.sinks.spark.jars import delta_jars

            conf.update(DELTA_CONF)
            if config.master.startswith("local"):
                # Delta's log replay defaults to 50 partitions: 50 tasks per MERGE for nothing.
                conf["spark.databricks.delta.snapshotPartitions"] = "2"
            jars = ",".join(str(p) for p in delta_jars())
            extra = config.conf.get("spark.jars")
            conf["spark.jars"] = f"{jars},{extra}" if extra else jars
        for key, value in config.conf.items():
            if key != "spark.jars" or not delta:
                conf[key] = value
        for key, value in conf.items():
            builder = builder.config(key, value)
        log.info("starting Spark (master %s)%s", config.master, _delta_note(required, delta))
        # PySpark replaces the SIGINT handler when it starts on the main thread; keep ours
        # (the engine stops at a transaction boundary on SIGINT).
        on_main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGINT) if on_main else None
        try:
            session = builder.getOrCreate()
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if not config.master.startswith("sc://"):
            session.sparkContext.setLogLevel("WARN")
        _session, _with_delta = session, delta
        return session
