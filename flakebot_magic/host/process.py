"""Child processes (cargo, git, nix, the tools): time limits, whole-tree kills, bounded output, clean environments.

Every child flakebot starts is started here, by :func:`spawn` (the one place
that forks: a test reads the package to hold it so). A command that runs to
its end goes through :class:`ProcessRunner`; a tool's call goes through
:class:`~flakebot_magic.host.exchange.Exchange`; a long-running tool process
(``clients/lifecycle.py``) is spawned from one long-lived thread
(``spawn(..., lasting=True)``). Every one of them

* has a time limit, and runs in its own process group: a timeout or a cancel
  kills cargo *and* the rustc processes it started, and whatever still holds
  its output pipes (a ``setsid`` grandchild) once its leader has exited;
* dies with the kernel: a lasting child by its parent-death signal
  (``PR_SET_PDEATHSIG``), the child of a call by :class:`~.guard.Guard` (started
  with ``vfork``, or a tool's call by ``posix_spawn``, :func:`start_call`, without
  Popen's Python: arming the signal would need a fork of this whole process);
  a child :func:`spawn` starts waits at a gate (:func:`~.guard.gated`) until the
  guard knows it, and one :func:`start_call` starts carries the guard's mark
  (:data:`~.guard.MARK`), by which the guard finds it if this process dies
  before it was told;
* is read in bounded chunks (:class:`~flakebot_magic.host.output.LineReader`, the one line cutter): a
  line without end is never held whole, what is kept per stream is capped,
  and past the cap a visible note says so;
* sees an allowlisted environment (:func:`allowed_env`, :func:`scrubbed_env`):
  variables pass by name, never because they "do not look like a secret";
* is never a Rust toolchain program (:data:`~.sandboxed.TOOLCHAIN_PROGRAMS`: cargo, rustc,
  rustdoc, rustup, clippy) unless it comes wrapped by the sandbox, as a
  :class:`~.sandboxed.SandboxedCommand`: those programs run what a crate says (its build
  scripts, its ``.cargo/config.toml``, its ``rust-toolchain.toml``), so no
  other command line for them is accepted.

:func:`kill_tree` (the one process-tree kill) and :func:`process_started_at`
(telling a process from a later one that reused its PID) live in :mod:`.proctree`
and are re-exported here.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import Cancelled, ConfigError, StageTimeout
from .callproc import CallProcess, PipeEnd
from .cancel import CancelToken, LinkedToken, stopped_during
from .crashpoints import crash_point
from .environment import allowed_env, scrubbed_env
from .guard import MARK, Guard, Spawner, check_program, gated
from .output import MAX_CAPTURE, LineCallback, Pipes
from .proctree import alive, finish, kill_tree, pipe_holders, process_started_at
from .sandboxed import SandboxedCommand, refuse_unsandboxed
from .writes import write_within

__all__ = [
    "CallProcess",
    "CancelToken",
    "Completed",
    "LinkedToken",
    "PipeEnd",
    "ProcessRunner",
    "alive",
    "allowed_env",
    "kill_tree",
    "process_started_at",
    "scrubbed_env",
    "spawn",
    "start_call",
]

#: seconds a command's stragglers may keep its pipes open after it exited, before they are killed
DRAIN_GRACE = 1.0


@dataclass(frozen=True)
class Completed:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed: float


@functools.lru_cache(maxsize=1)
def _prctl() -> Any:
    """libc's ``prctl``, looked up once per process (a ``dlopen`` and a symbol lookup per spawn cost 0.1 ms)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return prctl


