"""A call's child started by ``posix_spawn`` (:func:`start_call`) is the child ``spawn`` makes, over both doors.

The properties every call's child has, checked for :func:`start_call` (the
tool call's door, by ``posix_spawn``) and :func:`spawn` (``Popen``) alike:

* its own session and group (a kill of the group stops what it started);
* no descriptor of this process but its three pipes, even one made inheritable on purpose (``close_fds``);
* exactly the environment it was given (the allowlist is the caller's: nothing of ``os.environ`` is added);
* ``SIGPIPE`` and ``SIGXFSZ`` at their default, which Python ignores (``restore_signals``);
* registered with the guard until it is reaped, then not;
* a binary that cannot start raises the ``OSError`` of its cause (``FileNotFoundError``, ``PermissionError``)
  and leaves no descriptor behind; a NUL byte or a ``=`` in a name is a ``ValueError``, as in ``Popen``;
* ``wait(timeout)`` raises ``TimeoutExpired`` and the exchange stops a child past its limit.

The death of the parent (the guard kills the call's group) is tested over this door with the others, in
``test_process_entry.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from flakebot_magic.host import process
from flakebot_magic.host.exchange import Exchange
from flakebot_magic.host.guard import MARK
from flakebot_magic.host.process import CallProcess, spawn, start_call

ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "ONLY_THIS": "yes"}


def _via_posix_spawn(argv: list[str], env: dict[str, str]) -> CallProcess | subprocess.Popen[bytes]:
    proc = start_call(argv, env=env)
    assert isinstance(proc, CallProcess), "start_call fell back to Popen on this machine"
    return proc


def _via_popen(argv: list[str], env: dict[str, str]) -> CallProcess | subprocess.Popen[bytes]:
    return spawn(argv, env=env, stdin=True)


DOORS: dict[str, Callable[[list[str], dict[str, str]], CallProcess | subprocess.Popen[bytes]]] = {
    "start_call": _via_posix_spawn,
    "spawn": _via_popen,
}


def _run(door: str, argv: list[str], data: bytes = b"", env: dict[str, str] = ENV) -> tuple[str, int]:
    proc = DOORS[door](argv, env)
    out, _ = Exchange(proc).run(data, 30)
    assert proc.returncode is not None
    return out.decode(), proc.returncode


@pytest.mark.parametrize("door", DOORS)
def test_a_call_child_leads_its_own_session(door: str) -> None:
    out, code = _run(door, ["/bin/sh", "-c", "ps -o pid=,pgid=,sid= -p $$"])
    pid, pgid, sid = map(int, out.split())
    assert code == 0 and pid == pgid == sid != os.getsid(0)


@pytest.mark.parametrize("door", DOORS)
def test_no_descriptor_of_this_process_reaches_the_child(door: str) -> None:
    """Even one made inheritable on purpose, at a low and a high number: only 0, 1 and 2, each a pipe."""
    read, write = os.pipe()
    low = os.dup(read)
    high = 200
    os.dup2(write, high)  # inheritable by default
    os.set_inheritable(low, True)
    try:
        # the shell's own descriptors, listed by another process (ls's directory is its own)
        out, code = _run(door, ["/bin/sh", "-c", "ls /proc/$$/fd; readlink /proc/$$/fd/0 /proc/$$/fd/1 /proc/$$/fd/2"])
    finally:
        for fd in (read, write, low, high):
            os.close(fd)
    lines = out.split()
    assert code == 0
    assert sorted(lines[:-3], key=int) == ["0", "1", "2"], (low, high, out)
    assert all(link.startswith("pipe:") for link in lines[-3:]), out


@pytest.mark.parametrize("door", DOORS)
def test_the_child_sees_exactly_its_environment(door: str) -> None:
    os.environ["FLAKEBOT_TEST_SECRET_TOKEN"] = "must-not-pass"
    try:
        out, code = _run(door, ["/usr/bin/env"])
    finally:
        del os.environ["FLAKEBOT_TEST_SECRET_TOKEN"]
    assert code == 0
    # a CLI call's child also carries the guard's mark (no gate before it: by the mark the guard finds it)
    mark = {MARK: process._guard.mark} if door == "start_call" else {}
    assert dict(line.split("=", 1) for line in out.splitlines()) == {**ENV, **mark}


@pytest.mark.parametrize("door", DOORS)
def test_the_signals_python_ignores_are_at_their_default_in_the_child(door: str) -> None:
    assert signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN  # what a child would inherit
    out, code = _run(door, ["/bin/grep", "^SigIgn", "/proc/self/status"])
    ignored = int(out.split()[1], 16)
    assert code == 0
    assert not ignored & (1 << (signal.SIGPIPE - 1)) and not ignored & (1 << (signal.SIGXFSZ - 1)), out
    # and so a writer into a closed pipe dies of it, as in a shell
    out, code = _run(door, ["/bin/sh", "-c", "/usr/bin/yes | /usr/bin/head -c 1 >/dev/null; echo done"])
    assert (out, code) == ("done\n", 0)


@pytest.mark.parametrize("door", DOORS)
def test_the_guard_holds_the_group_until_it_is_reaped(door: str) -> None:
    proc = DOORS[door](["/bin/sh", "-c", "read line"], ENV)
    assert proc.pid in process._guard._groups
    Exchange(proc).run(b"go\n", 30)
    assert proc.returncode == 0
    assert proc.pid not in process._guard._groups


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_binary_that_cannot_start_raises_its_cause_and_leaves_no_descriptor(tmp_path: Path) -> None:
    not_executable = tmp_path / "tool"
    not_executable.write_text("#!/bin/sh\necho hi\n")
    before, groups = _open_descriptors(), dict(process._guard._groups)
    with pytest.raises(FileNotFoundError):
        start_call([str(tmp_path / "gone")], env=ENV)
    with pytest.raises(PermissionError):
        start_call([str(not_executable)], env=ENV)
    with pytest.raises(ValueError, match="null byte"):
        start_call(["/bin/echo", "a\0b"], env=ENV)
    with pytest.raises(ValueError, match="environment variable name"):
        start_call(["/bin/echo"], env={"A=B": "c"})
    assert _open_descriptors() <= before | {str(max(int(fd) for fd in before) + 1)}  # listdir's own at most
    assert process._guard._groups == groups  # nothing started, nothing registered


def test_a_command_without_a_path_goes_through_popen() -> None:
    proc = start_call(["echo", "hi"], env=ENV)  # posix_spawn does not search PATH: Popen does
    assert isinstance(proc, subprocess.Popen)
    assert Exchange(proc).run(b"", 30)[0] == b"hi\n"


def test_waiting_with_a_limit_and_the_exchange_stop_a_child_that_runs_on() -> None:
    proc = _via_posix_spawn(["/bin/sleep", "30"], ENV)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.05)
    exchange = Exchange(proc)
    with pytest.raises(subprocess.TimeoutExpired):
        exchange.run(b"", 0.2)
    process.kill_tree(proc.pid)
    exchange.close()
    assert proc.returncode == -signal.SIGKILL
    assert proc.poll() == -signal.SIGKILL
    assert proc.pid not in process._guard._groups


def test_output_beyond_the_cap_stops_the_child() -> None:
    proc = _via_posix_spawn(["/usr/bin/yes"], ENV)
    exchange = Exchange(proc, stdout_cap=100_000)
    out, _ = exchange.run(b"", 30)
    assert exchange.overflow and len(out) == 100_000
    assert proc.returncode == -signal.SIGKILL
