"""Walking, copying and removing trees that untrusted code shaped: an explicit stack, no symlink followed.

A workspace, a candidate's clone, a registry's crate and a benchmark's
checkout are trees somebody else made. Python's own tree functions are the
wrong tools for them: ``os.walk``, ``shutil.copytree`` and ``shutil.rmtree``
recurse (a tree a few thousand directories deep raises ``RecursionError``:
the edit loop's listing, ``clean --all``), ``copytree`` and ``read_text``
follow symlinks unless told otherwise (a benchmark whose instructions link to
``~/secret.txt`` sent the file to the model), and ``os.walk`` skips a
directory it cannot list without a word. So every such tree is read here:

* :class:`Walk`: ``os.walk`` top-down, links never entered, with a stack
  instead of recursion; it does not go below ``max_depth`` and says where it
  stopped (:attr:`Walk.too_deep`) and what it could not list
  (:attr:`Walk.unreadable`), so a caller can refuse instead of skipping;
* :func:`copy_tree`: regular files (:func:`~flakebot_magic.host.fsutil.copy_regular`:
  ``O_NOFOLLOW``, capped) and directories; a symlink is kept as a link
  (its text, never its target) or left out, a FIFO, device or socket left
  out, each named in the :class:`CopyReport`; a budget of bytes and files;
* :func:`stat_tree`: the ``lstat`` of every entry, by descriptors (what the
  sandbox's disk and file limits count, what ``clean`` frees): no depth or
  path length hides an entry from the count;
* :func:`remove_tree`: ``rm -rf`` by file descriptors (``openat`` with
  ``O_NOFOLLOW``, ``unlinkat``), so neither the depth nor the length of a
  path matters: a directory deeper than :data:`OPEN_DIRS` is moved up to the
  top and removed from there, so it never holds more than that many
  descriptors, and a directory a sandbox made unreadable (mode ``000``) is
  made the owner's again first.

(``host/fsutil.py`` holds the single-file habits: one read, one write, one copy.)
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .fsutil import TooLarge, UnsafePath, copy_regular

__all__ = ["MAX_DEPTH", "OPEN_DIRS", "CopyReport", "Walk", "copy_tree", "remove_tree", "stat_tree"]

#: how deep a reader goes below its root by default; no crate, checkout or workspace needs more
MAX_DEPTH = 128
#: the most directory descriptors :func:`remove_tree` holds at once
OPEN_DIRS = 64

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Walk:
    """``os.walk(root)`` (top-down, symlinks never entered) without recursion, no deeper than ``max_depth``.

    Iterating yields ``(dirpath, dirnames, filenames)`` as ``os.walk`` does
    (a symlink to a directory is in ``dirnames`` but never entered; pruning
    ``dirnames`` in place skips them). A directory below ``max_depth`` is not
    entered but named in :attr:`too_deep`; one that cannot be listed is named
    in :attr:`unreadable` with why (``os.walk`` would skip it in silence).

    >>> import tempfile; root = Path(tempfile.mkdtemp()); (root / "a" / "b").mkdir(parents=True)
    >>> walk = Walk(root, max_depth=1); [Path(d).relative_to(root).as_posix() for d, _, _ in walk]
    ['.', 'a']
    >>> [Path(p).relative_to(root).as_posix() for p in walk.too_deep]
    ['a/b']
    """

    def __init__(self, root: str | Path, *, max_depth: int = MAX_DEPTH) -> None:
        self.root = os.fspath(root)
        self.max_depth = max_depth
        #: directories that were not entered: deeper than ``max_depth``
        self.too_deep: list[str] = []
        #: directories that could not be listed, and why
        self.unreadable: list[tuple[str, str]] = []

    def __iter__(self) -> Iterator[tuple[str, list[str], list[str]]]:
        stack: list[tuple[str, int]] = [(self.root, 0)]
        while stack:
            top, depth = stack.pop()
            dirs: list[str] = []
            files: list[str] = []
            links: set[str] = set()
            try:
                with os.scandir(top) as entries:
                    for entry in entries:
                        try:
                            is_dir = entry.is_dir()
                        except OSError:
                            is_dir = False
                        (dirs if is_dir else files).append(entry.name)
                        if is_dir and entry.is_symlink():
                            links.add(entry.name)
            except OSError as exc:
                self.unreadable.append((top, exc.strerror or str(exc)))
                continue
            yield top, dirs, files
            below = [(os.path.join(top, name), depth + 1) for name in dirs if name not in links]
            if depth >= self.max_depth:
                self.too_deep += [path for path, _ in below]
                continue
            stack.extend(reversed(below))  # os.walk's order: the first directory first


@dataclass
class CopyReport:
    """What :func:`copy_tree` copied, and what it left out (relative path -> why)."""

    files: int = 0
    bytes: int = 0
    left_out: dict[str, str] = field(default_factory=dict)


def copy_tree(
    source: Path,
    dest: Path,
    *,
    links: bool = False,
    skip: Callable[[str], bool] | None = None,
    max_bytes: int = 1 << 40,
    max_files: int = 1 << 31,
    max_depth: int = MAX_DEPTH,
    times: bool = False,
) -> CopyReport:
    """Copy the tree ``source`` to ``dest`` (made if missing) without following a symlink anywhere.

    Regular files are copied as bytes (executable bit kept), capped together
    at ``max_bytes`` and ``max_files`` (:class:`~flakebot_magic.host.fsutil.TooLarge`).
    A symlink is recreated as a link to the same text with ``links``, else left
    out; a FIFO, device or socket is left out; ``skip(relative_path)`` leaves
    out what it says (not entered); a directory deeper than ``max_depth`` is
    left out. What was left out, and why, is in the report. With ``times``, a
    file keeps its access and modification times (git's index then finds a
    copied work tree unchanged). ``source`` itself must be a real directory (:class:`~flakebot_magic.host.fsutil.UnsafePath`).
    """
    report = CopyReport()
    if not stat.S_ISDIR(os.lstat(source).st_mode):
        raise UnsafePath(f"{source} is not a directory (a symlink?); refusing to copy it")
    os.makedirs(dest, exist_ok=True)
    stack: list[tuple[str, int]] = [("", 0)]
    while stack:
        relative, depth = stack.pop()
        here = os.path.join(source, relative) if relative else os.fspath(source)
        with os.scandir(here) as entries:
            listed = sorted(entries, key=lambda e: e.name)
        for entry in listed:
            rel = f"{relative}/{entry.name}" if relative else entry.name
            if skip is not None and skip(rel):
                continue
            target = os.path.join(dest, rel)
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                if depth + 1 > max_depth:
                    report.left_out[rel] = f"a directory deeper than {max_depth} levels"
                    continue
                os.makedirs(target, exist_ok=True)
                stack.append((rel, depth + 1))
            elif stat.S_ISLNK(info.st_mode):
                if links:
                    os.symlink(os.readlink(entry.path), target)
                    if times:
                        os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
                else:
                    report.left_out[rel] = "a symlink (never followed)"
            elif stat.S_ISREG(info.st_mode):
                if report.files >= max_files:
                    raise TooLarge(f"{source} holds more than {max_files:,} files")
                report.bytes += copy_regular(
                    entry.path, Path(target), executable=bool(info.st_mode & 0o111), limit=max_bytes - report.bytes
                )
                report.files += 1
                if times:
                    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
            else:
                report.left_out[rel] = "not a regular file (a FIFO, a device or a socket)"
    return report


def stat_tree(root: str | Path) -> Iterator[os.stat_result]:
    """The ``lstat`` of every entry under ``root`` (not ``root`` itself), by descriptors: no symlink followed, no
    depth and no path length too great (a count a writer cannot hide from below ``PATH_MAX``).

    At most :data:`OPEN_DIRS` descriptors are held: a directory whose turn
    comes again is opened anew from the nearest open one above it, one
    ``O_NOFOLLOW`` step at a time. What cannot be listed or opened (it went
    meanwhile) is passed over. ``root`` missing or not a directory: nothing.
    """
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError:
        return
    frames = [_Frame(top, "")]
    try:
        yield from _listed(frames[0])
        while frames:
            frame = frames[-1]
            if not frame.pending:
                frames.pop()
                if frame.fd >= 0:
                    os.close(frame.fd)
                continue
            name = frame.pending.pop()
            try:
                below = _Frame(os.open(name, _DIR_FLAGS, dir_fd=_reopened(frames)), name)
            except OSError:
                continue
            frames.append(below)
            if len(frames) > OPEN_DIRS:  # keep the root and the last OPEN_DIRS - 1 open
                far = frames[len(frames) - OPEN_DIRS]
                if far.fd >= 0:
                    os.close(far.fd)
                    far.fd = -1
            yield from _listed(below)
    finally:
        for frame in frames:
            if frame.fd >= 0:
                os.close(frame.fd)


def _listed(frame: _Frame) -> Iterator[os.stat_result]:
    """Each entry's ``lstat`` in ``frame``'s directory; its subdirectories become the frame's ``pending``."""
    try:
        with os.scandir(frame.fd) as entries:
            for entry in entries:
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    frame.pending.append(entry.name)
                yield info
    except OSError:
        return


