"""One run of a program: input in, bounded output back, under a deadline; and stopping its process group.

Used for every call of a command-line tool and for its ``--help`` probe.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import time

from .process import CallProcess, kill_tree
from .proctree import pipe_holders

__all__ = ["OUTPUT_BYTES", "STDERR_BYTES", "Exchange", "Started", "stop_group"]

#: a call's child: started by ``start_call`` (posix_spawn) or by ``spawn`` (Popen)
Started = subprocess.Popen[bytes] | CallProcess

#: what a call keeps of standard output (past it the tool is stopped) and of standard error
OUTPUT_BYTES = 64 * 1024 * 1024
STDERR_BYTES = 1024 * 1024


def _pidfd(pid: int) -> int:
    """A descriptor that polls readable when process ``pid`` exits (Linux 5.3); -1 where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def stop_group(proc: Started) -> None:
    """SIGKILL the process group ``proc`` leads (it was started with ``start_new_session``)."""
    with contextlib.suppress(PermissionError):  # a member we may not signal: the rest went
        kill_tree(proc.pid)


class Exchange:
    """``Popen.communicate`` with a deadline and bounded output, minus its sleep-polling wait for the exit.

    ``communicate(timeout=...)`` waits for the exit by sleeping in growing
    steps from 0.5 ms; for a tool that runs in a millisecond that doubles the
    call. Here the exit is awaited on a pidfd (Linux), without polling.

    Output is read in chunks and kept up to ``stdout_cap`` / ``stderr_cap``
    bytes. Past the standard output's cap the tool is stopped and
    :attr:`overflow` set (``stop_at_cap``), or the rest is read and dropped;
    what standard error drops is said at its end.
    """

    def __init__(
        self,
        proc: Started,
        *,
        stdout_cap: int = OUTPUT_BYTES,
        stderr_cap: int = STDERR_BYTES,
        stop_at_cap: bool = True,
    ) -> None:
        self.proc = proc
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self.caps = {"out": stdout_cap, "err": stderr_cap}
        self.sizes = {"out": 0, "err": 0}
        self.dropped = {"out": 0, "err": 0}
        self.stop_at_cap = stop_at_cap
        self.overflow = False
        #: the program itself exited while its output was read (what it started may still hold the output open)
        self.exited = False

    @property
    def stderr(self) -> bytes:
        return b"".join(self.err) + self._note("err")

    def _note(self, which: str) -> bytes:
        dropped = self.dropped[which]
        return (
            f"\n[flakebot: {dropped} more bytes dropped (truncated at {self.caps[which]} bytes)]\n".encode()
            if dropped
            else b""
        )

    def _keep(self, which: str, sink: list[bytes], chunk: bytes) -> None:
        room = self.caps[which] - self.sizes[which]
        if room > 0:
            sink.append(chunk[:room])
            self.sizes[which] += min(room, len(chunk))
        self.dropped[which] += max(len(chunk) - max(room, 0), 0)

    def run(self, data: bytes, limit: float) -> tuple[bytes, bytes]:
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        deadline = time.monotonic() + limit
        sinks = {
            proc.stdout.fileno(): ("out", self.out, proc.stdout),
            proc.stderr.fileno(): ("err", self.err, proc.stderr),
        }
        view = memoryview(data)
        offset = 0
        in_fd = proc.stdin.fileno()
        if view:  # an empty pipe takes PIPE_BUF bytes without blocking: most inputs go before the first poll
            try:
                offset = os.write(in_fd, view[: select.PIPE_BUF])
            except BrokenPipeError:
                offset = len(view)
        # the exit is awaited in the same poll as the output, on a pidfd: when both pipes end, the tool is
        # most often not a zombie yet (its descriptors close first), and a wait apart cost a poll, a pidfd,
        # a select and a close per call
        exit_fd = _pidfd(proc.pid)
        # poll(2) itself, as subprocess.communicate: no epoll descriptor per call, no selectors' keys
        watch = select.poll()
        for fd in sinks:
            watch.register(fd, select.POLLIN)
        waiting = len(sinks)
        if exit_fd >= 0:
            watch.register(exit_fd, select.POLLIN)
            waiting += 1
        if offset < len(view):
            watch.register(in_fd, select.POLLOUT)
            waiting += 1
        else:
            proc.stdin.close()
            in_fd = -1
        try:
            while waiting:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise subprocess.TimeoutExpired(proc.args, limit)
                for fd, _ in watch.poll(remaining * 1000):
                    if fd == exit_fd:  # exited; what it left behind may still hold its pipes
                        self.exited = True
                        watch.unregister(exit_fd)
                        waiting -= 1
                    elif fd == in_fd:
                        try:
                            offset += os.write(fd, view[offset : offset + select.PIPE_BUF])
                        except BrokenPipeError:  # the tool stopped reading: fine
                            offset = len(view)
                        if offset >= len(view):
                            watch.unregister(fd)
                            waiting -= 1
                            proc.stdin.close()
                            in_fd = -1
                    elif chunk := os.read(fd, 1 << 16):
                        which, sink, _ = sinks[fd]
                        self._keep(which, sink, chunk)
                        if which == "out" and self.dropped["out"] and self.stop_at_cap:
                            self.overflow = True
                            stop_group(proc)
                            self.close()
                            return b"".join(self.out), self.stderr
                    else:
                        watch.unregister(fd)
                        waiting -= 1
                        sinks[fd][2].close()
        finally:
            if exit_fd >= 0:
                os.close(exit_fd)
        if exit_fd >= 0:
            proc.wait()  # the pidfd said it exited: this reaps it at once
        else:
            self._reap(deadline, limit)
        return b"".join(self.out) + self._note("out"), b"".join(self.err) + self._note("err")

    def _reap(self, deadline: float, limit: float) -> None:
        """Wait for the exit where there are no pidfds: Popen's own polling wait."""
        proc = self.proc
        if proc.poll() is None:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.0))

    def abandon(self) -> None:
        """Give up on the run (its time ran out, or it was interrupted): SIGKILL its process group at once, and
        whatever outside the group (a child in its own session) still holds its output pipes; reap it, close."""
        proc = self.proc
        pipes = set()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                with contextlib.suppress(OSError, ValueError):
                    pipes.add(os.fstat(stream.fileno()).st_ino)
        stop_group(proc)
        for pid in pipe_holders(pipes) if pipes else ():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        """After a kill: reap the tool, close the pipes."""
        proc = self.proc
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()  # not read to the end: something outside the group may hold it open
