"""The max-key, chunk and bound queries of one Spanner table and key, as SQL text with its
parameters (``sql.Statement``).

The same three shapes as ``sql_common.ChunkQueries``, which builds them with SQLAlchemy for
PostgreSQL and MySQL: Spanner's two SQL dialects have no SQLAlchemy compiler among the
project's dependencies, so the shapes are composed here from ``sql``'s quoting, parameters and
written-out key ranges, once, in ``_select``:

- ``max_key``: the key columns, under the filter, by the key descending, one row;
- ``chunk``: every column in the key range, by the key, ``limit`` rows;
- ``bound``: the key columns in the same range and order, the row ``limit - 1`` past the
  first (``LIMIT 1 OFFSET``): the key that ends a chunk of ``limit`` rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from signals.names import TableId
from snapshotter.core.keys import Key
from snapshotter.sources.base import ChunkSpec
from snapshotter.sources.spanner import sql
from snapshotter.sources.spanner.client import SpannerDialectKind
from snapshotter.sources.spanner.types import SpannerType


class SpannerChunkQueries:
    """The queries of ``table`` keyed by ``key_columns`` (of Spanner types ``key_types``)."""

    def __init__(
        self,
        kind: SpannerDialectKind,
        table: TableId,
        key_columns: Sequence[str],
        key_types: Sequence[SpannerType],
    ) -> None:
        self.kind = kind
        self.table = table
        self.key_columns = tuple(key_columns)
        self.key_types = tuple(key_types)

    def max_key(self, condition: str | None) -> tuple[sql.Statement, str]:
        """The largest key under the filter (a backward scan of the key)."""
        st = sql.Statement(self.kind)
        where = [f"({condition})"] if condition is not None else []
        return st, self._select(st, self.key_columns, where, descending=True, limit="1")

    def chunk(self, spec: ChunkSpec) -> tuple[sql.Statement, str]:
        """Every column of ``spec``'s range, in key order, ``spec.limit`` rows."""
        st = sql.Statement(self.kind)
        where = self._range(st, spec)
        limit = st.param(spec.limit, sql.int64())
        return st, self._select(st, spec.schema.column_names, where, limit=limit)

    def bound(self, spec: ChunkSpec) -> tuple[sql.Statement, str]:
        """The key ``spec.limit - 1`` rows past the first of ``spec``'s range."""
        st = sql.Statement(self.kind)
        where = self._range(st, spec)
        skip = st.param(spec.limit - 1, sql.int64())
        return st, self._select(st, self.key_columns, where, limit="1", offset=skip)

    def _range(self, st: sql.Statement, spec: ChunkSpec) -> list[str]:
        """``spec``'s key range (after, up to its upper key) and its filter."""
        where = []
        if spec.after is not None:
            where.append(f"({self._after(st, spec.after)})")
        where.append(f"({sql.key_upto(st, self.key_columns, self.key_types, spec.upto)})")
        if spec.condition is not None:
            where.append(f"({spec.condition})")
        return where

    def _after(self, st: sql.Statement, key: Key) -> str:
        return sql.key_after(st, self.key_columns, self.key_types, key)

    def _select(
        self,
        st: sql.Statement,
        columns: Sequence[str],
        where: Sequence[str],
        *,
        descending: bool = False,
        limit: str,
        offset: str | None = None,
    ) -> str:
        text = (
            f"SELECT {', '.join(st.name(c) for c in columns)} "
            f"FROM {sql.table_ref(self.kind, self.table)}"
        )
        if where:
            text += " WHERE " + " AND ".join(where)
        text += f" ORDER BY {sql.order_by(st, self.key_columns, descending=descending)}"
        text += f" LIMIT {limit}"
        return text + (f" OFFSET {offset}" if offset is not None else "")
