"""The cache dir's layout: every directory under it named once, here (:class:`CacheLayout`), and made private.

A test reads the package to hold that no other module joins one of these
names onto a path, and that docs/ARCHITECTURE.md lists each of them.

The cache holds binaries that get executed (the store), what proves them
(provenance, proofs) and what a session steers by: each of its directories
is this user's alone. :func:`make_private` is the one way one is made
(``0700``); :meth:`CacheLayout.create` makes them all, and ``Settings.cache``
calls it, so whatever module writes under the cache finds its directory
there already, private. A directory that exists and that another user owns,
or that others may write to, is refused (anything could have been put in
it): the error says to check it and ``chmod 700`` it, or to use another
cache dir. One only others may read (a cache made before this rule) is
tightened to ``0700``.

Examples
--------
>>> layout = CacheLayout(Path("/c"))
>>> layout.journals, layout.attempts
(PosixPath('/c/journals'), PosixPath('/c/tools/attempts'))
"""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..commands import typed
from ..errors import StorageError

__all__ = ["CACHE_DIRECTORIES", "NOT_A_DIRECTORY", "CacheLayout", "make_private"]


#: what a layout directory that was no directory (a file, a dangling symlink) is renamed to: ``NAME.not-a-dir-<ns>``
NOT_A_DIRECTORY = ".not-a-dir-"

#: every directory directly under the cache dir, and what it holds
CACHE_DIRECTORIES: dict[str, str] = {
    "workspaces": "one git workspace per tool (and, while a build runs, .next/, .old/, .sandbox/)",
    "store": "built tools, hash-addressed (HASH-crate-version/)",
    "tools": "the tool inventory (tools.sqlite3); attempts/: builds that made no tool",
    "recipes": "request inputs -> store path",
    "index": "search indexes (registry/shared_index.py): the cache dir's own where no shared place can be used; "
    "the default cache dir's is the user's, shared by every cache dir",
    "logs": "each tool's build log, a cache hit's, a failed run's",
    "intents": "install transactions not finished yet, one intent record per tool name",
    "gcroots": "nix GC roots of live tools (nix backend)",
    "journals": "each tool's edit sessions and races, to resume them",
    "steer": "each running session's steering mailbox",
    "locks": "one lock file per tool name: one build at a time",
    "probes": "cached probes (can a nixpkgs reference be locked here)",
    "proofs": "passing test runs, one record per ProofKey digest (records/proofs.py); clean keeps them",
    "damaged": "records found damaged (an intent naming a path outside its place), set aside, never acted on",
    "units": "compiled dependency units, sealed by content (records/units.py), and their stub builds",
}


def make_private(path: Path, *, parents: bool = False) -> Path:
    """``path`` as a directory of this user's alone: created ``0700``, or checked and tightened to ``0700``.

    The one way a directory of the cache is made. ``parents``: missing
    directories above it are made too (as ``mkdir -p`` does; only ``path``
    itself is checked). Raises :class:`~flakebot_magic.errors.StorageError`
    (saying what to do) when it cannot be made, is no directory, belongs to
    another user, or others may write to it.
    """
    path = Path(path)
    if not _private(path, parents=parents):
        raise StorageError(
            f"The cache's {path} is not a directory. Run {typed('doctor')} (it sets it aside), or remove it.",
            path=path,
        )
    return path


