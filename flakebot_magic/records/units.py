"""The unit store: compiled dependency units, sealed into a content-addressed, read-only store, copied out by hash.

Under ``<cache>/units/`` (:attr:`~flakebot_magic.host.cache.CacheLayout.units`,
outside every sandbox's binds):

* ``objects/AB/ABCDEF...``: each file's bytes, named by their SHA-256, mode
  ``0444``, written to a temporary name and renamed (two builds sealing the
  same bytes make one object);
* ``keys/KEY/UNIT.json``: one record per unit: cargo's name of it
  (``memchr-4f098f77858ccf62``, the directory under ``.fingerprint/`` and
  the suffix of its files), its package, its files (path under the profile
  directory, SHA-256, mode, modification time), and, when the unit's writers
  were not confined, the packages whose code could write it (``writers``).
  ``KEY`` is the digest :mod:`flakebot_magic.stages.deps` computes (toolchain,
  flags, registry, the package and the checksums of its build-time closure);
  the record is written last, so a crash leaves objects :meth:`UnitStore.sweep`
  removes, never half a unit;
* ``sets/SET.json``: the units one stub build used, so the next build of the
  same dependencies copies them without starting cargo;
* ``stubs/``: the stub builds themselves (:mod:`flakebot_magic.stages.deps`).

A unit is sealed (:meth:`UnitStore.seal`) only after the build that made it
is over and its processes are gone. It is used (:meth:`UnitStore.copy_out`)
by copying each file, never linking it (a later build's writable target dir
would write through a link into the store), each file's SHA-256 checked as it
is copied: a record whose object is missing or differs is set aside
(``aside/``) and the unit is compiled again. A miss is slow, never wrong.

``FLAKEBOT_UNITS_NAIVE=1`` is a TEST HOOK (:data:`NAIVE_HOOK`): units are
hard-linked into the target dir and not checked, the sharing done naively
that the poisoning tests show unsafe. Nothing else reads it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StorageError
from ..host.fsutil import atomic_write
from ..host.storage import read_cache_json
from ..host.trees import Walk, remove_tree

__all__ = ["NAIVE_HOOK", "UNIT_FORMAT", "UnitFile", "UnitRecord", "UnitStore", "naive"]

#: bump when a record's meaning changes: records of another format are not read
UNIT_FORMAT = 1
#: TEST HOOK: the environment variable that turns the seal off (hard links, no hash check)
NAIVE_HOOK = "FLAKEBOT_UNITS_NAIVE"
#: cargo's name of a unit: ``<package>-<16 hex>``
UNIT_NAME = re.compile(r"[A-Za-z0-9_.+-]+-[0-9a-f]{16}")
_KEY = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 20
#: how an object or a file being sealed is opened: never through a link, never blocking on a FIFO
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_regular(path: str | Path, size: int | None = None, dir_fd: int | None = None) -> int:
    """A descriptor of the regular file ``path`` (of ``size`` bytes when given), read in chunks by the caller:
    a link, a FIFO, a device or a file of another size raises ``OSError`` before a byte is read."""
    fd = os.open(path, _READ, dir_fd=dir_fd)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or (size is not None and info.st_size != size):
        os.close(fd)
        raise OSError(f"{path} is not the regular file of {size} bytes it should be")
    return fd


def _create(path: str | Path, dir_fd: int | None = None) -> int:
    """A new file (never an existing one, never through a link), owner-only until its mode is set."""
    return os.open(path, _CREATE, 0o600, dir_fd=dir_fd)


def naive() -> bool:
    """TEST HOOK: is the seal off (:data:`NAIVE_HOOK`)?"""
    return os.environ.get(NAIVE_HOOK) == "1"


@dataclass(frozen=True)
class UnitFile:
    """One file of a unit: its path under the profile dir (``deps/libx-H.rlib``), bytes' SHA-256, mode, mtime."""

    path: str
    sha256: str
    mode: int
    mtime_ns: int
    size: int


