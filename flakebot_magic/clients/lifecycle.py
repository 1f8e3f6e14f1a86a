"""Long-running tool processes (MCP servers, HTTP services): start, watch, log, stop, never orphan.

Every tool process

* runs in its own process group (``start_new_session``), so stopping it stops
  whatever it started too;
* gets a parent-death signal: when the kernel or interpreter that started it
  dies, even by ``kill -9``, the tool dies with it (it is started by
  :func:`~flakebot_magic.host.process.spawn` with ``lasting=True``: from one
  long-lived thread, since the signal follows the thread that forked);
* keeps its output in a bounded buffer, readable as ``tool.logs()`` (its
  lines cut by :class:`~flakebot_magic.host.output.LineReader`);
* is stopped by :func:`stop` (``%flakebot stop NAME``), by :func:`stop_all`
  at interpreter exit (``atexit``: kernel shutdown and restart), and when a
  call to it is interrupted or times out (the next call starts it again).

Front ends use :func:`stop`, :func:`logs` and :func:`running`; they know a
tool by its name within a cache dir (its ``home``): two cache dirs may each
have a tool of the same name, and never reach each other's process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from ..errors import ToolError
from ..host.deadline import Deadline
from ..host.output import LineReader
from ..host.process import kill_tree, spawn
from ..host.proctree import pipe_holders
from ..untrusted import safe_text

__all__ = [
    "LogBuffer",
    "ToolProcess",
    "logs",
    "process_key",
    "register",
    "running",
    "stop",
    "stop_all",
    "unregister",
]

#: seconds a process killed past a call's deadline is still waited for, to reap it (a multi-threaded one is a
#: zombie only once its every thread has ended)
_REAP = 0.25
#: lines kept per tool, and the longest line kept whole
LOG_LINES = 2000
LOG_LINE_CHARS = 4000


class LogBuffer:
    """The last :data:`LOG_LINES` lines a tool wrote, thread-safe."""

    def __init__(self, max_lines: int = LOG_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self.dropped = 0

    def append(self, line: str) -> None:
        if len(line) > LOG_LINE_CHARS:  # cut first: a 32 MiB line is not escaped whole to keep 4 KiB of it
            line = line[:LOG_LINE_CHARS] + f"... ({len(line) - LOG_LINE_CHARS} more characters)"
        line = safe_text(line)  # shown by tool.logs(), `flakebot logs` and the dashboard
        with self._lock:
            if len(self._lines) == self._lines.maxlen:
                self.dropped += 1
            self._lines.append(line)

    def text(self, last: int | None = None) -> str:
        with self._lock:
            lines = list(self._lines)
        if last is not None:
            lines = lines[-last:] if last > 0 else []
        return "".join(line if line.endswith("\n") else line + "\n" for line in lines)

    def __len__(self) -> int:
        with self._lock:
            return len(self._lines)


class ToolProcess:
    """One running tool binary: its own process group, a parent-death signal, logs.

    Parameters
    ----------
    argv
        The command.
    env
        Its whole environment.
    logs
        Where its output lines go.
    stdio
        True: stdin and stdout are pipes the caller speaks a protocol on
        (MCP); stderr goes to ``logs``. False: stdin is empty and stdout and
        stderr both go to ``logs`` (HTTP).
    pass_fds
        Descriptors the process inherits (a confined service's listening socket).
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        logs: LogBuffer,
        stdio: bool,
        cwd: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        self.argv = list(argv)
        self.pass_fds = tuple(pass_fds)
        self.env = dict(env)
        self.logs = logs
        self.stdio = stdio
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._pumps: list[threading.Thread] = []
        #: the inodes of the pipes its readers read (what holds them after the group is gone is the tool's too)
        self._pipes: frozenset[int] = frozenset()
        self.started_at = 0.0

    def start(self) -> None:
        """Start the process (from the spawner thread)."""
        try:
            proc = spawn(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=self.stdio,
                lasting=True,
                bufsize=0,
                pass_fds=self.pass_fds,
            )
        except OSError as exc:
            raise ToolError(f"Could not start {self.argv[0]}: {exc}", returncode=None) from exc
        self.proc = proc
        self.started_at = time.time()
        streams: list[IO[bytes]] = [proc.stderr] if self.stdio else [proc.stdout, proc.stderr]  # type: ignore[list-item]
        self._pumps = [
            threading.Thread(target=self._pump, args=(stream,), name=f"flakebot-logs-{proc.pid}", daemon=True)
            for stream in streams
        ]
        self._pipes = frozenset(os.fstat(stream.fileno()).st_ino for stream in streams)
        for pump in self._pumps:
            pump.start()

    def _pump(self, stream: IO[bytes]) -> None:
        """Read the stream in chunks into :attr:`logs`: a line without end is cut (its head kept), never held whole."""
        # bytes; LogBuffer cuts the line to LOG_LINE_CHARS characters
        lines = LineReader(lambda line, end: self.logs.append(line + end), LOG_LINE_CHARS * 4, split=False)
        try:
            fd = stream.fileno()
            while chunk := os.read(fd, 1 << 16):
                lines.feed(chunk)
            lines.feed(b"", final=True)
        except (OSError, ValueError):  # closed under us
            pass
        finally:
            with contextlib.suppress(OSError):
                stream.close()  # the reader alone closes its stream: no descriptor is closed under a read

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def stop(self, grace: float = 1.0, *, deadline: Deadline | None = None) -> int | None:
        """Stop the process group: close stdin, SIGTERM, then SIGKILL after ``grace`` s; and whatever it started
        outside its group that still holds its output (a child in its own session), so its readers end.

        ``deadline``: a call gave up on the process. It is killed at once (SIGKILL, no grace the call would pay
        for), and nothing here waits past the deadline: a reader still blocked then ends when its pipe closes
        (its thread is a daemon). Returns the exit status (None when it was never started, or not yet reaped).
        """
        proc = self.proc
        if proc is None:
            return None
        if deadline is not None:
            grace = 0.0
        if grace > 0 and proc.poll() is None and proc.stdin is not None:
            try:
                proc.stdin.close()  # a stdio server exits by itself at EOF
            except OSError:
                pass
            try:
                proc.wait(timeout=min(grace, 0.2))
            except subprocess.TimeoutExpired:
                pass
        # SIGTERM, ``grace`` s for the group to end, then SIGKILL; whatever the leader left in its group goes too
        with contextlib.suppress(PermissionError):  # a member we may not signal: the rest went
            kill_tree(proc.pid, grace=grace if proc.poll() is None else 0.0)
        with contextlib.suppress(subprocess.TimeoutExpired):  # killed: its threads end in a moment, then it is reaped
            proc.wait(timeout=5.0 if deadline is None else max(deadline.left(), _REAP))
        for pump in self._pumps:
            pump.join(timeout=0.05 if deadline is None else deadline.wait(0.05))
        blocked = [pump for pump in self._pumps if pump.is_alive()]
        if blocked:  # something outside the group holds its output: it is the tool's, and goes with it
            for pid in pipe_holders(self._pipes):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for pump in blocked:
                pump.join(timeout=2.0 if deadline is None else deadline.left())
        for pipe in (proc.stdin, proc.stdout if self.stdio else None):  # the caller's; the readers close their own
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        return proc.poll()


# -- the tools that have a process, by (home, name) ----------------------------------------
#
# Two cache dirs may each hold a tool of the same name: a tool's process is known by where it is registered (its
# ``home``: the cache dir of the tool inventory that holds it, else its own store entry) AND its name, so neither
# can reach, replace or stop the other's.


class Stoppable(Protocol):
    name: str
    #: where the tool is registered (the cache dir), or its store entry; part of its key
    home: Path

    def stop(self) -> None: ...

    def logs(self, last: int | None = None) -> str: ...

    @property
    def running(self) -> bool: ...


ProcessKey = tuple[str, str]

_started: dict[ProcessKey, Stoppable] = {}
_started_lock = threading.Lock()
_atexit_registered = False


def process_key(home: Path | str, name: str) -> ProcessKey:
    """The key of the tool ``name`` of ``home`` (resolved: a symlinked cache dir is the same cache)."""
    return os.path.realpath(home), name


def _key(tool: Stoppable) -> ProcessKey:
    return process_key(tool.home, tool.name)


def register(tool: Stoppable) -> None:
    """Remember a started tool; a different tool of the same home and name is stopped first."""
    global _atexit_registered
    key = _key(tool)
    with _started_lock:
        previous = _started.get(key)
        _started[key] = tool
        if not _atexit_registered:
            atexit.register(stop_all)
            _atexit_registered = True
    if previous is not None and previous is not tool:
        previous.stop()


def unregister(tool: Stoppable) -> None:
    key = _key(tool)
    with _started_lock:
        if _started.get(key) is tool:
            del _started[key]


def stop(name: str, home: Path | str) -> bool:
    """Stop the tool called ``name`` of ``home`` (its cache dir); False when no such tool is running.

    This is what ``%flakebot stop NAME`` calls, with the kernel's cache dir.
    """
    with _started_lock:
        tool = _started.get(process_key(home, name))
    if tool is None:
        return False
    was_running = tool.running
    tool.stop()
    return was_running


def stop_all() -> list[str]:
    """Stop every tool this interpreter started; return their names (runs at exit)."""
    with _started_lock:
        tools = list(_started.values())
    for tool in tools:
        try:
            tool.stop()
        except Exception:  # at exit: stop the others regardless
            pass
    return [t.name for t in tools]


def logs(name: str, home: Path | str, last: int | None = None) -> str:
    """The output kept for the tool called ``name`` of ``home`` (``%flakebot logs NAME``).

    Raises
    ------
    KeyError
        No tool of that name and home was started in this interpreter.
    """
    with _started_lock:
        tool = _started.get(process_key(home, name))
    if tool is None:
        raise KeyError(name)
    return tool.logs(last)


def running(home: Path | str | None = None) -> list[str]:
    """Names of the tools whose process is running now (of ``home`` only, when given)."""
    with _started_lock:
        tools = list(_started.items())
    where = None if home is None else os.path.realpath(home)
    return sorted(t.name for (h, _), t in tools if t.running and (where is None or h == where))