def _private(path: Path, *, parents: bool = False, follow: bool = True) -> bool:
    """:func:`make_private`, but False (nothing done) for something that is no directory. ``follow=False``: a
    symlink is no directory either (a layout directory: what is under a link may be anywhere, so nothing is
    done through it; only the cache dir itself may be a link, to where the user keeps it)."""
    try:
        try:
            info = os.stat(path) if follow else os.lstat(path)  # usually there already (one system call)
        except FileNotFoundError:
            if parents:
                path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:  # made beside us a moment ago (checked as any other), or a dangling symlink
                if not os.path.exists(path):
                    return False
            info = os.stat(path) if follow else os.lstat(path)
    except NotADirectoryError:
        return False  # its parent is a file: no directory can be here (doctor sets the parent aside)
    except OSError as exc:
        raise StorageError(
            f"Cannot make the cache directory {path}: {exc.strerror or exc}. Check that you may write there, "
            "or point FLAKEBOT_CACHE_DIR (the cache_dir setting) at a directory of yours.",
            path=path,
            errno=exc.errno,
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        return False
    if info.st_uid != os.geteuid():
        raise StorageError(
            f"The cache directory {path} belongs to another user (uid {info.st_uid}): flakebot runs binaries from "
            "its cache, so it uses only directories of yours. Point FLAKEBOT_CACHE_DIR (the cache_dir setting) "
            "at a directory of yours.",
            path=path,
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StorageError(
            f"The cache directory {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): anyone could "
            "have put a binary or a record in it, and flakebot runs binaries from its cache. Check what it holds, "
            f"then `chmod 700 {path}` (or remove it, or point FLAKEBOT_CACHE_DIR elsewhere).",
            path=path,
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)  # readable by others only (made before this rule): tightened
    return True


@dataclass(frozen=True)
class CacheLayout:
    """The directories under the cache dir ``root`` (paths; :meth:`create` makes them).

    ``Settings.cache`` gives one whose directories were all made private (``0700``) first.
    """

    root: Path

    def _under(self, name: str) -> Path:
        return Path(self.root) / name

    @property
    def workspaces(self) -> Path:
        return self._under("workspaces")

    @property
    def store(self) -> Path:
        return self._under("store")

    @property
    def tools(self) -> Path:
        return self._under("tools")

    @property
    def attempts(self) -> Path:
        """Builds that made no tool (failed, cancelled): one record each, beside the tool inventory."""
        return self.tools / "attempts"

    @property
    def recipes(self) -> Path:
        return self._under("recipes")

    @property
    def index(self) -> Path:
        return self._under("index")

    @property
    def logs(self) -> Path:
        return self._under("logs")

    @property
    def intents(self) -> Path:
        """Transactions not finished yet (:mod:`flakebot_magic.manage.transaction`): one intent record per tool name."""
        return self._under("intents")

    @property
    def gcroots(self) -> Path:
        """Nix GC roots of live tools (nix backend): one symlink per tool name."""
        return self._under("gcroots")

    @property
    def pending_gcroots(self) -> Path:
        """Where ``nix build`` puts its out-links until their deploys complete (``clean`` removes leftovers)."""
        return self.gcroots / ".pending"

    @property
    def journals(self) -> Path:
        return self._under("journals")

    @property
    def steer(self) -> Path:
        return self._under("steer")

    @property
    def locks(self) -> Path:
        return self._under("locks")

    @property
    def probes(self) -> Path:
        return self._under("probes")

    @property
    def toolchain_memo(self) -> Path:
        """The toolchain a build found, kept for the next process (:func:`~flakebot_magic.sandbox.toolchain_of`)."""
        return self.probes / "toolchain.json"

    @property
    def proofs(self) -> Path:
        return self._under("proofs")

    @property
    def units(self) -> Path:
        """The unit store: dependency units compiled in stub builds, sealed (:mod:`flakebot_magic.records.units`)."""
        return self._under("units")

    def inside(self, path: Path | str, under: Path | None = None, *, follow: bool = True) -> bool:
        """Whether ``path`` is strictly under ``under`` (a directory of this layout; the cache dir by default),
        symlinks resolved: the one check every path a cache file names passes before it is removed, moved or
        written, so that whatever the cache's files say nothing outside the cache dir is touched.

        ``under`` is taken where the layout puts it (a layout directory that is a symlink to elsewhere does not
        move it); ``follow=False`` resolves all but the last part (an operation on the entry itself: removing or
        renaming a symlink acts on the link). A relative path, or one with a ``..`` that leaves, is outside.
        """
        path = Path(path)
        if not path.is_absolute() or path.name in ("", ".", ".."):
            return False
        root = Path(os.path.realpath(self.root))
        try:
            base = root / Path(under if under is not None else self.root).relative_to(self.root)
            where = Path(os.path.realpath(path)) if follow else Path(os.path.realpath(path.parent)) / path.name
            return where != base and where.is_relative_to(base)
        except (ValueError, OSError):
            return False

    @property
    def damaged(self) -> Path:
        """Records of the cache found damaged (an intent that names a path outside its place, or of wrong types),
        set aside here, kept for a look, never acted on."""
        return self._under("damaged")

    def directories(self) -> list[Path]:
        """Every directory of the layout, each parent before what is under it."""
        nested = [self.attempts, self.pending_gcroots]
        return [self._under(name) for name in CACHE_DIRECTORIES] + nested

    def create(self) -> CacheLayout:
        """Make the root and every directory of the layout private (:func:`make_private`); this layout.

        A layout path that is something else (a file, a symlink) is left for
        ``doctor`` (:meth:`set_aside_non_directories`); a symlink is never
        followed, so nothing outside the cache is changed.
        """
        make_private(self.root, parents=True)
        for path in self.directories():
            if path.parent != self.root and (path.parent.is_symlink() or not path.parent.is_dir()):
                continue  # under a layout path that is no directory: doctor sets that aside first
            _private(path, follow=False)  # False for a file or a symlink: left for doctor, never followed
        return self

    def set_aside_non_directories(self) -> list[str]:
        """Each layout directory that is something else (a file, a symlink: to a directory or dangling), renamed
        aside (kept; a symlink's target is never touched) and made again, empty; what was done, in words. A symlink
        is no directory of the cache: what is under it may be anywhere.

        Raises ``OSError`` when the cache cannot be written (the caller says so).
        """
        done = []
        for path in self.directories():
            if not os.path.lexists(path) or (path.is_dir() and not path.is_symlink()):
                continue
            aside = path.with_name(f"{path.name}{NOT_A_DIRECTORY}{time.monotonic_ns()}")
            os.rename(path, aside)
            make_private(path)
            done.append(f"set aside {path} (it was not a directory): it is at {aside} now (kept), made again empty")
        return done
