"""What a probe of this host found, kept only while what it probed is unchanged (:class:`ProbeCache`).

A probe (can bubblewrap make a sandbox, which toolchain is behind cargo, does
nix build in its sandbox) starts a process, so its answer is kept; but an
answer kept for the life of a kernel goes stale when the user installs,
upgrades or reconfigures the thing probed. So each answer is kept with the
*identity* of what it probed (:func:`file_identity`: path, device, inode,
mtime and size of the binaries and configuration files it read) and is asked
again once that identity changes. A failed probe is kept only
:data:`FAILURE_SECONDS` (the user is likely fixing it), and each cache holds
a bounded number of answers.

Examples
--------
>>> probes = ProbeCache[str, int]("example", 4)
>>> probes.get("k", (), lambda: 7)
7
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from typing import Generic, TypeVar

__all__ = ["FAILURE_SECONDS", "ProbeCache", "file_identity"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: how long a failed probe's answer is kept before the next use asks again
FAILURE_SECONDS = 30.0


def file_identity(paths: Iterable[str | os.PathLike[str] | None]) -> tuple[tuple[object, ...], ...]:
    """What each path is now: its resolved path, device, inode, mtime and size (``None`` fields when missing).

    A replaced binary (a new inode), an edited configuration file (mtime,
    size) or a different file at the same name gives another identity.
    """
    found: list[tuple[object, ...]] = []
    for path in paths:
        if path is None:
            continue
        text = os.fspath(path)
        try:
            info = os.stat(text)
        except OSError:
            found.append((text, None))
            continue
        found.append((os.path.realpath(text), info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size))
    return tuple(found)


class ProbeCache(Generic[K, V]):
    """Probe answers by key, each valid while its identity is the same; bounded; thread-safe.

    Parameters
    ----------
    name
        What is probed (for the structural test's allowlist and for debugging).
    maxsize
        The most answers kept (the least recently used goes first).
    failed
        Whether an answer is a failure: a failure is kept ``failure_seconds`` only.
    """

    def __init__(
        self,
        name: str,
        maxsize: int,
        *,
        failed: Callable[[V], bool] = lambda _: False,
        failure_seconds: float = FAILURE_SECONDS,
    ) -> None:
        self.name = name
        self.maxsize = maxsize
        self._failed = failed
        self.failure_seconds = failure_seconds
        self._entries: OrderedDict[K, tuple[object, float, V]] = OrderedDict()
        self._lock = threading.Lock()
        #: how many times a probe really ran (tests count them)
        self.probes = 0

    def get(self, key: K, identity: object, probe: Callable[[], V], *, valid: Callable[[V], bool] | None = None) -> V:
        """The answer for ``key``: the kept one while ``identity`` is unchanged (and ``valid`` holds), else ``probe()``.

        Two threads asking at once may both probe; the later answer is kept.
        """
        now = time.monotonic()
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None:
                kept_identity, expires, value = kept
                if kept_identity == identity and now < expires and (valid is None or valid(value)):
                    self._entries.move_to_end(key)
                    return value
                del self._entries[key]
        value = probe()
        expires = now + self.failure_seconds if self._failed(value) else float("inf")
        with self._lock:
            self.probes += 1
            self._entries[key] = (identity, expires, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.maxsize:
                self._entries.popitem(last=False)
        return value

    def clear(self) -> None:
        """Forget every answer (the next use of each probes again)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
