"""The base of a Parquet table's ``current/``: its files, their names, and the files no
metadata names (what a compaction cut short by a crash leaves).

A base is a set of files directly in ``current/``, each named ``<base>.<file>``, where
``<base>`` is ``base-<batch, 12 digits>`` (``-<tag>`` after it when a compaction at the
batch the base is already named after writes beside it): its bucket files
(``<base>.bucket-00003.parquet``, ``formats.parquet``), the files of READ rows appended to it
(``<base>.b<batch, 12 digits>-<uuid>.parquet``), or, in an earlier layout, Spark's part
files of a compaction (``base-000000000012.part-00000-<uuid>-c000.snappy.parquet``).
Flat, because that is the one layout every plain reader reads whole with its default
options:

* ``spark.read.parquet(current)`` reads the files of ``current/`` and of partition
  directories (``name=value``) only: a plain subdirectory is not read at all (0 files:
  "Unable to infer schema");
* a partition directory adds a column the table does not have (``__base`` before), and
  pyarrow (``pyarrow.parquet.read_table``, ``pyarrow.dataset``) and pandas skip every name
  starting with ``_`` or ``.``: they read 0 rows of ``current/__base=<batch>``, no error.

A compaction (``formats.parquet``) has Spark write the buckets it replaces into
``current/.compacting-<base>-<tag>/`` (hidden from every reader), commits, then moves them
into place. What a crash leaves of a base the metadata does not name are *strays*
(``remove_strays``), all of whose rows the changelog holds.

Older layouts stay recognised, as the base a table's metadata names and as strays to remove:
a directory ``current/__base=<batch>`` or (older still) ``current/v=<batch>``. A table whose
base is of an older layout is rewritten at its next compaction
(``Lander.compaction_due``).
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from snapshotter.sinks.spark.files import (
    add_file,
    parquet_files,
    parquet_rows,
    place_file,
    remove_files,
)
from snapshotter.sinks.spark.types import BASE_PARTITION

log = logging.getLogger(__name__)

PREFIX = "base-"
LEGACY_PREFIXES = (f"{BASE_PARTITION}=", "v=")
WRITING = ".compacting-"  # a compaction's output before it is published
_APPENDED = "b"  # <base>.b<batch>-<uuid>.parquet
_LEGACY_APPENDED = "part-b"  # in a directory base: part-b<batch>-<uuid>.parquet


def base_name_for(batch: int) -> str:
    """The name of a base compacted at ``batch``."""
    return f"{PREFIX}{batch:012d}"


def legacy_base_dir(batch: int) -> str:
    """The directory of a base of the first layout (metadata without ``base_dir``)."""
    return f"v={batch:012d}"


def is_legacy(name: str) -> bool:
    """Whether a base is a directory of an older layout, which plain readers cannot read."""
    return name.startswith(LEGACY_PREFIXES)


def owner(info: pafs.FileInfo) -> str | None:
    """The base an entry of ``current/`` belongs to (None: not a base's)."""
    name: str = info.base_name
    if info.type is pafs.FileType.Directory:
        if is_legacy(name):
            return name
        if name.startswith(WRITING):
            return name[len(WRITING) :]
        return None
    if name.startswith(PREFIX):
        return name.split(".", 1)[0]
    if name.startswith("." + PREFIX):  # a file of add_file not yet renamed into place
        return name[1:].split(".", 1)[0]
    return None


def _entries(fs: pafs.FileSystem, current: str) -> list[tuple[str, pafs.FileInfo]]:
    selector = pafs.FileSelector(current, allow_not_found=True)
    found = []
    for info in fs.get_file_info(selector):
        name = owner(info)
        if name is not None:
            found.append((name, info))
    return found


def files(fs: pafs.FileSystem, current: str, base: str) -> list[str]:
    """The data files of ``base`` (filesystem paths), sorted."""
    if is_legacy(base):
        return sorted(parquet_files(fs, f"{current}/{base}"))
    return sorted(
        info.path
        for owner, info in _entries(fs, current)
        if owner == base and info.type is pafs.FileType.File and info.base_name.startswith(base)
    )


def rows(fs: pafs.FileSystem, current: str, base: str) -> int:
    """The rows of ``base``, from its files' footers."""
    if is_legacy(base):
        return parquet_rows(fs, f"{current}/{base}")
    total = 0
    for path in files(fs, current, base):
        with fs.open_input_file(path) as f:
            total += pq.ParquetFile(f).metadata.num_rows
    return total


def publish(fs: pafs.FileSystem, current: str, base: str) -> None:
    """Move the data files a compaction wrote into ``current/.compacting-<base>`` into
    ``current/`` as files of ``base``, and remove what is left of that directory (Spark's
    ``_SUCCESS`` and checksums)."""
    written = f"{current}/{WRITING}{base}"
    for path in parquet_files(fs, written):
        fs.move(path, f"{current}/{base}.{path.rsplit('/', 1)[-1]}")
    fs.delete_dir(written)


def append(fs: pafs.FileSystem, current: str, base: str, batch: int, table: pa.Table) -> None:
    """Add ``table``, READ rows of ``batch`` that need no merge, to ``base`` as a file."""
    if is_legacy(base):
        add_file(fs, f"{current}/{base}", f"{_LEGACY_APPENDED}{batch:012d}-", table)
    else:
        add_file(fs, current, f"{base}.{_APPENDED}{batch:012d}-", table)


def append_file(fs: pafs.FileSystem, current: str, base: str, batch: int, source: Path) -> None:
    """Add the local file ``source`` (READ rows of ``batch`` that need no merge, in the
    current state's columns) to ``base``: linked or copied, not written again."""
    if is_legacy(base):
        directory, prefix = f"{current}/{base}", _LEGACY_APPENDED
    else:
        directory, prefix = current, f"{base}.{_APPENDED}"
    place_file(fs, source, directory, f"{prefix}{batch:012d}-{uuid.uuid4().hex}.parquet")


def drop_appended(fs: pafs.FileSystem, current: str, base: str, since: int) -> int:
    """Delete the files appended to ``base`` for batches ``since`` on; how many went."""
    directory, prefix = (
        (f"{current}/{base}", _LEGACY_APPENDED)
        if is_legacy(base)
        else (current, f"{base}.{_APPENDED}")
    )

    def again(name: str) -> bool:
        digits = name[len(prefix) : len(prefix) + 12]
        return name.startswith(prefix) and digits.isdigit() and int(digits) >= since

    return remove_files(fs, directory, again)


def strays(fs: pafs.FileSystem, current: str, keep: str | None) -> list[str]:
    """The bases with files (or directories) under ``current`` other than ``keep``, the
    one the table's metadata names; sorted."""
    return sorted({owner for owner, _ in _entries(fs, current) if owner != keep})


def remove_strays(
    fs: pafs.FileSystem, current: str, keep: str | None, *, table: object, crashed: bool
) -> list[str]:
    """Delete what belongs to bases other than ``keep``: a plain reader of ``current/``
    would read their rows besides the named base's (keys twice, deleted rows back). Their
    rows are all in the changelog too (a base is only ever made from it)."""
    doomed: set[str] = set()
    for owner, info in _entries(fs, current):
        if owner == keep:
            continue
        doomed.add(owner)
        if info.type is pafs.FileType.Directory:
            fs.delete_dir(info.path)
        else:
            fs.delete_file(info.path)
    if crashed and doomed:
        log.info(
            "%s: removed %s from current/, left by an unfinished compaction",
            table,
            ", ".join(sorted(doomed)),
        )
    return sorted(doomed)
