"""Files flakebot writes where untrusted code could have planted something: atomic, no symlinks followed.

Crate code and model-written code run with write access to the workspace, so
any path under it may be a symlink planted to redirect the next write (to
``~/.bashrc``, say). Every write flakebot makes goes through :func:`atomic_write`:
a fresh temporary file opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` in the
target's directory, written, ``fsync``-ed, then renamed over the target (a
rename replaces a symlink, it never follows it), with no symlink allowed in the
directories between ``root`` and the target.

Reading is the mirror image: :func:`read_regular` reads at most so many bytes
of a regular file, never through a symlink and never blocking on a FIFO that
untrusted code left in the file's place.

Directories flakebot keeps in a workspace for itself (``target/``, the edit
loop's target dir, the sandbox's temporary dir, candidates) are made real by
:func:`real_dir` before each use: whatever untrusted code left at any of their
components (a symlink to ``/root``, a file) is removed, never followed, so a
path flakebot hands to bubblewrap or to cargo resolves to the same place
inside the sandbox and out.

The same module owns the other file habits: private directories
(:func:`private_dir`, mode ``0700``), ``fsync`` of a directory
(:func:`fsync_dir`) and reading TOML (:func:`load_toml`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

__all__ = [
    "UnsafePath",
    "atomic_write",
    "check_no_symlinks",
    "fsync_dir",
    "is_real_dir",
    "load_toml",
    "private_dir",
    "read_regular",
    "real_dir",
    "remove_nofollow",
    "sha256_regular",
]


class UnsafePath(OSError):
    """A write was refused because a symlink (or a non-directory) stands in the way."""


def check_no_symlinks(root: Path, path: Path) -> None:
    """Raise :class:`UnsafePath` unless every directory from ``root`` down to ``path``'s parent is a real directory.

    ``path`` itself may be a symlink (it is replaced, never followed, by
    :func:`atomic_write`); the directories above it may not, or a write would
    land outside ``root``.
    """
    root = Path(os.path.abspath(root))
    path = Path(os.path.abspath(path))
    try:
        relative = path.parent.relative_to(root)
    except ValueError:
        raise UnsafePath(f"{path} is not inside {root}") from None
    current = root
    for part in relative.parts:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            return  # the rest is created by the caller, as real directories
        if stat.S_ISLNK(info.st_mode):
            raise UnsafePath(f"{current} is a symlink; refusing to write through it")
        if not stat.S_ISDIR(info.st_mode):
            raise UnsafePath(f"{current} is not a directory")


def is_real_dir(path: Path) -> bool:
    """Whether ``path`` is a directory itself (not a symlink to one)."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_nofollow(path: Path) -> None:
    """Remove ``path``, whatever it is; a symlink is removed, never followed (nothing there: nothing done)."""
    if is_real_dir(path):
        shutil.rmtree(path)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def real_dir(root: Path, path: Path, *, mode: int = 0o755) -> Path:
    """Make ``path`` (under ``root``) a chain of real directories from ``root`` down; return it.

    Each component between ``root`` and ``path`` that is missing is created;
    one that is a symlink, a file or anything but a directory is removed first
    (never followed). Only for directories that hold flakebot's outputs, never
    source: what untrusted code left there is not kept. ``root`` itself is
    trusted (flakebot made it). Raises :class:`UnsafePath` when ``path`` is
    not under ``root``.

    Examples
    --------
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> outside = Path(tempfile.mkdtemp())
    >>> (d / "target").symlink_to(outside)
    >>> real_dir(d, d / "target" / "flakebot-test") == d / "target" / "flakebot-test"
    True
    >>> (d / "target").is_symlink(), list(outside.iterdir())
    (False, [])
    """
    root = Path(os.path.abspath(root))
    path = Path(os.path.abspath(path))
    try:
        relative = path.relative_to(root)
    except ValueError:
        raise UnsafePath(f"{path} is not inside {root}") from None
    current = root
    for part in relative.parts:
        current = current / part
        for _ in range(3):  # untrusted code racing the fix-up gets three tries, then an error
            if is_real_dir(current):
                break
            remove_nofollow(current)
            try:
                os.mkdir(current, mode)
            except FileExistsError:
                pass
        else:
            if not is_real_dir(current):
                raise UnsafePath(f"{current} keeps being replaced by something that is not a directory")
    return path


def atomic_write(
    path: Path,
    data: bytes | str,
    *,
    mode: int = 0o600,
    root: Path | None = None,
    make_parents: bool = False,
) -> None:
    """Replace ``path`` with ``data`` in one step; a planted symlink is replaced, never followed.

    Parameters
    ----------
    path
        The file to write.
    data
        Its new content (``str`` is written as UTF-8).
    mode
        The new file's permission bits (default: readable by the owner only).
    root
        When given, ``path`` must lie under ``root`` with no symlink in the
        directories between them (:class:`UnsafePath` otherwise).
    make_parents
        Create missing parent directories (as real directories, mode 0700).

    Examples
    --------
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> atomic_write(d / "a.txt", "hi")
    >>> (d / "a.txt").read_text()
    'hi'
    >>> (d / "link").symlink_to(d / "a.txt")
    >>> atomic_write(d / "link", "new", root=d)
    >>> (d / "a.txt").read_text(), (d / "link").is_symlink()
    ('hi', False)
    """
    path = Path(path)
    if root is not None:
        check_no_symlinks(root, path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if root is not None:
            check_no_symlinks(root, path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode, follow_symlinks=False)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    fsync_dir(path.parent)


def read_regular(path: Path, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the regular file ``path``, and whether it holds more.

    The file is opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked with
    ``fstat`` before a byte is read: a symlink, a FIFO, a device or a
    directory raises :class:`UnsafePath` (a file named ``x.rs`` in a
    workspace may be a link to ``~/.ssh/id_rsa`` or a FIFO that never ends).
    A missing file raises ``FileNotFoundError``.

    Examples
    --------
    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> (d / "a").write_text("hello")
    5
    >>> read_regular(d / "a", 4)
    (b'hell', True)
    >>> (d / "b").symlink_to(d / "a")
    >>> read_regular(d / "b", 4)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    UnsafePath: ... is a symlink
    """
    fd = _open_regular(path)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    return data[:limit], len(data) > limit


def _open_regular(path: Path) -> int:
    """A read-only descriptor of the regular file ``path``: never through a symlink, never blocking on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symlink") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file (a FIFO, a device or a directory)")
    return fd


def sha256_regular(path: Path) -> str:
    """The SHA-256 (hex) of the regular file ``path``, read without following a symlink (:class:`UnsafePath`)."""
    fd = _open_regular(path)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def fsync_dir(directory: Path) -> None:
    """``fsync`` a directory, so a rename or a new entry in it survives a crash (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def private_dir(path: Path) -> Path:
    """``path`` as a directory only its owner can enter (created if missing, mode fixed if not)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if stat.S_IMODE(path.stat().st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def load_toml(source: str | Path) -> dict[str, Any]:
    """A TOML document (text, or a file's path) as plain Python data.

    ``tomllib`` when the interpreter has it (3.11+), else ``tomlkit``.
    Raises ``ValueError`` (``tomllib.TOMLDecodeError`` or tomlkit's parse
    error, both subclasses) for malformed input.
    """
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    try:
        import tomllib
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        import tomlkit

        data: dict[str, Any] = tomlkit.parse(text).unwrap()
        return data
    return tomllib.loads(text)
