"""How children die with this process: the spawner thread and the guard.

A lasting child (a tool's server) carries the parent-death signal, armed in
:mod:`.process` and forked from :class:`Spawner`'s one long-lived thread; the
child of a call is started with ``vfork`` and registered with :class:`Guard`,
which :mod:`.process` (the one place that forks) starts.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Guard", "Spawner"]

#: the guard's program: it keeps the process groups it is told of (``+PGID``, ``-PGID`` lines on its standard
#: input) and, when its input ends (the process that started it died or exited), kills those still listed
_GUARD_PROGRAM = """\
import os, signal
groups, rest = set(), b""
while True:
    data = os.read(0, 65536)
    if not data:
        break
    *lines, rest = (rest + data).split(b"\\n")
    for line in lines:
        (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class Guard:
    """Kills the groups of this process's running children when it dies: the parent-death signal without a fork.

    ``PR_SET_PDEATHSIG`` can only be armed by the child itself, between fork
    and exec: a ``preexec_fn``, which makes :mod:`subprocess` use ``fork()``
    rather than ``vfork()``. A fork copies the page tables of the whole
    process: 1.7 ms of CPU time for a fresh interpreter, 9 ms for a kernel
    that holds the search model (600 MB), per call of a tool that itself runs
    in a millisecond. So a child of a call is started with ``vfork()`` and
    registered here instead: one small process per Python process (started at
    the first spawn, in its own session) reads ``+PGID`` / ``-PGID`` lines from
    a pipe whose only writer is this process; when this process dies, even by
    SIGKILL, the pipe ends and the guard SIGKILLs every group still registered
    (the whole group, where the signal reached the child alone). A group is
    unregistered once its leader is reaped; its PID is reused only after the
    kernel has handed out every other PID, so a guard acting in the
    microseconds between the reap and the line never kills a stranger.
    If the guard itself is killed, the next spawn starts another and hands it
    the groups still running.
    """

    def __init__(self, start: Callable[[str, int], subprocess.Popen[bytes]]) -> None:
        self._start_process = start
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1
        self._pid = 0
        self._groups: set[int] = set()

    def forked(self) -> None:
        """In the child of a fork of this process: drop the parent's guard (holding its pipe open would keep
        it from seeing the parent die) and its groups, which are not this process's children."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._lock = threading.Lock()
        self._proc, self._fd, self._pid, self._groups = None, -1, 0, set()

    def _start(self) -> None:
        """Start a guard (the caller holds the lock) and tell it the groups still running."""
        if self._fd >= 0:
            os.close(self._fd)
        read, write = os.pipe2(os.O_CLOEXEC)  # no child inherits the write end: the guard's EOF is our death
        try:
            self._proc = self._start_process(_GUARD_PROGRAM, read)
        finally:
            os.close(read)
        self._fd, self._pid = write, os.getpid()
        if self._groups:
            os.write(self._fd, b"".join(b"+%d\n" % group for group in self._groups))

    def _send(self, line: bytes) -> None:
        if self._pid != os.getpid() or self._proc is None or self._proc.poll() is not None:
            self._start()
        try:
            os.write(self._fd, line)
        except BrokenPipeError:  # the guard died since: another, told everything
            self._start()
            os.write(self._fd, line)

    def add(self, pgid: int) -> None:
        with self._lock:
            self._groups.add(pgid)
            self._send(b"+%d\n" % pgid)

    def remove(self, pgid: int) -> None:
        with self._lock:
            if pgid in self._groups and self._pid == os.getpid():
                self._groups.discard(pgid)
                with contextlib.suppress(OSError):
                    self._send(b"-%d\n" % pgid)


class Spawner:
    """One long-lived daemon thread that forks the children that outlive a call (``spawn(..., lasting=True)``).

    ``PR_SET_PDEATHSIG`` fires when the forking *thread* exits, not the
    process; forking from a thread that lives as long as the interpreter makes
    it mean "when this process dies" (the pipeline runs on a short-lived thread).
    """

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue[tuple[bool, Any]]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pid = 0

    def _loop(self) -> None:
        while True:
            work, reply = self._requests.get()
            try:
                reply.put((True, work()))
            except BaseException as exc:  # handed back to the caller's thread
                reply.put((False, exc))

    def run(self, work: Callable[[], Any]) -> Any:
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()  # after a fork, the old thread does not exist here
                self._thread = threading.Thread(target=self._loop, name="flakebot-spawner", daemon=True)
                self._thread.start()
        reply: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._requests.put((work, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value
