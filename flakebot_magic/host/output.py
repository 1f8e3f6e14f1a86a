"""Reading a child's output in bounded pieces: the one line reader (:class:`LineReader`), and a capped capture.

The runner's commands (:mod:`.process`) and the long-lived tools' logs
(``clients/lifecycle.py``) read their pipes through :class:`LineReader`: a
line without end is never held whole.
"""

from __future__ import annotations

import codecs
import os
import selectors
from collections.abc import Callable

__all__ = ["MAX_CAPTURE", "MAX_LINE", "LineCallback", "LineReader", "Pipes", "StreamCapture"]

MiB = 1024**2
#: cap on the output kept in memory per stream; past it the output is drained and dropped, with a note
MAX_CAPTURE = 64 * MiB
#: a "line" handed to observers is at most this long (a line without newline arrives in pieces)
MAX_LINE = 64 * 1024
#: how much one read of a pipe takes
_CHUNK = 64 * 1024

LineCallback = Callable[[str, str], None]  # (stream, line)


class LineReader:
    r"""Bytes in chunks to text lines of at most ``max_line`` characters: a line without end is never held whole.

    ``emit(line, newline)`` gets each line (``newline`` is ``""`` for a last
    line without one). A longer line arrives in pieces (``split``), each but
    the last with ``newline`` ``""``, so that the pieces and their ends, joined,
    are the stream as it came (a capture of ``git ls-tree -z``, one "line" of
    every path, is data: a newline put in it renamed a path); or as its head and
    then a note of how many bytes of it were dropped.

    >>> lines = []; reader = LineReader(lambda line, end: lines.append(line), max_line=4, split=False)
    >>> reader.feed(b"ab\nabcdefgh"); reader.feed(b"ij\nz", final=True); lines
    ['ab', 'abcd', '[flakebot: 6 more bytes of this line dropped]', 'z']
    """

    def __init__(self, emit: Callable[[str, str], None], max_line: int = MAX_LINE, *, split: bool = True) -> None:
        self.emit = emit
        self.max_line = max_line
        self.split = split
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        #: bytes dropped so far of the over-long line being read (``split=False``)
        self.dropped = 0

    def feed(self, data: bytes, final: bool = False) -> None:
        lines = (self.pending + self.decoder.decode(data, final)).split("\n")
        self.pending = lines.pop()
        for line in lines:
            self._line(line, "\n")
        if len(self.pending) > self.max_line:
            if self.split:
                while len(self.pending) > self.max_line:
                    self.emit(self.pending[: self.max_line], "")  # a piece: the line goes on
                    self.pending = self.pending[self.max_line :]
            elif self.dropped:
                self.dropped += len(self.pending.encode("utf-8", "surrogatepass"))
                self.pending = ""
            else:
                self.emit(self.pending[: self.max_line], "\n")
                self.dropped = len(self.pending[self.max_line :].encode("utf-8", "surrogatepass"))
                self.pending = ""
        if final and (self.pending or self.dropped):
            self._line(self.pending, "")
            self.pending = ""

    def _line(self, line: str, newline: str) -> None:
        if self.dropped:  # the end of a line whose head went out
            dropped = self.dropped + len(line.encode("utf-8", "surrogatepass"))
            self.dropped = 0
            self.emit(f"[flakebot: {dropped} more bytes of this line dropped]", "\n")
            return
        while len(line) > self.max_line:
            if not self.split:
                self.dropped = len(line[self.max_line :].encode("utf-8", "surrogatepass"))
                self.emit(line[: self.max_line], "\n")
                self._line("", newline)
                return
            self.emit(line[: self.max_line], "")  # a piece: the line goes on
            line = line[self.max_line :]
        self.emit(line, newline)


class StreamCapture:
    """One output pipe of a command (:class:`~flakebot_magic.host.process.ProcessRunner`): its lines (:class:`LineReader`) kept up to ``cap`` bytes, then a note."""

    def __init__(self, name: str, cap: int, on_line: LineCallback | None) -> None:
        self.name = name
        self.cap = cap
        self.on_line = on_line
        self.lines = LineReader(self._emit)
        self.kept: list[str] = []
        self.size = 0  # bytes read
        self.kept_size = 0
        self.truncated = False

    def feed(self, data: bytes, final: bool = False) -> None:
        self.size += len(data)
        if not self.truncated:
            self.lines.feed(data, final)

    def _emit(self, line: str, newline: str = "\n") -> None:
        if self.truncated:
            return
        if self.kept_size + len(line) + 1 > self.cap:
            self.truncated = True
            note = f"[flakebot: output truncated after {self.cap / MiB:g} MiB]"
            self.kept.append(note + "\n")
            if self.on_line is not None:
                self.on_line(self.name, note)
            return
        self.kept.append(line + newline)
        self.kept_size += len(line) + 1
        if self.on_line is not None:
            self.on_line(self.name, line)

    def text(self) -> str:
        return "".join(self.kept)


class Pipes:
    """A command's stdout and stderr (:class:`~flakebot_magic.host.process.ProcessRunner`), read without blocking,
    by one selector, into their :class:`StreamCapture` s."""

    def __init__(self, stdout: int, stderr: int, cap: int, on_line: LineCallback | None) -> None:
        self.streams = {stdout: StreamCapture("stdout", cap, on_line), stderr: StreamCapture("stderr", cap, on_line)}
        self.selector = selectors.DefaultSelector()
        for fd in self.streams:
            os.set_blocking(fd, False)
            self.selector.register(fd, selectors.EVENT_READ)

    def read(self, timeout: float) -> None:
        """What the pipes hold now, waiting up to ``timeout`` seconds for some; a pipe at its end is done."""
        for key, _ in self.selector.select(timeout=timeout):
            fd = int(key.fd)
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                continue
            if data:
                self.streams[fd].feed(data)
            else:
                self.selector.unregister(fd)

    @property
    def open(self) -> bool:
        """Whether a pipe is not at its end yet: some process still holds its write end."""
        return bool(self.selector.get_map())

    def close(self) -> None:
        """Stop reading; each capture's last line (one without a newline) is kept."""
        self.selector.close()
        for stream in self.streams.values():
            stream.feed(b"", final=True)

    def texts(self) -> tuple[str, str]:
        """What was kept of stdout and stderr."""
        out, err = self.streams.values()
        return out.text(), err.text()
