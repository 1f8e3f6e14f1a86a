"""How children die with this process: the spawner thread, the guard and the gate.

A lasting child (a tool's server) carries the parent-death signal, armed in
:mod:`.process` and forked from :class:`Spawner`'s one long-lived thread; the
child of a call is started with ``vfork`` behind a gate (:func:`gated`) and
registered with :class:`Guard`, which :mod:`.process` (the one place that forks) starts.

The gate closes the window between the start of a call's child and its
registration: a child that exists but that the guard does not know of would
outlive this process if it died (SIGKILL) right then. So the child's first
program is a shell that waits for one line on its standard input, a pipe whose
only writer is this process, and becomes the command only when it comes; it
is written once the guard holds the child's group. When this process dies
before, the pipe ends and the shell exits without having run anything; after,
the guard kills the group. Either way nothing of a call outlives this process,
whenever it is killed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import queue
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["GATE_EXIT", "MARK", "Guard", "Spawner", "check_program", "gated"]

#: the variable a CLI call's child carries the guard's mark in (:meth:`Guard.ready`): no gate before it (a shell's
#: exec would double the call's cost), so a guard whose parent died finds a child it was not told of yet by it
MARK = "FLAKEBOT_GUARD_MARK"

#: the exit status of a gated child whose parent died before it let it pass (it ran nothing)
GATE_EXIT = 125
#: the gate (``sh -c``, arguments: the command): one line on standard input, then the command; at the end of the
#: input instead, exit. dash reads its input a byte at a time, so the command's input starts right after the line.
_GATE = f'read -r _ || exit {GATE_EXIT}; exec "$@"'
#: the gate of a command without input: the line comes on a pipe of its own, the command reads ``/dev/null``
_GATE_NULL = f'read -r _ || exit {GATE_EXIT}; exec "$@" </dev/null'
#: what the kernel runs without ``binfmt_misc``: an ELF binary, a ``#!`` script
_RUNNABLE = (b"\x7fELF", b"#!")


def gated(argv: Sequence[str], *, stdin: bool, pwd: bool = True) -> list[str]:
    """``argv`` behind the gate: it runs once its line is written to the child's standard input.

    ``stdin``: the command reads the rest of that pipe (else ``/dev/null``).
    ``pwd``: its environment holds ``PWD``; else the shell's own (dash exports
    one) is unset, so the command gets exactly the environment it was given.
    """
    gate = _GATE if stdin else _GATE_NULL
    return ["/bin/sh", "-c", gate if pwd else f"unset PWD; {gate}", "flakebot-gate", *argv]


def check_program(argv0: str, env: Mapping[str, str] | None, cwd: Path | str | None) -> None:
    """Raise the ``OSError`` a direct start of ``argv0`` would raise: the gate must not start what it cannot.

    A start behind the gate fails later, in the shell, which says so on
    standard error, or, for a file the kernel cannot run (``ENOEXEC``: a
    truncated or overwritten binary), runs it as a shell script. So the program
    is found here as :class:`subprocess.Popen` finds it (the ``PATH`` of
    ``env``; a path with a slash from ``cwd``) and must be executable and an ELF
    binary or a ``#!`` script.
    """
    if os.sep in argv0:
        path: str | None = os.path.join(cwd, argv0) if cwd is not None else argv0
        if not os.path.exists(path):  # type: ignore[arg-type]
            path = None
    else:
        path = shutil.which(argv0, path=os.pathsep.join(os.get_exec_path(env)))
    if path is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv0)
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), argv0)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except PermissionError:  # executable but not readable: the kernel runs it, this process cannot look
        return
    try:
        head = os.read(fd, 4)
    finally:
        os.close(fd)
    if not head.startswith(_RUNNABLE):
        raise OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), argv0)


#: seconds between the guard's reads of its pipe while this process lives (it wakes for nothing else)
DRAIN_EVERY = 0.5
#: the guard pipe's size asked for: lines that wait for the next read (64 KiB when the kernel refuses)
PIPE_BYTES = 1 << 20

#: the guard's program: it keeps the process groups it is told of (``+PGID TICKS``, ``-PGID`` lines on its standard
#: input) and, when its input ends (the process that started it died or exited), kills those still listed.
#: It waits on its input with no event asked for: the end of the input (``POLLHUP``, always reported) wakes it
#: at once, a line does not (a wake-up per line costs the writer CPU time, and on a busy machine its turn on
#: the CPU: 5 us and 250 us a line measured here); it reads what came every ``DRAIN_EVERY`` s.
#: ``TICKS``: the clock (boot time, clock ticks) just after the leader started. A ``-PGID`` comes at the reap, but
#: the guard reads its pipe every ``DRAIN_EVERY`` s, so before a kill it checks the group is still the one it was told of: a process with
#: that PID that started after ``TICKS`` is another that reused the PID, and is left alone; no process with
#: that PID means the number is held by the group's leftovers only (a PID in use as a group id is not reused).
_GUARD_PROGRAM = f"""\
import os, select, signal
groups, rest, ended, mark = {{}}, b"", False, b""
os.set_blocking(0, False)
watch = select.poll()
watch.register(0, 0)
while not ended:
    watch.poll({int(DRAIN_EVERY * 1000)})
    try:
        while data := os.read(0, 65536):
            *lines, rest = (rest + data).split(b"\\n")
            for line in lines:
                group, _, ticks = line[1:].partition(b" ")
                if line[:1] == b"=":
                    mark = b"{MARK}=" + line[1:]
                elif line[:1] == b"+":
                    groups[int(group)] = int(ticks)
                else:
                    groups.pop(int(group), None)
        ended = True  # the end of the input, read: nothing else ends the guard
    except BlockingIOError:
        pass
