"""The [sink] kind = "kafka" configuration: required keys, bounds, the JSON column mode, the
extra client settings table (reserved keys refused) and environment overrides."""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotter.config import KAFKA_RESERVED, Config, ConfigError, parse_config
from snapshotter.config.kafka import choose_client

SOURCE = """
[source]
kind = "postgres"
url = "postgresql://u:p@h:5432/shop"
"""
KAFKA = SOURCE + '[sink]\nkind = "kafka"\nbootstrap_servers = "k1:9092,k2:9092"\n'


def parse(text: str, environ: dict[str, str] | None = None) -> Config:
    return parse_config(text, "my.toml", base_dir=Path("/etc/snap"), environ=environ or {})


def refused(text: str, environ: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, environ)
    message = str(info.value)
    assert message.startswith("my.toml: ")
    return message


def test_kafka_defaults() -> None:
    sink = parse(KAFKA).sink
    assert sink.kind == "kafka"
    assert sink.bootstrap_servers == "k1:9092,k2:9092"
    assert (sink.partitions, sink.replication) == (1, 1)
    assert sink.schemas is False
    assert sink.json_columns is None
    assert sink.json_as_text is False
    assert sink.kafka == {}


@pytest.mark.parametrize("servers", [None, '""', '"   "'])
def test_bootstrap_servers_is_required(servers: str | None) -> None:
    text = SOURCE + '[sink]\nkind = "kafka"\n'
    if servers is not None:
        text += f"bootstrap_servers = {servers}\n"
    message = refused(text)
    assert "the kafka sink needs bootstrap_servers" in message
    assert 'bootstrap_servers = "host:9092"' in message  # says how


def test_bootstrap_servers_is_not_needed_by_other_sinks() -> None:
    assert parse(SOURCE + '[sink]\nkind = "jsonl"\n').sink.bootstrap_servers == ""


def test_bootstrap_servers_from_the_environment() -> None:
    text = SOURCE + '[sink]\nkind = "kafka"\n'
    sink = parse(text, {"SNAPSHOTTER_SINK_BOOTSTRAP_SERVERS": "b:9092"}).sink
    assert sink.bootstrap_servers == "b:9092"


@pytest.mark.parametrize("key", ["partitions", "replication"])
@pytest.mark.parametrize("value", [0, -1])
def test_partitions_and_replication_are_at_least_one(key: str, value: int) -> None:
    message = refused(KAFKA + f"{key} = {value}\n")
    assert f"sink.{key}" in message
    assert "greater than or equal to 1" in message


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 10_000), st.integers(1, 7))
def test_partitions_and_replication_accepted(partitions: int, replication: int) -> None:
    sink = parse(KAFKA + f"partitions = {partitions}\nreplication = {replication}\n").sink
    assert (sink.partitions, sink.replication) == (partitions, replication)


def test_schemas_with_embedded_json_is_refused() -> None:
    message = refused(KAFKA + 'schemas = true\njson_columns = "embedded"\n')
    assert 'json_columns = "embedded" cannot go with schemas = true' in message
    assert 'use json_columns = "text"' in message


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("", False),
        ("schemas = false\n", False),
        ("schemas = true\n", True),
        ('json_columns = "text"\n', True),
        ('json_columns = "embedded"\n', False),
        ('schemas = true\njson_columns = "text"\n', True),
        ('schemas = false\njson_columns = "text"\n', True),
        ('schemas = false\njson_columns = "embedded"\n', False),
    ],
)
def test_json_as_text(lines: str, expected: bool) -> None:
    assert parse(KAFKA + lines).sink.json_as_text is expected


def test_json_columns_takes_only_known_modes() -> None:
    assert "sink.json_columns" in refused(KAFKA + 'json_columns = "string"\n')


def test_extra_client_settings_are_accepted() -> None:
    text = KAFKA + (
        'kafka = {security_protocol = "SASL_SSL", sasl_mechanism = "PLAIN", '
        'linger_ms = 5, compression_type = "gzip", bootstrap_timeout_ms = 2500, '
        "ssl_check_hostname = false}\n"
    )
    assert parse(text).sink.kafka == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "linger_ms": 5,
        "compression_type": "gzip",
        "bootstrap_timeout_ms": 2500,
        "ssl_check_hostname": False,
    }


def test_extra_client_settings_as_a_table() -> None:
    text = KAFKA + '[sink.kafka]\nsecurity_protocol = "SSL"\nlinger_ms = 50\n'
    assert parse(text).sink.kafka == {"security_protocol": "SSL", "linger_ms": 50}


def test_extra_client_settings_take_scalars_only() -> None:
    assert "sink.kafka.linger_ms" in refused(KAFKA + "kafka = {linger_ms = [1, 2]}\n")


@pytest.mark.parametrize("key", sorted(KAFKA_RESERVED))
def test_a_reserved_setting_is_refused_by_name(key: str) -> None:
    message = refused(KAFKA + f"kafka = {{{key} = 1}}\n")
    assert "sink.kafka" in message
    assert re.search(rf"\b{key}\b: set by the sink itself", message)


