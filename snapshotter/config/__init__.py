"""The configuration file (TOML), validated by pydantic into typed settings.

Strings may name environment variables as ``${NAME}`` (e.g. ``url = "${SNAPSHOTTER_PG_URL}"``),
so credentials need not live in the file; an unset variable is an error, not an empty string.
Any key can also be set from the environment as ``SNAPSHOTTER_<SECTION>_<KEY>`` (e.g.
``SNAPSHOTTER_SOURCE_URL``, ``SNAPSHOTTER_SOURCE_CHUNK_SIZE=2048``,
``SNAPSHOTTER_SOURCE_TABLES='["public.a", "public.b"]'``): the value is read as a TOML value
when it is one (numbers, booleans, arrays, quoted strings) and as a plain string otherwise.
Relative paths are relative to the directory of the config file.

Which ``SNAPSHOTTER_*`` variables are configuration (a typo must never be ignored silently):

* ``SNAPSHOTTER_SOURCE_*``, ``SNAPSHOTTER_SINK_*``, ``SNAPSHOTTER_STATE_*``,
  ``SNAPSHOTTER_SPARK_*``, ``SNAPSHOTTER_SNAPSHOT_*``, ``SNAPSHOTTER_METRICS_*`` and
  ``SNAPSHOTTER_NOTIFICATIONS_*`` set the key the rest names; a key
  the section does not have is an error ("did you mean ...").
* A variable whose first word is a misspelt section name (``SNAPSHOTTER_SORUCE_URL``) is an
  error too.
* A variable the file references as ``${NAME}`` is only that reference, whatever its name.
* Every other ``SNAPSHOTTER_*`` variable is not configuration and is ignored here: the
  project's scripts and tests use such names (``SNAPSHOTTER_PG_URL``, ``SNAPSHOTTER_FAULTS``,
  ``SNAPSHOTTER_SERVICES_DIR``...), and a config may reference any variable as ``${NAME}``.

Unknown keys are refused everywhere, with the nearest known key as a suggestion: in the file's
sections, and inside ``[sink] kafka = {...}`` (checked against the settings kafka-python's
producer, admin client and consumer accept, or with ``client = "confluent"``, or ``"auto"``
and librdkafka's dotted names, by librdkafka).
"""

from __future__ import annotations

from snapshotter.config.common import (
    DEFAULT_JSONL,
    ENV_PREFIX,
    NOT_FINITE,
    ConfigError,
    is_loopback,
    is_uri,
)
from snapshotter.config.kafka import (
    KAFKA_OBJECT_SETTINGS,
    KAFKA_RESERVED,
    kafka_client_settings,
    kafka_setting_problem,
)
from snapshotter.config.loading import load_config, parse_config
from snapshotter.config.model import Config
from snapshotter.config.sections import (
    MetricsConfig,
    NotificationsConfig,
    SignalsConfig,
    SnapshotConfig,
    SparkConfig,
    StateConfig,
)
from snapshotter.config.sink import SinkConfig
from snapshotter.config.source import (
    SOURCE_KINDS,
    SPANNER_PATH,
    MySqlSource,
    PostgresSource,
    SourceConfig,
    SpannerSource,
)

__all__ = [
    "DEFAULT_JSONL",
    "ENV_PREFIX",
    "KAFKA_OBJECT_SETTINGS",
    "KAFKA_RESERVED",
    "NOT_FINITE",
    "SOURCE_KINDS",
    "SPANNER_PATH",
    "Config",
    "ConfigError",
    "MetricsConfig",
    "MySqlSource",
    "NotificationsConfig",
    "PostgresSource",
    "SignalsConfig",
    "SinkConfig",
    "SnapshotConfig",
    "SourceConfig",
    "SpannerSource",
    "SparkConfig",
    "StateConfig",
    "is_loopback",
    "is_uri",
    "kafka_client_settings",
    "kafka_setting_problem",
    "load_config",
    "parse_config",
]
