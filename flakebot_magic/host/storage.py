"""The cache on disk: OS and SQLite errors turned into :class:`~flakebot_magic.errors.StorageError` once, free space.

Whatever reads or writes the cache dir can meet ``OSError`` or ``sqlite3.Error``.
The boundaries (the tool inventory, the search index, a build, a management
command) wrap their work in :func:`storage_errors`, which re-raises either as a
:class:`~flakebot_magic.errors.FlakebotError` that says what happened and what
to do (``raise ... from exc``, as httpx's ``map_exceptions`` does). A full
disk is ``ENOSPC``/``EDQUOT``, SQLite's ``SQLITE_FULL``, or an I/O error
(``SQLITE_IOERR``, or a child process such as cargo or git that failed)
while the file system has next to nothing free; a child process says it in
words only, its C library's (:func:`no_space`: the one place they are read).

Examples
--------
>>> import tempfile
>>> with storage_errors("reading the demo", Path(tempfile.mkdtemp())):  # doctest: +SKIP
...     open("/nonexistent/file").read()
Traceback (most recent call last):
StorageError: reading the demo failed: No such file or directory (/nonexistent/file). ...
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import CacheFileDamaged, DiskFull, FlakebotError, StorageError
from .fsutil import TooLarge, UnsafePath, load_json, read_regular

__all__ = [
    "CACHE_FILE_LIMIT",
    "FULL_MARGIN",
    "NO_SPACE_WORDS",
    "SAID_FULL_MARGIN",
    "amount",
    "free_bytes",
    "is_full",
    "no_space",
    "ran_out_of_space",
    "read_cache_file",
    "read_cache_json",
    "storage_errors",
    "translate",
]

#: the most bytes a cache file (a manifest, a record, a log) may hold before it is taken for damage:
#: far above any real one (a manifest is a few KB, a build log a few MB), far below "reads forever"
CACHE_FILE_LIMIT = 64 * 1024 * 1024

#: below this many free bytes a failure is taken for a full disk (a failed cargo may already have removed
#: its half-written temporary files, so "0 bytes free" is too strict)
FULL_MARGIN = 4 * 1024 * 1024

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NO_PERMISSION = (errno.EACCES, errno.EPERM, errno.EROFS)
# SQLite's primary result codes (https://sqlite.org/rescode.html)
_SQLITE_ERROR, _SQLITE_PERM, _SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 1, 3, 5, 6, 8
_SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_AUTH, _SQLITE_NOTADB = 10, 11, 13, 14, 23, 26
#: what a damaged database answers: no such table (an empty file), malformed, not a database
DAMAGED_CODES = frozenset({_SQLITE_ERROR, _SQLITE_CORRUPT, _SQLITE_NOTADB})

CLEAN_HINT = (
    f"{typed('clean')} removes unused store entries, old workspaces and build outputs; "
    f"{typed('clean --all')} removes every tool"
)


def amount(size: int) -> str:
    """``12.3 MB (12,345,678 bytes)``: the rounded size for a glance, the bytes exactly."""
    return f"{size / 1e6:.1f} MB ({size:,} bytes)"


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged write may still use on the file system holding ``path`` (or its nearest parent)."""
    current = Path(os.path.abspath(path))
    while True:
        try:
            info = os.statvfs(current)
        except OSError:
            if current.parent == current:
                return 0
            current = current.parent
            continue
        return info.f_bavail * info.f_frsize


def is_full(path: Path, margin: int = FULL_MARGIN) -> bool:
    """Whether the file system holding ``path`` has less than ``margin`` bytes free."""
    return free_bytes(path) < margin


#: how a program says it met ENOSPC or EDQUOT: its C library's words (Rust adds "(os error 28)"), in a
#: compiler's, a linker's, a test's or git's output
NO_SPACE_WORDS = tuple(os.strerror(code) for code in _NO_SPACE)
#: below this many free bytes, a child that said so found this disk full: a failed cargo removes what it had
#: half written, so what it leaves free is far above :data:`FULL_MARGIN` and far below a roomy disk's (a test
#: filling the sandbox's own small tmpfs says the same words on a disk with room: that is the crate's)
SAID_FULL_MARGIN = 512 * 1024 * 1024


def ran_out_of_space(exc: OSError, path: Path) -> bool:
    """Whether ``exc`` (of an operation writing under ``path``) means the disk or the quota is full."""
    return exc.errno in _NO_SPACE or (exc.errno == errno.EIO and is_full(path))


def no_space(what: str, path: Path, *outputs: str) -> DiskFull | None:
    """The :class:`DiskFull` for a child process (cargo, its tests, git, nix) whose ``outputs`` say it met no
    space, on the disk holding ``path``; None when they do not, or the disk has room (:data:`SAID_FULL_MARGIN`)."""
    said = any(words in text for text in outputs for words in NO_SPACE_WORDS)
    if not said or free_bytes(path) >= SAID_FULL_MARGIN:
        return None
    return _disk_full(what, path, errno_=errno.ENOSPC)


def sqlite_code(exc: sqlite3.Error) -> tuple[int, str]:
    """SQLite's primary result code and extended name of ``exc`` (``(0, "")`` when it carries none)."""
    code = getattr(exc, "sqlite_errorcode", None)
    name = getattr(exc, "sqlite_errorname", None)
    return (code & 0xFF if isinstance(code, int) else 0), (name if isinstance(name, str) else "")