def _parent_death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when this process (its forking thread) dies; Linux only."""
    prctl = _prctl()
    if prctl is None:
        return None
    parent, kill = os.getpid(), int(signal.SIGKILL)

    def set_pdeathsig() -> None:  # runs in the child between fork and exec: no imports, no locks
        prctl(1, kill, 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return set_pdeathsig


_spawner = Spawner()


def _start_guard(program: str, read: int) -> subprocess.Popen[bytes]:
    """Start the guard (:mod:`.guard`) reading ``read``: in its own session, no descriptor of ours but that."""
    return subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", program],
        stdin=read,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # not in a group a kill of a call reaches, nor the terminal's
        close_fds=True,
        env={},
    )


_guard = Guard(_start_guard)
os.register_at_fork(after_in_child=_guard.forked)


class _GuardedChild(subprocess.Popen[bytes]):
    """A child the guard kills with this process; unregistered once reaped."""

    def _handle_exitstatus(self, *args: Any, **kwargs: Any) -> None:  # called where waitpid reaped it
        super()._handle_exitstatus(*args, **kwargs)  # type: ignore[misc]
        _guard.remove(self.pid)


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None,
    cwd: Path | str | None = None,
    stdin: bool = False,
    lasting: bool = False,
    bufsize: int = -1,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv``: the one place a child is forked.

    It gets its own process group (a kill stops what it started too), death
    with this process (``lasting``: the parent-death signal; else the guard,
    :class:`~.guard.Guard`, a start by ``vfork`` and the gate, :func:`~.guard.gated`),
    no inherited descriptors but ``pass_fds`` (a confined service's socket), standard output and error as
    pipes, standard input a pipe (``stdin``) or ``/dev/null``. ``lasting``: forked from the
    long-lived spawner thread, for a child that outlives the thread that asked
    for it (a tool's server). Raises ``OSError`` when it cannot start.
    """

    def start(
        kind: type[subprocess.Popen[bytes]], args: list[str], child_stdin: int, setup: Any, mark: str = ""
    ) -> Any:
        environment: dict[str, str] | None = dict(env) if env is not None else None
        if mark:  # a lasting child's workers carry the guard's mark, by which it finds those that left the group
            environment = {**(environment if environment is not None else os.environ), MARK: mark}
        return kind(
            args,
            cwd=cwd,
            env=environment,
            stdin=child_stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=bufsize,
            start_new_session=True,  # own process group: kill its children too
            preexec_fn=setup,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )

    if lasting:
        # the parent-death signal ends the child itself; its workers (its group, and any that left it, by the
        # guard's mark) are the guard's, as a call's are
        setup, mark = _parent_death_signal(), _guard.ready()
        proc: subprocess.Popen[bytes] = _spawner.run(
            lambda: start(_GuardedChild, list(argv), subprocess.PIPE if stdin else subprocess.DEVNULL, setup, mark),
            undo=_discard,
        )
        _guard.add(proc.pid)
        return proc
    # a call's child: no preexec_fn, so vfork() (a fork copies this whole process); the guard kills it with us,
    # and until the guard knows it, it waits at the gate
    check_program(argv[0], env, cwd)
    gate_read, gate = (-1, -1) if stdin else os.pipe2(os.O_CLOEXEC)
    try:
        proc = start(
            _GuardedChild,
            gated(argv, stdin=stdin, pwd="PWD" in (env if env is not None else os.environ)),
            subprocess.PIPE if stdin else gate_read,
            None,
        )
    except BaseException:
        if gate >= 0:
            os.close(gate)
        raise
    finally:
        if gate_read >= 0:
            os.close(gate_read)
    try:
        if stdin:
            assert proc.stdin is not None
            gate = proc.stdin.fileno()
        crash_point("spawn.started")  # a test kills this process here: the child waits at the gate, unknown
        _guard.add(proc.pid)  # its group id: it leads its own session
        crash_point("spawn.guarded")
        os.write(gate, b"\n")  # the guard knows it: it may run
    except BaseException:
        proc.kill()  # the gate shell alone: nothing has run
        proc.wait()
        raise
    finally:
        if not stdin:
            os.close(gate)
    return proc


def _discard(proc: subprocess.Popen[bytes]) -> None:
    """A child whose caller was interrupted while it started: its group killed, it reaped, its pipes closed."""
    kill_tree(proc.pid)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


#: posix_spawn's flags: POSIX_SPAWN_SETSIGDEF (the signals Python ignores back to their default), POSIX_SPAWN_SETSID
_SETSIGDEF, _SETSID = 0x04, 0x80


