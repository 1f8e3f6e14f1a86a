"""What a sandbox allows a command: its resource limits, the cgroups that count its processes and memory, its disk use."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import stat
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from ..host.trees import stat_tree

__all__ = [
    "CommandCgroups",
    "DiskUsage",
    "GiB",
    "Limits",
    "MiB",
    "disk_usage_of",
    "filesystem_usage",
    "make_cgroups",
    "memory_cgroup_killed",
    "memory_cgroups_writable",
    "pids_cgroups_writable",
    "remove_cgroups",
    "stopped",
    "usable_cpus",
]

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class Limits:
    """Per-command resource limits (wall time is the runner's ``timeout``)."""

    #: CPU seconds per process (RLIMIT_CPU) of a command that has no time limit (a confined tool's server);
    #: a command with one gets :meth:`cpu_for` its time limit instead
    cpu_seconds: int = 900
    #: address space per process (RLIMIT_AS)
    memory_bytes: int = 8 * GiB
    #: memory of all the command's processes together (a memory cgroup, where one is writable): many processes
    #: each under :attr:`memory_bytes` are stopped here by the kernel's OOM killer, not the host's
    sandbox_memory_bytes: int = 8 * GiB
    #: largest file a process may write (RLIMIT_FSIZE)
    file_bytes: int = 4 * GiB
    #: stdout plus stderr of one command; past it the command is stopped
    output_bytes: int = 32 * MiB
    #: processes (and threads) at once: a fork bomb stops here
    processes: int = 1024
    #: what the command may write (the workspace, target dir included); past it the command is stopped
    disk_bytes: int = 20 * GiB
    #: files, directories and links in what the command may write (inodes, counted as the disk is):
    #: a crate's build needs thousands, a build script creating empty files without end is stopped here
    files: int = 100_000
    #: the private /tmp and $HOME (tmpfs, so memory)
    tmp_bytes: int = 512 * MiB

    def cpu_for(self, timeout: float | None) -> int:
        """RLIMIT_CPU for a command allowed ``timeout`` wall seconds: the one place the CPU limit is decided.

        The wall time limit comes from the options (``build_timeout`` for
        cargo build, clippy and downloads, ``test_timeout`` for cargo test):
        the CPU limit follows it, so a long build is stopped by its own time
        limit, with the message that names the setting, never first by
        SIGXCPU. A process's threads (rustc's codegen, a parallel test
        binary) spend up to one CPU second per wall second on each CPU it may
        use, so the limit is the time limit times those CPUs. Without a time
        limit: :attr:`cpu_seconds`.

        >>> Limits().cpu_for(1800.0) >= 1800
        True
        """
        if timeout is None:
            return self.cpu_seconds
        return math.ceil(timeout * usable_cpus()) + 1


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


# --- the command's cgroups: its processes (the kernel never applies RLIMIT_NPROC to root) and their memory ---

#: what each cgroup controller limits, by its file (cgroup v1's name, v2's name)
_LIMIT_FILES = {"pids": ("pids.max", "pids.max"), "memory": ("memory.limit_in_bytes", "memory.max")}


def _cgroup_parent(controller: str) -> tuple[Path, bool] | None:
    """A cgroup directory of ``controller`` this process may create children in (and whether it is cgroup v2),
    or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controller in controllers.split(","):
            candidate, unified = Path("/sys/fs/cgroup") / controller / rel, False
        elif controllers == "":
            base = Path("/sys/fs/cgroup")
            if not (base / "cgroup.controllers").exists():
                base = base / "unified"
            candidate, unified = base / rel, True
            try:
                if controller not in (candidate / "cgroup.subtree_control").read_text().split():
                    continue
            except OSError:
                continue
        else:
            continue
        if os.access(candidate, os.W_OK) and (candidate / "cgroup.procs").exists():
            return candidate, unified
    return None


#: per controller, the parent found at first use (the process's own cgroup does not move)
_PARENTS: dict[str, tuple[Path, bool] | None] = {}


def pids_cgroups_writable() -> bool:
    """Whether commands here get a pids cgroup (root, or a delegated cgroup)."""
    return _cgroup_parent("pids") is not None


def memory_cgroups_writable() -> bool:
    """Whether commands here get a memory cgroup: their memory counted together (root, or a delegated cgroup)."""
    return _cgroup_parent("memory") is not None


def _parent(controller: str) -> tuple[Path, bool] | None:
    if controller not in _PARENTS:
        found = _PARENTS[controller] = _cgroup_parent(controller)
        if found is not None:
            _sweep_cgroups(found[0])
    return _PARENTS[controller]


class CommandCgroups(NamedTuple):
    """The cgroups one command enters: the pids one (emptied to end the command), and every one, to enter."""

    pids: Path | None
    all: tuple[Path, ...]


def make_cgroups(limits: Limits) -> CommandCgroups:
    """New cgroups for one command: at most ``limits.processes`` processes, at most ``limits.sandbox_memory_bytes``
    of memory for all of them together (their pages, the page cache they fill, the files of their tmpfs).

    One directory per hierarchy (cgroup v1 has one per controller, v2 one for all); a controller with no
    writable hierarchy here is left out (:func:`pids_cgroups_writable`, :func:`memory_cgroups_writable`).
    """
    wanted = {"pids": limits.processes, "memory": limits.sandbox_memory_bytes}
    made: dict[Path, Path] = {}
    pids: Path | None = None
    for controller, limit in wanted.items():
        found = _parent(controller)
        if found is None:
            continue
        parent, unified = found
        path = made.get(parent) or parent / f"flakebot-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir(exist_ok=True)
            (path / _LIMIT_FILES[controller][unified]).write_text(str(limit))
            if controller == "memory" and not unified and (path / "memory.memsw.limit_in_bytes").exists():
                (path / "memory.memsw.limit_in_bytes").write_text(str(limit))  # no way around it through swap
            elif controller == "memory" and unified and (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
        except OSError:
            if parent not in made:
                _remove_cgroup(path)
            continue
        made[parent] = path
        if controller == "pids":
            pids = path
    return CommandCgroups(pids, tuple(dict.fromkeys(made.values())))


def memory_cgroup_killed(cgroups: Iterable[Path]) -> bool:
    """Whether the kernel killed a process of these cgroups for passing their memory limit."""
    for cgroup in cgroups:
        for name in ("memory.oom_control", "memory.events"):
            with contextlib.suppress(OSError, ValueError):
                for line in (cgroup / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and int(value) > 0:
                        return True
    return False


def _remove_cgroup(path: Path) -> None:
    try:
        path.rmdir()  # fails while a process is still inside: then it stays for the next sweep
    except OSError:
        pass


def _sweep_cgroups(parent: Path) -> None:
    """Remove empty cgroups left by earlier runs (older than a minute: a new one is entered at once)."""
    for entry in parent.glob("flakebot-*"):
        try:
            if time.time() - entry.stat().st_mtime > 60:
                _remove_cgroup(entry)
        except OSError:
            pass


def remove_cgroups(cgroups: list[Path], *, grace: float = 0.0) -> None:
    """Remove the empty cgroups in ``cgroups`` and drop them from the list; busy ones stay for later.

    With ``grace``, a cgroup made less than that many seconds ago stays too: it may belong to a command of the
    same sandbox that has not entered it yet (the build and the test beside it release while the other starts).
    """
    now = time.time()
    for path in list(cgroups):
        if grace:
            try:
                if now - path.stat().st_mtime < grace:
                    continue
            except OSError:
                pass
        _remove_cgroup(path)
        if not path.exists():
            with contextlib.suppress(ValueError):  # the build and the test beside it release at once
                cgroups.remove(path)


class DiskUsage(NamedTuple):
    """What a tree holds: bytes (a file's allocated blocks or its length, whichever is more), and entries
    (each file, directory and link is an inode)."""

    bytes: int
    files: int


def disk_usage_of(roots: Iterable[Path]) -> DiskUsage:
    """Bytes and entries under ``roots``, never following a symlink.

    A file counts its length when that is more than its blocks: a sparse file
    costs the disk almost nothing, but git, libgit2 and nix read (and store)
    it whole, outside the sandbox. An entry reached through two roots, or two
    hard links, counts once.
    """
    total = files = 0
    seen: set[tuple[int, int]] = set()
    for root in roots:
        # by descriptors: no depth or path length hides a file from the count (a path-based walk passed over
        # whatever lay below PATH_MAX, so a writer could fill the disk there unseen)
        for st in stat_tree(root):
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            if st.st_nlink > 1 or stat.S_ISDIR(st.st_mode):
                seen.add(key)
            files += 1
            total += max(st.st_blocks * 512, st.st_size if stat.S_ISREG(st.st_mode) else 0)
    return DiskUsage(total, files)


def filesystem_usage(roots: Iterable[Path]) -> DiskUsage | None:
    """Used bytes and inodes of the file systems holding ``roots`` (each counted once), or None.

    One ``statvfs`` per file system: constant time however many files there are,
    so it can be asked every few milliseconds. It counts everyone's files, not
    only the command's: a rise is a reason to count exactly (:func:`disk_usage_of`),
    never a verdict. None where a file system does not count its inodes (btrfs).
    """
    total = files = 0
    devices: set[int] = set()
    for root in roots:
        try:
            device = os.stat(root).st_dev
            if device in devices:
                continue
            devices.add(device)
            fs = os.statvfs(root)
        except OSError:
            continue
        if fs.f_files == 0:
            return None
        total += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        files += fs.f_files - fs.f_ffree
    return DiskUsage(total, files)


@contextlib.contextmanager
def stopped(cgroups: Iterable[Path]) -> Iterator[list[bool]]:
    """Every process in ``cgroups`` stopped (SIGSTOP) for the block and continued after, unless the
    block appends to the list it is given (to be killed while stopped).

    A process forked while the list is read is caught by the next reading: the
    lists are read until one adds no process.
    """
    paused: set[int] = set()
    keep: list[bool] = []
    try:
        for _ in range(64):
            found: set[int] = set()
            for cgroup in cgroups:
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(line) for line in (cgroup / "cgroup.procs").read_text().split())
            new = found - paused
            if not new:
                break
            for pid in new:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            paused |= new
        yield keep
    finally:
        for pid in () if keep else paused:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
