"""One run of a program: input in, bounded output back, under a deadline; and stopping its process group.

Used for every call of a command-line tool and for its ``--help`` probe.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import subprocess
import time

from .process import kill_tree

__all__ = ["OUTPUT_BYTES", "STDERR_BYTES", "Exchange", "stop_group"]

#: what a call keeps of standard output (past it the tool is stopped) and of standard error
OUTPUT_BYTES = 64 * 1024 * 1024
STDERR_BYTES = 1024 * 1024


def _pidfd(pid: int) -> int:
    """A descriptor that polls readable when process ``pid`` exits (Linux 5.3); -1 where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1


def stop_group(proc: subprocess.Popen[bytes]) -> None:
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
        proc: subprocess.Popen[bytes],
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
        sinks = {proc.stdout: ("out", self.out), proc.stderr: ("err", self.err)}
        view = memoryview(data)
        offset = 0
        if view:  # an empty pipe takes PIPE_BUF bytes without blocking: most inputs go before the first poll
            try:
                offset = os.write(proc.stdin.fileno(), view[: select.PIPE_BUF])
            except BrokenPipeError:
                offset = len(view)
        # the exit is awaited in the same poll as the output, on a pidfd: when both pipes end, the tool is
        # most often not a zombie yet (its descriptors close first), and a wait apart cost a poll, a pidfd,
        # a select and a close per call
        exit_fd = _pidfd(proc.pid)
        # poll(2), as subprocess.communicate: no epoll descriptor to make, register with and close per call
        with selectors.PollSelector() as selector:
            for stream in sinks:
                selector.register(stream, selectors.EVENT_READ)
            if exit_fd >= 0:
                selector.register(exit_fd, selectors.EVENT_READ)
            if offset < len(view):
                selector.register(proc.stdin, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
            try:
                while selector.get_map():
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise subprocess.TimeoutExpired(proc.args, limit)
                    for key, _ in selector.select(remaining):
                        if key.fd == exit_fd:  # exited; what it left behind may still hold its pipes
                            selector.unregister(exit_fd)
                        elif key.fileobj is proc.stdin:
                            try:
                                offset += os.write(key.fd, view[offset : offset + select.PIPE_BUF])
                            except BrokenPipeError:  # the tool stopped reading: fine
                                offset = len(view)
                            if offset >= len(view):
                                selector.unregister(proc.stdin)
                                proc.stdin.close()
                        elif chunk := os.read(key.fd, 1 << 16):
                            which, sink = sinks[key.fileobj]  # type: ignore[index]
                            self._keep(which, sink, chunk)
                            if which == "out" and self.dropped["out"] and self.stop_at_cap:
                                self.overflow = True
                                stop_group(proc)
                                self.close()
                                return b"".join(self.out), self.stderr
                        else:
                            selector.unregister(key.fileobj)
                            key.fileobj.close()  # type: ignore[union-attr]
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

    def close(self) -> None:
        """After a kill: reap the tool, close the pipes."""
        proc = self.proc
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()  # not read to the end: something outside the group may hold it open
