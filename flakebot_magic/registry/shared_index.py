"""Where a registry's search index lives: once per machine and registry, shared by every cache dir.

Building the index of Debian's registry takes 10 to 35 s (its crates' text, and
each crate's meaning through the sentence model); it depends on the registry,
the index's version and the model, not on the cache dir. So it is kept where
every cache dir finds it, in the first of these :func:`index_places` that can
be trusted:

1. **the machine's**, :data:`SYSTEM_INDEX_DIR` (``/var/cache/flakebot/index``):
   written only by ``flakebot index --system`` as root (``make install`` and
   ``make demo`` run it), read by every user;
2. **the user's**, ``index/`` in the user cache dir (``~/.cache/flakebot/index``,
   or under ``$XDG_CACHE_HOME``): what a build of this user writes, shared by
   all of this user's cache dirs (``$FLAKEBOT_CACHE_DIR`` ones too);
3. **the cache dir's own** ``index/``: where neither of the others can be
   used (no home to write, or a place above that cannot be trusted).

A place is trusted (:func:`trusted_dir`) when it and every directory above it
belong to root or to this user and nobody else may write to it (a sticky
directory above it, as ``/tmp``, is fine: others cannot rename or remove what
is in it); an index file (:func:`trusted_file`) is a regular file of root's or
this user's that nobody else may write. An index says which directory holds a
crate's source, so a file somebody else could write could send a build to other
code.

An index is found by its file name (:func:`index_name`: the registry's path,
the index version and the model's identity) and checked by its signature
(the registry's crates and mtime, the same three). A build writes into the first place
this process may write, under a lock (:func:`build_lock`: a second process
waits, then finds it built), beside the old file under a fresh name, then
renamed over it in one step: a reader keeps the file it opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

from ..host.cache import CacheLayout

__all__ = [
    "SYSTEM_INDEX_DIR",
    "SharedIndex",
    "build_lock",
    "index_name",
    "index_places",
    "make_system_place",
    "trusted_dir",
    "trusted_file",
    "user_index_dir",
    "writable_place",
]

#: what fills an empty database with the index (its signature given), reporting ``(done, total)`` as it goes
Fill = Callable[[sqlite3.Connection, Callable[[int, int], None]], None]
#: told ``(done, total)`` while an index is built (``(0, total)`` first): the one word a build gives of itself
Progress = Callable[[int, int], None]

#: the machine's index directory: written by root at install, read by everyone
SYSTEM_INDEX_DIR = Path("/var/cache/flakebot/index")


def user_index_dir() -> Path | None:
    """``index/`` in the user cache dir (``~/.cache/flakebot/index``; ``$XDG_CACHE_HOME`` honoured), or None
    when there is no home to find it in."""
    from platformdirs import user_cache_dir

    try:
        return CacheLayout(Path(user_cache_dir("flakebot", appauthor=False))).index
    except (KeyError, RuntimeError, OSError):  # no HOME and no passwd entry
        return None


def index_places(cache_dir: Path, *, system: Path | None = SYSTEM_INDEX_DIR, user: Path | None = None) -> list[Path]:
    """The places an index is looked for, in order: the machine's, the user's, the cache dir's own (no repeats).

    ``user`` defaults to :func:`user_index_dir`; ``system=None`` leaves the machine's out.

    >>> index_places(Path("/c"), system=Path("/s"), user=Path("/u"))
    [PosixPath('/s'), PosixPath('/u'), PosixPath('/c/index')]
    """
    own = CacheLayout(Path(cache_dir)).index
    places = [p for p in (system, user if user is not None else user_index_dir(), own) if p is not None]
    return list(dict.fromkeys(places))


def index_name(registry: Path, model_identity: str, version: int) -> str:
    """The index file's name for a registry, a model (``"-"``: none) and an index version.

    Two kernels whose search differs (a model, or none) keep two files, never
    rebuilding each other's.
    """
    key = hashlib.sha256(f"{registry}\0{model_identity}\0{version}".encode()).hexdigest()[:24]
    return f"{key}.sqlite"


def _owner_ok(info: os.stat_result) -> bool:
    return info.st_uid in (0, os.geteuid())


def trusted_dir(path: Path) -> bool:
    """Whether ``path`` is a directory that only root and this user can have written into (nor replaced).

    It and every directory above it belong to root or to this user; nobody
    else may write to it, nor to a directory above it unless that one is
    sticky (``/tmp``: others cannot rename or remove what they do not own).
    False when it does not exist.
    """
    path = Path(os.path.abspath(path))
    try:
        info = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode) or not _owner_ok(info) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    for above in path.parents:
        try:
            up = os.stat(above)
        except OSError:
            return False
        if not _owner_ok(up):
            return False
        if up.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not up.st_mode & stat.S_ISVTX:
            return False
    return True


def trusted_file(path: Path) -> bool:
    """Whether ``path`` is a regular file (no symlink) of root's or this user's that nobody else may write."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and _owner_ok(info) and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def writable_place(places: list[Path], *, system: Path | None = SYSTEM_INDEX_DIR) -> Path | None:
    """The first of ``places`` this process may build an index in (made when missing), or None.

    The machine's place is never written here: only ``flakebot index --system``
    writes it (:func:`make_system_place`), so that whatever registry a test or a
    user searches leaves no file in it. The user's is made ``0700``.
    """
    for place in places:
        if system is not None and place == system:
            continue
        with contextlib.suppress(OSError):
            place.mkdir(parents=True, exist_ok=True, mode=0o700)
        if trusted_dir(place) and _owner_ok(os.stat(place)) and os.access(place, os.W_OK):
            return place
    return None


