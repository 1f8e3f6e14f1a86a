"""Removing what flakebot left behind: unused store entries, old workspaces, build outputs, GC roots.

Nix-built tools live in /nix/store, kept by a GC root ``<cache>/gcroots/NAME``;
removing the root (never the store path itself) lets ``nix-collect-garbage``
reclaim a tool flakebot no longer uses.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .config import Settings
from .inventory import Inventory

__all__ = ["CleanReport", "clean"]


@dataclass
class CleanReport:
    removed: list[Path] = field(default_factory=list)
    freed: int = 0

    def summary(self) -> list[str]:
        if not self.removed:
            return ["flakebot clean: nothing to remove."]
        lines = [f"removed {p}" for p in self.removed]
        lines.append(f"flakebot clean: removed {len(self.removed)} paths, {self.freed / 1e6:.1f} MB.")
        return lines


def _size(path: Path) -> int:
    if path.is_symlink():
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def clean(settings: Settings, *, everything: bool = False) -> CleanReport:
    """Remove what no tool uses; with ``everything``, remove all tools too."""
    report = CleanReport()

    def remove(path: Path) -> None:
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

    inventory = Inventory(settings.tools_dir)
    if everything:
        for path in (settings.tools_dir, settings.store_dir, settings.workspaces_dir, settings.recipes_dir, settings.index_dir):
            remove(path)
        if settings.gcroots_dir.is_dir():
            for root in sorted(settings.gcroots_dir.iterdir()):
                remove(root)
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
        remove(settings.workspaces_dir / ".old")
        for entry in sorted(settings.workspaces_dir.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry not in live_workspaces:
                remove(entry)
            else:
                remove(entry / "target")
    if settings.recipes_dir.is_dir():
        for recipe in sorted(settings.recipes_dir.glob("*.json")):
            try:
                store = Path(json.loads(recipe.read_text())["store"])
            except (OSError, ValueError, KeyError):
                store = Path("/nonexistent")
            if store not in live_store:
                remove(recipe)
    return report


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
