"""``flakebot doctor``: every damage it meets repaired or set aside, tool by tool; the tool inventory rebuilt from
the disk when it cannot be trusted.

Every command starts with :func:`prepare`: transactions a dead process left
are finished or undone (:func:`~flakebot_magic.manage.transaction.recover`), then
the inventory's :func:`health` is checked: its file (readable, ``PRAGMA
quick_check``, every record parses, not empty while the store holds entries
it never saw: :meth:`~flakebot_magic.records.inventory.Inventory.check`) and
what the store's manifests name that it does not account for (a tool with no
record, or a newer build than its record: :func:`~flakebot_magic.manage.evidence.unaccounted`).
One that cannot be trusted is rebuilt at once from what the disk proves
(:func:`~flakebot_magic.manage.evidence.reconstruct`: tool cards, workspaces,
store entries; the readable old records it does not replace are kept): the new
inventory is written beside, the damaged file (and its ``-wal``) moved to
``tools.sqlite3.damaged-<time>`` (named in the report), then the new one put
in its place.

``flakebot doctor`` / ``%flakebot doctor`` does that and goes through
everything, each repair on its own (one that fails stops no other):

* the cache's directories that are no directories, and flakebot's files
  that are no files (a tool's lock, an intent), set aside (kept);
* each store entry: modes its owner cannot read or run by given back (root
  ignores them, a tool in the sandbox does not), then a damaged one set aside;
* each tool: what stands in place of its tool card or ``.git/config`` set
  aside, a killed git's lock files removed, its card written again from its
  record when it is missing; the record checked against its store entry and
  workspace; a command-line tool's binary run once in the sandbox (its
  ``--help``), so one that cannot start is found before a call.

What it cannot repair is a problem naming the one command that fixes it
(:attr:`DoctorReport.problems`); ``flakebot doctor`` exits 1 while any
remain. It never deletes a tool.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clients.kinds import KINDS
from ..commands import typed
from ..config import Settings
from ..errors import FlakebotError, StorageError
from ..host.crashpoints import crash_point
from ..host.entry import remedy, restore_modes, runnable_damage
from ..host.fsutil import atomic_write, set_aside_non_file
from ..host.git import Git, remove_stale_locks
from ..host.locks import held_locks
from ..host.process import ProcessRunner
from ..host.storage import storage_errors
from ..host.trees import Walk
from ..records.inventory import Health, Inventory, ToolRecord
from ..records.units import UnitStore
from ..stages.deploy import entry_damage, set_aside
from ..untrusted import safe_line
from .evidence import entry_of, has_commit, namings, reconstruct, store_entries, unaccounted
from .transaction import CARD_FILE, read_card, recover, write_card

__all__ = ["DoctorReport", "doctor", "health", "prepare", "reconstruct", "store_entries"]


@dataclass
class DoctorReport:
    """What :func:`doctor` found and did; an :class:`~flakebot_magic.manage.tools.Answer` for the front doors."""

    health: Health = field(default_factory=Health)
    #: unfinished builds finished or undone first
    recovered: list[str] = field(default_factory=list)
    #: where the damaged inventory was moved (None: it was not)
    aside: Path | None = None
    #: the tools whose records were rebuilt, and workspaces that gave none (and why)
    rebuilt: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: tools re-registered from their store entry alone, with what is missing of their provenance
    reregistered: list[str] = field(default_factory=list)
    #: what the doctor could not repair, each naming the one command that does (it never deletes a tool)
    problems: list[str] = field(default_factory=list)
    #: what disagrees but needs no repair (a workspace edited since its build)
    remarks: list[str] = field(default_factory=list)
    #: git lock files a killed git had left in the tools' workspaces, removed
    unlocked: list[Path] = field(default_factory=list)
    #: what was moved aside (kept) or given back: damaged store entries, cache directories and files, modes
    set_aside: list[str] = field(default_factory=list)
    #: whether the checks of every tool ran (``prepare``'s rebuild alone does not)
    full: bool = False

    def repair_line(self) -> str:
        """One sentence on the repair ("" when the inventory was fine)."""
        if self.health.ok:
            return ""
        names = ", ".join(self.rebuilt) or "none"
        kept = f"; the damaged file is kept at {self.aside}" if self.aside else ""
        return (
            f"The tool inventory could not be trusted ({self.health.problem}); it was rebuilt from the store and "
            f"the workspaces: {len(self.rebuilt)} tool{'' if len(self.rebuilt) == 1 else 's'} ({names}){kept}."
        )

    @property
    def failed(self) -> bool:
        """Whether problems remain: ``flakebot doctor`` then exits 1."""
        return bool(self.problems)

    def summary(self) -> list[str]:
        lines = list(self.recovered)
        lines.append(self.repair_line() or "The tool inventory is sound (quick_check ok, every record parses).")
        lines += self.reregistered
        lines += [f"not rebuilt: {why}" for why in self.skipped]
        lines += [f"removed {lock} (a killed git's lock)" for lock in self.unlocked]
        lines += self.set_aside
        lines += self.remarks
        lines += [f"problem: {p}" for p in self.problems] or ["Every record agrees with its store entry and workspace."]
        return lines

    @property
    def data(self) -> dict[str, Any]:
        return {
            "ok": self.health.ok and not self.problems,
            "reason": self.health.reason,
            "problem": self.health.problem,
            "recovered": list(self.recovered),
            "aside": str(self.aside) if self.aside else None,
            "rebuilt": list(self.rebuilt),
            "reregistered": list(self.reregistered),
            "skipped": list(self.skipped),
            "problems": list(self.problems),
            "remarks": list(self.remarks),
            "unlocked": [str(p) for p in self.unlocked],
            "set_aside": list(self.set_aside),
        }

    @property
    def text(self) -> str:
        return "\n".join(self.summary())

    @property
    def notes(self) -> list[str]:
        return []


def health(settings: Settings) -> Health:
    """Whether the tool inventory can be trusted: its file (:meth:`Inventory.check`), then what the store names
    that it does not account for (:func:`~flakebot_magic.manage.evidence.unaccounted`). Reads only."""
    entries = store_entries(settings)
    inventory = Inventory(settings.cache.tools)
    found = inventory.check(entries)
    if not found.ok:
        return found
    try:
        records = {record.name: record for record in inventory.all()}
    except StorageError:
        return found  # what check could not see (a full disk) is not looked at closer here either
    missing = unaccounted(records, namings(settings, entries), inventory.reconciled_namings())
    if not missing:
        return found
    first, *more = missing.values()
    others = f" (and {len(more)} more entr{'y' if len(more) == 1 else 'ies'})" if more else ""
    return Health("unaccounted", f"{first}{others}")


def prepare(settings: Settings, *, repair: bool = True) -> list[str]:
    """What every command does first; returns what it did, in words (most often nothing).

    Unfinished transactions of dead processes are finished or undone; with
    ``repair``, an inventory that cannot be trusted is rebuilt (:func:`rebuild`).
    An inventory that is only empty (or not there yet) is left alone while a
    build runs (its first record may be on its way). A repair that fails (a full disk) is
    reported, not raised: reading commands go on.
    """
    notes = _layout(settings)
    try:
        with storage_errors("finishing what an interrupted command left", settings.cache_dir):
            notes += recover(settings)
    except StorageError as exc:
        notes.append(f"what an interrupted build left could not be finished now: {exc}")
    if not repair:
        return notes
    found = health(settings)
    if found.ok or (found.reason in ("empty", "missing") and held_locks(settings.cache)):
        return notes
    try:
        report = rebuild(settings, found)
    except StorageError as exc:
        return [*notes, f"the tool inventory cannot be trusted ({found.problem}) and could not be repaired now: {exc}"]
    return [*notes, report.repair_line(), *report.reregistered]


def _layout(settings: Settings) -> list[str]:
    """The cache's directories that are no directories (a file, a dangling symlink) set aside and made again; tool
    locks that are no files (a directory) set aside."""
    try:
        with storage_errors("setting aside what stands in place of a cache directory", settings.cache_dir):
            done = settings.cache.set_aside_non_directories()
    except StorageError as exc:
        return [f"a cache directory is not a directory and could not be set aside now: {exc}"]
    locks = settings.cache.locks
    for lock in sorted(locks.glob("*.lock")) if locks.is_dir() and not locks.is_symlink() else ():
        try:
            aside = set_aside_non_file(lock)
            crash_point("doctor.lock_aside")
        except OSError as exc:
            done.append(f"{lock} is no lock file and could not be set aside now ({exc.strerror or exc})")
            continue
        if aside is not None:
            done.append(f"set aside {lock} (it was no lock file): it is at {aside} now (kept)")
    return done


def rebuild(settings: Settings, found: Health | None = None) -> DoctorReport:
    """The inventory rebuilt from the disk when it cannot be trusted (``found``: what :func:`health` just said).

    Raises :class:`~flakebot_magic.errors.StorageError` when the rebuilt inventory cannot be written (a full disk);
    the damaged one is then left in place.
    """
    report = DoctorReport(health=found if found is not None else health(settings))
    if report.health.ok:
        return report
    inventory = Inventory(settings.cache.tools)
    with storage_errors("rebuilding the tool inventory", settings.cache.tools):
        evidence = reconstruct(settings, inventory.readable_records())
        report.aside = inventory.replace_all(evidence.records, store_entries(settings), evidence.considered)
    crash_point("doctor.replaced")
    report.rebuilt = [record.name for record in evidence.records]
    report.skipped, report.reregistered = evidence.skipped, evidence.notes
    return report


def doctor(settings: Settings, *, health: Health | None = None) -> DoctorReport:
    """Check and repair the cache, tool by tool (see the module); the inventory rebuilt when it cannot be trusted.

    ``health``: what a check just found. Raises :class:`~flakebot_magic.errors.StorageError` when the rebuilt
    inventory cannot be written (a full disk); the damaged one is then left in place.
    """
    set_aside_now = _layout(settings)
    recovered = recover(settings)
    set_aside_now += _store(settings)
    report = rebuild(settings, health)
    report.full = True
    report.set_aside[:0], report.recovered = set_aside_now, recovered
    runner = ProcessRunner()
    busy = held_locks(settings.cache)
    # each sealed dependency unit against its objects (hashed); objects of no record swept unless a build runs
    report.set_aside += UnitStore(settings.cache.units).check(sweep=not busy)
    probed: dict[tuple[str, str], str] = {}
    for record in Inventory(settings.cache.tools).all():
        name = record.name
        try:
            with storage_errors(f"checking {name!r}", settings.cache_dir):
                _tool(settings, record, runner, name in busy, report, probed)
        except (FlakebotError, OSError) as exc:  # one tool that cannot be checked stops no other
            what = str(exc).split(". ")[0].rstrip(".")  # what happened; the one command is the doctor's to name
            report.problems.append(
                f"{name}: it could not be checked ({what}); {typed(f'rebuild {name}')} forks and builds it again"
            )
    return report


def _store(settings: Settings) -> list[str]:
    """Each store entry its owner cannot read or run given its modes back; each damaged one moved aside (kept):
    its next build makes it again."""
    done = []
    for name in store_entries(settings):
        entry = settings.cache.store / name
        if not settings.cache.inside(entry, settings.cache.store, follow=False):
            continue
        try:
            with storage_errors(f"checking the store entry {entry}", entry):
                changed = restore_modes(entry)
                crash_point("doctor.modes")
        except StorageError:
            changed = []  # a manifest that cannot be read: entry_damage says so below
        why = entry_damage(entry)
        if changed:
            shown = ", ".join(str(path) for path in changed)
            done.append(f"gave their owner back the reading and running of {shown}{'' if why else ' (they are whole)'}")
        if why:
            aside = set_aside(entry)
            crash_point("doctor.entry_aside")
            if aside is not None:
                done.append(f"set aside {entry}: {why}; it is at {aside} now (kept), its next build makes it again")
    return done


def _tool(
    settings: Settings,
    record: ToolRecord,
    runner: ProcessRunner,
    busy: bool,
    report: DoctorReport,
    probed: dict[tuple[str, str], str],
) -> None:
    """One tool: its workspace's files repaired (unless a build holds it), then checked against the disk and run."""
    workspace = Path(record.workspace) if record.workspace else None
    inside = workspace is not None and settings.cache.inside(workspace, settings.cache.workspaces)
    if workspace is not None and inside and not busy and workspace.is_dir() and not workspace.is_symlink():
        git_dir = workspace / ".git"
        card = git_dir / CARD_FILE
        if git_dir.is_dir() and not git_dir.is_symlink():
            aside = set_aside_non_file(card)
            crash_point("doctor.card_aside")
            if aside is not None:
                report.set_aside.append(f"set aside {card} (it was no tool card): it is at {aside} now (kept)")
            report.set_aside += [f"{record.name}: {line}" for line in _special_files_aside(git_dir)]
            head = git_dir / "HEAD"
            if not os.path.lexists(head) and re.fullmatch(r"[0-9a-f]{40}", record.commit):
                atomic_write(head, f"{record.commit}\n", root=workspace)  # detached at the tool's build
                crash_point("doctor.head")
                report.set_aside.append(
                    f"{record.name}: wrote {head} again, at the recorded commit {record.commit[:12]}"
                )
            git = Git(workspace, runner)
            git.clean_config()  # what stands in place of .git/config is set aside
            report.set_aside += [f"{record.name}: {line}" for line in git.cleaned if line.startswith("(.git/config")]
            report.unlocked += remove_stale_locks(workspace)
            crash_point("doctor.unlocked")
    report.problems += _disagreements(settings, record, runner, report)
    lost_card = workspace is not None and inside and not busy and workspace.is_dir() and read_card(workspace) is None
    if (
        workspace is not None
        and lost_card
        and _whole(settings, record)
        and has_commit(workspace, record.commit, runner)
    ):
        write_card(workspace, record.to_json(), str(record.extra.get("txn") or ""))
        crash_point("doctor.card")
        report.set_aside.append(f"{record.name}: wrote its tool card {workspace / '.git' / CARD_FILE} again")
    if not _whole(settings, record):
        return
    why = runnable_damage(record.store_path, record.binary)  # modes doctor could not give back (not its own)
    if why:
        report.problems.append(f"{record.name}: it cannot run: {why}; {remedy(record.name, why)}")
        return
    kind = KINDS.get(record.kind)  # its kind runs it in the sandbox without a call, if it has a way (a --help)
    if kind is not None:
        key = (record.store_path, record.binary)
        if key not in probed:
            probed[key] = kind.runs_confined(Path(record.binary), Path(record.store_path))
        if probed[key]:
            report.problems.append(
                f"{record.name}: its binary {record.binary} {probed[key]} when run in the sandbox without a call; "
                f"{typed(f'rebuild {record.name}')} builds it again"
            )