def make_system_place(system: Path = SYSTEM_INDEX_DIR) -> Path:
    """The machine's place, made (``0755``: everyone reads) and checked; OSError when it cannot be (not root)."""
    system.mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(system, 0o755)
    if not trusted_dir(system) or not os.access(system, os.W_OK):
        raise PermissionError(f"{system} cannot be written by this user, or others may write to it")
    return system


@contextlib.contextmanager
def build_lock(place: Path, name: str) -> Iterator[None]:
    """Hold ``place/<name>.lock`` while building the index ``name``: a second builder, in any process, waits.

    The kernel drops the lock when its holder dies (``kill -9`` too), so a
    killed build never blocks the next one.
    """
    lock = place / f"{name}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _open_read_only(path: Path) -> sqlite3.Connection:
    """``path`` opened read-only: the file is never changed in place (a new index is renamed over it)."""
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False)


def signature_of(db: sqlite3.Connection) -> str | None:
    """The signature an index was built for (None: no index, or a damaged one)."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key = 'signature'").fetchone()
    except sqlite3.DatabaseError:
        return None
    return str(row[0]) if row else None


def _sweep(place: Path, keep: Path) -> None:
    """Remove this user's indexes in ``place`` whose registry is gone (a test's, a deleted ``cargo vendor``
    output): a shared place would otherwise keep one file per registry ever searched."""
    for path in place.glob("*.sqlite"):
        if path == keep or not trusted_file(path) or os.lstat(path).st_uid != os.geteuid():
            continue
        try:
            with contextlib.closing(_open_read_only(path)) as db:
                row = db.execute("SELECT value FROM meta WHERE key = 'registry'").fetchone()
        except sqlite3.Error:
            continue
        if row and not os.path.isdir(str(row[0])):
            with contextlib.suppress(OSError):
                path.unlink()
            with contextlib.suppress(OSError):  # nobody builds an index of a registry that is gone
                path.with_name(f"{path.name}.lock").unlink()


class SharedIndex:
    """One registry's index among the :func:`index_places`: found, or built once for every cache dir.

    ``name`` is its file name (:func:`index_name`). :meth:`connect` returns a
    connection to an index with the signature asked for: the first trusted
    place's that has it, else one built (:meth:`build`) in the first place
    this process may write, else (a full disk, nowhere to write) one in memory.
    """

    def __init__(self, places: list[Path], name: str, *, system: Path | None = SYSTEM_INDEX_DIR) -> None:
        self.places, self.name, self.system = places, name, system
        self._skipped: set[Path] = set()
        #: the file in use (after :meth:`open`), or where a build would write it
        self.path = places[-1] / name

    def find(self, signature: str) -> sqlite3.Connection | None:
        """An index with ``signature`` in a trusted place, read-only; None when there is none."""
        for place in self.places:
            path = place / self.name
            if path in self._skipped or not (trusted_dir(place) and trusted_file(path)):
                continue
            db = self._at(path, signature)
            if db is not None:
                self.path = path
                return db
        return None

    def _at(self, path: Path, signature: str) -> sqlite3.Connection | None:
        try:
            db = _open_read_only(path)
        except sqlite3.Error:
            return None
        if signature_of(db) == signature:
            return db
        db.close()
        return None

    def connect(self, signature: str, fill: Fill, progress: Progress | None = None) -> sqlite3.Connection:
        """A connection to the index with ``signature``: found, else built (``progress`` told how far)."""
        return self.find(signature) or self.build(signature, fill, progress)

    def build(
        self, signature: str, fill: Fill, progress: Progress | None = None, *, place: Path | None = None
    ) -> sqlite3.Connection:
        """Build the index into ``place`` (default: the first writable), under its lock; in memory where no
        place can take it. A process that waited for another's build takes that one."""
        target = place or writable_place(self.places, system=self.system)
        report = progress or (lambda done, total: None)
        if target is not None:
            path = target / self.name
            try:
                with build_lock(target, self.name):
                    if place is None:  # another process may have built it while this one waited
                        found = self._at(path, signature) if trusted_file(path) else None
                        if found is not None:
                            self.path = path
                            return found
                    self._write(path, signature, fill, report)
                    _sweep(target, keep=path)
                self._skipped.discard(path)
                self.path = path
                return _open_read_only(path)
            except (OSError, sqlite3.Error):
                if place is not None:
                    raise
        # nowhere can take the index (a full disk): this process keeps one in memory
        db = sqlite3.connect(":memory:", check_same_thread=False)
        fill(db, report)
        return db

    def _write(self, path: Path, signature: str, fill: Fill, report: Progress) -> None:
        """Fill a fresh file beside ``path``, then rename it over ``path`` (readers keep the file they opened)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with contextlib.closing(sqlite3.connect(tmp)) as db:
                fill(db, report)
                if signature_of(db) != signature:
                    raise sqlite3.DatabaseError("the index was filled for another signature")
            os.chmod(tmp, 0o644)  # the machine's place is read by every user; the user's dir is 0700 anyway
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def discard(self) -> None:
        """The index in use is damaged: removed when it is this user's, else never read again by this process."""
        self._skipped.add(self.path)
        with contextlib.suppress(OSError):
            if os.lstat(self.path).st_uid == os.geteuid():
                self.path.unlink()