class _Launcher:
    """glibc's ``posix_spawn`` for a call's child: ``clone(CLONE_VM|CLONE_VFORK)``, in C, with no Python between.

    What ``Popen(start_new_session=True, close_fds=True, env=...)`` does, without its Python: the
    child gets its own session (``POSIX_SPAWN_SETSID``), the pipes as 0, 1 and 2, no other descriptor
    (``posix_spawn_file_actions_addclosefrom_np(3)``: glibc 2.34), ``SIGPIPE`` and ``SIGXFSZ`` back to
    their default (Python ignores them; ``restore_signals``). The attributes are made once; the file
    actions once per triple of pipe descriptors (the lowest free numbers: the same call after call);
    the ``argv`` and ``envp`` arrays once per command line and environment (a tool's call repeats both).
    """

    def __init__(self, libc: Any) -> None:
        self.libc = libc
        self.spawn = libc.posix_spawn
        self.spawn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, *[ctypes.c_void_p] * 4]
        self.attr = ctypes.create_string_buffer(1024)  # posix_spawnattr_t: 336 bytes on x86-64 glibc
        signals = ctypes.create_string_buffer(1024)  # sigset_t: 128 bytes
        libc.posix_spawnattr_init(self.attr)
        libc.sigemptyset(signals)
        for number in (signal.SIGPIPE, signal.SIGXFSZ):
            libc.sigaddset(signals, int(number))
        if libc.posix_spawnattr_setsigdefault(self.attr, signals) or libc.posix_spawnattr_setflags(
            self.attr, ctypes.c_short(_SETSIGDEF | _SETSID)
        ):
            raise OSError("posix_spawn attributes refused")
        self.actions: dict[tuple[int, int, int], _FileActions] = {}
        self.arrays: dict[tuple[str, ...], Any] = {}
        self.envs: dict[tuple[tuple[str, str], ...], Any] = {}

    def _array(self, words: tuple[str, ...]) -> Any:
        """A NULL-ended ``char *[]`` of ``words``, kept (a bounded few: a tool's call repeats its own)."""
        array = self.arrays.get(words)
        if array is None:
            encoded = [os.fsencode(word) for word in words]
            if any(b"\0" in word for word in encoded):
                raise ValueError("embedded null byte")
            if len(self.arrays) >= 64:
                self.arrays.clear()
            array = self.arrays[words] = (ctypes.c_char_p * (len(encoded) + 1))(*encoded, None)
        return array

    def _environment(self, items: tuple[tuple[str, str], ...]) -> Any:
        """``envp`` for ``items`` (the same strings call after call: their hashes are kept, the key is cheap)."""
        array = self.envs.get(items)
        if array is None:
            if any("=" in key for key, _ in items):
                raise ValueError("illegal environment variable name")
            if len(self.envs) >= 64:
                self.envs.clear()
            array = self.envs[items] = self._array(tuple(f"{key}={value}" for key, value in items))
        return array

    def _file_actions(self, fds: tuple[int, int, int]) -> _FileActions:
        actions = self.actions.get(fds)
        if actions is None:
            if len(self.actions) >= 16:
                self.actions.clear()
            actions = self.actions[fds] = _FileActions(self.libc, fds)
        return actions

    def start(self, argv: Sequence[str], env: Mapping[str, str]) -> CallProcess:
        args = list(argv)
        argv_array = self._array(tuple(args))
        # the guard started and told the mark first: a child it has not been told of yet is found by it
        envp = self._environment((*env.items(), (MARK, _guard.ready())))
        in_read, in_write = os.pipe2(os.O_CLOEXEC)
        out_read, out_write = os.pipe2(os.O_CLOEXEC)
        err_read, err_write = os.pipe2(os.O_CLOEXEC)
        pid = ctypes.c_int()
        try:
            if in_read < 3 or out_write < 3 or err_write < 3:  # this process's 0-2 closed: Popen knows that dance
                raise _Unsupported
            actions = self._file_actions((in_read, out_write, err_write))  # held: a clear must not free it now
            failed = self.spawn(ctypes.byref(pid), argv_array[0], actions.buffer, self.attr, argv_array, envp)
            if failed:
                raise OSError(failed, os.strerror(failed), args[0])
        except BaseException:
            for fd in (in_read, in_write, out_read, out_write, err_read, err_write):
                os.close(fd)
            raise
        os.close(in_read)
        os.close(out_write)
        os.close(err_write)
        crash_point("call.started")  # a test kills this process here: the guard finds the child by its mark
        _guard.add(pid.value)  # its group id: it leads its own session
        return CallProcess(args, pid.value, in_write, out_read, err_read, reaped=_guard.remove)


