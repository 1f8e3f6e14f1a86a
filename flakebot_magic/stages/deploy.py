"""The ``deploy`` stage (cargo backend): put the built binaries in a content-addressed store.

A store entry is ``<cache>/store/<hash>-<crate>-<version>/`` with ``bin/``
and ``manifest.json``. The hash covers the source tree and Cargo.lock (the
workspace's git tree, less the flake files that do not affect a cargo
build), the rustc version and the build flags: the same inputs always give
the same path, and an existing path is reused without building.

An entry is replaced in one step: the new one is built in a staging
directory, fsync-ed, then swapped with the old one by ``renameat2(...,
RENAME_EXCHANGE)``, so a reader (or a crash, even ``kill -9``) sees the old
entry or the new one, never none and never half of one. The old one, now
under the staging name, is removed afterwards; ``flakebot clean`` removes
what a killed run left behind.

An entry is content: any tool whose workspace builds to the same hash may
share it. What belongs to one tool (its commit, its workspace, the tool that
forked the source) is kept per tool name in the manifest's ``tools`` map:
a tool is named there once its record is saved (:func:`add_tool`, by
:mod:`flakebot_magic.manage.transaction`), and a replaced entry's names are carried
into the new one, both under the store's lock
(:func:`~flakebot_magic.host.locks.store_lock`), so tools with the same content
never overwrite each other's data. The record and the tool card in the
tool's workspace hold it too.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import DeployError, StorageError
from ..host.crashpoints import crash_point
from ..host.entry import binary_digest, entry_damage, restore_modes
from ..host.fsutil import atomic_write, fsync_dir, sha256_regular
from ..host.git import Git
from ..host.locks import store_lock
from ..host.storage import read_cache_json
from ..host.trees import Walk, remove_tree
from ..sandbox.diagnostics import BINARY_NAME
from ..sandbox.layout import DEPS_DIR, SOURCE_PATHSPEC

__all__ = [
    "DAMAGED_PREFIX",
    "STAGING_PREFIX",
    "StorePath",
    "add_tool",
    "deploy",
    "entry_damage",
    "lookup",
    "served",
    "set_aside",
    "source_digest",
    "staging_owner",
    "store_key",
    "swap_in",
    "write_entry",
]

STORE_FORMAT = 1
#: tracked files and directories that do not change what cargo builds: the flake, and the stub its dependencies'
#: derivation builds (a rebuild's workspace holds them in its proven commit, a first build's not yet)
_NOT_BUILD_INPUTS = ("flake.nix", "flake.lock", DEPS_DIR)


@dataclass(frozen=True)
class StorePath:
    """A deployed tool's directory in the store."""

    path: Path
    hash: str

    @property
    def manifest(self) -> dict[str, Any]:
        return read_cache_json(self.path / "manifest.json")

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def __str__(self) -> str:
        return str(self.path)


def source_digest(git: Git, backend: str = "cargo") -> hashlib._Hash:
    """A running SHA-256 of the build inputs in ``git``'s work tree: the committed tree, then everything else
    cargo could read.

    The committed tree is git's listing (each path, mode and blob hash), so
    the same source hashes the same in any clone on any machine. For the nix
    backend the flake files are build inputs too (flake.lock pins nixpkgs,
    which supplies the toolchain). Then uncommitted edits, and the content of
    every file git does not track, ignored ones included (``include_str!``
    reads a file whatever ``.gitignore`` says; a sandboxed test may leave one):
    only flakebot's own output directories are left out
    (:data:`~flakebot_magic.sandbox.layout.NOT_SOURCE`).
    """
    digest = hashlib.sha256()
    listing = git("ls-tree", "-r", "--full-tree", "HEAD")
    for line in listing.splitlines():
        path = line.split("\t", 1)[-1]
        if backend == "nix" or not any(path == p or path.startswith(f"{p}/") for p in _NOT_BUILD_INPUTS):
            digest.update(line.encode() + b"\n")
    not_inputs = [f":(exclude){path}" for path in _NOT_BUILD_INPUTS]
    status = git("status", "--porcelain", "--untracked-files=all", "--", ".", *not_inputs)
    if status:  # uncommitted edits change the binary too
        digest.update(status.encode())
        digest.update(git("diff", "HEAD", "--", ".", *not_inputs).encode())
    # untracked files, ignored or not: by content (status names them only, and never the ignored ones)
    others = git("ls-files", "--others", "-z", "--", *SOURCE_PATHSPEC, *not_inputs)
    for rel in sorted(filter(None, others.split("\0"))):
        file = git.root / rel
        digest.update(b"\0untracked:" + rel.encode() + b"\0")
        if file.is_symlink():
            digest.update(b"L" + os.readlink(os.fsencode(file)))  # bytes: a target need not be UTF-8
            continue
        try:
            digest.update(sha256_regular(file).encode())
        except OSError as exc:  # a FIFO, a device, gone meanwhile: its kind decides, never its content
            digest.update(f"unreadable:{type(exc).__name__}".encode())
    return digest


