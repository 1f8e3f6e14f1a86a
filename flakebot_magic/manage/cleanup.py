"""Removing what flakebot left behind: unused store entries, old workspaces, build outputs, GC roots.

``clean`` never removes what it cannot prove unused. What no tool can use,
whatever the inventory says, goes first: build outputs (``target/``), the
losing candidates of an edit, workspaces a re-fork replaced (``.old/``),
what failed or killed builds left under ``.next/``, half-written store
entries, stale git lock files. Store entries, workspaces, recipes and GC
roots are removed only when the tool inventory names no tool that uses them,
so the inventory must be trustworthy first: unreadable, failing
``PRAGMA quick_check``, a record that does not parse, or empty (even
missing) while the store holds entries, and ``clean`` stops there, says why
(:attr:`CleanReport.refused`), and the doctor rebuilds the inventory from
disk (:mod:`flakebot_magic.manage.doctor`) for the next ``clean`` to use.

Nix-built tools live in /nix/store, kept by a GC root ``<cache>/gcroots/NAME``;
removing the root (never the store path itself) lets ``nix-collect-garbage``
reclaim a tool flakebot no longer uses.

A build that is still running (its tool lock is held, see
:mod:`flakebot_magic.host.locks`) keeps everything it may be using: its workspace,
the one it builds beside it (``workspaces/.next/``) and what was moved
aside, its private cargo home (``.sandbox/``), its staging entry and pending
GC roots, anything its unfinished transaction names, and any store entry or
recipe made since it started. Each is reported as kept.

A directory is first renamed aside (``.removing-...``, one step: no reader
ever sees half of a store entry), then removed; a crash in between leaves
only that, for the next ``clean``.

``clean(everything=True)`` removes the tool inventory too, and with it the
process groups it records: tools with a running process are stopped first.
``dry_run`` counts what would go (:func:`flakebot_magic.pipeline.deployed.disk_full`
says it).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..commands import typed
from ..config import Settings
from ..errors import StorageError
from ..host.crashpoints import crash_point
from ..host.git import remove_stale_locks, stale_locks
from ..host.locks import LockHolder, held_locks
from ..host.process import alive
from ..host.storage import amount, read_cache_json, storage_errors
from ..host.trees import remove_tree, stat_tree
from ..records.inventory import Inventory
from ..records.units import UnitStore
from ..sandbox import SANDBOX_DIR, release_target
from ..sandbox.layout import CANDIDATES_DIR
from ..stages.deploy import staging_owner
from ..stages.workspace import NEXT_DIR, OLD_DIR
from .doctor import health, prepare, rebuild
from .evidence import namings, unaccounted
from .tools import stop_all
from .transaction import pending

__all__ = ["CANDIDATES_DIR", "REMOVING_PREFIX", "CleanReport", "clean", "size_of"]

#: a directory clean renamed aside and is removing (``.removing-<name>-<pid>-<ns>``)
REMOVING_PREFIX = ".removing-"
#: directories under the workspaces dir (and the GC roots) whose entries are named after tools
_PER_TOOL = (OLD_DIR, NEXT_DIR, SANDBOX_DIR, ".pending")


@dataclass
class CleanReport:
    """What :func:`clean` did; an :class:`~flakebot_magic.manage.tools.Answer` for the front doors."""

    removed: list[Path] = field(default_factory=list)
    freed: int = 0
    #: what was left in place because a running build holds it, and why
    kept: list[str] = field(default_factory=list)
    #: what happened to each tool stopped first (``everything``)
    stopped: list[str] = field(default_factory=list)
    #: the losing candidates' workspaces removed (``<workspace>/.flakebot-candidates``), and their bytes
    candidates: list[Path] = field(default_factory=list)
    candidates_freed: int = 0
    #: why clean stopped before removing tools' store entries, workspaces and recipes ("" when it did not)
    refused: str = ""
    #: what happened before: unfinished builds finished or undone, the inventory repaired
    prepared: list[str] = field(default_factory=list)
    #: a dry run: nothing was removed, ``removed`` and ``freed`` say what would be
    dry_run: bool = False
    #: what the dependency cache keeps (kept by ``clean``, removed by ``clean --all``), in words ("" for nothing)
    units: str = ""

    @property
    def failed(self) -> bool:
        """Whether clean stopped short (:attr:`refused`): ``flakebot clean`` then exits 1."""
        return bool(self.refused)

    def summary(self) -> list[str]:
        lines = [f"kept {why}" for why in self.kept]
        verb = "would remove" if self.dry_run else "removed"
        if self.refused:
            lines.append(f"flakebot clean stopped: {self.refused}")
        if self.units:
            lines.append(self.units)
        if not self.removed:
            return [*lines, "flakebot clean: nothing to remove."]
        lines += [f"{verb} {p}" for p in self.removed]
        if self.candidates:
            tools = f"{len(self.candidates)} tool{'s' if len(self.candidates) != 1 else ''}"
            lines.append(
                f"flakebot clean: the losing candidates of {tools} ({CANDIDATES_DIR}): {amount(self.candidates_freed)}."
            )
        count = len(self.removed)
        lines.append(f"flakebot clean: {verb} {count} path{'' if count == 1 else 's'}, {amount(self.freed)}.")
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
            "refused": self.refused,
            "dry_run": self.dry_run,
            "units": self.units,
        }

    @property
    def text(self) -> str:
        return "\n".join(self.summary())

    @property
    def notes(self) -> list[str]:
        return [*self.prepared, *self.stopped]


class _Running:
    """What the builds running now (their locks held) may be using."""

    def __init__(self, holders: dict[str, LockHolder], outputs: tuple[Path, ...], installing: set[Path]) -> None:
        self.holders = holders
        self.outputs = outputs
        self.installing = installing
        self.pids = {h.pid for h in holders.values() if h.pid}
        # a store entry or recipe written after the oldest running build started may be its own
        self.since = min((h.started or 0.0 for h in holders.values()), default=None)

    def owner(self, path: Path) -> str:
        """The running build that holds ``path`` (described), or ``""``."""
        if path in self.installing:
            return "an unfinished build names it (its transaction is still running)"
        if path.name.startswith(REMOVING_PREFIX):
            pid = _removing_owner(path)
            return f"the clean with pid {pid} is removing it" if pid and pid != os.getpid() and alive(pid) else ""
        if not self.holders:
            return ""
        name = path.name
        for tool, holder in self.holders.items():
            # workspaces/NAME, workspaces/.old/NAME-<time>-<ns>, workspaces/.next/NAME-<pid>-<ns>,
            # workspaces/.sandbox/NAME, gcroots/NAME, gcroots/.pending/NAME-<pid>-<n>
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


def _removing_owner(path: Path) -> int | None:
    parts = path.name.rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def size_of(path: Path) -> int:
    """The bytes removing ``path`` frees: a file hard-linked from outside it (a candidate's warm target) frees none."""
    if path.is_symlink():
        return 0
    if path.is_file():
        info = path.stat()
        return info.st_size if info.st_nlink <= 1 else 0
    files: dict[tuple[int, int], list[int]] = {}  # inode -> [size, links, links seen here]
    for info in stat_tree(path):  # by descriptors: a tree of any depth (a sandbox may leave one) is counted
        if not stat.S_ISREG(info.st_mode):
            continue
        seen = files.setdefault((info.st_dev, info.st_ino), [info.st_size, info.st_nlink, 0])
        seen[2] += 1
    return sum(size for size, links, here in files.values() if here >= links)


def _discard(path: Path) -> None:
    """Remove ``path``: a directory is renamed aside first (gone for every reader in one step), then removed."""
    if path.is_dir() and not path.is_symlink():
        trash = path.with_name(f"{REMOVING_PREFIX}{path.name}-{os.getpid()}-{time.monotonic_ns()}")
        if not path.name.startswith(REMOVING_PREFIX):
            os.rename(path, trash)
            crash_point("clean.renamed")
            path = trash
        remove_tree(path, ignore_errors=True)  # no recursion: `clean --all` removes a tree of any depth
    else:
        path.unlink(missing_ok=True)
    crash_point("clean.removed")


def _installing(settings: Settings) -> set[Path]:
    """Everything an unfinished transaction (of a build still running) names."""
    paths: set[Path] = set()
    for intent in pending(settings):
        record = intent.record
        for text in (intent.final, intent.next, intent.aside, intent.recipe, str(record.get("store_path", ""))):
            if text:
                paths.add(Path(text))
        if intent.next:
            paths.add(Path(intent.next).parent)
    return paths


def clean(settings: Settings, *, everything: bool = False, dry_run: bool = False) -> CleanReport:
    """Remove what no tool uses; with ``everything``, remove all tools too; with ``dry_run``, only count.

    What a running build holds is kept either way and listed in
    :attr:`CleanReport.kept`. With ``everything``, tools with a running
    process are stopped first (:attr:`CleanReport.stopped`). With an inventory
    that cannot be trusted only what no tool can use is removed:
    :attr:`CleanReport.refused` says why, and the inventory is repaired.
    """
    report = CleanReport(dry_run=dry_run)
    if not dry_run:
        report.prepared = prepare(settings, repair=False)
    with storage_errors("cleaning the cache", settings.cache_dir):
        if everything and not dry_run:
            report.stopped = stop_all(settings)
        running = _Running(
            held_locks(settings.cache), (settings.cache.store, settings.cache.recipes), _installing(settings)
        )
        _clean(settings, report, running, everything=everything)
    return report


def _clean(settings: Settings, report: CleanReport, running: _Running, *, everything: bool) -> None:
    def remove(path: Path) -> None:
        why = running.owner(path)
        if not settings.cache.inside(path, follow=False):
            why = "it is outside the cache dir (a symlink on the way leads elsewhere); left alone"
        if why:
            report.kept.append(f"{path}: {why}")
            return
        if not (path.exists() or path.is_symlink()):
            return
        report.freed += size_of(path)
        report.removed.append(path)
        if not report.dry_run:
            _discard(path)

    def remove_all_in(directory: Path) -> None:
        """``directory`` itself when no build runs, else each entry (so the running one's stay)."""
        if not running.holders and not running.installing:
            remove(directory)
            return
        if directory.is_dir() and not directory.is_symlink():
            for entry in sorted(directory.iterdir()):
                if entry.name in _PER_TOOL and entry.is_dir() and not entry.is_symlink():
                    remove_all_in(entry)
                else:
                    remove(entry)

    if everything:
        remove(settings.cache.tools)
        for path in (settings.cache.store, settings.cache.workspaces, settings.cache.recipes, settings.cache.intents):
            remove_all_in(path)
        remove(settings.cache.index)
        remove_all_in(settings.cache.gcroots)
        if not running.holders and not running.installing:
            remove(settings.cache.units)  # every dependency unit: the next builds compile them again
        return

    _clean_leftovers(settings, report, running, remove)
    _clean_units(settings, report, running, remove)
    found = health(settings)
    if not found.ok:
        report.refused = (
            f"the tool inventory cannot be trusted: {found.problem}. Store entries, workspaces and recipes were "
            "left alone (only what no tool can use was removed)"
        )
        if found.reason in ("empty", "missing") and running.holders:
            report.refused += "; a build is running, and its first record may be on its way: try again after it"
        elif not report.dry_run:
            repaired = rebuild(settings, found)
            again = " ".join([repaired.repair_line(), *(f"{note}." for note in repaired.reregistered)])
            report.refused += f". {again} Check the tools with {typed('list')}, then run {typed('clean')} again."
        return
    records = Inventory(settings.cache.tools).all()
    # by name, whatever form a record's path takes (another cache dir's, a relative one): what any record
    # names is kept, never removed
    live_store = {Path(r.store_path).name for r in records}
    live_store |= {Path(r.extra["entry"]).name for r in records if r.extra.get("entry")}
    # what a tool's root must point at: the directory of its binary (nix: the /nix/store path; a tool pulled into
    # a second store (pipeline/team.py) records it, its binary being under that store's root)
    live = {r.name: str(r.extra.get("nix_store_path") or Path(r.binary).parent.parent) for r in records}
    _clean_gcroots(settings.cache.gcroots, live, remove)
    # an entry naming a tool with no record, or a newer build of one than its record, is kept whatever the last
    # rebuild of the inventory made of it (the store is evidence: manage/evidence.py)
    evidence = unaccounted({r.name: r for r in records}, namings(settings), reconciled=())
    if settings.cache.store.is_dir():
        for entry in sorted(settings.cache.store.iterdir()):
            if entry.name in evidence:
                report.kept.append(f"{entry}: {evidence[entry.name]}; {typed('doctor')} registers it")
            elif entry.name not in live_store:
                remove(entry)
    live_workspaces = {Path(r.workspace).name for r in records if r.workspace}
    if settings.cache.workspaces.is_dir():
        for entry in sorted(settings.cache.workspaces.iterdir()):
            if not entry.name.startswith(".") and entry.name not in live_workspaces:
                remove(entry)
    if settings.cache.recipes.is_dir():
        for recipe in sorted(settings.cache.recipes.glob("*.json")):
            try:
                store = Path(str(read_cache_json(recipe)["store"])).name
            except (OSError, StorageError, KeyError, TypeError):
                store = ""
            if store not in live_store:
                remove(recipe)


def _clean_leftovers(
    settings: Settings, report: CleanReport, running: _Running, remove: Callable[[Path], None]
) -> None:
    """What no tool can use, whatever the inventory says: old and failed attempts, build outputs, stale locks."""
    workspaces = settings.cache.workspaces
    if workspaces.is_dir():
        # workspaces replaced (.old) and builds beside a tool's workspace (.next): a running one's are kept
        for aside in (workspaces / OLD_DIR, workspaces / NEXT_DIR):
            if aside.is_dir() and not aside.is_symlink() and settings.cache.inside(aside):
                for entry in sorted(aside.iterdir()):
                    remove(entry)
                if not report.dry_run and not any(aside.iterdir()):
                    aside.rmdir()
            else:
                remove(aside)
        for entry in sorted(workspaces.iterdir()):
            if entry.name.startswith(REMOVING_PREFIX):
                remove(entry)
            if entry.name.startswith(".") or not entry.is_dir() or entry.is_symlink():
                continue
            if not settings.cache.inside(entry, workspaces):
                continue  # workspaces/ itself leads elsewhere: prepare sets it aside
            why = running.owner(entry)
            if why:
                report.kept.append(f"{entry / 'target'}: {why}")
                if (entry / CANDIDATES_DIR).exists():
                    report.kept.append(f"{entry / CANDIDATES_DIR}: {why}")
                continue
            remove(entry / "target")
            remove(release_target(entry))
            _remove_candidates(entry / CANDIDATES_DIR, report, remove)
            for lock in stale_locks(entry) if report.dry_run else remove_stale_locks(entry):
                report.removed.append(lock)
    if settings.cache.store.is_dir():
        for entry in sorted(settings.cache.store.iterdir()):
            if entry.name.startswith(REMOVING_PREFIX) or staging_owner(entry) is not None:
                remove(entry)
    pending_roots = settings.cache.pending_gcroots
    if pending_roots.is_dir() and not pending_roots.is_symlink():
        for link in sorted(pending_roots.iterdir()):
            remove(link)


def _clean_units(settings: Settings, report: CleanReport, running: _Running, remove: Callable[[Path], None]) -> None:
    """The dependency cache is kept (every later build shares it); what no unit record names goes: stub builds
    left over, objects of no record. Not while a build runs (it may be sealing: objects first, the record last)."""
    store = UnitStore(settings.cache.units)
    if not running.holders and not running.installing:
        # a stub build removes its own directories when it is over: one left is a killed build's (its lock and
        # its log stay, one small file each per dependency set)
        stubs = store.stubs
        for stub in sorted(stubs.iterdir()) if stubs.is_dir() and not stubs.is_symlink() else ():
            if stub.name == SANDBOX_DIR and stub.is_dir() and not stub.is_symlink():
                for left in sorted(stub.iterdir()):
                    remove(left)
            elif stub.is_dir() or stub.is_symlink():
                remove(stub)
        if not report.dry_run:
            report.freed += store.sweep()
    count, _, on_disk = store.usage()
    if count:
        report.units = (
            f"kept the dependency cache: {count} compiled dependency unit{'' if count == 1 else 's'}, "
            f"{amount(on_disk)} ({typed('clean --all')} removes it)"
        )


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
    """Drop roots of tools that are gone or rebuilt elsewhere."""
    if not gcroots.is_dir():
        return
    for root in sorted(gcroots.iterdir()):
        if not root.is_symlink():
            continue
        try:
            target = os.readlink(root)
        except OSError:
            target = ""
        if live.get(root.name) != target:
            remove(root)
    proofs = gcroots / ".proofs"  # a build's proof (backends/nix_cache.py) lives as long as its tool's name
    for root in sorted(proofs.iterdir()) if proofs.is_dir() else ():
        if root.is_symlink() and root.name not in live:
            remove(root)