def _disk_full(what: str, path: Path, *, errno_: int | None = None, code: str = "") -> DiskFull:
    free = free_bytes(path)
    return DiskFull(
        f"{what} failed: the disk holding {path} is full ({amount(free)} free). Free some space, then try again: "
        f"{CLEAN_HINT}.",
        path=path,
        free=free,
        errno=errno_,
        code=code,
    )


def translate(
    exc: OSError | sqlite3.Error,
    what: str,
    path: Path,
    *,
    damaged: Callable[[sqlite3.Error, str], StorageError] | None = None,
) -> StorageError:
    """The :class:`StorageError` (or :class:`DiskFull`) for ``exc``, met while ``what`` (``"listing the tools"``).

    ``path`` is the file or directory the work was on; ``damaged`` makes the
    error for a database that is not one (malformed, not a database, its
    table missing); by default a plain :class:`StorageError` naming the file.
    """
    if isinstance(exc, sqlite3.Error):
        primary, name = sqlite_code(exc)
        if primary == _SQLITE_FULL or (primary == _SQLITE_IOERR and is_full(path)):
            return _disk_full(what, path, code=name)
        if primary in DAMAGED_CODES or (isinstance(exc, sqlite3.DatabaseError) and not primary):
            if damaged is not None:
                return damaged(exc, name)
            return StorageError(
                f"{what} failed: {path} is damaged ({exc}). Move it aside; flakebot makes it again.",
                path=path,
                code=name,
            )
        if primary in (_SQLITE_BUSY, _SQLITE_LOCKED):
            return StorageError(
                f"{what} failed: {path} stayed locked by another process ({exc}). Try again when the other "
                "flakebot command (a build, a clean) has finished.",
                path=path,
                code=name,
            )
        if primary in (_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_AUTH, _SQLITE_CANTOPEN):
            return StorageError(
                f"{what} failed: {path} cannot be opened for writing ({exc}). Check that the cache dir is yours "
                "and writable (mode 0700), or set FLAKEBOT_CACHE_DIR to another directory.",
                path=path,
                code=name,
            )
        return StorageError(
            f"{what} failed: SQLite reported {name or type(exc).__name__} ({exc}) on {path}. "
            f"{typed('doctor')} checks and repairs the cache.",
            path=path,
            code=name,
        )
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        # a copy of a tree collects one error per file: the first says what happened
        first = [*exc.args[0][0], "", "", ""]
        exc = OSError(None, str(first[2]), str(first[1]))
    named = exc.filename
    where = Path(os.fsdecode(named)) if isinstance(named, (str, bytes, os.PathLike)) and named else path
    if ran_out_of_space(exc, path):
        return _disk_full(what, path, errno_=exc.errno)
    if exc.errno in _NO_PERMISSION:
        return StorageError(
            f"{what} failed: {exc.strerror or exc} ({where}). Check that the cache dir is yours and writable "
            "(mode 0700), or set FLAKEBOT_CACHE_DIR to another directory.",
            path=where,
            errno=exc.errno,
        )
    return StorageError(
        f"{what} failed: {exc.strerror or exc} ({where}). {typed('doctor')} checks and repairs "
        "the cache; if the error persists, the disk may be failing.",
        path=where,
        errno=exc.errno,
    )


@contextmanager
def storage_errors(
    what: str, path: Path, *, damaged: Callable[[sqlite3.Error, str], StorageError] | None = None
) -> Iterator[None]:
    """Re-raise every ``OSError`` and ``sqlite3.Error`` of the block as a :class:`StorageError` (see :func:`translate`).

    A :class:`~flakebot_magic.errors.FlakebotError` passes through unchanged.
    """
    try:
        yield
    except FlakebotError:
        raise
    except (OSError, sqlite3.Error) as exc:
        raise translate(exc, what, path, damaged=damaged) from exc


def read_cache_file(path: Path, limit: int = CACHE_FILE_LIMIT) -> bytes:
    """The bytes of the cache file ``path``: the one way a cache file is read, bounded and never blocking.

    Opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked to be a regular file
    before a byte is read (:func:`~flakebot_magic.host.fsutil.read_regular`):
    a FIFO, a device, a directory, a symlink or a file of more than ``limit``
    bytes is :class:`~flakebot_magic.errors.CacheFileDamaged` naming it and
    ``flakebot doctor``; a missing file is ``FileNotFoundError``.
    """
    try:
        data, more = read_regular(path, limit)
        if more:
            raise TooLarge(f"{path} holds more than {limit:,} bytes")
    except (UnsafePath, TooLarge) as exc:
        raise CacheFileDamaged(
            f"{path} is damaged ({exc}). {typed('doctor')} sets a damaged store entry aside; remove or rebuild "
            "what it names.",
            path=path,
        ) from None
    return data


def read_cache_json(path: Path) -> dict[str, Any]:
    """The JSON object in the cache file ``path``: the one reader of a store manifest, so damage reads one way.

    Raises ``OSError`` when it cannot be read (missing: ``FileNotFoundError``),
    and :class:`~flakebot_magic.errors.CacheFileDamaged` naming the file and
    ``flakebot doctor`` when it holds no JSON object (emptied, random bytes,
    not UTF-8, nested too deep to decode) or is no regular file of a sane size (:func:`read_cache_file`).
    """
    raw = read_cache_file(path)
    try:
        data = load_json(raw.decode("utf-8"))
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, nested too deep
        data = exc
    if not isinstance(data, dict):
        why = data if isinstance(data, ValueError) else f"a JSON {type(data).__name__}, not an object"
        raise CacheFileDamaged(
            f"{path} is damaged ({str(why)[:200]}). {typed('doctor')} sets the damaged entry aside; the next "
            "build of the tool makes it again.",
            path=path,
        )
    return data
