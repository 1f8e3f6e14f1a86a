"""The workspace's files as the model sees them: containment, capped reads, atomic writes, the five file functions.

Every model-chosen path goes through :func:`contain` (the rule set is
:mod:`flakebot_magic.sandbox.policy`'s); a Cargo.toml is checked by the build policy
before it is written; writes go through :func:`flakebot_magic.host.fsutil.atomic_write`
(never through a symlink); reads are capped and never follow a symlink, a
FIFO or a device. Files in the workspace are written by untrusted code.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ..host.fsutil import atomic_write, check_no_symlinks, load_toml, read_regular
from ..host.trees import Walk
from ..sandbox.layout import BUILD_DIR, CANDIDATES_DIR, source_dirs
from ..sandbox.policy import REFUSED_DIRS, TOOLCHAIN_FILES, Baseline, check_manifest

__all__ = [
    "MAX_FILE_READ",
    "PathRefused",
    "WorkspaceFiles",
    "check_manifest_text",
    "contain",
    "line_count",
    "read_capped",
    "read_text",
    "write_text",
]

#: the most of one file read into the kernel (read_file shows less; the ratchet and prompt read this much)
MAX_FILE_READ = 8 * 1024 * 1024
MAX_READ_LINES = 800
MAX_READ_CHARS = 40_000
MAX_WRITE_BYTES = 1_000_000
MAX_LISTED = 400


class PathRefused(Exception):
    """A model-chosen path or edit that flakebot refuses; the message goes back to the model."""


def contain(root: Path, path: str, *, write: bool = False, allow_build_scripts: bool = False) -> Path:
    """The absolute path of ``path`` inside ``root``, or :class:`PathRefused` saying why not.

    Examples
    --------
    >>> contain(Path("/ws"), "../etc/passwd")
    Traceback (most recent call last):
    ...
    flakebot_magic.edit.files.PathRefused: '../etc/passwd' leaves the crate: '..' is not allowed
    """
    if not isinstance(path, str) or not path.strip():
        raise PathRefused("the path is empty; give a path relative to the crate root, e.g. src/main.rs")
    if "\0" in path:
        raise PathRefused(f"{path!r} contains a NUL byte")
    if path.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:[\\/]", path):
        raise PathRefused(f"{path!r} is absolute: give a path relative to the crate root, e.g. src/main.rs")
    parts = [p for p in PurePosixPath(path.replace("\\", "/")).parts if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused(f"{path!r} leaves the crate: '..' is not allowed")
    for part in parts:
        if part in REFUSED_DIRS:
            raise PathRefused(f"{path!r} is inside {part}/, which is off limits: {REFUSED_DIRS[part]}")
    root = root.resolve()
    target = root.joinpath(*parts) if parts else root
    resolved = target.resolve()
    if resolved != root and root not in resolved.parents:
        raise PathRefused(f"{path!r} resolves to {resolved}, outside the crate (a symlink leaves it)")
    if parts[:1] == [CANDIDATES_DIR] or resolved.relative_to(root).parts[:1] == (CANDIDATES_DIR,):
        raise PathRefused(f"{path!r} is inside {CANDIDATES_DIR}/, other candidates' workspaces: off limits")
    if write:
        if not parts:
            raise PathRefused("give a file path, not the crate root")
        if parts[0] == BUILD_DIR:
            raise PathRefused(f"{path!r} is inside target/, cargo's build output")
        name = parts[-1]
        if name in TOOLCHAIN_FILES:
            raise PathRefused(f"{path!r}: the toolchain is not the model's to choose")
        if name == "build.rs" and not allow_build_scripts:
            raise PathRefused(
                f"{path!r}: build scripts run arbitrary code at build time and are refused "
                "(the user can allow them with --allow-build-scripts)"
            )
        if target.is_symlink():
            raise PathRefused(f"{path!r} is a symlink; write the file it points to instead")
    return target


def check_manifest_text(
    root: Path,
    text: str,
    *,
    allow_build_scripts: bool,
    baseline: Baseline | None = None,
    manifest: Path | None = None,
) -> None:
    """Refuse a manifest the build policy refuses (a build script unless allowed, a path outside, ...).

    The rules are :func:`flakebot_magic.sandbox.policy.check_manifest`'s: the same
    ones checked on disk after every check run.
    """
    try:
        doc = load_toml(text)
    except ValueError as exc:
        raise PathRefused(f"Cargo.toml is not valid TOML: {exc}") from None
    found = check_manifest(
        root, manifest or root / "Cargo.toml", doc, allow_build_scripts=allow_build_scripts, baseline=baseline
    )
    if found:
        raise PathRefused("; ".join(str(v) for v in found))


def write_text(root: Path, target: Path, content: str) -> None:
    """Replace ``target`` in one step (:func:`~flakebot_magic.host.fsutil.atomic_write`: a fresh O_EXCL|O_NOFOLLOW
    temporary file, no symlink between ``root`` and it, a planted symlink replaced, never followed).

    A regular file keeps its permission bits (without set-id or group/other write); a new one is 0644.
    """
    try:
        info = os.lstat(target)
        mode = stat.S_IMODE(info.st_mode) & 0o755 if stat.S_ISREG(info.st_mode) else 0o644
    except FileNotFoundError:
        mode = 0o644
    atomic_write(target, content.encode("utf-8", errors="surrogateescape"), mode=mode, root=root, make_parents=True)


def read_capped(path: Path, limit: int = MAX_FILE_READ) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the regular file ``path`` (never through a symlink), and whether there was more.

    Files in the workspace are written by untrusted code: see :func:`~flakebot_magic.host.fsutil.read_regular`
    (an ``OSError`` for a symlink, a FIFO, a device or a missing file).
    """
    return read_regular(path, limit)


