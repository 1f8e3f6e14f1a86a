"""A forked crate's workspace: its saved state, where it lives, and how a rebuild puts a new one in place.

Where workspaces live::

    workspaces/NAME                         the tool's workspace (its record's commit is its HEAD)
    workspaces/.next/NAME-<pid>-<ns>/NAME   a build that replaces it (a re-fork, or a copy for --continue)
    workspaces/.old/NAME-<time>-<ns>        a workspace a re-fork replaced

A build never changes ``workspaces/NAME`` of a tool it replaces: it forks
(``--rebuild``, another crate) or copies (``--continue``, a cached tool under
a new name: :func:`clone_at`) into ``.next/``, and the transaction that
makes the build the tool (:mod:`flakebot_magic.manage.transaction`) puts the result
in place in one step (``renameat2(RENAME_EXCHANGE)``) only once it is
deployed. A failed, cancelled or killed build leaves the tool's workspace as
it was; its own tree stays under ``.next/`` (the error says where) until
``clean``.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ..errors import ForkError, StorageError
from ..host.fsutil import atomic_write
from ..host.git import Git
from ..host.process import ProcessRunner
from ..host.storage import read_cache_json
from ..host.trees import copy_tree
from ..registry.base import CrateCandidate
from ..sandbox.layout import OUTPUT_DIRS

__all__ = [
    "FORK_FORMAT",
    "NEXT_DIR",
    "OLD_DIR",
    "DroppedDependency",
    "Workspace",
    "aside_path",
    "clone_at",
    "copy_beside",
    "next_owner",
    "next_path",
]

STATE_FILE = "flakebot.json"
FORK_FORMAT = 2  # bump when fix-ups or the import change, so old workspaces are re-forked
#: under the workspaces dir: builds that replace a tool's workspace, and workspaces they replaced
NEXT_DIR, OLD_DIR = ".next", ".old"


@dataclass(frozen=True)
class DroppedDependency:
    key: str
    crate: str
    requirement: str
    kind: str  # "dev" | "optional" | "target"

    def __str__(self) -> str:
        return f"{self.crate} {self.requirement}".strip()


@dataclass
class Workspace:
    """A forked crate: its git repo, where it came from, and what was changed to build it."""

    path: Path
    crate: CrateCandidate
    checksum: str
    checksum_kind: str
    published_commit: str
    dropped: list[DroppedDependency] = field(default_factory=list)
    skipped_targets: list[str] = field(default_factory=list)
    lock_action: str = "kept"
    reused: bool = False
    #: the workspace this one replaces once its build is deployed (:func:`~flakebot_magic.manage.transaction.install`); None: it is in place
    replaces: Path | None = None

    @property
    def git_dir(self) -> Path:
        return self.path / ".git"

    def save(self) -> None:
        data = asdict(self)
        data["path"] = str(self.path)
        data["crate"] = self.crate.to_json()
        data["format"] = FORK_FORMAT
        data.pop("reused")
        data.pop("replaces")
        # sandboxed code may have planted a symlink here; atomic_write replaces it, never follows it
        atomic_write(self.git_dir / STATE_FILE, json.dumps(data, indent=2), root=self.path)

    @classmethod
    def load(cls, path: Path) -> Workspace | None:
        try:
            data = read_cache_json(path / ".git" / STATE_FILE)
        except (OSError, StorageError):
            return None
        if data.pop("format", None) != FORK_FORMAT:
            return None
        crate = data.pop("crate")
        for key in ("bin_names", "keywords", "categories"):
            crate[key] = tuple(crate[key])
        return cls(
            path=path,
            crate=CrateCandidate(**crate),
            checksum=data["checksum"],
            checksum_kind=data["checksum_kind"],
            published_commit=data["published_commit"],
            dropped=[DroppedDependency(**d) for d in data["dropped"]],
            skipped_targets=list(data["skipped_targets"]),
            lock_action=data["lock_action"],
            reused=True,
        )


def next_path(workspaces_dir: Path, name: str) -> Path:
    """``.next/NAME-<pid>-<ns>/NAME``: a build replacing ``name``'s workspace (its sandbox's home goes beside it)."""
    attempt = workspaces_dir / NEXT_DIR / f"{name}-{os.getpid()}-{time.time_ns()}"
    attempt.mkdir(parents=True)
    return attempt / name


def next_owner(path: Path) -> int | None:
    """The pid of the run building in ``.next/NAME-<pid>-<ns>`` (None: not such a name)."""
    parts = path.name.rsplit("-", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1])


def copy_beside(workspace: Workspace, path: Path) -> Workspace:
    """A copy of ``workspace`` (its history and working tree, not its build outputs) at ``path``."""
    try:
        # build outputs, and the losing candidates of an earlier speculative session, stay; no symlink is followed
        # and no FIFO read (sandboxed code left them), and no depth ends the copy with a RecursionError
        copy_tree(workspace.path, path, links=True, skip=lambda rel: rel in OUTPUT_DIRS, times=True)
    except OSError as exc:
        raise ForkError(
            f"Could not copy the workspace {workspace.path} to build beside it: {exc}", workspace=path
        ) from exc
    return replace(workspace, path=path, reused=True, replaces=workspace.path)


def clone_at(source: Path, commit: str, path: Path, runner: ProcessRunner) -> Workspace:
    """A copy of the workspace ``source`` at ``path`` (see :func:`copy_beside`), its HEAD set to ``commit``.

    A tool that comes from the cache under a new name gets its own
    workspace this way: the history of the workspace its store entry was
    built from, checked out at the commit that built it.
    """
    original = Workspace.load(source)
    if original is None:
        raise ForkError(f"{source} is not a flakebot workspace (no readable .git/{STATE_FILE}).", workspace=source)
    copy = copy_beside(original, path)
    git = Git(path, runner)
    git("reset", "-q", "--hard", commit)
    git("clean", "-q", "-f", "-d")
    return replace(copy, replaces=None)


def aside_path(workspaces_dir: Path, name: str) -> Path:
    """A fresh ``.old/NAME-<time>-<ns>`` for a workspace a re-fork replaces (``.old`` is made if missing)."""
    parent = workspaces_dir / OLD_DIR
    parent.mkdir(parents=True, exist_ok=True)
    return parent / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{time.time_ns() % 10**9:09d}"
