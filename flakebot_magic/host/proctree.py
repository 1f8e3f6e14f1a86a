"""Process identity and process-tree kills: who a PID is, what a finished command left behind, and its end.

:func:`kill_tree` is the one process-tree kill; :func:`process_started_at`
tells a process from a later one that reused its PID; :func:`finish` ends
what a command whose leader has exited left behind, and proves nothing is
left in constant time when it can (the command's own cgroup is empty, or its
process group is gone once the leader is reaped) rather than by reading every
process of the machine in ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Set
from pathlib import Path

__all__ = ["alive", "finish", "kill_tree", "pipe_holders", "process_started_at"]


def _clock_ticks() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def _uptime() -> float | None:
    try:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):
        return None


def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat from field 3 (state) on; the command name may hold spaces."""
    try:  # os.open and os.read: no buffered file object per process (a group scan reads every process's)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.read(fd, 4096).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)
    return raw[raw.rfind(")") + 2 :].split()


def process_started_at(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch, ±1 s), or None when there is none.

    Compare it with the time a PID was recorded: a process that started
    after that is another process that reused the PID, and must not be
    signalled.
    """
    fields = _stat_fields(pid)
    uptime = _uptime()
    if not fields or uptime is None or len(fields) < 20:
        return None
    # field 22, starttime, counts clock ticks since boot; /proc/stat's btime drifts with clock steps
    return time.time() - (uptime - int(fields[19]) / _clock_ticks())


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    members: list[int] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    group = str(pgid)
    for entry in entries:
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields and len(fields) > 2 and fields[2] == group and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def kill_tree(pid_or_pgid: int, *, grace: float = 0.0, first: int = signal.SIGTERM) -> None:
    """Kill process group ``pid_or_pgid``, all of it, and wait (up to 5 s) until its members are gone.

    With ``grace`` > 0 the group gets ``first`` (SIGTERM; nix wants SIGINT)
    and that many seconds to end by itself; then SIGKILL. A sandboxed command
    is a group too: killing bubblewrap ends its pid namespace, and with it
    everything inside, ``setsid`` or not. Zombies (unreaped members) count as
    gone. Quietly does nothing for a group that no longer exists.
    """
    if pid_or_pgid <= 1:
        raise ValueError(f"refusing to kill process group {pid_or_pgid}")
    if grace > 0:
        try:
            os.killpg(pid_or_pgid, first)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while _group_members(pid_or_pgid) and time.monotonic() < deadline:
            time.sleep(0.02)
    deadline = time.monotonic() + 5.0
    while True:
        try:
            os.killpg(pid_or_pgid, signal.SIGKILL)
        except ProcessLookupError:
            return
        if not _group_members(pid_or_pgid) or time.monotonic() > deadline:
            return
        time.sleep(0.02)  # a member forked between the signal and now


def _pipe_inode(fd: int) -> int:
    return os.fstat(fd).st_ino


def alive(pid: int | None) -> bool:
    """Whether a process ``pid`` exists (one owned by another user counts); False for no pid."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parent_of(pid: int) -> int | None:
    """The parent PID of ``pid`` (from ``/proc/PID/stat``), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()  # after "(comm)", which may hold spaces
    return int(fields[1]) if len(fields) > 1 else None


def pipe_holders(inodes: Set[int]) -> list[int]:
    """Processes with a descriptor on one of the pipes ``inodes``, other than this one and its own children.

    This process's children are left out: a command another thread is just
    starting holds copies of every open pipe between its fork and its exec
    (which closes them: they are close-on-exec). What holds a finished
    command's pipes for real is that command's descendants, never ours.
    """
    wanted = {f"pipe:[{inode}]" for inode in inodes}
    holders: list[int] = []
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return holders
    for entry in entries:
        if not entry.isdigit() or int(entry) == me or _parent_of(int(entry)) == me:
            continue
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{entry}/fd/{fd}") in wanted:
                    holders.append(int(entry))
                    break
            except OSError:
                continue
    return holders


def _cgroup_members(cgroup: Path) -> list[int] | None:
    """The processes in ``cgroup`` (exited ones, zombies, are not listed), or None when it cannot be read."""
    try:
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return None


def _empty_cgroup(cgroup: Path, *, timeout: float = 5.0) -> bool:
    """SIGKILL every process in ``cgroup`` until none is left; whether it was read empty (within ``timeout``).

    One read when nothing is left. A process forked while the list was read
    is in the cgroup too, so the next reading catches it.
    """
    deadline = time.monotonic() + timeout
    while members := _cgroup_members(cgroup):
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return members is not None


def finish(proc: subprocess.Popen[bytes], *, cgroup: Path | None = None, inodes: Set[int] = frozenset()) -> None:
    """After ``proc`` (a group leader) has exited: kill whatever it left, reap it; nothing of it survives.

    The group gets SIGKILL while its leader is unreaped (the group id is still
    this command's). Then the proof that nothing is left, without a walk of
    ``/proc``:

    * with ``cgroup`` (a sandboxed command's pids cgroup, which every process
      it starts enters, ``setsid`` or not, and which sandboxed code cannot
      leave): its process list is read until it is empty, killing what it
      names; an empty list is one read;
    * then the leader is reaped, and ``killpg(group, SIGKILL)`` fails with
      ``ESRCH`` at once when no member is left (a group id stays taken while
      any process is in the group, so it names no other process then); only
      when a member remains does :func:`kill_tree` walk ``/proc`` to wait for
      it.

    ``inodes``: the output pipes of a command whose pipes were not at their
    end; any process holding one is killed too (a walk of ``/proc``, paid only
    then).
    """
    pgid = proc.pid
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    emptied = cgroup is not None and _empty_cgroup(cgroup)
    for pid in pipe_holders(inodes) if inodes else ():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    if not emptied:  # an empty cgroup held every member of the group: nothing to look for
        kill_tree(pgid)
