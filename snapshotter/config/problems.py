"""pydantic's errors said as people read them, one ``where: what`` each: a missing key with
what it is and where to add it, a name that breaks its pattern with the rule (never the
regex), an unknown key with the nearest known one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from snapshotter.common.librdkafka import did_you_mean
from snapshotter.config.common import ENV_PREFIX, NOT_FINITE, PATTERN_RULES
from snapshotter.config.model import SECTION_MODELS, Config
from snapshotter.config.source import SOURCE_KINDS, SOURCE_MODELS, kind_of_key

# What a required key is, for the error that says it is missing.
_REQUIRED: dict[tuple[str, ...], str] = {
    ("source", "url"): "the database URL",
    ("source", "kind"): "the kind of database",
}


def section_fields() -> dict[str, dict[str, str]]:
    """Per section: the upper-case key as a variable spells it -> the key."""
    return {
        name: {f.upper(): f for model in models for f in model.model_fields}
        for name, models in SECTION_MODELS.items()
    }


def _kinds() -> str:
    return ", ".join(f'"{k}"' for k in SOURCE_KINDS[:-1]) + f' or "{SOURCE_KINDS[-1]}"'


def _missing(loc: tuple[str, ...], kind: str | None) -> str:
    """A required key or section that is not there: what it is, and where to write it."""
    if loc == ("source",):
        return (
            f"source: required: the database to capture; add a [source] section with kind "
            f'({_kinds()}) and url, e.g. kind = "postgres" and url = '
            f'"{SOURCE_MODELS[0].url_example}"'
        )
    where = ".".join(loc)
    if len(loc) == 1:
        return f"{where}: required; add a [{where}] section"
    section, key = ".".join(loc[:-1]), loc[-1]
    what = _REQUIRED.get(loc, "")
    if loc == ("source", "kind"):
        value = _kinds()
    elif loc == ("source", "url"):
        model = dict(zip(SOURCE_KINDS, SOURCE_MODELS, strict=True)).get(kind or "")
        value = f'"{(model or SOURCE_MODELS[0]).url_example}"'
    else:
        value = "..."
    what = f": {what}" if what else ""
    # A key of a section can come from the environment too (config.loading).
    also = f" (or set {ENV_PREFIX}{'_'.join(loc).upper()})" if len(loc) == 2 else ""
    return f"{where}: required{what}; add {key} = {value} under [{section}]{also}"


def _pattern(where: str, error: Mapping[str, Any]) -> str | None:
    """A value that breaks its pattern, as the rule it breaks (None: no rule is known)."""
    found = PATTERN_RULES.get(str((error.get("ctx") or {}).get("pattern", "")))
    if found is None:
        return None
    rule, show_value = found
    value = error.get("input")
    if show_value and isinstance(value, str):
        return f"{where} = {json.dumps(value)}: must be {rule}"
    return f"{where}: must be {rule}"


def problem(error: Mapping[str, Any]) -> str:
    """One pydantic error as ``where: what``; an unknown key with the nearest known one."""
    loc = tuple(str(p) for p in error["loc"])
    kind = None
    if loc[:1] == ("source",) and loc[1:2] and loc[1] in SOURCE_KINDS:
        kind = loc[1]
        loc = loc[:1] + loc[2:]  # [source]'s model per kind is not a level of the file
    where = ".".join(loc) or "top level"
    if error["type"] == "union_tag_not_found" and loc == ("source",):
        return _missing(("source", "kind"), None)
    if error["type"] == "union_tag_invalid" and loc == ("source",):
        kinds = ", ".join(repr(k) for k in SOURCE_KINDS[:-1])
        return f"source.kind: Input should be {kinds} or {SOURCE_KINDS[-1]!r}"
    if error["type"] == "missing" and loc:
        return _missing(loc, kind)
    if error["type"] == "string_pattern_mismatch":
        said = _pattern(where, error)
        if said:
            return said
    owner = kind_of_key(loc[-1]) if loc[:1] == ("source",) else None
    if error["type"] == "extra_forbidden" and owner:
        return f'{where}: only for kind = "{owner}"'
    if error["type"] == "extra_forbidden" and loc:
        sections = section_fields()
        known = (
            list(Config.model_fields) if len(loc) == 1 else list(sections.get(loc[0], {}).values())
        )
        return f"{where}: unknown key{did_you_mean(loc[-1], known)}"
    if error["type"] == "finite_number":
        return f"{where}: {error['input']!r} is {NOT_FINITE}"
    message = str(error["msg"]).removeprefix("Value error, ")
    return f"{where}: {message}"
