"""The pure core: events, positions, key codec, the DBLog window and snapshot state.

Nothing here does IO or imports a database driver; tests check that.
"""

from snapshotter.core.events import ChangeEvent, Op, Row, SnapshotMarker, Source
from snapshotter.core.keys import Key, KeyCodecError, KeyValue, decode_key, encode_key
from snapshotter.core.position import Position, PositionError
from snapshotter.core.state import (
    STATE_VERSION,
    EngineState,
    SnapshotStatus,
    StateError,
    TableProgress,
)
from snapshotter.core.window import ChunkWindow, ReadBatch, WindowOrderError, WindowPhase

__all__ = [
    "STATE_VERSION",
    "ChangeEvent",
    "ChunkWindow",
    "EngineState",
    "Key",
    "KeyCodecError",
    "KeyValue",
    "Op",
    "Position",
    "PositionError",
    "ReadBatch",
    "Row",
    "SnapshotMarker",
    "SnapshotStatus",
    "Source",
    "StateError",
    "TableProgress",
    "WindowOrderError",
    "WindowPhase",
    "decode_key",
    "encode_key",
]