def _special_files_aside(git_dir: Path) -> list[str]:
    """Every FIFO, socket, device or symlink under a workspace's ``.git`` removed: git opens what it finds there
    (``HEAD``, refs, the index, objects) and would block on a FIFO until its time limit, or read a link's target.
    None of them holds data (a link's target is named in the report), and flakebot and git make none; renamed
    aside inside ``.git`` they would still be read (a name under ``refs/`` is a ref)."""
    done = []
    for top, dirs, files in Walk(git_dir):
        for name in [*files, *(d for d in dirs if os.path.islink(os.path.join(top, d)))]:
            path = os.path.join(top, name)
            try:
                mode = os.lstat(path).st_mode
                if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                    continue
                what = f"a symlink to {safe_line(os.readlink(path))!r}" if stat.S_ISLNK(mode) else _what(mode)
                os.unlink(path)
                crash_point("doctor.special_removed")
            except FileNotFoundError:
                continue
            except OSError as exc:
                done.append(f"{path} is no file git can read, and could not be removed now ({exc.strerror or exc})")
                continue
            done.append(f"removed {path}: {what} where git reads files (it held no data)")
    return done


def _what(mode: int) -> str:
    return "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"


def _whole(settings: Settings, record: ToolRecord) -> bool:
    return not entry_of(settings, record)[1]


