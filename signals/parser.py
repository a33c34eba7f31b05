"""The strict signal parser: a signal-table row in, a typed signal or an error value out.

It never raises. A bad row (malformed JSON, an unknown type, a missing, misspelt or
wrong-typed field) comes back as a ``SignalError`` naming the signal id and the problem, so
the engine can record it where the user looks and keep streaming. Unknown fields are errors
too: a misspelt ``additional-conditions`` silently ignored would snapshot the wrong rows, and
so is a field given twice (JSON parsers disagree on which one wins).

Sizes are capped, so that no signal row can make the engine do unbounded work on the
stream's thread or grow its state without bound: ``data`` is at most ``MAX_DATA_CHARS``
characters, a signal id at most ``MAX_ID_CHARS``, a ``data-collections`` or
``additional-conditions`` list at most ``MAX_TABLES`` entries of which at most
``MAX_PATTERNS`` are patterns (each pattern is tried on every table of the catalog), and each
name or pattern at most ``signals.names.MAX_SELECTOR_CHARS`` characters.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from signals.model import (
    USER_SIGNAL_TYPES,
    AdditionalCondition,
    ExecuteSnapshot,
    LogSignal,
    PauseSnapshot,
    ResumeSnapshot,
    Signal,
    SignalError,
    SignalType,
    SnapshotType,
    StopSnapshot,
    Watermark,
    WatermarkKind,
)
from signals.names import (
    TableId,
    TableNameError,
    TablePattern,
    TableSelector,
    parse_table_selector,
)
from signals.sqlguard import FilterError, check_filter

NonEmpty = Annotated[str, StringConstraints(min_length=1)]

MAX_DATA_CHARS = 65_536
MAX_ID_CHARS = 255
MAX_TABLES = 1_000
MAX_PATTERNS = 32
_SHOWN_CHARS = 80  # how much of an over-long id or type an error repeats


class _Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Condition(_Payload):
    data_collection: NonEmpty = Field(alias="data-collection")
    filter: NonEmpty


class _ExecuteData(_Payload):
    data_collections: list[NonEmpty] = Field(alias="data-collections", min_length=1)
    type: NonEmpty | None = None  # null means the default, as in Debezium
    additional_conditions: list[_Condition] = Field(default=[], alias="additional-conditions")
    surrogate_key: NonEmpty | None = Field(default=None, alias="surrogate-key")


class _StopData(_Payload):
    data_collections: list[NonEmpty] = Field(default=[], alias="data-collections")
    type: NonEmpty | None = None  # null means the default, as in Debezium


class _TypeOnlyData(_Payload):
    type: NonEmpty | None = None  # null means the default, as in Debezium


class _LogData(_Payload):
    message: str


class _Problem(Exception):
    """Internal: carries one problem up to the single place that makes the error value."""


_TOO_DEEP = "data is nested too deeply"


# Friendlier words for mistakes people make when porting signals from older Debezium docs.
_HINTS = {
    "additional-condition": "'additional-condition' (one string) was replaced by "
    '\'additional-conditions\': [{"data-collection": ..., "filter": ...}]',
    "data-collection": "did you mean 'data-collections' (a list of tables)?",
}


def _describe(exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "data"
        if err["type"] == "extra_forbidden":
            hint = _HINTS.get(str(err["loc"][-1]))
            problems.append(f"unknown field {where!r}" + (f": {hint}" if hint else ""))
        elif err["type"] == "missing":
            problems.append(f"field {where!r} is required")
        else:
            problems.append(f"field {where!r}: {err['msg'].lower()}")
    return "; ".join(problems)


def _validate(model: type[_Payload], data: Any) -> Any:
    try:
        return model.model_validate(data, by_alias=True)
    except ValidationError as exc:
        raise _Problem(_describe(exc)) from None


def _snapshot_type(value: str | None) -> SnapshotType:
    # Debezium reads a missing or null type as INCREMENTAL, and upper-cases the type before
    # looking it up; its docs spell it "INCREMENTAL".
    if value is None:
        return SnapshotType.INCREMENTAL
    lowered = value.lower()
    if lowered == SnapshotType.INCREMENTAL.value:
        return SnapshotType.INCREMENTAL
    if lowered == "blocking":
        raise _Problem("snapshot type 'blocking' is not supported; use 'incremental'")
    raise _Problem(f"unknown snapshot type {value!r}; the only type is 'incremental'")


def _clip(text: str, limit: int = _SHOWN_CHARS) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _selectors(names: list[str], field: str) -> tuple[TableSelector, ...]:
    if len(names) > MAX_TABLES:
        raise _Problem(
            f"{field} has {len(names)} entries; a signal may name at most {MAX_TABLES}: "
            "split it into several signals"
        )
    out: list[TableSelector] = []
    seen: set[TableSelector] = set()
    patterns = 0
    for name in names:
        try:
            selector = parse_table_selector(name)
        except TableNameError as exc:
            raise _Problem(f"{field}: {exc}") from None
        if selector in seen:
            raise _Problem(f"{field}: {_clip(name)!r} is listed twice")
        if isinstance(selector, TablePattern):
            patterns += 1
            if patterns > MAX_PATTERNS:
                raise _Problem(
                    f"{field} has more than {MAX_PATTERNS} patterns; a signal may hold at "
                    f"most {MAX_PATTERNS} (each is tried on every table): combine them with "
                    "| or split the signal"
                )
        seen.add(selector)
        out.append(selector)
    return tuple(out)


def _conditions(
    raw: list[_Condition], tables: tuple[TableSelector, ...], dollar_quotes: bool
) -> tuple[AdditionalCondition, ...]:
    out: list[AdditionalCondition] = []
    listed = set(tables)
    if len(raw) > MAX_TABLES:
        raise _Problem(
            f"additional-conditions has {len(raw)} entries; a signal may hold at most {MAX_TABLES}"
        )
    patterns = 0
    for cond in raw:
        (selector,) = _selectors([cond.data_collection], "additional-conditions")
        if isinstance(selector, TablePattern):
            patterns += 1
            if patterns > MAX_PATTERNS:
                raise _Problem(
                    f"additional-conditions has more than {MAX_PATTERNS} patterns; a signal "
                    f"may hold at most {MAX_PATTERNS}"
                )
        if any(c.data_collection == selector for c in out):
            raise _Problem(
                f"additional-conditions: two filters for {cond.data_collection!r}; "
                "combine them into one with AND"
            )
        # An exact name that none of the snapshot's tables can be is surely a typo. Patterns
        # and unqualified names are checked once the names are resolved against the catalog.
        if (
            isinstance(selector, TableId)
            and selector.schema is not None
            and all(isinstance(t, TableId) and t.schema is not None for t in tables)
            and selector not in listed
        ):
            raise _Problem(
                f"additional-conditions: {cond.data_collection!r} is not one of the "
                "data-collections of this snapshot"
            )
        try:
            check_filter(cond.filter, dollar_quotes=dollar_quotes)
        except FilterError as exc:
            raise _Problem(
                f"additional-conditions: the filter for {cond.data_collection!r} is refused: {exc}"
            ) from None
        out.append(AdditionalCondition(selector, cond.filter))
    return tuple(out)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (``json`` would keep the last silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Problem(f"data has a duplicate field {key!r}")
        out[key] = value
    return out


def _payload(data: str | None) -> Any:
    if data is None or not data.strip():
        return {}
    if len(data) > MAX_DATA_CHARS:
        raise _Problem(
            f"data is {len(data)} characters long; a signal's data may be at most "
            f"{MAX_DATA_CHARS}: split it into several signals"
        )
    try:
        payload = json.loads(data, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise _Problem(
            f"data is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise _Problem(_TOO_DEEP) from None
    if payload is None:
        return {}
    if not isinstance(payload, dict):
        raise _Problem(f"data must be a JSON object, not {type(payload).__name__}")
    try:
        # JSON may spell a lone surrogate (\\ud800), which no database, file or log takes.
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise _Problem("data holds a lone surrogate (\\ud800...): not valid Unicode text") from None
    return payload


def _parse(
    signal_id: str, signal_type: str, data: str | None, dollar_quotes: bool
) -> Signal | Watermark:
    if not signal_id:
        raise _Problem("the signal has an empty id")
    if len(signal_id) > MAX_ID_CHARS:
        raise _Problem(f"the id is {len(signal_id)} characters long; at most {MAX_ID_CHARS}")
    try:
        kind = SignalType(signal_type)
    except ValueError:
        known = ", ".join(t.value for t in USER_SIGNAL_TYPES)
        raise _Problem(
            f"unknown signal type {_clip(signal_type)!r}; known types: {known}"
        ) from None
    payload = _payload(data)
    match kind:
        case SignalType.EXECUTE_SNAPSHOT:
            ex = _validate(_ExecuteData, payload)
            tables = _selectors(ex.data_collections, "data-collections")
            return ExecuteSnapshot(
                id=signal_id,
                data_collections=tables,
                snapshot_type=_snapshot_type(ex.type),
                additional_conditions=_conditions(ex.additional_conditions, tables, dollar_quotes),
                surrogate_key=ex.surrogate_key,
            )
        case SignalType.STOP_SNAPSHOT:
            st = _validate(_StopData, payload)
            return StopSnapshot(
                id=signal_id,
                data_collections=_selectors(st.data_collections, "data-collections"),
                snapshot_type=_snapshot_type(st.type),
            )
        case SignalType.PAUSE_SNAPSHOT:
            pause = _validate(_TypeOnlyData, payload)
            return PauseSnapshot(id=signal_id, snapshot_type=_snapshot_type(pause.type))
        case SignalType.RESUME_SNAPSHOT:
            resume = _validate(_TypeOnlyData, payload)
            return ResumeSnapshot(id=signal_id, snapshot_type=_snapshot_type(resume.type))
        case SignalType.LOG:
            return LogSignal(id=signal_id, message=_validate(_LogData, payload).message)
        case SignalType.WINDOW_OPEN | SignalType.WINDOW_CLOSE:
            wm_kind = WatermarkKind.OPEN if kind is SignalType.WINDOW_OPEN else WatermarkKind.CLOSE
            suffix = f"-{wm_kind.value}"
            if not signal_id.endswith(suffix) or len(signal_id) == len(suffix):
                raise _Problem(f"a {kind.value} row must have an id '<window>{suffix}'")
            # Other fields (Debezium writes a timestamp) are the writer's business.
            token = payload.get("token")
            return Watermark(
                window_id=signal_id[: -len(suffix)],
                kind=wm_kind,
                token=token if isinstance(token, str) else None,
            )
    raise AssertionError(kind)  # pragma: no cover - match is exhaustive


def _text(value: object, field: str) -> str | None:
    """A column value as text: str as is, bytes decoded as UTF-8, None as None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise _Problem(f"{field} is not UTF-8 text") from None
    raise _Problem(f"{field} must be text, not {type(value).__name__}")


