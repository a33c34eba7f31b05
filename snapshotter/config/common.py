"""Shared pieces of the configuration: the base of every section, its error, the
defaults and patterns more than one section uses."""

from __future__ import annotations

import ipaddress
import re

from pydantic import BaseModel, ConfigDict

from signals.names import TableNameError, parse_table_name

ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
ENV_PREFIX = "SNAPSHOTTER_"
NOT_FINITE = "not a finite number (nan and inf are refused); give a number"

DEFAULT_JSONL = "snapshotter-events.jsonl"


def checked_table_name(value: str) -> str:
    """A table name setting (signal_table, notifications.table): refused unless it parses."""
    try:
        parse_table_name(value)
    except TableNameError as exc:
        raise ValueError(str(exc)) from None
    return value


# Every pattern= of a setting, with what it allows as people read it: an error says the rule,
# never the regex (config.problems). Filled by ``pattern``, which the models call.
PATTERN_RULES: dict[str, tuple[str, bool]] = {}


def pattern(regex: str, rule: str, *, show_value: bool = True) -> str:
    """``regex`` (for ``Field(pattern=...)``), remembered with ``rule``: what a value must be,
    completing "must be ...". ``show_value``: whether an error may quote the value (not for
    a URL, which may carry a token)."""
    PATTERN_RULES[regex] = (rule, show_value)
    return regex


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message says where and why."""


class Section(BaseModel):
    # allow_inf_nan=False: TOML reads nan and inf as numbers, and no setting means either (a
    # timeout of inf seconds overflows the waits that take it).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


# The host of a master or Connect URL: a bracketed IPv6 address ("spark://[::1]:7077") or a
# name or IPv4 address.
URL_HOST = re.compile(r"^[a-z][a-z0-9+.\-]*://(?:\[([^\]/]+)\]|([^\[\]/:@]+))")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP address, IPv6 without brackets) is this machine's
    loopback interface: localhost, 127.0.0.0/8, ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_uri(path: str) -> bool:
    """Whether ``path`` names a location by URI (``s3a://``, ``hdfs://``, ``file://``...)."""
    return bool(_URI.match(path))


# Kafka client settings the sink sets itself: the ordering and durability promises rest on
# them (or they are given by other [sink] keys).
