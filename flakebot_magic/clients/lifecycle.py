"""Long-running tool processes (MCP servers, HTTP services): start, watch, log, stop, never orphan.

Every tool process

* runs in its own process group (``start_new_session``), so stopping it stops
  whatever it started too;
* gets a parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``): when
  the kernel or interpreter that started it dies, even by ``kill -9``, the
  tool dies with it. The signal follows the *thread* that forked the child,
  so every tool is spawned from one long-lived thread (the pipeline runs on a
  short-lived background thread);
* keeps its output in a bounded buffer, readable as ``tool.logs()``;
* is stopped by :func:`stop` (``%flakebot stop NAME``), by :func:`stop_all`
  at interpreter exit (``atexit``: kernel shutdown and restart), and when a
  call to it is interrupted or times out (the next call starts it again).

Front ends use :func:`stop`, :func:`logs` and :func:`running`; they know tools
only by name.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

from ..errors import ToolError
from ..host.process import kill_tree
from ..untrusted import safe_text

__all__ = [
    "LogBuffer",
    "ToolProcess",
    "logs",
    "register",
    "running",
    "stop",
    "stop_all",
    "unregister",
]

_PR_SET_PDEATHSIG = 1

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
        line = safe_text(line)  # shown by tool.logs(), `flakebot logs` and the dashboard
        if len(line) > LOG_LINE_CHARS:
            line = line[:LOG_LINE_CHARS] + f"... ({len(line) - LOG_LINE_CHARS} more characters)"
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


def _death_signal_setup(parent: int) -> Callable[[], None] | None:
    """A preexec function that ties the child's life to this process (Linux only)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    kill = int(signal.SIGKILL)

    def setup() -> None:  # runs in the child between fork and exec: no imports, no locks
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return setup


class _Spawner:
    """One long-lived daemon thread that forks every tool process.

    ``PR_SET_PDEATHSIG`` fires when the forking *thread* exits, not the
    process; forking from a thread that lives as long as the interpreter makes
    it mean "when this process dies".
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


_spawner = _Spawner()


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
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        logs: LogBuffer,
        stdio: bool,
        cwd: Path | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.logs = logs
        self.stdio = stdio
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._pumps: list[threading.Thread] = []
        self.started_at = 0.0

    def start(self) -> None:
        """Start the process (from the spawner thread)."""
        setup = _death_signal_setup(os.getpid())

        def spawn() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdin=subprocess.PIPE if self.stdio else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
                preexec_fn=setup,
                close_fds=True,
            )

        try:
            proc: subprocess.Popen[bytes] = _spawner.run(spawn)
        except OSError as exc:
            raise ToolError(f"Could not start {self.argv[0]}: {exc}", returncode=None) from exc
        self.proc = proc
        self.started_at = time.time()
        streams: list[IO[bytes]] = [proc.stderr] if self.stdio else [proc.stdout, proc.stderr]  # type: ignore[list-item]
        self._pumps = [
            threading.Thread(target=self._pump, args=(stream,), name=f"flakebot-logs-{proc.pid}", daemon=True)
            for stream in streams
        ]
        for pump in self._pumps:
            pump.start()

    def _pump(self, stream: IO[bytes]) -> None:
        """Read the stream in chunks into :attr:`logs`: a line without end is cut, never held whole."""
        limit = LOG_LINE_CHARS * 4  # bytes; LogBuffer cuts the line to LOG_LINE_CHARS characters
        pending = bytearray()
        skipped = 0  # bytes of an over-long line dropped so far
        try:
            fd = stream.fileno()
            while True:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    break
                pending += chunk
                while True:
                    end = pending.find(b"\n")
                    if end < 0:
                        break
                    if skipped:
                        self.logs.append(f"[flakebot: {skipped + end} more bytes of this line dropped]\n")
                        skipped = 0
                    else:
                        self.logs.append(pending[: end + 1].decode("utf-8", "replace"))
                    del pending[: end + 1]
                if len(pending) > limit:
                    if not skipped:
                        self.logs.append(pending[:limit].decode("utf-8", "replace") + "\n")
                        skipped = len(pending) - limit
                    else:
                        skipped += len(pending)
                    pending.clear()
            if pending and not skipped:
                self.logs.append(pending.decode("utf-8", "replace"))
            elif skipped:
                self.logs.append(f"[flakebot: {skipped + len(pending)} more bytes of this line dropped]\n")
        except (OSError, ValueError):  # closed under us by stop()
            pass

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    def stop(self, grace: float = 1.0) -> int | None:
        """Stop the process group: close stdin, SIGTERM, then SIGKILL after ``grace`` s.

        Returns the exit status (None when it was never started).
        """
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None and proc.stdin is not None:
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
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        for pump in self._pumps:
            pump.join(timeout=2)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        return proc.returncode


# -- the tools that have a process, by name --------------------------------------------


class Stoppable(Protocol):
    name: str

    def stop(self) -> None: ...

    def logs(self, last: int | None = None) -> str: ...

    @property
    def running(self) -> bool: ...


_registry: dict[str, Stoppable] = {}
_registry_lock = threading.Lock()
_atexit_registered = False


def register(tool: Stoppable) -> None:
    """Remember a started tool; a different tool of the same name is stopped first."""
    global _atexit_registered
    with _registry_lock:
        previous = _registry.get(tool.name)
        _registry[tool.name] = tool
        if not _atexit_registered:
            atexit.register(stop_all)
            _atexit_registered = True
    if previous is not None and previous is not tool:
        previous.stop()


def unregister(tool: Stoppable) -> None:
    with _registry_lock:
        if _registry.get(tool.name) is tool:
            del _registry[tool.name]


def stop(name: str) -> bool:
    """Stop the tool called ``name``; False when no tool of that name is running.

    This is what ``%flakebot stop NAME`` calls.
    """
    with _registry_lock:
        tool = _registry.get(name)
    if tool is None:
        return False
    was_running = tool.running
    tool.stop()
    return was_running


def stop_all() -> list[str]:
    """Stop every tool this interpreter started; return their names (runs at exit)."""
    with _registry_lock:
        tools = list(_registry.values())
    for tool in tools:
        try:
            tool.stop()
        except Exception:  # at exit: stop the others regardless
            pass
    return [t.name for t in tools]


def logs(name: str, last: int | None = None) -> str:
    """The output kept for the tool called ``name`` (``%flakebot logs NAME``).

    Raises
    ------
    KeyError
        No tool of that name was started in this interpreter.
    """
    with _registry_lock:
        tool = _registry.get(name)
    if tool is None:
        raise KeyError(name)
    return tool.logs(last)


def running() -> list[str]:
    """Names of the tools whose process is running now."""
    with _registry_lock:
        tools = list(_registry.values())
    return sorted(t.name for t in tools if t.running)
