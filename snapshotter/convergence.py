"""The built-in convergence check for a configured source: materialize the sink's output for
one table and compare it with the table, row by row (``snapshotter verify``).

Meaningful once the engine has caught up with the log and the table is not being written
(otherwise the table is ahead of the output by the writes in flight).
"""

from __future__ import annotations

import psycopg

from signals.names import TableId
from snapshotter.config import Config
from snapshotter.connect import sqlalchemy_url
from snapshotter.dialects import pg_types
from snapshotter.dialects.postgres import PostgresDialect
from snapshotter.runner import libpq_url
from snapshotter.verify import Verdict, compare, materialize, read_table_rows


def check_table(config: Config, table: TableId) -> Verdict:
    source = config.source
    table = table.with_default_schema(source.default_schema)
    dialect = PostgresDialect(
        sqlalchemy_url(source), signal_table=source.signal_table_id, publication=source.publication
    )
    try:
        schema = dialect.describe(table)
    finally:
        dialect.close()
    columns = [(c.name, c.type_code) for c in schema.columns]
    key = list(schema.primary_key) or [c.name for c in schema.columns]
    topic = f"{source.topic_prefix}.{table.schema}.{table.table}"
    output = materialize(config.sink.path, topic)
    with psycopg.connect(libpq_url(config), context=pg_types.LoadContext()) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        return compare(output, read_table_rows(conn, table, columns), key)
