"""What ``snapshotter init`` created, so that ``teardown`` drops only that.

``init`` adopts a signal table, notification table or publication that is already there (a
table a Debezium connector uses, one another pipeline made, one an administrator made for a
user without CREATE); ``teardown`` must never drop those. So init records each object it
*created* in ``<[state] dir>/created.json`` (versioned JSON, replaced atomically), with the
database it is in, and teardown drops an object only when the record names it there. An
object missing from the record (adopted, or made by a snapshotter before this record
existed) is kept, and teardown says why and how to drop it by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, ValidationError

from snapshotter.common.atomic import write_atomically
from snapshotter.common.errors import disk_error
from snapshotter.config import Config

CREATED_FILE = "created.json"
VERSION: Literal[1] = 1


class RecordError(Exception):
    """The record cannot be read or written; the message names the file."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Created(_Model):
    kind: str  # as teardown names it: "signal table", "notification table", "publication"
    name: str  # schema.table, or the publication's name
    database: str  # where: host:port/database (no user, no password)


class Record(_Model):
    version: Literal[1] = VERSION
    created: list[Created] = []


def record_path(config: Config) -> Path:
    return config.state.dir / CREATED_FILE


def database_of(config: Config) -> str:
    """The source database as the record names it: ``host:port/database`` (Spanner: its
    path), never the user or the password."""
    url = sa.make_url(config.source.url)
    if config.source.kind == "spanner":
        return str(url.database or "")
    return f"{url.host or ''}:{url.port or ''}/{url.database or ''}"


def load(path: Path) -> Record:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Record()
    except OSError as exc:
        raise RecordError(f"cannot read {path}: {exc.strerror}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{path} is not valid JSON: {exc}") from None
    version = raw.get("version") if isinstance(raw, dict) else None
    if version != VERSION:
        raise RecordError(
            f"{path}: version {version!r} is not one this snapshotter reads ({VERSION})"
        )
    try:
        return Record.model_validate(raw)
    except ValidationError as exc:
        raise RecordError(f"{path} does not validate: {exc}") from None


def _save(path: Path, record: Record) -> None:
    text = json.dumps(record.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
    try:
        write_atomically(path, text)
    except OSError as exc:
        raise RecordError(
            disk_error(exc, path, "the record of what init created", "[state] dir")
        ) from None


def remember(config: Config, kind: str, name: str) -> None:
    """Record that init created ``kind`` ``name`` in the configured source database."""
    path = record_path(config)
    record = load(path)
    entry = Created(kind=kind, name=name, database=database_of(config))
    if entry not in record.created:
        record.created.append(entry)
        _save(path, record)


def forget(config: Config, kind: str, name: str) -> None:
    """Take ``kind`` ``name`` out of the record (teardown dropped it)."""
    path = record_path(config)
    record = load(path)
    entry = Created(kind=kind, name=name, database=database_of(config))
    if entry in record.created:
        record.created.remove(entry)
        _save(path, record)


def was_created(config: Config, kind: str, name: str) -> bool:
    """Whether init recorded creating ``kind`` ``name`` in the configured source database."""
    entry = Created(kind=kind, name=name, database=database_of(config))
    return entry in load(record_path(config)).created