def read_text(path: Path, limit: int = MAX_FILE_READ) -> str:
    """:func:`read_capped` decoded as UTF-8 (undecodable bytes replaced)."""
    return read_capped(path, limit)[0].decode("utf-8", errors="replace")


def line_count(path: Path) -> int:
    """The number of lines of ``path`` (0 when it cannot be read)."""
    try:
        data, _ = read_capped(path)
    except OSError:
        return 0
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


@dataclass
class WorkspaceFiles:
    """The file functions of the protocol (list, read, write, replace, delete) on one workspace.

    Each returns the text the model gets back, or raises :class:`PathRefused`
    (or :class:`~flakebot_magic.host.fsutil.UnsafePath` for a symlink planted on
    the way); nothing is changed then.
    """

    root: Path
    allow_build_scripts: bool = False
    #: the crate as published (the fork's ``published`` tag): its own build script is allowed
    published: Baseline = field(default_factory=Baseline)

    def contain(self, path: str, *, write: bool = False) -> Path:
        return contain(self.root, path, write=write, allow_build_scripts=self.allow_build_scripts)

    def list_files(self, path: str) -> str:
        base = self.contain(path)
        if not base.is_dir():
            raise PathRefused(f"{path!r} is not a directory")
        lines: list[str] = []
        for dirpath, dirnames, filenames in Walk(base):  # an explicit stack, never deeper than MAX_DEPTH
            dirnames[:] = sorted(source_dirs(dirnames))
            for filename in sorted(filenames):
                file = Path(dirpath) / filename
                rel = file.relative_to(self.root).as_posix()
                lines.append(f"{rel} ({line_count(file)} lines)")
        shown = lines[:MAX_LISTED]
        more = f"\n... and {len(lines) - MAX_LISTED} more" if len(lines) > MAX_LISTED else ""
        return ("\n".join(shown) or "(no files)") + more

    def read_file(self, path: str, start: Any, end: Any) -> str:
        target = self.contain(path)
        if not target.is_file():
            raise PathRefused(f"{path!r} does not exist (list_files shows what does)")
        try:  # contain() checked that the resolved path is inside; it is read without following a link
            data, cut = read_capped(target.resolve())
        except OSError as exc:
            raise PathRefused(f"{path!r} cannot be read: {exc.strerror or exc}") from None
        text = data.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if cut:
            lines.append(f"... (the file passes {MAX_FILE_READ // (1024 * 1024)} MiB; the rest is not read)")
        first = max(1, int(start)) if isinstance(start, int) else 1
        last = min(len(lines), int(end)) if isinstance(end, int) else len(lines)
        last = min(last, first + MAX_READ_LINES - 1)
        body = "\n".join(lines[first - 1 : last])
        if len(body) > MAX_READ_CHARS:
            body = body[:MAX_READ_CHARS] + "\n... (cut; read fewer lines at a time)"
        whole = (first, last) == (1, len(lines))
        header = f"{path} ({len(lines)} lines):" if whole else f"{path} (lines {first}-{last} of {len(lines)}):"
        return f"{header}\n{body}"

    def write_file(self, path: str, content: str) -> str:
        target = self.contain(path, write=True)
        if len(content.encode()) > MAX_WRITE_BYTES:
            raise PathRefused(f"the content passes {MAX_WRITE_BYTES // 1000} kB")
        if target.exists() and not target.is_file():
            raise PathRefused(f"{path!r} is a directory")
        self._refuse_published_build_script(path, target)
        if target.name == "Cargo.toml":
            self._check_manifest(content, target)
        existed = target.exists()
        write_text(self.root, target, content)
        return f"{'overwrote' if existed else 'created'} {path} ({len(content.splitlines())} lines)"

    def replace_in_file(self, path: str, search: str, replace: str) -> str:
        target = self.contain(path, write=True)
        if not target.is_file():
            raise PathRefused(f"{path!r} does not exist; use write_file to create it")
        if not search:
            return "error: `search` is empty; give the exact text to replace. Nothing was changed."
        self._refuse_published_build_script(path, target)
        try:
            data, cut = read_capped(target.resolve())
        except OSError as exc:
            raise PathRefused(f"{path!r} cannot be read: {exc.strerror or exc}") from None
        if cut:
            raise PathRefused(f"{path!r} passes {MAX_FILE_READ // (1024 * 1024)} MiB; it cannot be edited here")
        text = data.decode("utf-8", errors="surrogateescape")
        count = text.count(search)
        if count != 1:
            hint = (
                "it does not occur; read_file the current text and copy it exactly (whitespace included)"
                if count == 0
                else f"it occurs {count} times; include more surrounding lines so it matches once"
            )
            return f"error: the search text must match exactly once in {path}, but {hint}. Nothing was changed."
        new = text.replace(search, replace, 1)
        if target.name == "Cargo.toml":
            self._check_manifest(new, target)
        write_text(self.root, target, new)
        line = text[: text.index(search)].count("\n") + 1
        return f"replaced 1 occurrence in {path} at line {line}"

    def delete_file(self, path: str) -> str:
        target = self.contain(path, write=True)
        if not target.is_file():
            raise PathRefused(f"{path!r} is not a file")
        self._refuse_published_build_script(path, target)
        check_no_symlinks(self.root, target)
        target.unlink()
        return f"deleted {path}"

    def _check_manifest(self, text: str, target: Path) -> None:
        check_manifest_text(
            self.root, text, allow_build_scripts=self.allow_build_scripts, baseline=self.published, manifest=target
        )

    def _refuse_published_build_script(self, path: str, target: Path) -> None:
        """A published build script under another name than build.rs is as off limits as build.rs."""
        if self.allow_build_scripts:
            return
        if target.relative_to(self.root).as_posix() in self.published.build_scripts:
            raise PathRefused(
                f"{path!r} is the crate's build script: build scripts run arbitrary code at build time and are "
                "refused (the user can allow them with --allow-build-scripts)"
            )
