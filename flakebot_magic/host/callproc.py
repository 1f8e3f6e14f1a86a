"""A CLI call's child as :func:`~.process.start_call` starts it: its pid, its pipe ends, its wait and kill.

What a call uses of a :class:`subprocess.Popen`, without its Python: the pipe
ends are bare descriptors (no ``fstat``, ``ioctl`` and ``lseek`` each, as a
buffered file's), the exit is awaited on a pidfd. Nothing here starts a
process (:mod:`.process` does).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
from collections.abc import Callable

__all__ = ["CallProcess", "PipeEnd"]


class PipeEnd:
    """One end of a call's pipe: its descriptor, read and written unbuffered (no ``fstat`` to make, as a file's)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.closed = fd, False

    def fileno(self) -> int:
        return self.fd

    def read(self, size: int = 1 << 16) -> bytes:
        return os.read(self.fd, size)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            os.close(self.fd)


class CallProcess:
    """A call's child started by :func:`start_call`: what a call uses of a ``Popen`` (pid, pipes, wait, kill).

    ``stdin``/``stdout``/``stderr`` are its pipe ends (:class:`PipeEnd`). Reaping it (:meth:`wait`,
    :meth:`poll`) calls ``reaped`` with its pid (the guard forgets its group, as for a spawned child).
    """

    def __init__(
        self, args: list[str], pid: int, stdin: int, stdout: int, stderr: int, *, reaped: Callable[[int], None]
    ) -> None:
        self.args, self.pid, self._on_reaped = args, pid, reaped
        self.stdin, self.stdout, self.stderr = PipeEnd(stdin), PipeEnd(stdout), PipeEnd(stderr)
        self.returncode: int | None = None

    def _reaped(self, flags: int) -> int | None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler): its status is lost, as in Popen
            pid, status = self.pid, 0
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        self._on_reaped(self.pid)
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._reaped(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        """Reap it (waiting up to ``timeout`` s, then ``subprocess.TimeoutExpired``); its exit code."""
        if self.returncode is None and timeout is not None:
            exit_fd = os.pidfd_open(self.pid)
            try:
                if not _readable(exit_fd, timeout):
                    raise subprocess.TimeoutExpired(self.args, timeout)
            finally:
                os.close(exit_fd)
        code = self.returncode if self.returncode is not None else self._reaped(0)
        assert code is not None
        return code

    def kill(self) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _readable(fd: int, timeout: float) -> bool:
    (watch := select.poll()).register(fd, select.POLLIN)
    return bool(watch.poll(max(timeout, 0.0) * 1000))
