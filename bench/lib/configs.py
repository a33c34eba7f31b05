"""Engine config text for the benches: TOML literals and sections, and ``--set
[SINK:]SECTION.KEY=VALUE`` settings put into every run's config."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def toml_string(text: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, except that TOML takes no surrogate
    pairs (so no ASCII-only escaping) and wants DEL escaped."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """A TOML literal for a str, bool, int, float, list or (inline) table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, Mapping):
        pairs = ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + pairs + " }"
    if isinstance(value, Sequence):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"no TOML literal for {value!r}")


def toml_text(sections: Mapping[str, Mapping[str, Any]]) -> str:
    lines: list[str] = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in keys.items()]
        lines.append("")
    text = "\n".join(lines)
    tomllib.loads(text)  # what we write must read back
    return text


@dataclass(frozen=True)
class Setting:
    """One ``--set [SINK:]SECTION.KEY=VALUE``: a config key for every engine run, or only for
    the runs of one sink."""

    sink: str | None
    section: str
    key: str
    value: Any


def parse_setting(text: str, sinks: Sequence[str]) -> Setting:
    """``source.read_parallelism=2``, ``kafka:sink.client="confluent"``,
    ``spark:spark.conf={"spark.driver.memory" = "2g"}``. VALUE is a TOML literal; a bare
    word that is not one is taken as a string."""
    target, sep, raw = text.partition("=")
    if not sep or not raw.strip():
        raise ValueError(f"{text!r}: write [SINK:]SECTION.KEY=VALUE")
    sink: str | None = None
    if ":" in target:
        sink, target = target.split(":", 1)
        if sink not in sinks:
            raise ValueError(f"{text!r}: {sink!r} is not a sink ({', '.join(sinks)})")
    section, dot, key = target.strip().partition(".")
    if not dot or not section or not key:
        raise ValueError(f"{text!r}: write [SINK:]SECTION.KEY=VALUE")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return Setting(sink, section, key.strip(), value)


def apply_settings(
    sections: dict[str, dict[str, Any]], settings: Sequence[Setting], sink: str
) -> None:
    """Put every setting for all sinks or for ``sink`` into ``sections`` (in place)."""
    for s in settings:
        if s.sink is None or s.sink == sink:
            sections.setdefault(s.section, {})[s.key] = s.value