def store_key(git: Git, rustc_version: str, flags: Sequence[str], backend: str = "cargo") -> str:
    """The hash of everything that decides the built binary (:func:`source_digest`, the toolchain, the flags)."""
    digest = source_digest(git, backend)
    digest.update(
        f"\0rustc:{rustc_version}\0flags:{' '.join(flags)}\0backend:{backend}\0format:{STORE_FORMAT}".encode()
    )
    return digest.hexdigest()[:32]


def _entry(store_dir: Path, key: str, crate: str, version: str) -> Path:
    return store_dir / f"{key}-{crate}-{version}"


def lookup(store_dir: Path, key: str, crate: str, version: str) -> StorePath | None:
    """The store entry for ``key``, when a complete, undamaged one exists.

    A damaged one (:func:`entry_damage`) is set aside (:func:`set_aside`) and
    is no cache hit: the build makes the entry again.
    """
    return served(_entry(store_dir, key, crate, version), key)


def served(path: Path, key: str) -> StorePath | None:
    """``path`` as a cache hit: None when it is not there, or damaged (then it is set aside)."""
    if not (path / "manifest.json").is_file():
        return None
    if entry_damage(path):
        if not entry_damage(path, modes=False):  # whole, its modes taken away: given back, as doctor does
            try:
                restore_modes(path)
            except (OSError, StorageError):
                pass
        if entry_damage(path):
            set_aside(path)
            return None
    return StorePath(path, key)


#: a store entry found damaged and set aside (``.damaged-<entry>-<ns>``; ``flakebot clean`` removes it)
DAMAGED_PREFIX = ".damaged-"


def set_aside(path: Path) -> Path | None:
    """Move the damaged store entry ``path`` aside (kept for a look, until ``flakebot clean``); where it went."""
    aside = path.with_name(f"{DAMAGED_PREFIX}{path.name}-{time.monotonic_ns()}")
    try:
        os.rename(path, aside)
    except OSError:  # gone already (another process set it aside), or the store cannot be written
        return None
    return aside


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2


def _renameat2(source: Path, target: Path, flags: int) -> None:
    """``renameat2(2)``; raises ``OSError(ENOSYS)`` where the C library lacks it."""
    function = getattr(_LIBC, "renameat2", None) if _LIBC is not None else None
    if function is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(target))


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover - no C library to load
    _LIBC = None


def _fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (a small store entry), then ``root`` itself."""
    for directory, _, files in Walk(root):
        for name in files:
            path = os.path.join(directory, name)
            if os.path.islink(path):
                continue
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(directory))


def swap_in(staging: Path, final: Path) -> None:
    """Make ``staging`` the entry ``final`` in one step; the old entry (if any) ends up at ``staging``.

    Store entries and workspaces (:mod:`flakebot_magic.manage.transaction`) are swapped this way.
    """
    try:
        _renameat2(staging, final, _RENAME_NOREPLACE)
        return
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            pass
        elif exc.errno in (errno.ENOSYS, errno.EINVAL):
            if not final.exists():  # renameat2 unsupported here; a plain rename onto nothing is atomic too
                try:
                    os.rename(staging, final)
                    return
                except OSError as again:
                    if again.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                        raise
        else:
            raise
    try:
        _renameat2(staging, final, _RENAME_EXCHANGE)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        # no atomic exchange on this file system: the shortest window we can have
        aside = staging.with_name(staging.name + ".old")
        os.rename(final, aside)
        os.rename(staging, final)
        os.rename(aside, staging)


def write_entry(
    store_dir: Path, key: str, crate: str, version: str, fill: Callable[[Path], None], manifest: dict[str, Any]
) -> StorePath:
    """Write the store entry for ``key`` atomically: ``fill(staging)`` makes ``bin``, then the manifest.

    Both backends write their entries through here, so the recipe, lookup and
    cleanup machinery treat cargo-built and nix-built tools alike. An
    existing entry (a ``--rebuild``: same inputs, same path) is swapped out
    in one step, never removed first; the tools it named stay named in the
    new manifest's ``tools``.
    """
    final = _entry(store_dir, key, crate, version)
    staging = store_dir / f"{STAGING_PREFIX}{key}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        staging.mkdir(parents=True)
        crash_point("deploy.staging")
        fill(staging)
        crash_point("deploy.filled")
        with store_lock(store_dir):
            # the tools the replaced entry named stay named (each tool's own data: stages/deploy.py's docstring)
            data = {**manifest, "hash": key, "format": STORE_FORMAT, "tools": _tools_of(final)}
            atomic_write(staging / "manifest.json", json.dumps(data, indent=2, sort_keys=True), mode=0o644)
            crash_point("deploy.manifest")
            _fsync_tree(staging)
            crash_point("deploy.synced")
            swap_in(staging, final)
            fsync_dir(store_dir)
            crash_point("deploy.swapped")
        remove_tree(staging, ignore_errors=True)  # the replaced entry, now under the staging name
        crash_point("deploy.done")
    except OSError as exc:
        raise DeployError(f"Could not write the store entry {final}: {exc}") from exc
    finally:
        if staging.exists() or staging.is_symlink():
            remove_tree(staging, ignore_errors=True)
    return StorePath(final, key)


def _tools_of(entry: Path) -> dict[str, Any]:
    """The ``tools`` map of ``entry``'s manifest ({} when there is none)."""
    try:
        data = read_cache_json(entry / "manifest.json")
    except (OSError, StorageError):
        return {}
    tools = data.get("tools")
    return dict(tools) if isinstance(tools, dict) else {}