@dataclass(frozen=True)
class UnitRecord:
    """A sealed unit: cargo's name of it, its package (``name version``), its key, its files, its writers."""

    unit: str
    package: str
    key: str
    files: tuple[UnitFile, ...]
    #: the packages (``name version digest``) whose code could write the unit when it was built; None: confined
    writers: tuple[str, ...] | None
    sealed_at: float

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": UNIT_FORMAT,
            "unit": self.unit,
            "package": self.package,
            "key": self.key,
            "files": [[f.path, f.sha256, f.mode, f.mtime_ns, f.size] for f in self.files],
            "writers": list(self.writers) if self.writers is not None else None,
            "sealed_at": self.sealed_at,
        }

    @classmethod
    def from_json(cls, data: Any) -> UnitRecord:
        """A record from its JSON; ``ValueError`` for anything else (a file name that leaves the unit included)."""
        try:
            if (
                data["format"] != UNIT_FORMAT
                or not UNIT_NAME.fullmatch(data["unit"])
                or not _KEY.fullmatch(data["key"])
            ):
                raise ValueError("not a unit record of this format")
            files = tuple(UnitFile(str(p), str(h), int(m), int(t), int(s)) for p, h, m, t, s in data["files"])
            writers = data["writers"]
            record = cls(
                str(data["unit"]),
                str(data["package"]),
                str(data["key"]),
                files,
                tuple(map(str, writers)) if writers is not None else None,
                float(data["sealed_at"]),
            )
        except (KeyError, TypeError, IndexError) as exc:
            raise ValueError(f"not a unit record: {exc}") from None
        for file in files:
            if not _inside_unit(file.path, record.unit) or not _KEY.fullmatch(file.sha256):
                raise ValueError(f"a unit record naming {file.path!r}")
        return record


def _inside_unit(path: str, unit: str) -> bool:
    """Is ``path`` (relative to the profile dir) one of the unit's own: under ``.fingerprint/UNIT/`` or
    ``build/UNIT/``, or ``deps/`` with the unit's hash as its suffix?"""
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return False
    if parts[0] in (".fingerprint", "build") and len(parts) > 2:
        return parts[1] == unit
    suffix = unit.rsplit("-", 1)[1]
    return (
        len(parts) == 2
        and parts[0] == "deps"
        and re.fullmatch(rf"[A-Za-z0-9_]+-{re.escape(suffix)}(\.[A-Za-z0-9_.]+)?", parts[1]) is not None
    )


def unit_paths(profile_dir: Path, unit: str) -> Iterator[tuple[str, Path]]:
    """The files of ``unit`` in ``profile_dir`` (``target/release``): (path under it, path); ``OSError`` for
    anything there that is neither a regular file nor a directory (a link, a FIFO)."""
    for top in (".fingerprint", "build"):
        root = profile_dir / top / unit
        if not root.is_dir() or root.is_symlink():
            continue
        walk = Walk(root)
        for directory, dirs, files in walk:
            for name in dirs + files:
                path = Path(directory) / name
                kind = path.lstat().st_mode
                if stat.S_ISDIR(kind):
                    continue
                if not stat.S_ISREG(kind):
                    raise OSError(f"{path} is not a regular file: a unit with one is not sealed")
                yield path.relative_to(profile_dir).as_posix(), path
        if walk.too_deep or walk.unreadable:
            raise OSError(f"{root} is deeper than a unit may be, or unreadable: not sealed")
    deps = profile_dir / "deps"
    for entry in sorted(os.scandir(deps), key=lambda e: e.name) if deps.is_dir() else []:
        relative = f"deps/{entry.name}"
        if _inside_unit(relative, unit):
            if not entry.is_file(follow_symlinks=False):
                raise OSError(f"{entry.path} is not a regular file: a unit with one is not sealed")
            yield relative, Path(entry.path)


