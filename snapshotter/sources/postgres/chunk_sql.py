"""The chunk SQL (``sql_common.ChunkQueries``) as PostgreSQL reads it through ADBC:
columns selected so the driver's values equal what the log decoder makes of pgoutput's
text, key bounds as one row comparison with each value cast to its column's type (so the
planner compares in that type and range-scans the key's index), compiled with ``$n``
parameters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import psycopg as sa_psycopg
from sqlalchemy.types import UserDefinedType

from snapshotter.sources.base import ChunkSpec, ColumnInfo, TableSchema
from snapshotter.sources.postgres import arrow as pg_arrow
from snapshotter.sources.sql_common import ChunkQueries

# Chunk statements are compiled with positional parameters ($1, $2, ...), as the ADBC
# driver binds them.
DOLLAR_PARAMS = sa_psycopg.dialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]


class _SqlType(UserDefinedType[Any]):
    """A column's own type, as ``format_type`` spells it, for ``CAST(:p AS <type>)``.

    The name comes from the catalog (``format_type`` quotes what needs quoting), never from
    a signal.
    """

    cache_ok = True

    def __init__(self, name: str) -> None:
        self.name = name

    def get_col_spec(self, **kw: Any) -> str:
        return self.name


class PgChunkQueries(ChunkQueries):
    """The chunk SQL (``sql_common.ChunkQueries``) as PostgreSQL reads it through ADBC."""

    def __init__(self, schema: TableSchema, key_columns: Sequence[str], float_text: bool) -> None:
        super().__init__(schema, key_columns)
        self.float_text = float_text  # the connection reads float8 as text (pg_arrow)

    def output(self, column: ColumnInfo) -> sa.ColumnElement[Any]:
        """As is when read by type, cast where the driver's binary value differs from what
        the log decoder loads (``pg_arrow.select_as``), else the text of its type's output
        function, as pgoutput sends it (``pg_types.OUTPUT_TEXT``, written with SQLAlchemy)."""
        raw = self.table.c[column.name]
        how = pg_arrow.how_read(column.type_code, self.float_text)
        if how is pg_arrow.Read.AS_IS:
            return raw
        if how is pg_arrow.Read.FLOAT_TEXT:
            return sa.cast(sa.cast(raw, sa.Text()), sa.Double()).label(column.name)
        if how is pg_arrow.Read.TEXT:
            return sa.cast(raw, sa.Text()).label(column.name)
        if how is pg_arrow.Read.BIGINT:
            return sa.cast(raw, sa.BigInteger()).label(column.name)
        one: sa.ColumnElement[Any] = sa.literal_column("1")
        return sa.case((sa.func.num_nonnulls(raw) == one, sa.func.concat(raw))).label(column.name)

    def key_range(self, prefix: str, lower: bool) -> sa.ColumnElement[bool]:
        """``(k1, k2) > (v1, v2)``: a row comparison PostgreSQL turns into one index range
        (an OR-expanded form would be a filter over the whole index), each value
        ``CAST(:<prefix>i AS <column type>)`` so the planner compares in the column's type."""
        op = ">" if lower else "<="
        values = [
            sa.cast(
                sa.bindparam(f"{prefix}{i}", type_=_SqlType(self.schema.column(k).type_name)),
                _SqlType(self.schema.column(k).type_name),
            )
            for i, k in enumerate(self.key_columns)
        ]
        if len(self.keys) == 1:
            compared: sa.ColumnElement[bool] = self.keys[0].op(op)(values[0])
        else:
            compared = sa.tuple_(*self.keys).op(op)(sa.tuple_(*values))
        return compared

    def count(self, name: str) -> sa.BindParameter[Any]:
        return sa.bindparam(name, type_=_SqlType("bigint"))


def key_params(spec: ChunkSpec) -> dict[str, Any]:
    """The key range's parameters: ``u<i>`` the upper key, ``a<i>`` the lower one."""
    params: dict[str, Any] = {f"u{i}": v for i, v in enumerate(spec.upto)}
    params.update({f"a{i}": v for i, v in enumerate(spec.after or ())})
    return params