def _id_text(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return str(value)
        except ValueError:  # more digits than int-to-str allows; no id column holds that
            raise _Problem("id is an integer too large to be an id") from None
    return _text(value, "id") or ""


def _shown(value: object) -> str:
    """How an error names a raw id or type that may not be usable text."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "backslashreplace")
    try:
        return repr(value)
    except ValueError:
        return f"<{type(value).__name__}>"


def parse_signal(
    signal_id: object, signal_type: object, data: object, *, dollar_quotes: bool = True
) -> Signal | Watermark | SignalError:
    """Parse one signal-table row. Never raises; a bad row gives a ``SignalError``.

    All three columns are text, as a driver returns them: ``str``, or ``bytes``,
    ``bytearray`` or ``memoryview`` (binary or VARBINARY columns), decoded as UTF-8; bytes that
    are not UTF-8 are an error naming the column. ``None`` means an empty id or type, and no
    data. An ``int`` id (some MySQL users key the signal table by integer) is accepted as its
    decimal text, so ``7`` is the id ``"7"``; any other type of value (a ``bool`` id, an
    ``int`` type, a ``dict`` as data) is an error. The error names the id as best it can,
    undecodable bytes shown with backslash escapes.

    ``dollar_quotes`` says how the source database reads ``$$``: PostgreSQL as a quote,
    MySQL as part of a name; filters are checked the way the database will read them
    (``signals.sqlguard.check_filter``).
    """
    sid = _clip(_shown(signal_id))
    stype = _clip(_shown(signal_type))
    try:
        full_id = _id_text(signal_id)
        full_type = _text(signal_type, "type") or ""
        sid, stype = _clip(full_id), _clip(full_type)
        return _parse(full_id, full_type, _text(data, "data"), dollar_quotes)
    except _Problem as problem:
        return SignalError(sid, stype or "?", str(problem))
    except RecursionError:
        return SignalError(sid, stype or "?", _TOO_DEEP)
    except Exception as exc:  # a parser bug must not stop the stream either
        return SignalError(sid, stype or "?", f"internal error while parsing: {exc!r}")