def _reopened(frames: list[_Frame]) -> int:
    """The descriptor of the last frame, opened again (from the nearest open frame above) if it was closed."""
    last = len(frames) - 1
    if frames[last].fd >= 0:
        return frames[last].fd
    start = max(i for i in range(last) if frames[i].fd >= 0)
    for i in range(start + 1, last + 1):
        frames[i].fd = os.open(frames[i].name, _DIR_FLAGS, dir_fd=frames[i - 1].fd)
    for i in range(1, len(frames) - OPEN_DIRS + 1):  # the chain just opened is closed again above the window
        if frames[i].fd >= 0 and i != last:
            os.close(frames[i].fd)
            frames[i].fd = -1
    return frames[last].fd


def remove_tree(path: str | Path, *, ignore_errors: bool = False) -> None:
    """Remove ``path`` and everything under it, following no symlink, whatever the depth (``rm -rf``).

    ``path`` itself, when a symlink or a file, is unlinked (its target is
    untouched). Missing: nothing done. What cannot be removed is passed
    over and the rest removed; then the first error is raised, unless
    ``ignore_errors`` (as ``shutil.rmtree(ignore_errors=True)``).
    """
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    errors: list[OSError] = []
    try:
        parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        _remove_at(parent_fd, name, errors)
    finally:
        os.close(parent_fd)
    errors = [e for e in errors if not isinstance(e, FileNotFoundError)]
    if errors and not ignore_errors:
        raise errors[0]


