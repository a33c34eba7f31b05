"""The file channel's IO ([signals] file): the lines appended to the file since the offset
state holds, read without ever writing the file (``signals.lines`` parses them).

The offset moves on with the lines handed out and is saved with the checkpoint that holds
what they did, so after a crash the lines since the last checkpoint are read and acted on
again, as their effects were lost with it; a line is acted on once in what survives. A file
shorter than the offset was replaced or truncated: it is read from its start (logged), and
signal ids already processed at the engine's position are skipped as for the table.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import BinaryIO

from signals.lines import MAX_LINE_BYTES, SignalLine, complete_lines

log = logging.getLogger("snapshotter.engine")

READ_BYTES = 4 * MAX_LINE_BYTES  # read per poll at most (a burst of signals spans polls)


class SignalFile:
    """The file channel's reader (``signal_channels.ChannelReader``)."""

    def __init__(self, path: Path, offset: int) -> None:
        self.path = path
        self.key = f"file:{path}"  # in state's signal_channels
        self.label = f"signal file {path}"
        self.offset = offset  # the bytes acted on (state's signal_channels[key])
        self._line = 1  # the number of the line at ``offset``, for messages (1 after a restart)
        self._missing_logged = False

    def read(self) -> list[SignalLine]:
        """The complete lines appended since the last read; ``offset`` moves past them."""
        try:
            return self._read()
        except FileNotFoundError:
            if not self._missing_logged:
                log.info("signal file %s does not exist yet; waiting for it", self.path)
                self._missing_logged = True
        except OSError as exc:  # unreadable (permissions, a directory): the stream goes on
            if not self._missing_logged:
                log.warning("signal file %s cannot be read (%s); waiting for it", self.path, exc)
                self._missing_logged = True
        return []

    def rewind(self, offset: int) -> None:
        """Read again from byte ``offset`` (a line whose action did not complete)."""
        self.offset = offset

    def _read(self) -> list[SignalLine]:
        size = os.stat(self.path).st_size
        if size < self.offset:
            log.warning(
                "signal file %s is shorter (%d bytes) than what was read of it (%d): it was "
                "replaced or truncated; reading it from its start",
                self.path,
                size,
                self.offset,
            )
            self.offset, self._line = 0, 1
        if size == self.offset:
            self._missing_logged = False
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            buffer = f.read(READ_BYTES)
            lines, end, line = complete_lines(buffer, self.offset, self._line)
            if not lines and end == self.offset and len(buffer) > MAX_LINE_BYTES:
                lines, end, line = self._skip_long_line(f, buffer)
        self.offset, self._line = end, line
        self._missing_logged = False
        return lines

    def close(self) -> None:
        pass  # nothing held open between reads

    def _skip_long_line(self, f: BinaryIO, buffer: bytes) -> tuple[list[SignalLine], int, int]:
        """A line longer than any signal: passed over once it ends, as one problem."""
        length = len(buffer)
        while (chunk := f.read(READ_BYTES)) and b"\n" not in chunk:
            length += len(chunk)
        if not chunk:
            return [], self.offset, self._line  # not ended yet: looked at again next time
        length += chunk.index(b"\n") + 1
        problem = SignalLine(
            self.offset,
            f"line {self._line}",
            problem=f"line {self._line}: longer than {MAX_LINE_BYTES} bytes; a signal is one "
            "short JSON object",
        )
        return [problem], self.offset + length, self._line + 1
