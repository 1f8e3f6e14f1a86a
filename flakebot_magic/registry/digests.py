"""Each registry package's digest: the SHA-256 of its files, which the dependency cache keys units on.

A directory registry's checksum claims are not enough (Debian's say "Could not get crate checksum" for some
crates), and cargo itself never rereads a registry package's files: its fingerprint of one is its version. So
:class:`PackageDigests` hashes each package's directory itself (:func:`~flakebot_magic.registry.vendored.tree_sha256`),
the one whose ``Cargo.toml`` names that package and version, and keeps the digest in a file of the cache while
every file there has the size, modification time and inode it had (a walk of ``lstat`` s, no read). It also says
whether code of the package runs at build time (a build script, a proc macro), read from its manifest: the
per-build rule's writers.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..errors import StorageError
from ..host.fsutil import atomic_write, load_toml, read_regular
from ..host.storage import read_cache_json
from ..host.trees import Walk
from ..sandbox.stub import LockPackage
from .vendored import tree_sha256

__all__ = ["PackageDigests"]


class PackageDigests:
    """Each registry package's digest (and whether code of it runs at build time), kept in ``sources.json`` while
    its files are what they were (their names, sizes, modification times and inodes)."""

    def __init__(self, path: Path, registry: Path) -> None:
        self.path = path
        self.registry = registry
        try:
            self.known: dict[str, Any] = read_cache_json(path)
        except (OSError, StorageError, ValueError):
            self.known = {}
        self.changed = False

    def _entry(self, package: LockPackage) -> dict[str, Any] | None:
        """What is known of ``package``'s directory in the registry (the one whose Cargo.toml names it), or None."""
        for name in (f"{package.name}-{package.version}", package.name):
            directory = self.registry / name
            if directory.is_symlink() or not (directory / "Cargo.toml").is_file():
                continue
            signature = _stat_signature(directory)
            entry = self.known.get(str(directory))
            if not (isinstance(entry, dict) and entry.get("signature") == signature):
                try:
                    entry = {"signature": signature, "digest": tree_sha256(directory, exclude=()), **_about(directory)}
                except OSError:
                    continue
                self.known[str(directory)] = entry
                self.changed = True
            if entry.get("package") == package.id:
                return entry
        return None

    def digest(self, package: LockPackage) -> str:
        entry = self._entry(package)
        return str(entry["digest"]) if entry is not None else ""

    def writes(self, package: LockPackage) -> bool:
        entry = self._entry(package)
        return bool(entry["writes"]) if entry is not None else True

    def save(self) -> None:
        if self.changed:
            try:
                atomic_write(self.path, json.dumps(self.known), make_parents=True)
            except OSError:
                pass  # only means hashing again next time


def _stat_signature(directory: Path) -> str:
    """Each file's path, size, modification time and inode under a registry package's directory, hashed."""
    digest = hashlib.sha256()
    for path, dirs, files in Walk(directory):
        dirs.sort()
        for name in sorted(files):
            info = os.lstat(os.path.join(path, name))
            where = os.path.relpath(os.path.join(path, name), directory)
            digest.update(f"{where}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ino}\n".encode())
    return digest.hexdigest()


def _about(directory: Path) -> dict[str, Any]:
    """The package a registry directory holds (``name version``), and whether code of it runs at build time (a
    build script, a proc macro: it could write what compiles beside it)."""
    data, _ = read_regular(directory / "Cargo.toml", 1 << 20)
    try:
        doc = load_toml(data.decode("utf-8"))
    except ValueError:
        return {"package": "", "writes": True}
    package = doc.get("package", {})
    lib = doc.get("lib", {})
    if not isinstance(package, dict):
        return {"package": "", "writes": True}
    build = package.get("build")
    macro = isinstance(lib, dict) and bool(lib.get("proc-macro") or lib.get("proc_macro"))
    writes = macro or (build is not False and (isinstance(build, str) or (directory / "build.rs").is_file()))
    return {"package": f"{package.get('name')} {package.get('version')}", "writes": writes}
