"""Reading the file: ``${NAME}`` references, ``SNAPSHOTTER_<SECTION>_<KEY>`` variables,
relative paths, and pydantic's errors said as one line each (``config.problems``)."""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from snapshotter.common.librdkafka import did_you_mean
from snapshotter.config.common import (
    DEFAULT_JSONL,
    ENV_PREFIX,
    ENV_REF,
    ConfigError,
    is_uri,
)
from snapshotter.config.model import Config
from snapshotter.config.problems import problem, section_fields


def _expand(value: Any, where: str, environ: Mapping[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _expand(v, f"{where}.{k}" if where else k, environ) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, f"{where}[{i}]", environ) for i, v in enumerate(value)]
    if isinstance(value, str):

        def lookup(m: re.Match[str]) -> str:
            name = m.group(1)
            if name not in environ:
                raise ConfigError(f"{where}: environment variable {name} is not set")
            return environ[name]

        return ENV_REF.sub(lookup, value)
    return value


def _env_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _referenced(value: Any) -> set[str]:
    """The environment variables the file names as ``${NAME}``."""
    if isinstance(value, dict):
        return {name for v in value.values() for name in _referenced(v)}
    if isinstance(value, list):
        return {name for v in value for name in _referenced(v)}
    if isinstance(value, str):
        return set(ENV_REF.findall(value))
    return set()


def _env_target(var: str, sections: dict[str, dict[str, str]]) -> tuple[str, str] | None:
    """The (section, key) a ``SNAPSHOTTER_*`` variable sets; None for a variable that is not
    configuration (see the module docstring); ConfigError for a misspelt one."""
    rest = var[len(ENV_PREFIX) :]
    for section, fields in sections.items():
        prefix = section.upper() + "_"
        if rest.startswith(prefix):
            key = rest[len(prefix) :]
            if key in fields:
                return section, fields[key]
            known = [f"{ENV_PREFIX}{section.upper()}_{k}" for k in fields]
            raise ConfigError(
                f"environment variable {var}: [{section}] has no key {key.lower()!r}"
                f"{did_you_mean(var, known)}; unset it or fix the name"
            )
    first = rest.split("_", 1)[0]
    close = difflib.get_close_matches(first, [s.upper() for s in sections], n=1, cutoff=0.75)
    if close and "_" in rest:
        raise ConfigError(
            f"environment variable {var}: no section {first.lower()!r} (did you mean "
            f"{ENV_PREFIX}{close[0]}_{rest.split('_', 1)[1]}?); unset it or fix the name"
        )
    return None


def _apply_env(
    raw: dict[str, Any], environ: Mapping[str, str], referenced: Set[str] = frozenset()
) -> dict[str, Any]:
    """Overlay ``SNAPSHOTTER_<SECTION>_<KEY>`` variables on the file's values (the rule for
    which variables count is in the module docstring)."""
    sections = section_fields()
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in raw.items()}
    for var in sorted(environ):
        if not var.startswith(ENV_PREFIX) or var in referenced:
            continue
        target = _env_target(var, sections)
        if target is None:
            continue
        section, key = target
        values = out.setdefault(section, {})
        if isinstance(values, dict):
            values[key] = _env_value(environ[var])
    return out


def _resolve_paths(config: Config, base: Path) -> Config:
    path = config.sink.path or ("lake" if config.sink.kind == "spark" else DEFAULT_JSONL)
    if not is_uri(path):
        path = str(base / path)
    update: dict[str, Any] = {"path": path}
    if config.sink.staging_path is not None:
        update["staging_path"] = base / config.sink.staging_path
    sink = config.sink.model_copy(update=update)
    state = config.state.model_copy(update={"dir": base / config.state.dir})
    signals = config.signals
    if signals.file is not None:
        signals = signals.model_copy(update={"file": base / signals.file})
    return config.model_copy(update={"sink": sink, "state": state, "signals": signals})


def parse_config(
    text: str,
    origin: str = "<config>",
    *,
    base_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: not valid TOML: {exc}") from None
    try:
        env = os.environ if environ is None else environ
        raw = _apply_env(_expand(raw, "", env), env, _referenced(raw))
        config = Config.model_validate(raw)
    except ConfigError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(problem(e) for e in exc.errors())
        raise ConfigError(f"{origin}: {problems}") from None
    return _resolve_paths(config, base_dir if base_dir is not None else Path.cwd())


def load_config(path: str | Path) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    return parse_config(text, str(path), base_dir=path.resolve().parent)
