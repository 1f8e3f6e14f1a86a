"""Removing what flakebot left behind: unused store entries, old workspaces, build outputs."""

from __future__ import annotations

import json
import shutil
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
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def clean(settings: Settings, *, everything: bool = False) -> CleanReport:
    """Remove what no tool uses; with ``everything``, remove all tools too."""
    report = CleanReport()

    def remove(path: Path) -> None:
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
        return report
    records = inventory.all()
    live_store = {Path(r.store_path) for r in records}
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
