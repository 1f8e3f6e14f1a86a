"""The guard's protocol: one write per call, and a kill at the parent's death that never reaches a stranger.

* a call costs one ``write`` to the guard, at its start: the reap's ``-PGID`` waits for the next ``+``, and a
  new guard is told only the groups still running;
* the guard's program, told of groups and then left by its parent: it kills a registered group (also one whose
  leader is gone and whose leftovers hold the number), spares a group unregistered, and spares a process whose
  PID is registered but which started after the registration's clock (a PID reused while its ``-`` waited).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from flakebot_magic.host.guard import _GUARD_PROGRAM, Guard, _ticks
from flakebot_magic.host.proctree import alive


def _pending(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return b""


def test_a_line_at_each_start_and_each_reap() -> None:
    copies: list[int] = []
    sleepers: list[subprocess.Popen[bytes]] = []

    def start(program: str, read: int) -> subprocess.Popen[bytes]:  # a guard that never reads: we read for it
        copies.append(os.dup(read))
        os.set_blocking(copies[-1], False)
        sleepers.append(subprocess.Popen(["sleep", "60"]))
        return sleepers[-1]

    guard = Guard(start)
    try:
        guard.add(101)
        mark, _, first = _pending(copies[0]).partition(b"\n")  # a guard is told the mark first, once
        assert mark == b"=" + guard.mark.encode()
        assert first.startswith(b"+101 ") and first.count(b"\n") == 1
        assert 0 <= _ticks() - int(first.split()[1]) < 100
        guard.remove(101)  # told at once: a guard that held the number could kill a stranger that got the PID
        assert _pending(copies[0]) == b"-101\n"
        guard.remove(999)  # never added (a fork's child's): nothing
        assert _pending(copies[0]) == b""
        guard.add(102)
        assert _pending(copies[0]).startswith(b"+102 ")
        guard.remove(102)
        guard.add(103)
        sleepers[0].kill()
        sleepers[0].wait()
        os.close(copies[0])  # the guard's pipe has no reader left: the next line starts another
        guard.add(104)
        told = _pending(copies[1])
        assert sorted(line.split()[0] for line in told.splitlines()) == [b"+103", b"+104", b"=" + guard.mark.encode()]
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
        for fd in copies[1:]:
            os.close(fd)


def _session(command: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", command], stdout=subprocess.PIPE, start_new_session=True)


def test_the_guard_kills_its_groups_and_never_a_reused_pid() -> None:
    registered = _session("sleep 300")
    unregistered = _session("sleep 300")
    stranger = _session("sleep 300")  # stands for a process that took a registered group's PID later
    leftover_leader = _session("sleep 300 & echo $!")
    assert leftover_leader.stdout is not None
    leftover = int(leftover_leader.stdout.readline())
    leftover_leader.wait()  # the leader is reaped: only the leftover holds its group's number
    now = _ticks()
    guard = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARD_PROGRAM], stdin=subprocess.PIPE)
    assert guard.stdin is not None
    lines = [
        b"+%d %d\n" % (registered.pid, now),
        b"+%d %d\n" % (unregistered.pid, now),
        b"-%d\n" % unregistered.pid,
        b"+%d %d\n" % (stranger.pid, _started(stranger.pid) - 1),  # registered before it started
        b"+%d %d\n" % (leftover_leader.pid, now),
    ]
    try:
        guard.stdin.write(b"".join(lines))
        guard.stdin.close()  # the parent's death, as the guard sees it
        assert guard.wait(timeout=30) == 0
        assert registered.wait(timeout=10) == -signal.SIGKILL
        deadline = time.monotonic() + 10
        while alive(leftover) and time.monotonic() < deadline:  # not our child: reaped by init once killed
            time.sleep(0.02)
        assert not alive(leftover)
        assert unregistered.poll() is None and stranger.poll() is None
    finally:
        for proc in (registered, unregistered, stranger, leftover_leader):
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if alive(leftover):
            os.kill(leftover, signal.SIGKILL)


def _started(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return int(stat.read().rsplit(b")", 1)[1].split()[19])
