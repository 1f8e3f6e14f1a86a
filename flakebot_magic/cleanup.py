"""Removing what flakebot left behind: unused store entries, old workspaces, build outputs, GC roots.

Nix-built tools live in /nix/store, kept by a GC root ``<cache>/gcroots/NAME``;
removing the root (never the store path itself) lets ``nix-collect-garbage``
reclaim a tool flakebot no longer uses.

The losing candidates of a tool's edit (``<workspace>/.flakebot-candidates/``,
kept for inspection) are removed with its build outputs.

A build that is still running (its tool lock is held, see
:mod:`flakebot_magic.locks`) keeps everything it may be using: its workspace,
the one it builds beside it (``workspaces/.next/``) and what was moved
aside, its staging entry and pending GC roots, and any store entry or
recipe made since it started. Each is reported as kept. What a build that
failed or was killed left under ``.next/`` is removed.

``clean(everything=True)`` removes the tool registry too, and with it the
process groups it records: tools with a running process are stopped first.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .config import Settings
from .inventory import Inventory
from .locks import LockHolder, held_locks
from .policy import CANDIDATES_DIR
from .process import alive
from .stages.deploy import staging_owner
from .stages.workspace import NEXT_DIR, OLD_DIR
from .tools import stop_all

__all__ = ["CANDIDATES_DIR", "CleanReport", "clean"]


@dataclass
class CleanReport:
    """What :func:`clean` did; an :class:`~flakebot_magic.tools.Answer` for the front doors."""

    removed: list[Path] = field(default_factory=list)
    freed: int = 0
    #: what was left in place because a running build holds it, and why
    kept: list[str] = field(default_factory=list)
    #: what happened to each tool stopped first (``everything``)
    stopped: list[str] = field(default_factory=list)
    #: the losing candidates' workspaces removed (``<workspace>/.flakebot-candidates``), and their bytes
    candidates: list[Path] = field(default_factory=list)
    candidates_freed: int = 0

    def summary(self) -> list[str]:
        lines = [f"kept {why}" for why in self.kept]
        if not self.removed:
            return [*lines, "flakebot clean: nothing to remove."]
        lines += [f"removed {p}" for p in self.removed]
        if self.candidates:
            tools = f"{len(self.candidates)} tool{'s' if len(self.candidates) != 1 else ''}"
            lines.append(
                f"flakebot clean: the losing candidates of {tools} ({CANDIDATES_DIR}): {_amount(self.candidates_freed)}."
            )
        count = len(self.removed)
        lines.append(f"flakebot clean: removed {count} path{'' if count == 1 else 's'}, {_amount(self.freed)}.")
        return lines

    @property
    def data(self) -> dict[str, object]:
        return {
            "removed": [str(p) for p in self.removed],
            "freed_bytes": self.freed,
            "kept": list(self.kept),
            "stopped": list(self.stopped),
            "candidates": [str(p) for p in self.candidates],
            "candidates_freed_bytes": self.candidates_freed,
        }

    @property
    def text(self) -> str:
        return "\n".join(self.summary())

    @property
    def notes(self) -> list[str]:
        return list(self.stopped)


class _Running:
    """What the builds running now (their locks held) may be using."""

    def __init__(self, holders: dict[str, LockHolder], outputs: tuple[Path, ...]) -> None:
        self.holders = holders
        self.outputs = outputs
        self.pids = {h.pid for h in holders.values() if h.pid}
        # a store entry or recipe written after the oldest running build started may be its own
        self.since = min((h.started or 0.0 for h in holders.values()), default=None)

    def owner(self, path: Path) -> str:
        """The running build that holds ``path`` (described), or ``""``."""
        if not self.holders:
            return ""
        name = path.name
        for tool, holder in self.holders.items():
            # workspaces/NAME, workspaces/.old/NAME-<time>, workspaces/.next/NAME-<pid>-<ns>,
            # gcroots/NAME, gcroots/.pending/NAME-<pid>-<n>
            if name == tool or name.startswith(f"{tool}-"):
                return f"the build of {tool!r} is still running ({holder.describe()})"
        pid = staging_owner(path)
        if pid is not None and (pid in self.pids or alive(pid)):
            return f"the run with pid {pid} is still writing it"
        if self.since is not None and path.parent in self.outputs:
            try:
                if path.lstat().st_mtime >= self.since - 1:
                    return "it was written while a build is running"
            except OSError:
                return ""
        return ""


def _amount(size: int) -> str:
    """``12.3 MB (12,345,678 bytes)``: the rounded size for a glance, the bytes exactly."""
    return f"{size / 1e6:.1f} MB ({size:,} bytes)"


def _size(path: Path) -> int:
    """The bytes removing ``path`` frees: a file hard-linked from outside it (a candidate's warm target) frees none."""
    if path.is_symlink():
        return 0
    if path.is_file():
        info = path.stat()
        return info.st_size if info.st_nlink <= 1 else 0
    files: dict[tuple[int, int], list[int]] = {}  # inode -> [size, links, links seen here]
    for each in path.rglob("*"):
        try:
            info = each.lstat()
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue
        seen = files.setdefault((info.st_dev, info.st_ino), [info.st_size, info.st_nlink, 0])
        seen[2] += 1
    return sum(size for size, links, here in files.values() if here >= links)


def clean(settings: Settings, *, everything: bool = False) -> CleanReport:
    """Remove what no tool uses; with ``everything``, remove all tools too.

    What a running build holds is kept either way and listed in
    :attr:`CleanReport.kept`. With ``everything``, tools with a running
    process are stopped first (:attr:`CleanReport.stopped`).
    """
    report = CleanReport(stopped=stop_all(settings) if everything else [])
    running = _Running(held_locks(settings.cache_dir), (settings.store_dir, settings.recipes_dir))

    def remove(path: Path) -> None:
        why = running.owner(path)
        if why:
            report.kept.append(f"{path}: {why}")
            return
        if path.is_symlink():  # a GC root: drop the link, never what it points to
            path.unlink()
            report.removed.append(path)
            return
        if not path.exists():
            return
        report.freed += _size(path)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
        report.removed.append(path)

    def remove_all_in(directory: Path) -> None:
        """``directory`` itself when no build runs, else each entry (so the running one's stay)."""
        if not running.holders:
            remove(directory)
            return
        if directory.is_dir():
            for entry in sorted(directory.iterdir()):
                if entry.name in (OLD_DIR, NEXT_DIR, ".pending") and entry.is_dir() and not entry.is_symlink():
                    remove_all_in(entry)
                else:
                    remove(entry)

    inventory = Inventory(settings.tools_dir)
    if everything:
        for path in (
            settings.tools_dir,
            settings.store_dir,
            settings.workspaces_dir,
            settings.recipes_dir,
            settings.index_dir,
        ):
            if path in (settings.tools_dir, settings.index_dir):
                remove(path)
            else:
                remove_all_in(path)
        if settings.gcroots_dir.is_dir():
            for root in sorted(settings.gcroots_dir.iterdir()):
                if root.name == ".pending" and root.is_dir() and not root.is_symlink():
                    remove_all_in(root)
                else:
                    remove(root)
            if not running.holders:
                remove(settings.gcroots_dir)
        return report
    records = inventory.all()
    live_store = {Path(r.store_path) for r in records}
    live_store |= {Path(r.extra["entry"]) for r in records if r.extra.get("entry")}
    _clean_gcroots(settings.gcroots_dir, {r.name: r.store_path for r in records}, remove)
    live_workspaces = {Path(r.workspace) for r in records}
    if settings.store_dir.is_dir():
        for entry in sorted(settings.store_dir.iterdir()):
            if entry not in live_store:
                remove(entry)
    if settings.workspaces_dir.is_dir():
        # workspaces replaced (.old) and builds beside a tool's workspace (.next): a running one's are kept
        for aside in (settings.workspaces_dir / OLD_DIR, settings.workspaces_dir / NEXT_DIR):
            if aside.is_dir() and not aside.is_symlink():
                for entry in sorted(aside.iterdir()):
                    remove(entry)
                if not any(aside.iterdir()):
                    aside.rmdir()
            else:
                remove(aside)
        for entry in sorted(settings.workspaces_dir.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry not in live_workspaces:
                remove(entry)
            elif running.owner(entry):
                report.kept.append(f"{entry / 'target'}: {running.owner(entry)}")
                if (entry / CANDIDATES_DIR).exists():
                    report.kept.append(f"{entry / CANDIDATES_DIR}: {running.owner(entry)}")
            else:
                remove(entry / "target")
                _remove_candidates(entry / CANDIDATES_DIR, report, remove)
    if settings.recipes_dir.is_dir():
        for recipe in sorted(settings.recipes_dir.glob("*.json")):
            try:
                store = Path(json.loads(recipe.read_text())["store"])
            except (OSError, ValueError, KeyError):
                store = Path("/nonexistent")
            if store not in live_store:
                remove(recipe)
    return report


def _remove_candidates(path: Path, report: CleanReport, remove: Callable[[Path], None]) -> None:
    """Remove a workspace's losing candidates, counted apart in ``report`` too (never through a symlink)."""
    if path.is_symlink():
        remove(path)  # only the link goes
        return
    if not path.is_dir():
        return
    before = report.freed
    remove(path)
    if path in report.removed:
        report.candidates.append(path)
        report.candidates_freed += report.freed - before


def _clean_gcroots(gcroots: Path, live: dict[str, str], remove: Callable[[Path], None]) -> None:
    """Drop roots of tools that are gone or rebuilt elsewhere, and any run's leftover pending roots."""
    if not gcroots.is_dir():
        return
    pending = gcroots / ".pending"
    if pending.is_dir():
        for link in sorted(pending.iterdir()):
            remove(link)
    for root in sorted(gcroots.iterdir()):
        if not root.is_symlink():
            continue
        try:
            target = os.readlink(root)
        except OSError:
            target = ""
        if live.get(root.name) != target:
            remove(root)