@dataclass
class _Frame:
    """One directory :func:`remove_tree` is in: its descriptor, its name in the one above, what is left in it."""

    fd: int
    name: str
    pending: list[str] = field(default_factory=list)


def _remove_at(parent_fd: int, name: str, errors: list[OSError]) -> None:
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=parent_fd).st_mode):
            os.unlink(name, dir_fd=parent_fd)
            return
        top = _Frame(_open_dir(parent_fd, name), name)
    except OSError as exc:
        errors.append(exc)
        return
    stack = [top]
    try:
        _clear(top, errors)
        while stack:
            frame = stack[-1]
            if frame.pending:
                child = frame.pending.pop()
                try:
                    if len(stack) >= OPEN_DIRS:  # moved up to the top, removed from there at a shallow depth
                        top.pending.append(_move_up(frame.fd, child, top.fd))
                        continue
                    below = _Frame(_open_dir(frame.fd, child), child)
                except OSError as exc:
                    errors.append(exc)
                    continue
                stack.append(below)
                _clear(below, errors)
                continue
            stack.pop()
            os.close(frame.fd)
            frame.fd = -1
            try:
                os.rmdir(frame.name, dir_fd=stack[-1].fd if stack else parent_fd)
            except OSError as exc:
                errors.append(exc)
    finally:
        for frame in stack:
            if frame.fd >= 0:
                os.close(frame.fd)


def _open_dir(parent_fd: int, name: str) -> int:
    """The directory ``name`` (never a symlink), opened, its owner's to empty (a ``chmod 000`` undone)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except PermissionError:
        held = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
        try:
            os.chmod(f"/proc/self/fd/{held}", 0o700)  # the directory itself: the descriptor is no symlink
        finally:
            os.close(held)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o700 != 0o700:
            os.fchmod(fd, 0o700)
    except OSError:
        os.close(fd)
        raise
    return fd


def _clear(frame: _Frame, errors: list[OSError]) -> None:
    """Unlink everything in ``frame`` but its directories, which become its ``pending``."""
    with os.scandir(frame.fd) as entries:
        listed = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in entries]
    for name, is_dir in listed:
        if is_dir:
            frame.pending.append(name)
            continue
        try:
            os.unlink(name, dir_fd=frame.fd)
        except OSError as exc:
            errors.append(exc)


def _move_up(fd: int, name: str, top_fd: int) -> str:
    """Rename the directory ``name`` of ``fd`` into ``top_fd`` under a fresh name; the new name."""
    for _ in range(8):
        fresh = f".flakebot-rm-{secrets.token_hex(8)}"
        try:
            os.rename(name, fresh, src_dir_fd=fd, dst_dir_fd=top_fd)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                continue
            raise
        return fresh
    raise OSError(errno.EEXIST, "no fresh name to move a directory up to", name)
