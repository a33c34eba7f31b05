"""Unknown keys are refused everywhere: in the file (with the nearest key), inside
``[sink] kafka`` (checked against kafka-python's clients), and in ``SNAPSHOTTER_*``
variables (the rule in snapshotter/config's docstring); a source URL that cannot be used
is said at load, never with its password."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.config import (
    KAFKA_OBJECT_SETTINGS,
    KAFKA_RESERVED,
    Config,
    ConfigError,
    kafka_client_settings,
    parse_config,
)
from snapshotter.config.model import SECTION_MODELS

SOURCE = """
[source]
kind = "postgres"
url = "postgresql://u:Secret-pw1@h:5432/shop"
"""
KAFKA = SOURCE + '[sink]\nkind = "kafka"\nbootstrap_servers = "k:9092"\n'


def parse(text: str, environ: dict[str, str] | None = None) -> Config:
    return parse_config(text, "my.toml", base_dir=Path("/etc/snap"), environ=environ or {})


def refused(text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, environ)
    message = str(info.value)
    assert message.startswith("my.toml: ")
    assert "Secret-pw1" not in message
    return message


# --- [sink] kafka ---------------------------------------------------------------------------


def test_a_misspelt_client_setting_is_refused_with_the_nearest() -> None:
    message = refused(KAFKA + 'kafka = {security_protocl = "SASL_SSL"}\n')
    assert "sink.kafka: security_protocl: not a kafka-python client setting" in message
    assert "(did you mean security_protocol?)" in message


def test_settings_of_any_client_are_accepted() -> None:
    # producer (linger_ms), consumer only (fetch_max_bytes), all (security_protocol)
    text = KAFKA + 'kafka = {linger_ms = 5, fetch_max_bytes = 1000, security_protocol = "SSL"}\n'
    assert parse(text).sink.kafka["fetch_max_bytes"] == 1000


def test_object_settings_are_refused() -> None:
    assert "takes a Python object" in refused(KAFKA + 'kafka = {selector = "x"}\n')


def test_the_known_settings_are_kafka_pythons() -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

    known = kafka_client_settings()
    for client in (KafkaProducer, KafkaAdminClient, KafkaConsumer):
        assert set(client.DEFAULT_CONFIG) <= known
    assert known >= KAFKA_OBJECT_SETTINGS


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(sorted(kafka_client_settings() - KAFKA_RESERVED - KAFKA_OBJECT_SETTINGS)))
def test_every_settable_client_setting_is_accepted(name: str) -> None:
    assert name in parse(KAFKA + f"kafka = {{{name} = 1}}\n").sink.kafka


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[a-z][a-z_]{2,30}", fullmatch=True))
def test_an_unknown_name_is_refused(name: str) -> None:
    if name in kafka_client_settings():
        return
    message = refused(KAFKA + f"kafka = {{{name} = 1}}\n")
    assert f"{name}: not a kafka-python client setting" in message or "set by the sink" in message


def test_a_sink_built_in_code_refuses_them_too() -> None:
    from snapshotter.sinks.kafka.sink import KafkaSink, KafkaSinkError

    with pytest.raises(KafkaSinkError, match="security_protocl: not a kafka-python"):
        KafkaSink(
            bootstrap_servers="k:9092",
            topic_prefix="p",
            key_columns=lambda table: ("id",),
            settings={"security_protocl": "SSL"},
        )


# --- unknown keys in the file ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (SOURCE + "chunk_sise = 10\n", "source.chunk_sise: unknown key (did you mean chunk_size?)"),
        (SOURCE + "[stat]\ndir = 'x'\n", "stat: unknown key (did you mean state?)"),
        (SOURCE + "[sink]\npth = 'x'\n", "sink.pth: unknown key (did you mean path?)"),
        (SOURCE + "zzz = 1\n", "source.zzz: unknown key"),
    ],
)
def test_unknown_keys_in_the_file(text: str, expected: str) -> None:
    assert expected in refused(text)


# --- SNAPSHOTTER_* variables ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("var", "expected"),
    [
        ("SNAPSHOTTER_SOURCE_CHUNKSIZE", "did you mean SNAPSHOTTER_SOURCE_CHUNK_SIZE?"),
        ("SNAPSHOTTER_SINK_BOOTSTRAP", "did you mean SNAPSHOTTER_SINK_BOOTSTRAP_SERVERS?"),
        ("SNAPSHOTTER_STATE_DIRECTORY", "[state] has no key 'directory'"),
        ("SNAPSHOTTER_SORUCE_URL", "did you mean SNAPSHOTTER_SOURCE_URL?"),
        ("SNAPSHOTTER_SPRAK_MASTER", "did you mean SNAPSHOTTER_SPARK_MASTER?"),
    ],
)
def test_a_misspelt_variable_is_refused(var: str, expected: str) -> None:
    message = refused(SOURCE, {var: "1"})
    assert f"environment variable {var}" in message and expected in message


@pytest.mark.parametrize(
    "var",
    [
        "SNAPSHOTTER_PG_URL",
        "SNAPSHOTTER_MYSQL_URL",
        "SNAPSHOTTER_KAFKA_BOOTSTRAP",
        "SNAPSHOTTER_FAULTS",
        "SNAPSHOTTER_FAULT_SEEDS",
        "SNAPSHOTTER_SERVICES_DIR",
        "SNAPSHOTTER_JARS",
        "SNAPSHOTTER_VENV",
        "SNAPSHOTTER_UNRELATED",
    ],
)
def test_the_projects_own_variables_are_not_configuration(var: str) -> None:
    assert parse(SOURCE, {var: "anything"}).source.chunk_size == 32768


def test_a_referenced_variable_is_only_a_reference() -> None:
    text = SOURCE.replace("u:Secret-pw1@", "u:${SNAPSHOTTER_SOURCE_PASSWORD}@")
    config = parse(text, {"SNAPSHOTTER_SOURCE_PASSWORD": "pw"})
    assert config.source.url == "postgresql://u:pw@h:5432/shop"


def test_a_variable_sets_nested_client_settings_checked_too() -> None:
    message = refused(KAFKA, {"SNAPSHOTTER_SINK_KAFKA": '{sasl_mechansim = "PLAIN"}'})
    assert "did you mean sasl_mechanism?" in message


# --- source.url -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "url", "expected"),
    [
        ("mysql", "mysql://u:Secret-pw1@h:3306", "names no database"),
        ("mysql", "mysql://u:Secret-pw1@h:3306/", "names no database"),
        ("postgres", "postgresql://u:Secret-pw1@h:port/db", "its port is not a number"),
        ("postgres", "not a url Secret-pw1", "cannot be parsed (not a URL"),
    ],
)
def test_an_unusable_url_is_said_without_its_password(kind: str, url: str, expected: str) -> None:
    message = refused(f'[source]\nkind = "{kind}"\nurl = "{url}"\n')
    assert "source.url: " in message and expected in message
    assert "USER:PASSWORD@HOST:PORT/DATABASE" in message


def test_a_url_from_the_environment_is_checked_too() -> None:
    message = refused(
        '[source]\nkind = "mysql"\nurl = "mysql://u@h/db"\n',
        {"SNAPSHOTTER_SOURCE_URL": "mysql://u:Secret-pw1@h"},
    )
    assert "names no database" in message


# --- [spark]: where Spark runs, and staging its executors can read -------------------------

SPARK = SOURCE + '[sink]\nkind = "spark"\npath = "lake"\n'


def test_staging_defaults_next_to_a_local_landing_path() -> None:
    config = parse(SPARK)
    assert config.staging_dir == Path("/etc/snap/lake/_staging")
    on_s3 = parse(SOURCE + '[sink]\nkind = "spark"\npath = "s3a://b/lake"\n')
    assert on_s3.staging_dir == Path("/etc/snap/snapshotter-state/staging")
    given = parse(SPARK + 'staging_path = "/shared/staging"\n')
    assert given.staging_dir == Path("/shared/staging")


@pytest.mark.parametrize(
    "where",
    [
        'master = "spark://127.0.0.1:7077"',
        'master = "spark://localhost:7077"',
        'master = "spark://[::1]:7077"',  # IPv6 loopback is loopback
        'master = "spark://127.0.1.1:7077"',
        'remote = "sc://127.0.0.1:15002"',
        'remote = "sc://[::1]:15002"',
        'master = "local[4]"',
    ],
)
def test_spark_on_this_machine_lands_a_local_path(where: str) -> None:
    config = parse(SPARK + f"[spark]\n{where}\n")
    assert not config.spark.runs_elsewhere


@pytest.mark.parametrize(
    "where",
    [
        'master = "spark://10.1.2.3:7077"',
        'master = "spark://[fd00::1]:7077"',
        'remote = "sc://spark.example:15002"',
        'master = "yarn"',
    ],
)
def test_a_local_landing_path_with_spark_elsewhere_is_refused_at_start(where: str) -> None:
    message = refused(SPARK + f"[spark]\n{where}\n")
    assert "executors cannot read this machine's disk" in message
    assert "staging_path" in message
    # Shared storage named: accepted.
    shared = SOURCE + '[sink]\nkind = "spark"\npath = "hdfs://nn/lake"\n'
    shared += 'staging_path = "/mnt/shared/staging"\n'
    assert parse(shared + f"[spark]\n{where}\n").spark.runs_elsewhere


def test_a_connect_url_as_master_is_refused_with_remote() -> None:
    message = refused(SPARK + '[spark]\nmaster = "sc://h:15002"\n')
    assert 'remote = "sc://h:15002"' in message
    both = refused(SPARK + '[spark]\nmaster = "local[2]"\nremote = "sc://h:15002"\n')
    assert "remove master" in both


def test_the_old_staging_key_is_refused_with_the_new_name() -> None:
    assert "staging_path" in refused(SPARK + 'staging = "/x"\n')


def test_the_variables_of_scripts_services_and_the_tests_are_not_configuration() -> None:
    """scripts/test exports the servers' addresses; SNAPSHOTTER_SPARK_* would be [spark]
    keys (a CI run once failed every engine test with SNAPSHOTTER_SPARK_MASTER set)."""
    import re

    repo = Path(__file__).resolve().parents[2]
    names: set[str] = set()
    scripts = ["scripts/services", "scripts/services-spark.sh", "scripts/test", "scripts/lib.sh"]
    for script in scripts:
        names.update(re.findall(r"\b(SNAPSHOTTER_[A-Z0-9_]+)", (repo / script).read_text()))
    names -= {"SNAPSHOTTER_REPO", "SNAPSHOTTER_VENV"}
    assert "SNAPSHOTTER_STANDALONE_MASTER" in names
    config = parse(SPARK, {name: "x" for name in names})
    assert config.spark.master == "local[*]"


# --- numbers: nan and inf are refused everywhere ----------------------------------------------

# Every float setting, with a valid [sink] for it (TOML reads nan, inf, +inf and -inf).
FLOAT_SETTINGS = [
    ("source", "chunk_timeout_s", SOURCE.replace("[source]\n", "[source]\n{line}\n")),
    ("sink", "compact_ratio", SOURCE + '[sink]\nkind = "spark"\n{line}\n'),
    ("sink", "compact_idle_s", SOURCE + '[sink]\nkind = "spark"\n{line}\n'),
    ("sink", "maintenance_interval_s", SOURCE + '[sink]\nkind = "spark"\n{line}\n'),
    ("sink", "snapshot_retention_s", SOURCE + '[sink]\nkind = "spark"\n{line}\n'),
    ("sink", "rewrite_delete_ratio", SOURCE + '[sink]\nkind = "spark"\n{line}\n'),
    ("spark", "start_timeout_s", SOURCE + '[sink]\nkind = "spark"\n[spark]\n{line}\n'),
    ("state", "shutdown_timeout_s", SOURCE + "[state]\n{line}\n"),
]


def test_every_float_setting_is_listed() -> None:
    """A float setting added later is tested here too (or this fails)."""
    floats = {
        (section, name)
        for section, models in SECTION_MODELS.items()
        for model in models
        for name, info in model.model_fields.items()
        if info.annotation in (float, float | None)
    }
    assert floats == {(section, key) for section, key, _ in FLOAT_SETTINGS}


@pytest.mark.parametrize(
    ("section", "key", "template"),
    [pytest.param(*setting, id=f"{setting[0]}.{setting[1]}") for setting in FLOAT_SETTINGS],
)
@pytest.mark.parametrize("value", ["nan", "inf", "+inf", "-inf"])
def test_a_float_setting_refuses_nan_and_inf(
    section: str, key: str, template: str, value: str
) -> None:
    """``compact_idle_s = inf`` was taken, and killed the lander thread with an
    OverflowError: refused at load, one line naming the key."""
    message = refused(template.format(line=f"{key} = {value}"))
    assert message == (
        f"my.toml: {section}.{key}: {float(value)!r} is not a finite number (nan and inf are "
        "refused); give a number"
    )
    # From the environment too.
    variable = f"SNAPSHOTTER_{section.upper()}_{key.upper()}"
    assert "not a finite number" in refused(template.format(line=""), {variable: value})


def test_the_idle_compaction_pause_is_bounded() -> None:
    """A finite pause too long for a wait (1e308 s overflows Condition.wait) is refused."""
    spark = SOURCE + '[sink]\nkind = "spark"\n'
    assert "less than or equal to 86400" in refused(spark + "compact_idle_s = 1e308\n")
    assert parse(spark + "compact_idle_s = 86400\n").sink.compact_idle_s == 86_400
    assert "less than or equal to 1000000" in refused(spark + "compact_ratio = 1e308\n")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_kafka_client_setting_refuses_nan_and_inf(value: str) -> None:
    message = refused(KAFKA + f"kafka = {{ linger_ms = {value} }}\n")
    assert message == (
        f"my.toml: sink.kafka: linger_ms = {float(value)}: not a finite number (nan and inf "
        "are refused); give a number"
    )
