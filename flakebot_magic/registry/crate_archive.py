"""Unpacking a downloaded ``.crate`` archive safely: every member checked before anything is written."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from ..errors import RegistryError
from .base import MAX_SOURCE_BYTES, MAX_SOURCE_FILES

__all__ = ["unpack_crate"]


def unpack_crate(archive: bytes, dest: Path, *, top: str, label: str) -> None:
    """Unpack a ``.crate`` (tar.gz) into ``dest``, stripping ``top/``; refuse escapes, and archives that unpack
    to more than :data:`~.base.MAX_SOURCE_BYTES` or :data:`~.base.MAX_SOURCE_FILES` (a sparse member declares any
    size in a few bytes): the sizes the members declare are summed before anything is written."""
    with _tar_errors(label), tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = _safe_members(tar.getmembers(), top=top, label=label)
        declared = sum(m.size for m in members if m.isfile())
        if declared > MAX_SOURCE_BYTES or len(members) > MAX_SOURCE_FILES:
            raise RegistryError(
                f"refusing to unpack {label}: it unpacks to {declared:,} bytes in {len(members):,} entries, more "
                f"than a crate may ({MAX_SOURCE_BYTES:,} bytes, {MAX_SOURCE_FILES:,} files). Nothing was unpacked; "
                "choose another crate or version."
            )
        dest.mkdir(parents=True, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python without PEP 706
            tar.extractall(dest, members=members)


@contextlib.contextmanager
def _tar_errors(label: str) -> Iterator[None]:
    """Turn tarfile's and the OS's complaints into RegistryError."""
    try:
        yield
    except tarfile.TarError as exc:  # FilterError is a TarError too
        raise RegistryError(
            f"the archive of {label} is not a well-formed crate ({exc}); it was not unpacked. Try another version."
        ) from exc
    except (EOFError, OSError) as exc:
        raise RegistryError(
            f"could not unpack {label}: {exc}. Check the destination is writable, or try another version."
        ) from exc


def _escape(label: str, member: str, why: str) -> RegistryError:
    return RegistryError(
        f"refusing to unpack {label}: archive member {member!r} {why}. The crate "
        "archive is malformed or malicious; nothing was unpacked."
    )


def _inside(path: str) -> bool:
    """True when a relative POSIX path stays within its root after resolving ``..``."""
    if not path or path.startswith("/") or PurePosixPath(path).is_absolute():
        return False
    depth = 0
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        else:
            depth += 1
    return True


def _safe_members(members: list[tarfile.TarInfo], *, top: str, label: str) -> list[tarfile.TarInfo]:
    """Copies of ``members`` renamed without ``top/``, or RegistryError if any escapes."""
    prefix = f"{top}/"
    kept: list[tarfile.TarInfo] = []
    for member in members:
        name = member.name
        if "\\" in name or "\x00" in name or os.path.isabs(name) or name.startswith("/"):
            raise _escape(label, name, "has an absolute or non-POSIX path")
        if ".." in name.split("/"):
            raise _escape(label, name, "contains '..'")
        if name.rstrip("/") == top and member.isdir():
            continue
        if not name.startswith(prefix):
            raise _escape(label, name, f"is not under {prefix}")
        relative = name[len(prefix) :].strip("/")
        if not relative or not _inside(relative):
            raise _escape(label, name, "points outside the crate directory")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise _escape(label, name, "is a device, pipe or other special file")
        renamed = copy.copy(member)
        renamed.name = relative
        if member.issym():
            target = member.linkname
            parent = relative.rsplit("/", 1)[0] if "/" in relative else ""
            joined = f"{parent}/{target}" if parent else target
            if target.startswith("/") or os.path.isabs(target) or not _inside(joined):
                raise _escape(label, name, f"is a symlink pointing outside ({target!r})")
        elif member.islnk():
            target = member.linkname
            if not target.startswith(prefix) or not _inside(target[len(prefix) :]):
                raise _escape(label, name, f"is a hard link pointing outside ({target!r})")
            renamed.linkname = target[len(prefix) :]
        kept.append(renamed)
    return kept
