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
        ('[source]\nkind = "postgres"\n', {}, "source.url: Field required"),
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