class UnitStore:
    """The sealed units under ``root`` (``<cache>/units``); see the module docstring."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects"
        self.keys = self.root / "keys"
        self.sets = self.root / "sets"
        self.stubs = self.root / "stubs"
        self.aside = self.root / "aside"

    def _object(self, digest: str) -> Path:
        return self.objects / digest[:2] / digest

    # -- sealing -------------------------------------------------------------------------------------------

    def seal(
        self, profile_dir: Path, unit: str, package: str, key: str, writers: Iterable[str] | None
    ) -> UnitRecord | None:
        """Seal ``unit`` of ``profile_dir`` under ``key``: its bytes into objects, then its record; the record
        already there if another build sealed it first (the first one stands); None when it cannot be sealed
        (a file that is no regular file). Call only once no process of the build that made it is left."""
        record_path = self.keys / key / f"{unit}.json"
        found = self.record(record_path)
        if found is not None:
            return found
        try:
            files = tuple(self._put(relative, path) for relative, path in unit_paths(profile_dir, unit))
        except OSError:
            return None
        if not files:
            return None
        record = UnitRecord(
            unit, package, key, files, tuple(sorted(writers)) if writers is not None else None, time.time()
        )
        record_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = record_path.with_name(f".{unit}.{secrets.token_hex(6)}.tmp")
        atomic_write(tmp, json.dumps(record.to_json(), separators=(",", ":")))
        try:
            os.link(tmp, record_path)  # the first seal of a unit stands
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
        return self.record(record_path)

    def _put(self, relative: str, path: Path) -> UnitFile:
        """Copy one file into the objects (hashed as it is read); its entry in a record."""
        self.objects.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = _open_regular(path)
        tmp = self.objects / f".{secrets.token_hex(8)}.tmp"
        try:
            info = os.fstat(fd)
            digest = hashlib.sha256()
            size = 0
            out = _create(tmp)
            try:
                while chunk := os.read(fd, _CHUNK):
                    digest.update(chunk)
                    os.write(out, chunk)
                    size += len(chunk)
                os.fchmod(out, 0o444)
            finally:
                os.close(out)
            sha = digest.hexdigest()
            final = self._object(sha)
            final.parent.mkdir(exist_ok=True, mode=0o700)
            if final.exists():
                tmp.unlink()
            else:
                os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return UnitFile(relative, sha, 0o755 if info.st_mode & 0o111 else 0o644, info.st_mtime_ns, size)

    # -- finding -------------------------------------------------------------------------------------------

    def record(self, path: Path) -> UnitRecord | None:
        """The record at ``path``; None when there is none, or it is not one (set aside)."""
        if not path.is_file():
            return None
        try:
            return UnitRecord.from_json(read_cache_json(path))
        except (ValueError, OSError):
            self._set_aside(path)
            return None

    def find(self, key: str) -> list[UnitRecord]:
        """Every unit sealed under ``key``."""
        directory = self.keys / key
        if not _KEY.fullmatch(key) or not directory.is_dir():
            return []
        found = (self.record(directory / name) for name in sorted(os.listdir(directory)) if name.endswith(".json"))
        return [record for record in found if record is not None]

    def get(self, key: str, unit: str) -> UnitRecord | None:
        if not _KEY.fullmatch(key) or not UNIT_NAME.fullmatch(unit):
            return None
        return self.record(self.keys / key / f"{unit}.json")

    # -- using ---------------------------------------------------------------------------------------------

    def copy_out(self, record: UnitRecord, root: Path, profile: str) -> bool:
        """Copy ``record``'s files into ``root/profile`` (``target_dir/release``), each checked against its
        SHA-256 as it is copied, with its mode and modification time; False (nothing of it left there, the record
        set aside) when one differs.

        ``root`` is a directory of flakebot's; every directory below it is opened (made if missing) one at a
        time without following a link, so a symlink planted in a workspace's target dir by code running beside
        never leads a copy elsewhere (it fails instead).
        """
        written: list[tuple[int, str]] = []
        dirs = _Dirs(root)
        try:
            for file in record.files:
                parent, name = dirs.enter(f"{profile}/{file.path}".split("/")[:-1]), file.path.rsplit("/", 1)[-1]
                if naive():  # TEST HOOK: linked, unchecked
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=parent)
                    os.link(self._object(file.sha256), name, dst_dir_fd=parent)
                else:
                    self._copy(file, parent, name)
                written.append((parent, name))
                os.utime(name, ns=(file.mtime_ns, file.mtime_ns), dir_fd=parent, follow_symlinks=False)
        except (OSError, _Mismatch):
            for parent, name in written:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=parent)
            dirs.close()
            self._set_aside(self.keys / record.key / f"{record.unit}.json")
            return False
        dirs.close()
        return True

    def _copy(self, file: UnitFile, parent: int, name: str) -> None:
        tmp = f".{name}.{secrets.token_hex(4)}.flakebot-tmp"
        fd = _open_regular(self._object(file.sha256), file.size)
        try:
            digest = hashlib.sha256()
            out = _create(tmp, dir_fd=parent)
            try:
                while chunk := os.read(fd, _CHUNK):
                    digest.update(chunk)
                    os.write(out, chunk)
                os.fchmod(out, file.mode)
            finally:
                os.close(out)
        finally:
            os.close(fd)
        if digest.hexdigest() != file.sha256:
            os.unlink(tmp, dir_fd=parent)
            raise _Mismatch(file.path)
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)

    # -- sets ----------------------------------------------------------------------------------------------

    def remember_set(self, set_key: str, units: Iterable[tuple[str, str]]) -> None:
        """The units (key, unit) a stub build of the dependency set ``set_key`` used."""
        atomic_write(
            self.sets / f"{set_key}.json",
            json.dumps({"format": UNIT_FORMAT, "units": sorted(units)}),
            make_parents=True,
        )

    def set_units(self, set_key: str) -> list[tuple[str, str]] | None:
        """The units a stub build of ``set_key`` used, when it was built before."""
        path = self.sets / f"{set_key}.json"
        if not _KEY.fullmatch(set_key) or not path.is_file():
            return None
        try:
            data = read_cache_json(path)
            if data.get("format") != UNIT_FORMAT:
                return None
            return [(str(k), str(u)) for k, u in data["units"]]
        except (OSError, StorageError, ValueError, TypeError, KeyError, AttributeError):
            return None

    # -- upkeep --------------------------------------------------------------------------------------------

    def records(self) -> Iterator[tuple[Path, UnitRecord | None]]:
        """Every record file and what it holds (None: not a record)."""
        for directory in sorted(self.keys.iterdir()) if self.keys.is_dir() else []:
            for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
                try:
                    yield path, UnitRecord.from_json(read_cache_json(path))
                except (ValueError, OSError):
                    yield path, None

    def usage(self) -> tuple[int, int, int]:
        """(records, their bytes as copied out, bytes of the objects on disk)."""
        count = copied = 0
        for _, record in self.records():
            if record is not None:
                count += 1
                copied += record.size
        on_disk = sum(path.stat().st_size for path in self._object_files())
        return count, copied, on_disk

    def _object_files(self) -> list[Path]:
        """Every file under ``objects/`` (``AB/ABCD...`` and temporary ones): flakebot's own, two levels deep."""
        found: list[Path] = []
        for top in sorted(self.objects.iterdir()) if self.objects.is_dir() else ():
            if top.is_dir() and not top.is_symlink():
                found += [p for p in sorted(top.iterdir()) if p.is_file() and not p.is_symlink()]
            elif top.is_file():
                found.append(top)
        return found

    def check(self, *, full: bool = True, sweep: bool = True) -> list[str]:
        """Set aside every record that is not one, or whose objects are missing (``full``: or differ); what
        was set aside, in words. Then (``sweep``) :meth:`sweep`."""
        done = []
        for path, record in self.records():
            why = "not a unit record" if record is None else self._damage(record, full=full)
            if why:
                self._set_aside(path)
                done.append(f"set aside the dependency unit {path.stem} ({why}): its next build compiles it again")
        if sweep:
            self.sweep()
        return done

    def _damage(self, record: UnitRecord, *, full: bool) -> str:
        for file in record.files:
            path = self._object(file.sha256)
            if not path.is_file():
                return f"{file.path} is missing from the objects"
            if full:
                digest = hashlib.sha256()
                try:
                    fd = _open_regular(path, file.size)
                except OSError:
                    return f"{file.path} is not the file that was sealed"
                try:
                    while chunk := os.read(fd, _CHUNK):
                        digest.update(chunk)
                finally:
                    os.close(fd)
                if digest.hexdigest() != file.sha256:
                    return f"{file.path} differs from what was sealed"
        return ""

    def sweep(self) -> int:
        """Remove objects no record names, temporary files, set records naming a missing unit and leftover stub
        builds; the bytes freed."""
        named = {f.sha256 for _, record in self.records() if record is not None for f in record.files}
        freed = 0
        for path in self._object_files():
            if path.name.startswith(".") or path.name not in named:
                freed += path.stat().st_size
                path.unlink(missing_ok=True)
        for path in list(self.sets.glob("*.json")) if self.sets.is_dir() else []:
            units = self.set_units(path.stem)
            if units is None or any(self.get(key, unit) is None for key, unit in units):
                path.unlink(missing_ok=True)
        return freed

    def clear(self) -> int:
        """Remove every unit (``clean --units``); the bytes freed."""
        _, _, on_disk = self.usage()
        for part in (self.keys, self.sets, self.objects, self.stubs):
            remove_tree(part, ignore_errors=True)
        return on_disk

    def _set_aside(self, path: Path) -> None:
        try:
            self.aside.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.replace(path, self.aside / f"{path.parent.name[:16]}-{path.name}-{time.monotonic_ns()}")
        except OSError:
            pass


class _Mismatch(Exception):
    """A copied file's bytes are not those sealed."""


class _Dirs:
    """Directories under ``root``, each opened from its parent without following a link (made when missing)."""

    _FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

    def __init__(self, root: Path) -> None:
        self.fds: dict[tuple[str, ...], int] = {(): self._open(root)}

    def _open(self, path: str | Path, dir_fd: int | None = None) -> int:
        return os.open(path, self._FLAGS, dir_fd=dir_fd)

    def enter(self, parts: list[str]) -> int:
        key: tuple[str, ...] = ()
        for part in parts:
            if part in ("", ".", ".."):
                raise OSError(f"{part!r} in a unit's path")
            parent, key = self.fds[key], (*key, part)
            if key not in self.fds:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=parent)
                self.fds[key] = self._open(part, parent)
        return self.fds[key]

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()
