"""A crate copied out of a directory registry: its tree's sha256, and what the registry's
``.cargo-checksum.json`` claims, checked file by file (never recorded as verified when it cannot be)."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..host.fsutil import TooLarge, load_json, read_inside, read_regular
from ..host.trees import Walk
from ..sandbox.layout import BUILD_DIR, GIT_DIR
from ..untrusted import safe_line
from .base import MAX_SOURCE_BYTES, FetchedSource

__all__ = ["checked_source", "tree_sha256"]


def tree_sha256(root: Path, *, exclude: tuple[str, ...] = (GIT_DIR, BUILD_DIR)) -> str:
    """sha256 over every file's relative path and bytes, in sorted order (regular files and links only: OSError else)."""
    digest = hashlib.sha256()
    for path in sorted(_walk(root, exclude)):
        rel = path.relative_to(root).as_posix()
        digest.update(os.fsencode(rel) + b"\0")  # the name's bytes, UTF-8 or not
        if path.is_symlink():
            digest.update(b"L" + os.readlink(os.fsencode(path)))
        else:
            data, more = read_regular(path, MAX_SOURCE_BYTES)  # a FIFO or a device is refused, never read
            if more:
                raise TooLarge(f"{path} holds more than {MAX_SOURCE_BYTES:,} bytes")
            digest.update(b"F" + data)
        digest.update(b"\0")
    return digest.hexdigest()


def _walk(root: Path, exclude: tuple[str, ...]) -> Iterator[Path]:
    for dirpath, dirnames, filenames in Walk(root):  # a registry's tree: an explicit stack, links never entered
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in exclude]
        for filename in filenames:
            yield Path(dirpath) / filename


def checked_source(source: Path, dest: Path) -> FetchedSource:
    """The copy in ``dest`` with its tree's sha256, and what ``.cargo-checksum.json`` claims, checked.

    A directory registry has no ``.crate``: the ``package`` value it records
    (the archive's sha256) cannot be checked here, so it is never recorded as
    the source's checksum, only quoted as a claim. Its per-file sha256s are
    checked against the copied files; a mismatch or a file it does not list is
    said. The checksum recorded is always the copy's own tree sha256.
    """
    notes = []
    try:
        data, _ = read_inside(source, ".cargo-checksum.json", 16 * 1024 * 1024)
        recorded = load_json(data)
    except (OSError, ValueError):
        recorded = None
    if isinstance(recorded, dict):
        package = recorded.get("package")
        if isinstance(package, str) and re.fullmatch(r"[0-9a-f]{64}", package) and package != _PLACEHOLDER:
            notes.append(
                f"The registry's .cargo-checksum.json says the published .crate's sha256 is {safe_line(package)}; "
                "a directory registry has no .crate, so flakebot could not verify it."
            )
        files = recorded.get("files")
        if isinstance(files, dict) and files:
            notes.append(_files_verdict(dest, files))
    if not notes:
        notes.append("The registry records no .crate checksum; the checksum is the sha256 of the source tree.")
    return FetchedSource(path=dest, checksum=tree_sha256(dest), checksum_kind="tree-sha256", notes=tuple(notes))


def _files_verdict(dest: Path, files: dict[str, Any]) -> str:
    """Whether every copied file is listed in ``files`` with its sha256 (cargo's vendoring record)."""
    wrong = []
    listed = set()
    for rel, expected in files.items():
        listed.add(rel)
        try:
            data, more = read_inside(dest, str(rel), MAX_SOURCE_BYTES)
        except OSError:
            wrong.append(str(rel))
            continue
        if more or hashlib.sha256(data).hexdigest() != expected:
            wrong.append(str(rel))
    unlisted = [p.relative_to(dest).as_posix() for p in _walk(dest, ()) if p.relative_to(dest).as_posix() not in listed]
    if wrong or unlisted:
        names = ", ".join(safe_line(n) for n in (wrong + unlisted)[:5])
        return (
            f"The files do NOT match the registry's .cargo-checksum.json ({len(wrong)} differ or are missing, "
            f"{len(unlisted)} are not listed: {names}): the source is not what the registry recorded."
        )
    return f"Every file matches the sha256 the registry's .cargo-checksum.json lists ({len(listed)} files)."


#: Debian marks some crates with the sha256 of "0" instead of a real checksum
_PLACEHOLDER = hashlib.sha256(b"0").hexdigest()
