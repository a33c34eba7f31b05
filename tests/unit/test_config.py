"""The configuration file: defaults, environment references and overrides, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from signals.names import TableId
from snapshotter.config import ConfigError, load_config, parse_config

MINIMAL = """
[source]
kind = "postgres"
url = "postgresql://u:p@h:5432/shop"
"""


def test_defaults() -> None:
    config = parse_config(MINIMAL, base_dir=Path("/etc/snap"), environ={})
    source = config.source
    assert source.topic_prefix == "shop"  # the database name
    assert (source.chunk_size, source.slot, source.publication) == (
        32768,
        "snapshotter",
        "snapshotter",
    )
    assert source.signal_table_id == TableId("public", "debezium_signal")
    assert config.sink.kind == "jsonl"
    assert config.sink.local_path == Path("/etc/snap/snapshotter-events.jsonl")
    assert config.state.dir == Path("/etc/snap/snapshotter-state")


def test_paths_are_relative_to_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "conf" / "s.toml"
    path.parent.mkdir()
    path.write_text(MINIMAL + '[sink]\npath = "out/e.jsonl"\n[state]\ndir = "/abs/state"\n')
    config = load_config(path)
    assert config.sink.local_path == tmp_path / "conf" / "out" / "e.jsonl"
    assert config.state.dir == Path("/abs/state")


def test_environment_references_and_overrides() -> None:
    text = MINIMAL.replace('"postgresql://u:p@h:5432/shop"', '"${DB_URL}"')
    environ = {
        "DB_URL": "postgresql://x@y/z",
        "SNAPSHOTTER_SOURCE_CHUNK_SIZE": "250",
        "SNAPSHOTTER_SOURCE_TABLES": '["public.a", "sales.*"]',
        "SNAPSHOTTER_SOURCE_NAME": "prod",
        "SNAPSHOTTER_SINK_PATH": "/tmp/x.jsonl",
        "SNAPSHOTTER_UNRELATED": "ignored",
    }
    config = parse_config(text, environ=environ)
    assert config.source.url == "postgresql://x@y/z"
    assert config.source.chunk_size == 250
    assert config.source.tables == ["public.a", "sales.*"]
    assert config.source.topic_prefix == "prod"
    assert config.sink.local_path == Path("/tmp/x.jsonl")


def test_an_override_can_supply_a_missing_required_key() -> None:
    text = '[source]\nkind = "postgres"\n'
    config = parse_config(text, environ={"SNAPSHOTTER_SOURCE_URL": "postgresql://a@b/c"})
    assert config.source.url == "postgresql://a@b/c"


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ("[source\n", {}, "not valid TOML"),
        ('[source]\nkind = "oracle"\nurl = "x"\n', {}, "source.kind"),
        ('[source]\nkind = "postgres"\n', {}, "source.url: required: the database URL"),
        (MINIMAL + "chunk_size = 0\n", {}, "source.chunk_size"),
        (MINIMAL + "chunk_size = 0\n", {}, "greater than or equal to 1"),
        (MINIMAL + "tables = ['public.[bad']\n", {}, "source.tables"),
        (MINIMAL + 'slot = "Bad-Slot"\n', {}, "source.slot"),
        (MINIMAL + 'publication = "a,b"\n', {}, "source.publication"),
        (MINIMAL + "colour = 1\n", {}, "source.colour: unknown key"),
        (MINIMAL.replace("postgresql://u:p@h:5432/shop", "${NOPE}"), {}, "NOPE is not set"),
        (MINIMAL, {"SNAPSHOTTER_SOURCE_CHUNK_SIZE": "many"}, "source.chunk_size"),
        (MINIMAL + '[sink]\nkind = "parquet"\n', {}, "sink.kind"),
    ],
)
def test_errors_name_the_key(text: str, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_config(text, "my.toml", environ=environ)


def test_a_missing_file() -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config("/nonexistent/snapshotter.toml")


def test_read_parallelism_defaults_to_two_and_is_bounded() -> None:
    assert parse_config(MINIMAL, base_dir=Path("."), environ={}).source.read_parallelism == 2
    three = parse_config(MINIMAL + "read_parallelism = 3\n", base_dir=Path("."), environ={})
    assert three.source.read_parallelism == 3
    for bad in ("0", "17"):
        with pytest.raises(ConfigError, match="read_parallelism"):
            parse_config(MINIMAL + f"read_parallelism = {bad}\n", base_dir=Path("."), environ={})


# --- errors people read: required keys, patterns said as rules -------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[source]\nkind = "postgres"\n',
            'source.url: required: the database URL; add url = "postgresql://USER:PASSWORD@'
            'HOST:PORT/DATABASE" under [source] (or set SNAPSHOTTER_SOURCE_URL)',
        ),
        (
            '[source]\nkind = "mysql"\n',
            'add url = "mysql://USER:PASSWORD@HOST:PORT/DATABASE" under [source]',
        ),
        (
            '[source]\nurl = "postgresql://a@b/c"\n',
            'source.kind: required: the kind of database; add kind = "postgres", "mysql" or '
            '"spanner" under [source]',
        ),
        ('[sink]\nkind = "jsonl"\n', "source: required: the database to capture; add a [source]"),
    ],
)
def test_a_missing_key_says_what_it_is_and_where_to_add_it(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "my.toml", environ={})
    assert message in str(info.value)
    assert "Field required" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            MINIMAL + 'slot = "My-Slot"\n',
            'source.slot = "My-Slot": must be lowercase letters, digits and underscores, at '
            "most 63 characters",
        ),
        (MINIMAL + f'slot = "{"a" * 64}"\n', "at most 63 characters"),
        (MINIMAL + 'publication = "9pub"\n', 'source.publication = "9pub": must be a letter'),
        (MINIMAL + 'name = "a b"\n', 'source.name = "a b": must be letters, digits'),
        (MINIMAL + '[sink]\ncatalog = "x-y"\n', 'sink.catalog = "x-y": must be a letter'),
        (MINIMAL + '[notifications]\ntopic = "a b"\n', "(a Kafka topic name)"),
        # A Connect URL may carry a token: the rule, not the value.
        (MINIMAL + '[spark]\nremote = "http://h;token=s3cret"\n', "spark.remote: must be a"),
        (
            '[source]\nkind = "spanner"\nurl = "spanner:///projects/p-1234/instances/i/'
            'databases/db"\nchange_stream = "1x"\nemulator_host = "localhost"\n',
            'source.emulator_host = "localhost": must be HOST:PORT',
        ),
        (
            '[source]\nkind = "spanner"\nurl = "spanner:///projects/p-1234/instances/i/'
            'databases/db"\nchange_stream = "1x"\n',
            'source.change_stream = "1x": must be a letter',
        ),
    ],
)
def test_a_name_breaking_its_pattern_says_the_rule_not_the_regex(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "my.toml", environ={})
    said = str(info.value)
    assert message in said
    assert "should match pattern" not in said and "^" not in said, said
    assert "s3cret" not in said


def test_every_pattern_of_the_models_has_a_rule() -> None:
    from snapshotter.config.common import PATTERN_RULES
    from snapshotter.config.model import SECTION_MODELS

    patterns = {
        (model.__name__, name): getattr(meta, "pattern", None)
        for models in SECTION_MODELS.values()
        for model in models
        for name, field in model.model_fields.items()
        for meta in field.metadata
        if getattr(meta, "pattern", None)
    }
    assert len(patterns) >= 8  # the walk finds them (source, sink, spark, notifications)
    unexplained = {key: regex for key, regex in patterns.items() if regex not in PATTERN_RULES}
    assert not unexplained, f"pattern= without config.common.pattern(...): {unexplained}"
