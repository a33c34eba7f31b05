"""Sources: everything that differs per database, one package each.

``base`` holds the small interface the engine reads chunks through (``Dialect``) and the
types it shares; ``log`` what log readers hand the engine (``LogReader``, its items);
``connector`` one object per source that owns its dialect, log reader, setup checks and
position checks, found by ``connector_for(source config)``. ``postgres/`` and ``mysql/`` hold
the rest (dialect, types, setup, log decoder and reader, positions); the chunk SQL both
build on is in ``sql_common``.
"""