class _FileActions:
    """posix_spawn's file actions: the pipes ``fds`` as 0, 1 and 2, every other descriptor closed (from 3 up)."""

    def __init__(self, libc: Any, fds: tuple[int, int, int]) -> None:
        self.libc = libc
        self.buffer = ctypes.create_string_buffer(1024)  # posix_spawn_file_actions_t: 80 bytes on x86-64 glibc
        libc.posix_spawn_file_actions_init(self.buffer)
        for target, fd in enumerate(fds):
            libc.posix_spawn_file_actions_adddup2(self.buffer, fd, target)
        libc.posix_spawn_file_actions_addclosefrom_np(self.buffer, 3)

    def __del__(self) -> None:
        self.libc.posix_spawn_file_actions_destroy(self.buffer)


class _Unsupported(Exception):
    """This call cannot go through posix_spawn: Popen starts it."""


@functools.lru_cache(maxsize=1)
def _launcher() -> _Launcher | None:
    """The posix_spawn launcher, made once; None where the C library lacks what it needs (then Popen starts calls)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # glibc 2.34's closefrom (no close_fds without it); the exit is awaited on a pidfd (Linux 5.3)
        if not hasattr(libc, "posix_spawn_file_actions_addclosefrom_np") or not hasattr(os, "pidfd_open"):
            return None
        return _Launcher(libc)
    except OSError:
        return None


def start_call(argv: Sequence[str], *, env: Mapping[str, str]) -> CallProcess | subprocess.Popen[bytes]:
    """Start the child of one call of a tool: as :func:`spawn` with ``stdin=True``, without Popen's Python.

    The same child (its own session, the guard, no inherited descriptor,
    ``env`` as given, standard streams as pipes), started by ``posix_spawn``
    (:class:`_Launcher`); where the C library cannot (no
    ``addclosefrom_np``), or ``argv[0]`` is no path, by :func:`spawn`.
    Raises ``OSError`` when it cannot start.
    """
    launcher = _launcher()
    if launcher is not None and os.sep in argv[0]:
        with contextlib.suppress(_Unsupported):
            return launcher.start(argv, env)
    return spawn(argv, env=env, stdin=True)


def _short(argv: list[str]) -> str:
    """A command as named in a message: the program's name and its first two arguments."""
    if not argv:
        return ""
    return " ".join([os.path.basename(argv[0]), *argv[1:3]])