for group, ticks in groups.items():
    try:
        with open(f"/proc/{{group}}/stat", "rb") as stat:
            if int(stat.read().rsplit(b")", 1)[1].split()[19]) > ticks:
                continue  # started after the group was registered: a stranger with a reused PID
    except (OSError, ValueError, IndexError):
        pass  # no such process: only the group's leftovers can hold the number
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
for _ in range(3 if mark else 0):  # the processes that carry the mark: a call's child started, not told of yet
    found = 0
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{{name}}/environ", "rb") as environ:
                if mark not in environ.read().split(b"\\0"):
                    continue
        except (OSError, ValueError):
            continue
        found += 1
        for kill in (os.killpg, os.kill):  # its group (a call's child leads one), and it
            try:
                kill(int(name), signal.SIGKILL)
            except OSError:
                pass
    if not found:
        break
"""


#: what ``/proc/PID/stat`` counts a process's start in
_TICKS_PER_SECOND = int(os.sysconf("SC_CLK_TCK"))


def _ticks() -> int:
    """The boot-time clock in clock ticks, as ``/proc/PID/stat`` counts a start: no system call (vDSO)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS_PER_SECOND)


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
    unregistered by a line as soon as its leader is reaped (a line that waited
    for the next registration saved about 1% of a call, and let a guard whose
    process died before that call kill a stranger that got the PID meanwhile);
    a PID reused before the guard read that line is told from the group by its
    start, later than the registration's clock.
    If the guard itself is killed, the next spawn starts another and hands it
    the groups still running.
    """

    def __init__(self, start: Callable[[str, int], subprocess.Popen[bytes]]) -> None:
        self._start_process = start
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._fd = -1
        #: the guard pipe's read end while a guard starts (a fork's child closes its copy: see _send)
        self._read = -1
        #: the groups running, each with the clock just after its leader started (``_ticks``)
        self._groups: dict[int, int] = {}
        #: what a child started without the gate carries in its environment (:data:`MARK`), one per process
        self.mark = secrets.token_hex(16)

    def forked(self) -> None:
        """In the child of a fork of this process: drop the parent's guard (holding its pipe open would keep
        it from seeing the parent die) and its groups, which are not this process's children."""
        for fd in (self._fd, self._read):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._lock = threading.Lock()
        self._proc, self._fd, self._read, self._groups = None, -1, -1, {}
        self.mark = secrets.token_hex(16)  # the parent's guard would kill this process's calls

    def _start(self) -> None:
        """Start a guard (the caller holds the lock) and tell it the groups still running."""
        if self._fd >= 0:
            os.close(self._fd)
        read, write = os.pipe2(os.O_CLOEXEC)  # no child inherits the write end: the guard's EOF is our death
        self._read = read
        with contextlib.suppress(OSError):  # room for the lines written between two reads of the guard
            fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        try:
            self._proc = self._start_process(_GUARD_PROGRAM, read)
        finally:
            self._read = -1  # before the close: a fork's child never closes a descriptor number reused since
            os.close(read)
        self._fd = write
        told = b"".join(b"+%d %d\n" % item for item in self._groups.items())
        os.write(self._fd, b"=%s\n%s" % (self.mark.encode(), told))

    def ready(self) -> str:
        """The guard started (it knows :attr:`mark` then); the mark, for a child about to start without the gate."""
        with self._lock:
            if self._fd < 0:
                self._start()
        return self.mark

    def _send(self, line: bytes) -> None:
        """Write ``line`` to the guard: one ``write`` per call of a tool (at its start), nothing more.

        A dead guard is found by the write itself: its pipe has no reader left,
        so the write fails with ``EPIPE`` (Python ignores ``SIGPIPE``), and
        another guard is started and told every group (no ``waitpid`` on the
        guard per call: a system call costs some microseconds on a VM). The
        read end is in no other process: it is close-on-exec, and the child of
        an ``os.fork`` made while a guard starts closes its copy (:meth:`forked`).
        A fork's child has no guard yet, so its first line starts one.
        """
        if self._fd < 0:
            self._start()
        try:
            os.write(self._fd, line)
        except BrokenPipeError:  # the guard died since: another, told everything
            self._start()
            os.write(self._fd, line)

    def add(self, pgid: int) -> None:
        """Register the group of a leader just started, with the groups reaped since (one ``write``)."""
        ticks = _ticks()  # after the start: the leader started at or before it
        with self._lock:
            self._send(
                b"+%d %d\n" % (pgid, ticks)
            )  # a guard started by it is told the groups before this one: each once
            self._groups[pgid] = ticks

    def remove(self, pgid: int) -> None:
        """The group's leader is reaped: told to the guard at once.

        Not with the next ``add`` (one write a call less, about 1% of a call):
        a reaped leader's PID is free, a stranger may get it, lead a group and
        leave it to its workers, and a guard still holding the number would
        kill them if this process died before its next call.
        """
        with self._lock:
            if self._groups.pop(pgid, None) is not None:  # a fork's child holds none of its parent's (forked)
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

    def run(self, work: Callable[[], Any], undo: Callable[[Any], None] | None = None) -> Any:
        """``work()`` on the spawner thread; its value, or its exception raised here.

        Interrupted while it works (Ctrl-C: a KeyboardInterrupt in this thread),
        the caller never gets the value, so ``undo`` gets it (the child just
        started is killed rather than left running, unknown), then the
        interrupt goes on.
        """
        with self._lock:
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._pid = os.getpid()  # after a fork, the old thread does not exist here
                self._thread = threading.Thread(target=self._loop, name="flakebot-spawner", daemon=True)
                self._thread.start()
        reply: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._requests.put((work, reply))
        try:
            ok, value = reply.get()
        except BaseException:
            ok, value = reply.get()  # the work finishes by itself (a fork and an exec)
            if ok and undo is not None:
                undo(value)
            raise
        if not ok:
            raise value
        return value