def test_reserved_settings_are_all_named() -> None:
    text = KAFKA + 'kafka = {acks = 1, enable_idempotence = false, bootstrap_servers = "x:1"}\n'
    message = refused(text)
    assert "acks, bootstrap_servers, enable_idempotence: set by the sink itself" in message
    assert "bootstrap_servers is a [sink] key" in message


def test_the_reserved_set_covers_what_the_sink_promises_rest_on() -> None:
    from snapshotter.sinks.kafka.sink import PRODUCER_FIXED

    assert set(PRODUCER_FIXED) <= KAFKA_RESERVED
    assert {"bootstrap_servers", "acks", "enable_idempotence", "retries"} <= KAFKA_RESERVED


def test_a_reserved_setting_is_refused_even_for_another_sink_kind() -> None:
    # the settings table is validated whatever the kind (it is only used by the kafka sink)
    assert "acks" in refused(SOURCE + '[sink]\nkind = "jsonl"\nkafka = {acks = 1}\n')


def test_environment_overrides_for_the_kafka_sink() -> None:
    environ = {
        "SNAPSHOTTER_SINK_KAFKA": "{linger_ms = 5}",
        "SNAPSHOTTER_SINK_PARTITIONS": "3",
        "SNAPSHOTTER_SINK_REPLICATION": "2",
        "SNAPSHOTTER_SINK_SCHEMAS": "true",
        "SNAPSHOTTER_SINK_JSON_COLUMNS": "text",
    }
    sink = parse(KAFKA + "partitions = 1\nkafka = {linger_ms = 100}\n", environ).sink
    assert sink.kafka == {"linger_ms": 5}  # the variable replaces the table
    assert (sink.partitions, sink.replication) == (3, 2)
    assert sink.schemas is True and sink.json_as_text is True


def test_environment_override_can_choose_the_kafka_sink() -> None:
    environ = {
        "SNAPSHOTTER_SINK_KIND": "kafka",
        "SNAPSHOTTER_SINK_BOOTSTRAP_SERVERS": "k:9092",
        "SNAPSHOTTER_SINK_KAFKA": '{security_protocol = "SSL", linger_ms = 5}',
    }
    sink = parse(SOURCE, environ).sink
    assert (sink.kind, sink.bootstrap_servers) == ("kafka", "k:9092")
    assert sink.kafka == {"security_protocol": "SSL", "linger_ms": 5}


@pytest.mark.parametrize(
    ("environ", "where"),
    [
        ({"SNAPSHOTTER_SINK_PARTITIONS": "0"}, "sink.partitions"),
        ({"SNAPSHOTTER_SINK_PARTITIONS": "many"}, "sink.partitions"),
        ({"SNAPSHOTTER_SINK_KAFKA": "{acks = 0}"}, "acks: set by the sink itself"),
        ({"SNAPSHOTTER_SINK_KAFKA": "linger_ms=5"}, "sink.kafka"),
        ({"SNAPSHOTTER_SINK_BOOTSTRAP_SERVERS": ""}, "needs bootstrap_servers"),
    ],
)
def test_bad_environment_overrides_are_refused(environ: dict[str, str], where: str) -> None:
    assert where in refused(KAFKA, environ)


def test_environment_references_in_client_settings() -> None:
    text = KAFKA + 'kafka = {sasl_plain_password = "${KAFKA_PASSWORD}"}\n'
    sink = parse(text, {"KAFKA_PASSWORD": "s3cret"}).sink
    assert sink.kafka == {"sasl_plain_password": "s3cret"}
    assert "KAFKA_PASSWORD is not set" in refused(text)


# --- client = "confluent": librdkafka's own settings ------------------------------------------

CONFLUENT = KAFKA + 'client = "confluent"\n'


def test_the_client_is_auto_unless_chosen() -> None:
    assert parse(KAFKA).sink.client == "auto"
    assert "sink.client" in refused(KAFKA + 'client = "librdkafka"\n')
    environ = {"SNAPSHOTTER_SINK_CLIENT": "confluent"}
    assert parse(KAFKA, environ).sink.client == "confluent"
    assert parse(KAFKA, environ).sink.kafka_client == "confluent"
    pinned = parse(KAFKA + 'client = "kafka-python"\n').sink
    assert choose_client(pinned.client, pinned.kafka)[0] == "kafka-python"
    assert pinned.kafka_client == "kafka-python"


def test_auto_takes_confluent_when_it_imports() -> None:
    pytest.importorskip("confluent_kafka")
    sink = parse(KAFKA).sink
    assert sink.kafka_client == "confluent"
    assert choose_client("auto", {})[1] == 'client = "auto": confluent_kafka imports'


def test_auto_falls_back_to_kafka_python_when_confluent_does_not_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # import raises ImportError
    sink = parse(KAFKA).sink
    assert sink.kafka_client == "kafka-python"
    client, why = choose_client("auto", {})
    assert client == "kafka-python" and "confluent_kafka does not import" in why
    # A client named is taken as named (its own errors say when it cannot run).
    assert parse(KAFKA + 'client = "confluent"\n').sink.kafka_client == "confluent"