class ProcessRunner:
    """Runs commands with a time limit in their own process group.

    Parameters
    ----------
    cancel
        When set, the running process group is killed and :class:`Cancelled` raised.
    """

    def __init__(self, cancel: CancelToken | None = None) -> None:
        self.cancel = cancel or CancelToken()

    def run(
        self,
        args: Sequence[str | os.PathLike[str]],
        *,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
        on_line: LineCallback | None = None,
        input: bytes | None = None,
        workspace: Path | None = None,
        interrupt_grace: float = 0.0,
        capture_limit: int = MAX_CAPTURE,
        label: Sequence[str] | None = None,
    ) -> Completed:
        """Run ``args``; return its output, whatever its exit code.

        ``label`` is the command as the user knows it (``cargo build``), named
        in errors instead of ``args`` when wrappers (the sandbox, ``nice``)
        stand in front of it.

        Raises :class:`StageTimeout` past ``timeout`` seconds, :class:`Cancelled`
        when the cancel token is set, :class:`ConfigError` when the program is
        missing. ``workspace`` is attached to those errors.

        Output is read in chunks; each stream keeps at most ``capture_limit``
        bytes (then ``[flakebot: output truncated after N MiB]``, and the rest
        is read and dropped). ``on_line`` sees every kept line, a long line in
        pieces of at most 64 KiB.

        When the command exits, whatever it left running in its process group,
        or holding its output pipes (a ``setsid`` grandchild), gets
        :data:`DRAIN_GRACE` seconds and is then killed.

        ``interrupt_grace``: when stopping the process, send SIGINT first and
        allow it this many seconds to clean up before SIGKILL. nix needs it:
        its builders run in their own session, so only nix itself can stop
        them, and it does so (and releases its locks) on SIGINT.
        """
        argv = [os.fspath(a) for a in args]
        command = list(label) if label is not None else argv
        self._refuse(args, argv, env, _short(command), workspace)
        started = time.monotonic()
        proc = spawn(argv, cwd=cwd, env=env, stdin=input is not None)
        assert proc.stdout is not None and proc.stderr is not None
        pipes = Pipes(proc.stdout.fileno(), proc.stderr.fileno(), capture_limit, on_line)
        inodes = {os.fstat(fd).st_ino for fd in pipes.streams}
        if input is not None:
            threading.Thread(target=_write_input, args=(proc, input, started + timeout), daemon=True).start()
        deadline = started + timeout
        try:
            ended = self._read(proc, pipes, deadline)
            if ended != "exited":
                self._stop(proc, interrupt_grace, inodes)
                raise _stopped(ended, command, timeout, workspace)
            # leftovers of a command that has exited; both pipes at end of file means no process holds
            # their write ends any more, so there is no holder to look for in /proc (a walk of every
            # process's descriptors, which every git and cargo command paid for before); an empty cgroup
            # or an empty group is known in constant time (proctree.finish)
            cgroup = args.cgroup if isinstance(args, SandboxedCommand) else None
            finish(proc, cgroup=cgroup, inodes=inodes if pipes.open else set())
        except BaseException:
            self._stop(proc, interrupt_grace, inodes)  # KeyboardInterrupt too: never leave cargo running
            raise
        finally:
            pipes.close()
            for pipe in (proc.stdout, proc.stderr, proc.stdin):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:
                        pass
        return Completed(argv, proc.returncode, *pipes.texts(), time.monotonic() - started)

    def _refuse(
        self,
        args: Sequence[str | os.PathLike[str]],
        argv: list[str],
        env: Mapping[str, str] | None,
        shown: str,
        workspace: Path | None,
    ) -> None:
        """Raise when ``argv`` must not start: a toolchain program outside the sandbox, a program not on PATH,
        a run already cancelled."""
        refuse_unsandboxed(args, argv)
        if shutil.which(argv[0], path=(env or os.environ).get("PATH")) is None and not os.path.isabs(argv[0]):
            raise ConfigError(
                f"`{argv[0]}` is not on PATH. Install it (for cargo: `make install` "
                "in the flakebot-magic checkout, or https://rustup.rs) and try again.",
                workspace=workspace,
            )
        if self.cancel.cancelled:
            raise Cancelled(f"Stopped before `{shown}` started.", workspace=workspace)

    def _read(self, proc: subprocess.Popen[bytes], pipes: Pipes, deadline: float) -> str:
        """Read ``pipes`` until the process has exited and they are drained (or :data:`DRAIN_GRACE` has passed
        since: stragglers hold them, and are killed after): ``"exited"``; or ``"cancelled"``, ``"timeout"``
        (past ``deadline``) as soon as one happens, the process still running."""
        exited_at: float | None = None
        while True:
            pipes.read(0.05)
            if exited_at is None and _exited(proc.pid):
                exited_at = time.monotonic()
            if exited_at is not None:
                if not pipes.open:
                    return "exited"
                if time.monotonic() > min(deadline, exited_at + DRAIN_GRACE):
                    return "exited"  # stragglers hold the pipes: they are killed after
            if self.cancel.cancelled:
                return "cancelled"
            if exited_at is None and time.monotonic() > deadline:
                return "timeout"

    @staticmethod
    def _stop(proc: subprocess.Popen[bytes], grace: float, inodes: set[int]) -> None:
        """Kill the command's process group and whatever holds its pipes; reap the leader."""
        # the leader is not reaped yet (a zombie at most), so its PID, which is the group's id, is not reusable
        if grace > 0 and not _exited(proc.pid):
            kill_tree(proc.pid, grace=grace, first=signal.SIGINT)
        else:
            kill_tree(proc.pid)
        for pid in pipe_holders(inodes) if inodes else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        proc.wait()


def _stopped(why: str, command: list[str], timeout: float, workspace: Path | None) -> Cancelled | StageTimeout:
    """What a command stopped before its end raises: cancelled, or past its time limit."""
    if why == "cancelled":
        return Cancelled(stopped_during(command), workspace=workspace)
    return StageTimeout(
        f"`{_short(command)}` ran past its time limit of {timeout:g} s "
        "and was stopped. Raise the limit (build_timeout / test_timeout) "
        "if the crate is just slow to build.",
        command=command,
        seconds=timeout,
        workspace=workspace,
    )


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it (its PID stays reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _write_input(proc: subprocess.Popen[bytes], data: bytes, deadline: float) -> None:
    """The command's input, written by the run's deadline (a reader that never reads never holds this thread)."""
    assert proc.stdin is not None
    try:
        write_within(proc.stdin.fileno(), data, deadline)
    except (OSError, ValueError):  # gone, not reading by the deadline (WriteTimeout), or closed
        pass
    try:
        proc.stdin.close()
    except (OSError, ValueError):
        pass
