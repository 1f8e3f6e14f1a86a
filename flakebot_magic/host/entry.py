"""Whether a deployed store entry is whole: the one check a cache hit, ``doctor`` and every client door use.

A store entry (``store/<key>-<crate>-<version>/``) holds ``manifest.json``
and ``bin/``. The manifest records each binary's size and sha256 at deploy
(``digests``). :func:`entry_damage` says in words why an entry cannot be
served ("" when it is whole); :func:`runnable_damage` adds that the binary a
client is about to run is one of the entry's own.

Hashing a binary costs a read of it (a few MB, some ms; see
``tests/host/test_entry.py::test_verdict_is_cached``), and every call of a
client checks its entry. A whole verdict is kept in memory with the
``lstat`` of each file it read (the manifest, each binary it lists, the
binary to run: device, inode, size, ``mtime_ns``, ``ctime_ns``), taken
before the file was read: a write, a swap or a rename changes ``ctime``
(which no user can set back) or the inode, so a changed file is hashed
again. A kept verdict costs a call one ``lstat`` per file (the manifest and
the binary: some microseconds). Only "whole" is kept; damage is found
afresh each time.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import StorageError
from .fsutil import sha256_regular
from .storage import read_cache_json

__all__ = [
    "binary_digest",
    "entry_damage",
    "forget_verdicts",
    "mode_damage",
    "remedy",
    "restore_modes",
    "runnable_damage",
]

_Identity = tuple[int, int, int, int, int]
_Stamp = tuple[_Identity, ...]
#: the files a whole verdict read, and their identity (:func:`_identity`) before it read them
_Kept = tuple[tuple[str, ...], _Stamp]
#: (store entry, binary) -> what vouches for its last whole verdict, the binary one of its own
_WHOLE: dict[tuple[str, str], _Kept] = {}
_LOCK = threading.Lock()


def binary_digest(binary: Path) -> dict[str, Any]:
    """What identifies a deployed binary: its size and sha256 (read without following a link, never blocking)."""
    return {"size": binary.stat().st_size, "sha256": sha256_regular(binary)}


def _bin_dir(path: Path, manifest: dict[str, Any]) -> Path:
    """Where the entry's binaries are: its own ``bin/``, or a nix entry's store path's; a tool pulled into a
    nix store of its own (a chroot store) is reached through the entry's ``bin`` link, as its record says."""
    nix = manifest.get("nix_store_path")
    if nix and not (Path(str(nix)) / "bin").is_dir() and (path / "bin").is_dir():
        return path / "bin"
    return Path(str(nix or path)) / "bin"


def entry_damage(path: Path, *, modes: bool = True) -> str:
    """Why the store entry ``path`` cannot be served, in words ("": it is whole).

    Its manifest must parse (read bounded, never blocking), and each binary
    it lists be there with the size and sha256 recorded at deploy
    (``digests``; an entry from before digests is checked for its binaries
    only). Reading the binaries costs a hash of a few MB: cheap beside a build.
    Its modes must let a process without privileges read and run it
    (:func:`mode_damage`); ``modes=False`` asks about its content alone (is it
    as deployed: evidence of a tool, whatever its modes, which ``doctor`` gives back).
    """
    try:
        manifest = read_cache_json(path / "manifest.json")
    except (OSError, StorageError) as exc:
        return f"its manifest {path / 'manifest.json'} is damaged or unreadable ({exc})"
    return _damage(path, manifest, modes=modes)


#: how :func:`mode_damage` words what it finds (:func:`remedy` knows it by this)
_MODES = "(its mode is "
#: what each part of an entry must allow: search and read a directory, read the manifest, read and run a binary
_DIRECTORY, _FILE, _PROGRAM = 0o5, 0o4, 0o5


def _allowed(info: os.stat_result, need: int) -> bool:
    """Whether the mode bits of ``info`` that apply to this user (owner's, group's or others') grant ``need``
    (``rwx`` as 0o7): what a process without privileges may do, as a tool in the sandbox runs (root's power to
    ignore modes ends there)."""
    if info.st_uid == os.geteuid():
        shift = 6
    elif info.st_gid in (os.getegid(), *os.getgroups()):
        shift = 3
    else:
        shift = 0
    return (info.st_mode >> shift) & need == need


def _plain(name: object) -> bool:
    """Whether a binary's name from a manifest (a cache file: untrusted) is one path component of its own."""
    text = str(name)
    return bool(text) and "/" not in text and "\0" not in text and text not in (".", "..")


def _parts(path: Path, manifest: dict[str, Any]) -> list[tuple[Path, int]]:
    """The entry's parts a run reads, each with what it must allow (:data:`_DIRECTORY`, ...); a binary's name
    that is not one plain component (``../../x``: issue 33) names no part (:func:`_damage` says so)."""
    bin_dir = _bin_dir(path, manifest)
    names = [str(name) for name in manifest.get("binaries") or [] if _plain(name)]
    return [(path, _DIRECTORY), (path / "manifest.json", _FILE), (bin_dir, _DIRECTORY)] + [
        (bin_dir / name, _PROGRAM) for name in names
    ]


def mode_damage(path: Path, manifest: dict[str, Any]) -> str:
    """Why a process without privileges (the sandbox, a user) could not read or run the entry ``path``, in words
    ("": it can). Root reads a mode-000 file all the same; a tool in the sandbox cannot."""
    for part, need in _parts(path, manifest):
        try:
            info = os.stat(part)
        except FileNotFoundError:
            continue  # gone: the digests' check says so
        except OSError as exc:
            return f"{part} cannot be looked at ({exc.strerror or exc})"
        if not _allowed(info, need):
            what = {_DIRECTORY: "listed", _FILE: "read", _PROGRAM: "read and run"}[need]
            return f"{part} cannot be {what} {_MODES}{stat.S_IMODE(info.st_mode):03o})"
    return ""