def test_auto_follows_the_names_of_the_client_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings written for one client are never read as the other's, whatever imports: a
    config from before "auto" (kafka-python's names, no client) keeps kafka-python."""
    python_names = parse(KAFKA + 'kafka = {security_protocol = "PLAINTEXT", linger_ms = 5}\n')
    assert python_names.sink.kafka_client == "kafka-python"
    assert "kafka-python's names" in choose_client("auto", python_names.sink.kafka)[1]
    # Dotted names are librdkafka's: judged by librdkafka, run on confluent.
    pytest.importorskip("confluent_kafka")
    dotted = parse(KAFKA + 'kafka = {"linger.ms" = 5}\n').sink
    assert dotted.kafka_client == "confluent"
    mixed = refused(KAFKA + 'kafka = {"linger.ms" = 5, linger_ms = 5}\n')
    assert "linger_ms: not a librdkafka setting (did you mean linger.ms?)" in mixed
    # Without confluent-kafka, dotted names say how to get it.
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)
    missing = refused(KAFKA + 'kafka = {"linger.ms" = 5}\n')
    assert "pip install confluent-kafka" in missing and 'client = "kafka-python"' in missing


def test_the_sink_logs_the_client_it_runs_on(caplog: pytest.LogCaptureFixture) -> None:
    from snapshotter.sinks.factory import sink_for

    def describe(table: object) -> Any:
        raise AssertionError("schemas = false: no table is described")

    config = parse(KAFKA + "kafka = {linger_ms = 5}\n")
    with caplog.at_level(logging.INFO, logger="snapshotter.sinks.factory"):
        sink_for(config, describe, lambda table: ["id"])  # builds it; connects only on open
    assert 'kafka sink: the kafka-python client (client = "auto"' in caplog.text


def test_confluent_takes_librdkafka_settings() -> None:
    pytest.importorskip("confluent_kafka")
    text = CONFLUENT + (
        'kafka = {"security.protocol" = "SASL_SSL", "sasl.mechanism" = "PLAIN", '
        '"sasl.username" = "u", "sasl.password" = "p", '
        '"linger.ms" = 5, "compression.type" = "zstd", "fetch.min.bytes" = 1}\n'
    )
    assert parse(text).sink.kafka == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
        "linger.ms": 5,
        "compression.type": "zstd",
        "fetch.min.bytes": 1,  # the verify consumer's
    }


def test_confluent_refuses_kafka_python_names_and_unknown_settings() -> None:
    pytest.importorskip("confluent_kafka")
    message = refused(CONFLUENT + 'kafka = {linger_ms = 5, "linger.mss" = 5}\n')
    assert "sink.kafka" in message
    assert "linger_ms: not a librdkafka setting (did you mean linger.ms?)" in message
    assert "linger.mss: not a librdkafka setting (did you mean linger.ms?)" in message
    assert "the keys are librdkafka's" in message


def test_confluent_refuses_a_value_librdkafka_refuses() -> None:
    pytest.importorskip("confluent_kafka")
    message = refused(CONFLUENT + 'kafka = {"linger.ms" = "soon"}\n')
    assert "linger.ms: Invalid value" in message


@pytest.mark.parametrize(
    "key",
    ["acks", "enable.idempotence", "partitioner", "bootstrap.servers", "transactional.id"],
)
def test_confluent_refuses_what_the_sink_sets(key: str) -> None:
    message = refused(CONFLUENT + f'kafka = {{"{key}" = "x"}}\n')
    assert f"{key}: set by the sink itself" in message


def test_confluent_refuses_callback_settings() -> None:
    message = refused(CONFLUENT + 'kafka = {error_cb = "print"}\n')
    assert "error_cb: takes a Python object" in message


def test_the_confluent_fixed_settings_are_reserved() -> None:
    from snapshotter.common.librdkafka import CONFLUENT_FIXED, CONFLUENT_RESERVED

    assert set(CONFLUENT_FIXED) <= CONFLUENT_RESERVED
    assert CONFLUENT_FIXED["partitioner"] == "murmur2_random"  # kafka-python's partitions


def test_both_clients_put_a_key_on_the_same_partition() -> None:
    """librdkafka's murmur2 partitioner and kafka-python's default one agree, so a run
    resumed with the other client keeps each key's events on one partition, in order."""
    confluent = pytest.importorskip("confluent_kafka")
    from kafka.partitioner.default import murmur2

    keys = [b"", b"{}", b'{"id":7}', '{"a":1,"b":"é"}'.encode(), bytes(range(256))]
    for key in keys:
        for partitions in (1, 2, 3, 7, 100):
            assert confluent.murmur2(key, partitions) == (murmur2(key) & 0x7FFFFFFF) % partitions


def test_confluent_settings_are_judged_together() -> None:
    pytest.importorskip("confluent_kafka")
    message = refused(
        CONFLUENT + 'kafka = {"sasl.mechanism" = "NOPE", "security.protocol" = "SASL_SSL"}\n'
    )
    assert "librdkafka refuses these settings" in message
