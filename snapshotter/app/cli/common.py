"""What every command shares: the two consoles, the one-line error (``CliError``), the
``Session`` (a command's secrets to mask and its source URL, loaded with its config) and the
source's connection."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from snapshotter.common.redact import Redactor, setting_secrets, url_secrets
from snapshotter.config import Config, ConfigError, load_config
from snapshotter.sources.connector import connector_for

# Off a terminal rich assumes 80 columns, which folds the status table into a column of
# fragments; pipes and logs get room for a whole row instead.
_PIPE_WIDTH = None if sys.stdout.isatty() else 200
out = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True, width=_PIPE_WIDTH)


# -c's file when -c is not given, in the current directory.
DEFAULT_CONFIG = "snapshotter.toml"
CONFIG_HELP = f"the TOML configuration file (default: ./{DEFAULT_CONFIG}, when it exists)"


class CliError(Exception):
    """An error to print as one line and exit with ``code``."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Session:
    """One command's run. Everything printed as an error or logged passes through
    ``redact``: it knows the configured secrets once the command has loaded its config (and
    masks URL passwords anyway); ``source_url`` names the source in error messages."""

    redact: Redactor = field(default_factory=Redactor)
    source_url: str | None = None

    def load_config(self, path: str) -> Config:
        """The config at ``path``; its secrets join ``redact``. A config that cannot be
        read or is invalid exits 2."""
        try:
            config = load_config(path)
        except ConfigError as exc:
            raise CliError(str(exc), code=2) from None
        self.redact.add(url_secrets(config.source.url))
        self.redact.add(setting_secrets(config.sink.kafka))
        self.redact.add(setting_secrets(config.spark.conf))
        self.source_url = config.source.url
        return config


def connect(config: Config) -> Any:
    """A handle on the source (``Connector.connect``), checked to answer."""
    from snapshotter.sources.connector import ConnectError

    try:
        return connector_for(config.source).connect()
    except ConnectError as exc:
        raise CliError(str(exc)) from None


def config_path(given: str | None) -> str:
    """The configuration file a command reads: ``-c``'s, else ./snapshotter.toml when it is
    there; else a usage error (exit 2) that says how to give one."""
    if given:
        return given
    if Path(DEFAULT_CONFIG).is_file():
        return DEFAULT_CONFIG
    raise CliError(
        f"no -c given and no ./{DEFAULT_CONFIG} here ({Path.cwd()}): pass -c <file>, the TOML "
        "configuration file",
        code=2,
    )
