"""A published crate's files, imported as data into a new workspace: nothing the crate ships is obeyed.

A crate archive (or a registry directory) may hold more than source: a
``.git`` (a directory whose index git would trust, or a ``gitdir:`` file
pointing git at another repository), a ``.cargo/config.toml`` (a
``rustc-wrapper`` or ``runner`` cargo would start), a ``rust-toolchain.toml``
(rustup would run the compiler it names, even one at a ``path``), and
``.gitattributes``/``.gitmodules`` (git would change what it records and
shows). :func:`import_source` reads the unpacked crate with flakebot's own
code and copies regular files and links that stay inside; those names
(:data:`NEVER_IMPORTED`), at any depth, never enter the workspace, and each
one dropped is named in the ``published`` commit's message and in a notice.
The first commit is then made from exactly the imported files
(:meth:`flakebot_magic.host.git.Git.commit_files`).
"""

from __future__ import annotations

import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ForkError
from ..host.fsutil import TooLarge, UnsafePath, copy_regular
from ..registry.base import MAX_SOURCE_BYTES, MAX_SOURCE_FILES

__all__ = ["MAX_DEPTH", "NEVER_IMPORTED", "Imported", "import_source"]

#: names never taken from a published crate, wherever they are in it, and why
NEVER_IMPORTED = {
    ".git": "a repository of its own: git would obey its index, config or gitdir pointer",
    ".cargo": "cargo configuration: a rustc-wrapper or runner would run outside the build",
    "rust-toolchain": "a toolchain file: rustup would run the compiler it names",
    "rust-toolchain.toml": "a toolchain file: rustup would run the compiler it names",
    ".gitattributes": "git attributes: they change what git records and shows",
    ".gitmodules": "git submodules",
}
_COPY_CHUNK = 1 << 20


@dataclass
class Imported:
    """What :func:`import_source` copied, and what it left out (path -> why)."""

    files: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    #: bytes copied so far (at most :data:`~flakebot_magic.registry.base.MAX_SOURCE_BYTES`)
    size: int = 0

    def describe(self) -> str:
        """The dropped files, one line each (for the commit message)."""
        return "\n".join(f"- {path}: {why}" for path, why in sorted(self.dropped.items()))


def import_source(source: Path, dest: Path) -> Imported:
    """Copy the unpacked crate ``source`` into the directory ``dest`` as data.

    Regular files keep their bytes and whether they are executable; symlinks
    are kept when their target stays inside the crate (else dropped); other
    entries (FIFOs, devices, sockets), names with control characters and
    :data:`NEVER_IMPORTED` are dropped. Nothing is followed, nothing is run.
    A source of more than :data:`~flakebot_magic.registry.base.MAX_SOURCE_BYTES`
    or :data:`~flakebot_magic.registry.base.MAX_SOURCE_FILES` is refused
    (ForkError): its bytes are counted as they are copied (a sparse file
    counts what it reads as, not the blocks it holds).
    """
    imported = Imported()
    _copy_dir(Path(source), Path(dest), "", imported)
    imported.files.sort()
    return imported


#: how deep the published source's directories may nest
MAX_DEPTH = 64


def _copy_dir(source: Path, dest: Path, rel: str, imported: Imported) -> None:
    if rel.count("/") >= MAX_DEPTH:
        raise _too_large(dest, f"directories nested more than {MAX_DEPTH} deep (at {rel})")
    try:
        entries = sorted(os.scandir(source), key=lambda e: e.name)
    except OSError as exc:
        raise ForkError(f"Could not read the published source at {source}: {exc}", workspace=dest) from exc
    for entry in entries:
        name = entry.name
        path = posixpath.join(rel, name) if rel else name
        info = entry.stat(follow_symlinks=False)
        if name in NEVER_IMPORTED:
            imported.dropped[path + ("/" if stat.S_ISDIR(info.st_mode) else "")] = NEVER_IMPORTED[name]
        elif any(ord(c) < 32 or ord(c) == 127 for c in name):
            imported.dropped[repr(path)] = "a name with control characters"
        elif not _utf8(name):
            imported.dropped[os.fsencode(path).decode("ascii", "backslashreplace")] = "a name that is not UTF-8"
        elif stat.S_ISDIR(info.st_mode):
            os.mkdir(dest / name, 0o755)
            _copy_dir(Path(entry.path), dest / name, path, imported)
        elif stat.S_ISLNK(info.st_mode):
            target = os.readlink(entry.path)
            if not _utf8(target):
                imported.dropped[path] = "a symlink whose target is not UTF-8"
                continue
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(path), target))
            if target.startswith("/") or joined == ".." or joined.startswith("../") or _into_dropped(joined):
                imported.dropped[path] = f"a symlink pointing outside the crate ({target})"
                continue
            os.symlink(target, dest / name)
            imported.files.append(path)
        elif stat.S_ISREG(info.st_mode):
            _copy_file(entry.path, dest / name, path, imported, executable=bool(info.st_mode & 0o111))
        else:
            imported.dropped[path] = "not a regular file, directory or symlink"


def _utf8(name: str) -> bool:
    """Whether a name read from disk was UTF-8 (one that was not holds surrogates: ``os.fsdecode``).

    Such names are left out: no Rust source can name them, and each door that
    shows or hashes a path would need their bytes.
    """
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _into_dropped(target: str) -> bool:
    """Whether a link's target (relative to the crate's root) lies in something never imported."""
    return any(part in NEVER_IMPORTED for part in target.split("/"))


def _copy_file(source: str, dest: Path, path: str, imported: Imported, *, executable: bool) -> None:
    """Copy bytes only (no owner, no times, no special bits), within what is left of the source's budget."""
    if len(imported.files) >= MAX_SOURCE_FILES:
        raise _too_large(dest, f"more than {MAX_SOURCE_FILES:,} files")
    try:
        imported.size += copy_regular(source, dest, executable=executable, limit=MAX_SOURCE_BYTES - imported.size)
    except TooLarge:
        raise _too_large(dest, f"more than {MAX_SOURCE_BYTES:,} bytes (at {path})") from None
    except UnsafePath as exc:
        raise ForkError(
            f"{source} changed while the published source was imported ({exc})", workspace=dest.parent
        ) from exc
    imported.files.append(path)


def _too_large(dest: Path, what: str) -> ForkError:
    return ForkError(
        f"The published source holds {what}, more than flakebot imports from one crate; nothing was built. "
        "Choose another crate or version.",
        workspace=dest.parent,
    )