def _disagreements(settings: Settings, record: ToolRecord, runner: ProcessRunner, report: DoctorReport) -> list[str]:
    """How ``record`` disagrees with its store entry and workspace (nothing: it is whole), each with its command."""
    name = record.name
    again = f"{typed(f'rebuild {name}')} builds it again"
    _, why = entry_of(settings, record)
    problems = [f"{name}: {why}; {again}"] if why else []
    if not Path(record.binary).is_file() and not why:
        problems.append(f"{name}: its binary {record.binary} is gone; {again}")
    if not record.workspace:  # pulled from a team's cache (pipeline/team.py): its source is the proof's, not here
        return problems
    workspace = Path(record.workspace)
    fork = f"{typed(f'rebuild {name}')} forks and builds it again"
    if not settings.cache.inside(workspace, settings.cache.workspaces):  # git there would harden (write) it
        problems.append(f"{name}: its workspace {workspace} is not under {settings.cache.workspaces}; {fork}")
        return problems
    if not workspace.is_dir() or workspace.is_symlink():
        problems.append(f"{name}: its workspace {workspace} is gone, so its source history cannot be shown; {fork}")
        return problems
    if not has_commit(workspace, record.commit, runner):  # its objects lost: HEAD's name alone proves nothing
        problems.append(
            f"{name}: its recorded commit {record.commit[:12]} is not in its workspace {workspace} (its git "
            f"objects are damaged or gone); {fork}"
        )
        return problems
    head = Git(workspace, runner)("rev-parse", "HEAD", check=False)
    if head != record.commit:
        report.remarks.append(
            f"{name}: its workspace {workspace} is at {head[:12] or '(no commit)'}, not at the recorded "
            f"{record.commit[:12]} (edited by hand, or a build there did not finish); the tool is its recorded build"
        )
    return problems
