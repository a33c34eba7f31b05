"""The configuration file (TOML), validated by pydantic into typed settings.

Strings may name environment variables as ``${NAME}`` (e.g. ``url = "${SNAPSHOTTER_PG_URL}"``),
so credentials need not live in the file; an unset variable is an error, not an empty string.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from signals.names import TableId, TableNameError, parse_table_name

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

# The schema an unqualified name lives in, per source kind.
DEFAULT_SCHEMA = {"postgres": "public"}


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message says where and why."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceConfig(_Section):
    kind: Literal["postgres"]
    # The logical name of this source: Debezium's topic prefix, ``source.name`` in events.
    name: str = Field(default="snapshotter", pattern=r"^[A-Za-z0-9_.\-]+$")
    url: str = Field(min_length=1)
    signal_table: str = "debezium_signal"

    @field_validator("signal_table")
    @classmethod
    def _parses(cls, value: str) -> str:
        try:
            parse_table_name(value)
        except TableNameError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def signal_table_id(self) -> TableId:
        return parse_table_name(self.signal_table).with_default_schema(DEFAULT_SCHEMA[self.kind])


class Config(_Section):
    source: SourceConfig


def _expand(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else k) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str):

        def lookup(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in os.environ:
                raise ConfigError(f"{where}: environment variable {name} is not set")
            return os.environ[name]

        return _ENV_REF.sub(lookup, value)
    return value


def parse_config(text: str, origin: str = "<config>") -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    try:
        return Config.model_validate(_expand(raw, ""))
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'top level'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{origin}: {problems}") from None


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    return parse_config(text, str(path))