def add_tool(store: StorePath, name: str, data: dict[str, Any]) -> None:
    """Name one more tool in ``store``'s manifest (``tools[name] = data``), atomically, under the store's lock.

    Only the ``tools`` map changes; the rest of the manifest (what the entry
    holds) stays as it is.
    """
    try:
        with store_lock(store.path.parent):
            manifest = store.manifest
            tools = dict(manifest.get("tools") or {})
            if tools.get(name) == data:
                return
            manifest["tools"] = {**tools, name: data}
            atomic_write(store.path / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True), mode=0o644)
    except (OSError, StorageError) as exc:
        raise DeployError(f"Could not name {name!r} in the store entry {store.path}: {exc}") from exc


#: the name of a store entry under construction (or an old one being removed)
STAGING_PREFIX = ".staging-"


def staging_owner(path: Path) -> int | None:
    """The pid of the run that owns a staging directory in the store (``None``: not a staging name)."""
    if not path.name.startswith(STAGING_PREFIX):
        return None
    parts = path.name[len(STAGING_PREFIX) :].split("-")
    try:
        return int(parts[1])
    except (IndexError, ValueError):
        return None


def _copy_binary(name: str, source: Path, target: Path, digest: str | None = None) -> None:
    """Copy one built binary into the staging entry without following a symlink at either end.

    With ``digest``, the bytes copied must have that SHA-256 (the build's), or
    :class:`DeployError`: the file changed after its build.
    """
    if not BINARY_NAME.fullmatch(name):
        raise DeployError(
            f"Refusing to deploy a binary named {name[:80]!r}: a binary name is letters, digits, '_' and '-'."
        )
    try:
        source_fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise DeployError(f"Refusing to deploy {source}: it is a symlink, not the built binary.") from exc
        raise
    try:
        info = os.fstat(source_fd)
        if not stat.S_ISREG(info.st_mode):
            raise DeployError(f"Refusing to deploy {source}: it is not a regular file.")
        target_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o700)
        copied = hashlib.sha256()
        try:
            while True:
                chunk = os.read(source_fd, 1 << 20)
                if not chunk:
                    break
                copied.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(target_fd, view) :]
            if digest is not None and copied.hexdigest() != digest:
                raise DeployError(
                    f"Refusing to deploy {name}: {source} is not the binary its build made (SHA-256 "
                    f"{copied.hexdigest()[:16]}…, the build's {digest[:16]}…); something changed it after the build. "
                    f"Nothing was deployed; build again ({typed('build --rebuild ...', '%%flakebot --rebuild')})."
                )
            os.fchmod(target_fd, 0o555)
            os.utime(target_fd, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(target_fd)
    finally:
        os.close(source_fd)


def deploy(
    store_dir: Path,
    key: str,
    crate: str,
    version: str,
    binaries: Mapping[str, Path],
    manifest: dict[str, Any],
    *,
    digests: Mapping[str, str] | None = None,
) -> StorePath:
    """Copy ``binaries`` into the store entry for ``key``, atomically.

    Names must match :data:`~flakebot_magic.sandbox.diagnostics.BINARY_NAME` and
    sources be regular files (never followed through a symlink). With
    ``digests`` (the build's, :class:`~flakebot_magic.stages.build.BuildResult`),
    each binary must still have its SHA-256, or nothing is deployed.
    """
    if not binaries:
        raise DeployError(f"{crate} {version} built no binaries, so there is nothing to deploy.")
    for name in binaries:
        if not BINARY_NAME.fullmatch(name):
            raise DeployError(
                f"Refusing to deploy a binary named {name[:80]!r}: a binary name is letters, digits, '_' and '-'."
            )

    recorded: dict[str, Any] = {}  # what the manifest keeps of each copy, for the doctor and every cache hit

    def copy_binaries(staging: Path) -> None:
        (staging / "bin").mkdir()
        for name, source in sorted(binaries.items()):
            _copy_binary(name, Path(source), staging / "bin" / name, None if not digests else digests.get(name, ""))
            recorded[name] = binary_digest(staging / "bin" / name)

    # the digests are of the copies: they are in the manifest, written after fill
    manifest = {**manifest, "binaries": sorted(binaries), "digests": recorded}
    return write_entry(store_dir, key, crate, version, copy_binaries, manifest)
