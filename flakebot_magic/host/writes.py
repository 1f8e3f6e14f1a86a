"""Writing to a pipe or a socket whose reader is not trusted: every write ends by a deadline (issue 33, class D).

A reader that never reads (a deployed MCP server flooding requests, an agent that stopped reading the server's
stdout, a confined service) fills the pipe or the socket's buffer; a blocking write then waits for it forever,
whatever timeout the caller was given. :func:`write_within` is the one writer for such peers: it waits for room
with ``poll`` up to the deadline and writes what fits, so a call's timeout holds while it writes, too.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
from typing import IO

__all__ = ["PEER_SECONDS", "PeerStream", "WriteTimeout", "send_within", "write_within"]

#: how long a server's write to its client (``flakebot mcp``'s stdout, the bridge's) may wait for the client to
#: read: past it the client is taken as gone, and the session ends as if it had closed its input
PEER_SECONDS = 60.0


class WriteTimeout(TimeoutError):
    """The reader took in less than was written before the deadline; ``written`` bytes went."""

    def __init__(self, message: str, written: int) -> None:
        super().__init__(message)
        self.written = written


def write_within(fd: int, data: bytes | memoryview, deadline: float) -> None:
    """Write all of ``data`` to ``fd`` by ``deadline`` (``time.monotonic()``), or raise :class:`WriteTimeout`.

    ``fd`` is made non-blocking (it stays so: every later write of the caller's goes through here too).
    ``BrokenPipeError`` (the reader is gone) is raised as it is.

    >>> r, w = os.pipe()
    >>> write_within(w, b"x" * 10, time.monotonic() + 1); os.read(r, 100)
    b'xxxxxxxxxx'
    >>> try:
    ...     write_within(w, b"x" * (1 << 22), time.monotonic() + 0.2)  # 4 MiB into a 64 KiB pipe nobody reads
    ... except WriteTimeout as exc:
    ...     0 < exc.written < 1 << 22
    True
    """
    view = memoryview(data).cast("B")
    os.set_blocking(fd, False)
    watch = select.poll()
    watch.register(fd, select.POLLOUT)
    written = 0
    while written < len(view):
        try:
            written += os.write(fd, view[written:])
            continue
        except BlockingIOError:
            pass
        except InterruptedError:
            continue
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WriteTimeout(f"the reader took {written} of {len(view)} bytes before the deadline", written)
        for _, events in watch.poll(remaining * 1000):
            if events & (select.POLLERR | select.POLLHUP) and not events & select.POLLOUT:
                raise BrokenPipeError(errno.EPIPE, "the reader is gone")


def send_within(sock: socket.socket, data: bytes, deadline: float) -> None:
    """``sock.sendall(data)`` that ends by ``deadline``: :class:`WriteTimeout` when the peer does not read.

    Python's own socket timeout bounds one ``sendall`` as a whole (since 3.5), so this sets it to what is left;
    the socket's earlier timeout is put back.
    """
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise WriteTimeout("the deadline passed before the write", 0)
    before = sock.gettimeout()
    sock.settimeout(remaining)
    try:
        sock.sendall(data)
    except TimeoutError:
        raise WriteTimeout("the peer did not take the data before the deadline", 0) from None
    finally:
        sock.settimeout(before)


class PeerStream:
    """A stream a server answers its client on, one writer at a time, each write within ``seconds``.

    Once a write failed (the client did not read for ``seconds``, or is gone) every later one raises
    ``BrokenPipeError`` at once: the threads that notify the client (builds, the inventory watcher) never wait
    on it, and the serving loop ends. A stream without a descriptor (a test's ``BytesIO``) is written as it is.
    """

    def __init__(self, stream: IO[bytes], seconds: float = PEER_SECONDS) -> None:
        self.stream = stream
        self.seconds = seconds
        self._lock = threading.Lock()
        self._gone = False

    def write(self, data: bytes) -> None:
        with self._lock:
            if self._gone:
                raise BrokenPipeError(errno.EPIPE, "the client stopped reading")
            try:
                try:
                    fd = self.stream.fileno()
                except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: no descriptor
                    fd = -1
                self.stream.flush()
                if fd < 0:
                    self.stream.write(data)
                    self.stream.flush()
                else:
                    write_within(fd, data, time.monotonic() + self.seconds)
            except OSError:
                self._gone = True
                raise
