"""One lock per tool name: two kernels never build, re-fork or clean the same tool at once.

A build of the tool ``NAME`` holds ``fcntl.flock`` on ``<cache>/locks/NAME.lock``
for the whole pipeline run (fork may move a workspace aside; deploy swaps a
store entry). The file records who holds it (pid, start time, command) so that
whoever finds it taken can say so.

The policy: a second build of the same name, in any process, **waits** up to
:data:`WAIT_SECONDS` for the first to finish (it then usually finds the tool in
the cache), and otherwise fails with :class:`ToolBusy`, naming the holder.
``flakebot clean`` never waits: it asks :func:`held_locks` and skips what a
running build holds. The kernel drops a flock when the holder dies, even by
``kill -9``, so a crashed build never leaves a stale lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import ToolBusy
from .cache import CacheLayout
from .crashpoints import crash_point
from .fsutil import load_json, private_dir, set_aside_non_file
from .names import check_tool_name

__all__ = ["WAIT_SECONDS", "LockHolder", "ToolBusy", "held_locks", "store_lock", "tool_lock"]

#: how long a second build of the same name waits for the first before it gives up
WAIT_SECONDS = 10.0
_POLL = 0.1


@dataclass(frozen=True)
class LockHolder:
    """Who holds a tool's lock (as recorded in the lock file; empty when it could not be read)."""

    pid: int = 0
    started: float = 0.0
    command: str = ""

    def describe(self) -> str:
        if not self.pid:
            return "another process"
        when = time.strftime("%H:%M:%S", time.localtime(self.started)) if self.started else "?"
        command = f", `{self.command}`" if self.command else ""
        return f"pid {self.pid} (since {when}{command})"


def _lock_file(cache: CacheLayout, name: str) -> Path:
    return cache.locks / f"{check_tool_name(name)}.lock"


def _read_holder(fd: int) -> LockHolder:
    try:
        data = load_json(os.pread(fd, 4096, 0).decode("utf-8", "replace") or "{}")
        return LockHolder(int(data.get("pid", 0)), float(data.get("started", 0.0)), str(data.get("command", ""))[:200])
    except (OSError, ValueError, TypeError, AttributeError):
        return LockHolder()


def _open(path: Path) -> int:
    """The lock file ``path``, opened (made when missing). Whatever else stands in its place (a directory, a
    symlink, a FIFO: no build made it, and no process can hold it as the lock) is set aside first
    (``NAME.lock.not-a-file-<ns>``, kept), so that it blocks the tool for no longer than this."""
    for _ in range(3):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            if exc.errno not in (errno.EISDIR, errno.ELOOP, errno.ENXIO):
                raise
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        set_aside_non_file(path)
        crash_point("lock.aside")
    raise IsADirectoryError(errno.EISDIR, "the lock file is no regular file, and comes back", str(path))


@contextmanager
def tool_lock(
    cache: CacheLayout, name: str, *, wait: float | None = None, rebuild: bool = False
) -> Iterator[LockHolder]:
    """Hold the lock of tool ``name`` for the ``with`` block; wait up to ``wait`` seconds for it.

    Raises :class:`ToolBusy` (naming the holder) when it stays taken; it
    says a second run then comes from the cache unless ``rebuild`` (which
    builds again whatever the cache holds). Not re-entrant: a second
    ``tool_lock`` of one name in the same process waits for the first, like
    any other holder.

    Examples
    --------
    >>> import tempfile
    >>> cache = CacheLayout(Path(tempfile.mkdtemp()))
    >>> with tool_lock(cache, "md") as me:
    ...     sorted(held_locks(cache)) == ["md"] and me.pid == os.getpid()
    True
    >>> held_locks(cache)
    {}
    """
    path = _lock_file(cache, name)
    private_dir(path.parent)
    fd = _open(path)
    try:
        deadline = time.monotonic() + (WAIT_SECONDS if wait is None else wait)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                holder = _read_holder(fd)
                then = (
                    "(--rebuild builds it once more then; it does not come from the cache)"
                    if rebuild
                    else "(it will then come from the cache when it asked for the same tool)"
                )
                raise ToolBusy(
                    f"Another build of the tool {name!r} is running: {holder.describe()}. "
                    f"Wait for it to finish and run this again {then}, "
                    f"or build under another name with --name. The lock is {path}.",
                    name=name,
                    holder=holder,
                )
            time.sleep(_POLL)
        me = LockHolder(
            os.getpid(),
            time.time(),
            " ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:200],
        )
        record = json.dumps({"pid": me.pid, "started": me.started, "command": me.command}).encode()
        try:  # who holds it, for the message of whoever waits: the lock is the flock, not this record
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
        except OSError:  # a full disk: the lock holds all the same
            pass
        try:
            yield me
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # drops the flock


def held_locks(cache: CacheLayout) -> dict[str, LockHolder]:
    """The tool names whose lock some process (this one included) holds now, with their holders."""
    directory = cache.locks
    held: dict[str, LockHolder] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return held
    for path in entries:
        if path.suffix != ".lock" or path.is_symlink():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                held[path.stem] = _read_holder(fd)
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return held


@contextmanager
def store_lock(store_dir: Path) -> Iterator[None]:
    """Hold ``flock`` on the store directory itself for the ``with`` block (created if missing).

    Held only for the moments a store entry's manifest is merged and the
    entry swapped in: two builds of different names that share an entry
    never lose each other's part of its manifest.
    """
    Path(store_dir).mkdir(parents=True, exist_ok=True)
    fd = os.open(store_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the flock