def restore_modes(path: Path) -> list[Path]:
    """Give the owner back what each part of the entry ``path`` needs (:func:`mode_damage`), nothing more; the parts
    changed. The entry and its manifest first (then the manifest is read for the rest). Parts outside the entry (a
    nix store path's) are nix's, and left alone. Raises ``OSError`` (or
    :class:`~flakebot_magic.errors.StorageError`: its manifest does not parse) when it cannot."""
    changed = _restore(path, [(path, _DIRECTORY), (path / "manifest.json", _FILE)])
    return changed + _restore(path, _parts(path, read_cache_json(path / "manifest.json"))[2:])


def _restore(entry: Path, parts: list[tuple[Path, int]]) -> list[Path]:
    changed = []
    for part, need in parts:
        try:
            info = os.lstat(part)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(info.st_mode) or not part.is_relative_to(entry) or info.st_uid != os.geteuid():
            continue
        if not _allowed(info, need):
            os.chmod(part, stat.S_IMODE(info.st_mode) | (need << 6))
            changed.append(part)
    return changed


def _damage(path: Path, manifest: dict[str, Any], *, modes: bool = True) -> str:
    """:func:`entry_damage` of the entry ``path`` whose manifest reads ``manifest``: what its content lacks first,
    then what its modes forbid (a content that could not be read for its modes is said as the modes)."""
    forbidden = mode_damage(path, manifest) if modes else ""
    bin_dir = _bin_dir(path, manifest)
    digests = manifest.get("digests")
    digests = digests if isinstance(digests, dict) else {}
    for name in manifest.get("binaries") or []:
        if not _plain(name):
            return f"its manifest names the binary {str(name)[:80]!r}, which is not a plain name"
        binary = bin_dir / str(name)
        recorded = digests.get(name)
        try:
            if not binary.is_file():
                return f"its binary {binary} is gone"
            if isinstance(recorded, dict) and recorded != binary_digest(binary):
                return f"its binary {binary} is not the one deployed (size or sha256 differs)"
        except OSError as exc:
            return forbidden or f"its binary {binary} cannot be read ({exc.strerror or exc})"
    return forbidden


def _identity(path: str) -> _Identity:
    """What a change to the file ``path`` (not following a last symlink) changes: its ``lstat``'s device, inode,
    size, ``mtime_ns`` and ``ctime_ns``."""
    info = os.lstat(path)
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _unchanged(kept: _Kept) -> bool:
    """Whether every file a kept verdict read is as it was then (a file gone counts as changed)."""
    paths, stamp = kept
    try:
        return tuple([_identity(path) for path in paths]) == stamp
    except OSError:
        return False


def runnable_damage(store_path: Path | str, binary: Path | str) -> str:
    """Why ``binary`` of the store entry ``store_path`` must not run, in words ("": it may).

    The entry must be whole (:func:`entry_damage`, the check of a cache hit)
    and ``binary`` one it lists, in its ``bin/``. A whole verdict is reused
    while no file it read changed (the module's docstring says how): then
    the check is an ``lstat`` of the manifest and of each binary.
    """
    key = (os.fspath(store_path), os.fspath(binary))
    kept = _WHOLE.get(key)  # a lookup needs no lock (one dict read); writes take it
    if kept is not None and _unchanged(kept):
        return ""
    store_path, binary = Path(store_path), Path(binary)
    manifest_path = store_path / "manifest.json"
    try:
        manifest_seen = _identity(str(manifest_path))  # before it is read: a later write changes it
        manifest = read_cache_json(manifest_path)
    except FileNotFoundError as exc:
        return f"its store entry {store_path} cannot be read ({exc.strerror or exc})"
    except (OSError, StorageError) as exc:
        return f"its manifest {manifest_path} is damaged or unreadable ({exc})"
    names = [str(name) for name in manifest.get("binaries") or [] if _plain(name)]
    bin_dir = _bin_dir(store_path, manifest)
    listed = [str(bin_dir / name) for name in names]
    # the entry and its bin/ too: a chmod of either (which root's reads ignore, the sandbox's do not) changes them
    paths = (
        str(manifest_path),
        *listed,
        *([] if str(binary) in listed else [str(binary)]),
        str(store_path),
        str(bin_dir),
    )
    try:  # before the binaries are hashed: a change while they are read changes the next stamp
        stamp: _Stamp | None = (manifest_seen, *[_identity(path) for path in paths[1:]])
    except OSError:
        stamp = None  # one is gone: the check below says which, and nothing is kept
    why = _damage(store_path, manifest)
    if why:
        return why
    # the record may name it through the entry's own bin (a link to a nix store path's) or directly
    places = {os.path.realpath(bin_dir), os.path.realpath(store_path / "bin")}
    if os.path.realpath(binary.parent) not in places or binary.name not in names:
        return f"its binary {binary} is not one its store entry {store_path} deployed"
    if stamp is not None:
        with _LOCK:
            _WHOLE[key] = (paths, stamp)
    return ""


def remedy(name: str, why: str) -> str:
    """The one command that makes tool ``name``'s entry runnable again, given :func:`runnable_damage`'s ``why``:
    ``doctor`` when only its modes are wrong (it gives them back), else ``rebuild NAME``."""
    if _MODES in why:
        return f"{typed('doctor')} gives its owner back the reading and running of it"
    return f"Build it again with {typed(f'rebuild {name}')}; {typed('doctor')} sets the damaged entry aside"


def forget_verdicts() -> None:
    """Forget every kept verdict (tests; a process that wants every entry hashed again)."""
    with _LOCK:
        _WHOLE.clear()
