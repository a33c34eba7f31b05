"""The command line without a database: -c's default, every command's --help, and `status`
when the source does not answer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from snapshotter.app.cli import parser as cli_parser
from snapshotter.app.cli.parser import build_parser, main

CONFIG = '[source]\nkind = "postgres"\nurl = "postgresql://alice:s3cret-pw@db.example:5432/shop"\n'


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def _every_command() -> list[tuple[str, argparse.ArgumentParser]]:
    found = []
    for name, command in _subcommands(build_parser()).items():
        found.append((name, command))
        found += [(f"{name} {kind}", p) for kind, p in _subcommands(command).items()]
    return found


@pytest.mark.parametrize(("name", "command"), _every_command())
def test_every_command_help_says_what_it_does(name: str, command: argparse.ArgumentParser) -> None:
    description = command.description or ""
    assert len(description) > 30 and description.endswith("."), (name, description)
    assert description[0].isupper(), (name, description)
    text = command.format_help()
    assert description.split()[0] in text
    assert "TOML configuration file" in text and "TOML config file" not in text


def test_without_c_and_without_the_default_file_the_error_says_how(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    for argv in (["status"], ["signal", "log", "hi"], ["verify", "t"], ["run"]):
        assert main(argv) == 2
        said = capsys.readouterr().err.strip()
        assert said == (
            f"error: no -c given and no ./snapshotter.toml here ({tmp_path}): pass -c <file>, "
            "the TOML configuration file"
        ), said


def test_without_c_the_file_in_the_current_directory_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "snapshotter.toml").write_text(CONFIG)
    seen: list[str] = []

    def fake_status(session: object, args: argparse.Namespace) -> int:
        seen.append(args.config)
        return 0

    monkeypatch.setattr(cli_parser, "cmd_status", fake_status)
    assert main(["status"]) == 0
    assert main(["status", "-c", "other.toml"]) == 0  # -c wins
    assert seen == ["snapshotter.toml", "other.toml"]


class _Down:
    """A source that does not answer (a wrong password, a host down): ConnectError, whose
    message names the URL (here with its password, which the CLI must mask anyway)."""

    log_name = "replication slot"
    errors = (OSError,)

    def connect(self, timeout_s: float | None = None) -> object:
        from snapshotter.sources.connector import ConnectError

        raise ConnectError(
            "cannot connect to the source at postgresql://alice:s3cret-pw@db.example:5432/shop: "
            'password authentication failed for user "alice"; check source.url\nDETAIL: more'
        )


@pytest.mark.parametrize("as_json", [False, True])
def test_status_exits_1_when_the_source_does_not_answer(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    from snapshotter.app import stream_position

    monkeypatch.setattr(stream_position, "connector_for", lambda source: _Down())
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    code = main(["status", "-c", str(config), *(["--json"] if as_json else [])])
    said = capsys.readouterr()
    assert code == 1
    assert "s3cret-pw" not in said.out + said.err
    (line,) = said.err.strip().splitlines()  # one line: what failed, where, the fix
    assert line.startswith("error: cannot connect to the source at postgresql://alice:***@db")
    assert 'password authentication failed for user "alice"; check source.url' in line
    assert "status shows the saved state only" in line
    if as_json:  # the report still comes, saying the source did not answer
        report = json.loads(said.out)
        assert report["source_reachable"] is False and report["snapshots"] == []
        assert report["warnings"][0].startswith("could not check the replication slot at")
    else:  # the state is printed, the reason once (on stderr, not again as a warning)
        assert "state file: " in said.out and "stream: " in said.out
        assert "warning:" not in said.out
