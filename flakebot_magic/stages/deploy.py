"""Stage 5 (cargo backend): put the built binaries in a content-addressed store.

A store entry is ``<cache>/store/<hash>-<crate>-<version>/`` with ``bin/``
and ``manifest.json``. The hash covers the source tree and Cargo.lock (the
workspace's git tree, less the flake files that do not affect a cargo
build), the rustc version and the build flags: the same inputs always give
the same path, and an existing path is reused without building.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DeployError
from ..git import Git

__all__ = ["StorePath", "deploy", "lookup", "store_key", "write_entry"]

STORE_FORMAT = 1
#: tracked files that do not change what cargo builds
_NOT_BUILD_INPUTS = ("flake.nix", "flake.lock")


@dataclass(frozen=True)
class StorePath:
    """A deployed tool's directory in the store."""

    path: Path
    hash: str

    @property
    def manifest(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.path / "manifest.json").read_text())
        return data

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def __str__(self) -> str:
        return str(self.path)


def store_key(git: Git, rustc_version: str, flags: Sequence[str], backend: str = "cargo") -> str:
    """The hash of everything that decides the built binary.

    For the nix backend the flake files are build inputs too (flake.lock
    pins nixpkgs, which supplies the toolchain).
    """
    digest = hashlib.sha256()
    listing = git("ls-tree", "-r", "--full-tree", "HEAD")
    for line in listing.splitlines():
        path = line.split("\t", 1)[-1]
        if backend == "nix" or path not in _NOT_BUILD_INPUTS:
            digest.update(line.encode() + b"\n")
    not_inputs = [f":(exclude){path}" for path in _NOT_BUILD_INPUTS]
    status = git("status", "--porcelain", "--untracked-files=all", "--", ".", *not_inputs)
    if status:  # uncommitted edits change the binary too
        digest.update(status.encode())
        digest.update(git("diff", "HEAD", "--", ".", *not_inputs).encode())
    digest.update(f"\0rustc:{rustc_version}\0flags:{' '.join(flags)}\0backend:{backend}\0format:{STORE_FORMAT}".encode())
    return digest.hexdigest()[:32]


def _entry(store_dir: Path, key: str, crate: str, version: str) -> Path:
    return store_dir / f"{key}-{crate}-{version}"


def lookup(store_dir: Path, key: str, crate: str, version: str) -> StorePath | None:
    """The store entry for ``key``, when a complete one exists."""
    path = _entry(store_dir, key, crate, version)
    if (path / "manifest.json").is_file():
        return StorePath(path, key)
    return None


def write_entry(
    store_dir: Path, key: str, crate: str, version: str, fill: Callable[[Path], None], manifest: dict[str, Any]
) -> StorePath:
    """Write the store entry for ``key`` atomically: ``fill(staging)`` makes ``bin``, then the manifest.

    Both backends write their entries through here, so the recipe, lookup and
    cleanup machinery treat cargo-built and nix-built tools alike.
    """
    final = _entry(store_dir, key, crate, version)
    store_dir.mkdir(parents=True, exist_ok=True)
    staging = store_dir / f".staging-{key}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        staging.mkdir()
        fill(staging)
        data = {**manifest, "hash": key, "format": STORE_FORMAT}
        (staging / "manifest.json").write_text(json.dumps(data, indent=2, sort_keys=True))
        if final.exists():  # a --rebuild replaces the entry; same inputs, same path
            shutil.rmtree(final)
        os.replace(staging, final)
    except OSError as exc:
        raise DeployError(f"Could not write the store entry {final}: {exc}") from exc
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return StorePath(final, key)


def deploy(
    store_dir: Path,
    key: str,
    crate: str,
    version: str,
    binaries: Mapping[str, Path],
    manifest: dict[str, Any],
) -> StorePath:
    """Copy ``binaries`` into the store entry for ``key``, atomically."""
    if not binaries:
        raise DeployError(f"{crate} {version} built no binaries, so there is nothing to deploy.")

    def copy_binaries(staging: Path) -> None:
        (staging / "bin").mkdir()
        for name, source in sorted(binaries.items()):
            target = staging / "bin" / name
            shutil.copy2(source, target)
            target.chmod(0o555)

    return write_entry(
        store_dir, key, crate, version, copy_binaries, {**manifest, "binaries": sorted(binaries)}
    )
