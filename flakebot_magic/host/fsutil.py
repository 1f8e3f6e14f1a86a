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
untrusted code left in the file's place. A path that *untrusted data names*
(a crate manifest's ``readme``, a ``[[bin]] path``) is read only through
:func:`read_inside`: relative to the crate's root, never leaving it, no
symlink at any step. :func:`copy_regular` copies one regular file the same
way, capped.

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
import json
import os
import secrets
import stat
import time
from pathlib import Path
from typing import Any

__all__ = [
    "MAX_JSON_DEPTH",
    "RACY_SECONDS",
    "TooLarge",
    "UnsafePath",
    "atomic_write",
    "check_no_symlinks",
    "copy_regular",
    "fsync_dir",
    "identity",
    "is_real_dir",
    "load_json",
    "load_toml",
    "private_dir",
    "read_inside",
    "read_regular",
    "real_dir",
    "settled",
    "sha256_regular",
]


class UnsafePath(OSError):
    """A read or write was refused: a symlink, a non-regular file or a path leaving its root stands in the way."""


class TooLarge(OSError):
    """A copy was stopped: the file holds more than the bytes it was allowed."""


#: a file changed less than this many seconds before it was read may change again within the same clock tick
#: and keep its times and size: what was read of it is never reused on the strength of its stat (git's
#: "racily clean" entries)
RACY_SECONDS = 2.0


def identity(st: os.stat_result) -> tuple[int, ...]:
    """What tells one state of a file from another without reading it: device, inode, mode, size, mtime, ctime.

    The change time (ctime) is set by the kernel on every write, rename, chmod and ``utime``, and no
    program, sandboxed or not, can set it back: rewriting a file and restoring its modification time
    still gives it another identity.
    """
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(key: tuple[int, ...]) -> bool:
    """Whether the file of :func:`identity` ``key`` last changed more than :data:`RACY_SECONDS` ago."""
    return time.time() - max(key[4], key[5]) / 1e9 > RACY_SECONDS


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
            try:
                os.mkdir(current, mode)
                break
            except FileExistsError:
                pass
            if is_real_dir(current):  # there already, or made meanwhile by another thread of ours
                break
            try:
                os.unlink(current)  # a symlink, a file, a FIFO: removed, never followed
            except (FileNotFoundError, IsADirectoryError):  # gone, or a directory now: look again
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
    return _read_fd(_open_file(path), path, limit)


def _open_file(path: str | Path, dir_fd: int | None = None) -> int:
    """``path`` opened for reading, never through a final symlink (:class:`UnsafePath`), never blocking."""
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symlink") from None
        raise


def _read_fd(fd: int, path: object, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the open ``fd`` (closed after), if it is a regular file."""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"{path} is not a regular file (a FIFO, a device or a directory)")
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


def read_inside(root: Path, relative: str, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the regular file ``relative`` under ``root``, and whether it holds more.

    The one way to open a file that untrusted data names (a manifest's
    ``readme``, a target's ``path``): ``relative`` must be relative, without
    ``..`` or a NUL; every directory on the way is opened with ``O_NOFOLLOW``
    from the one before (a symlink anywhere is refused, not followed); the
    file itself as :func:`read_regular` opens it (no symlink, no FIFO, no
    device: nothing that can block or never end). Raises :class:`UnsafePath`
    for all of these, ``FileNotFoundError`` when it is missing.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "README.md").write_text("hi")
    >>> read_inside(d, "README.md", 10)
    (b'hi', False)
    >>> read_inside(d, "/proc/self/environ", 10)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    UnsafePath: '/proc/self/environ' is not a path inside the crate
    """
    text = str(relative).replace("\\", "/")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if not text or text.startswith("/") or "\0" in text or ".." in parts or not parts:
        raise UnsafePath(f"{relative!r} is not a path inside the crate")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafePath(f"{relative!r}: {part!r} is a symlink or not a directory") from None
                raise
            os.close(fd)
            fd = inner
        file_fd = _open_file(parts[-1], dir_fd=fd)
    finally:
        os.close(fd)
    return _read_fd(file_fd, relative, limit)


def copy_regular(source: str | Path, dest: Path, *, executable: bool, limit: int) -> int:
    """Copy the regular file ``source`` to the new file ``dest``: bytes only, at most ``limit`` of them.

    Never follows a link and never blocks (``O_NOFOLLOW | O_NONBLOCK``, then
    ``fstat``): a symlink, FIFO or device raises :class:`UnsafePath`; more
    than ``limit`` bytes raises :class:`TooLarge` (and ``dest`` is removed).
    ``dest`` must not exist. Returns the bytes copied.
    """
    fd_in = _open_file(source)
    try:
        if not stat.S_ISREG(os.fstat(fd_in).st_mode):
            raise UnsafePath(f"{source} is not a regular file (a FIFO, a device or a directory)")
        mode = 0o755 if executable else 0o644
        fd_out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        copied = 0
        try:
            while chunk := os.read(fd_in, min(1 << 20, limit + 1 - copied) or 1):
                copied += len(chunk)
                if copied > limit:
                    raise TooLarge(f"{source} holds more than {limit} bytes")
                os.write(fd_out, chunk)
            os.fchmod(fd_out, mode)  # whatever the umask
        except BaseException:
            os.close(fd_out)
            fd_out = -1
            os.unlink(dest)
            raise
        finally:
            if fd_out >= 0:
                os.close(fd_out)
    finally:
        os.close(fd_in)
    return copied


def sha256_regular(path: Path) -> str:
    """The SHA-256 (hex) of the regular file ``path``, read without following a symlink (:class:`UnsafePath`)."""
    fd = _open_file(path)
    digest = hashlib.sha256()
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafePath(f"{path} is not a regular file (a FIFO, a device or a directory)")
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
    """A TOML document (text, or a file's path) as plain Python data: the one TOML parser for untrusted text.

    ``tomllib`` when the interpreter has it (3.11+), else ``tomlkit``.
    Raises ``ValueError`` for any malformed input (``tomllib.TOMLDecodeError``
    and tomlkit's parse error are subclasses), a document nested too deeply
    for the parser's recursion included: a manifest's bad TOML is a clear
    error, never a ``RecursionError`` traceback.

    >>> load_toml("a = " + "[" * 5000)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    ValueError: the TOML is nested too deeply to read
    """
    text = source.read_text(encoding="utf-8") if isinstance(source, Path) else source
    try:
        try:
            import tomllib
        except ModuleNotFoundError:  # pragma: no cover - Python 3.10
            import tomlkit

            data: dict[str, Any] = tomlkit.parse(text).unwrap()
            return data
        return tomllib.loads(text)
    except RecursionError:
        raise ValueError("the TOML is nested too deeply to read") from None


#: how deeply a JSON document :func:`load_json` returns may nest: far more than any message flakebot reads
#: (cargo's, a model's, an MCP server's), far less than the depth at which Python's recursion runs out
MAX_JSON_DEPTH = 200


def load_json(text: str | bytes | bytearray, *, strict: bool = True) -> Any:
    """A JSON document as plain Python data: the one JSON parser (a test reads the package for any other).

    Raises ``ValueError`` for anything that is not JSON (``json.JSONDecodeError``
    and ``UnicodeDecodeError`` are subclasses), and for a document nested more
    than :data:`MAX_JSON_DEPTH` deep: a build script, a test, a tool or a model
    printing ``[[[[...`` gets a clear "not JSON" where it would otherwise raise a
    ``RecursionError``, in the decoder or later in whatever walks the data.
    ``strict=False`` lets control characters stand in strings (``json.loads``' own flag).

    >>> load_json('{"a": [1, 2]}')
    {'a': [1, 2]}
    >>> load_json("[" * 100_000 + "]" * 100_000)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    ValueError: the JSON is nested too deeply to read
    """
    try:
        data = json.loads(text, strict=strict)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply to read") from None
    level: list[tuple[Any, int]] = [(data, 0)]
    while level:  # iterative: the check itself never recurses
        value, depth = level.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError("the JSON is nested too deeply to read")
        if isinstance(value, dict):
            level.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            level.extend((v, depth + 1) for v in value)
    return data
