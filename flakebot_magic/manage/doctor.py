"""``flakebot doctor``: the cache checked, and the tool inventory rebuilt from what is on disk when it cannot be trusted.

Every command starts with :func:`prepare`: transactions a dead process left
are finished or undone (:func:`~flakebot_magic.manage.transaction.recover`), then
the inventory is checked (:meth:`~flakebot_magic.records.inventory.Inventory.check`:
readable, ``PRAGMA quick_check``, every record parses, not empty while the
store holds entries it never saw). One that cannot be trusted is rebuilt
at once, by :func:`doctor`, which ``flakebot doctor`` / ``%flakebot doctor``
also run by hand:

* each tool's record comes from its workspace: the tool card the
  transaction wrote (``workspaces/NAME/.git/flakebot-tool.json``), believed
  only when its store entry is there with the same hash and binary and its
  commit is in the workspace's history; a workspace from before tool cards
  gives its crate (``.git/flakebot.json``) and HEAD, matched with the store
  entry whose manifest names that commit;
* what the damaged inventory still says of the same build (its log, its
  request, who asked for it) is kept;
* the new inventory is written beside, the damaged file (and its ``-wal``)
  moved to ``tools.sqlite3.damaged-<time>`` (named in the report), then the
  new one put in its place.

The doctor also says which records disagree with the disk (a store entry or
a workspace removed by hand) and removes git lock files a killed git left in
the tools' workspaces. It never deletes a tool.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..commands import typed
from ..config import Settings
from ..errors import StorageError
from ..host.git import Git, remove_stale_locks
from ..host.locks import held_locks
from ..host.process import ProcessRunner
from ..host.storage import read_cache_json, storage_errors
from ..records.inventory import Health, Inventory, ToolRecord
from ..records.units import UnitStore
from ..stages.deploy import entry_damage, set_aside
from ..stages.workspace import Workspace
from .transaction import read_card, recover

__all__ = ["DoctorReport", "doctor", "prepare", "reconstruct", "store_entries"]

#: what the damaged inventory may still tell of a build the rebuilt record describes
_KEPT_FROM_OLD = ("created", "log_path", "request", "requested_by", "description", "extra")


def store_entries(settings: Settings) -> list[str]:
    """The names of the store's complete entries (those with a manifest)."""
    store = settings.cache.store
    if not store.is_dir():
        return []
    return sorted(e.name for e in store.iterdir() if not e.name.startswith(".") and (e / "manifest.json").is_file())


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
    #: records that disagree with the disk (not changed: the doctor never deletes a tool)
    problems: list[str] = field(default_factory=list)
    #: git lock files a killed git had left in the tools' workspaces, removed
    unlocked: list[Path] = field(default_factory=list)
    #: damaged store entries and cache directories moved aside (kept), in words
    set_aside: list[str] = field(default_factory=list)

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

    def summary(self) -> list[str]:
        lines = list(self.recovered)
        lines.append(self.repair_line() or "The tool inventory is sound (quick_check ok, every record parses).")
        lines += [f"not rebuilt: {why}" for why in self.skipped]
        lines += [f"removed {lock} (a killed git's lock)" for lock in self.unlocked]
        lines += self.set_aside
        lines += [f"problem: {p}" for p in self.problems] or ["Every record agrees with its store entry and workspace."]
        return lines

    @property
    def data(self) -> dict[str, Any]:
        return {
            "ok": self.health.ok,
            "reason": self.health.reason,
            "problem": self.health.problem,
            "recovered": list(self.recovered),
            "aside": str(self.aside) if self.aside else None,
            "rebuilt": list(self.rebuilt),
            "skipped": list(self.skipped),
            "problems": list(self.problems),
            "unlocked": [str(p) for p in self.unlocked],
            "set_aside": list(self.set_aside),
        }

    @property
    def text(self) -> str:
        return "\n".join(self.summary())

    @property
    def notes(self) -> list[str]:
        return []


def prepare(settings: Settings, *, repair: bool = True) -> list[str]:
    """What every command does first; returns what it did, in words (most often nothing).

    Unfinished transactions of dead processes are finished or undone; with
    ``repair``, an inventory that cannot be trusted is rebuilt (:func:`doctor`).
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
    health = Inventory(settings.cache.tools).check(store_entries(settings))
    if health.ok or (health.reason in ("empty", "missing") and held_locks(settings.cache_dir)):
        return notes
    try:
        report = doctor(settings, health=health)
    except StorageError as exc:
        return [*notes, f"the tool inventory cannot be trusted ({health.problem}) and could not be repaired now: {exc}"]
    return [*notes, *report.recovered, report.repair_line()]


def _layout(settings: Settings) -> list[str]:
    """The cache's directories that are no directories (a file, a dangling symlink) set aside and made again."""
    try:
        with storage_errors("setting aside what stands in place of a cache directory", settings.cache_dir):
            return settings.cache.set_aside_non_directories()
    except StorageError as exc:
        return [f"a cache directory is not a directory and could not be set aside now: {exc}"]


def doctor(settings: Settings, *, health: Health | None = None) -> DoctorReport:
    """Check the inventory and the tools on disk; rebuild the inventory when it cannot be trusted.

    ``health``: what a check just found (else the doctor checks). Raises
    :class:`~flakebot_magic.errors.StorageError` when the rebuilt inventory
    cannot be written (a full disk); the damaged one is then left in place.
    """
    report = DoctorReport(set_aside=_layout(settings))
    report.recovered = recover(settings)
    entries = store_entries(settings)
    inventory = Inventory(settings.cache.tools)
    report.health = health if health is not None else inventory.check(entries)
    if not report.health.ok:
        records, report.skipped = reconstruct(settings, inventory.readable_records())
        report.aside = inventory.replace_all(records, entries)
        report.rebuilt = [r.name for r in records]
    report.set_aside += _set_aside_damaged(settings)
    runner = ProcessRunner()
    busy = held_locks(settings.cache_dir)
    # each sealed dependency unit against its objects (hashed); objects of no record swept unless a build runs
    report.set_aside += UnitStore(settings.cache.units).check(sweep=not busy)
    for record in inventory.all():
        report.problems += _disagreements(settings, record, runner)
        workspace = Path(record.workspace)
        inside = record.workspace and settings.cache.inside(workspace, settings.cache.workspaces)
        if inside and record.name not in busy and workspace.is_dir():
            report.unlocked += remove_stale_locks(workspace)
    return report


def _set_aside_damaged(settings: Settings) -> list[str]:
    """Each store entry whose manifest or binaries are damaged, moved aside (kept): its next build makes it again."""
    moved = []
    for name in store_entries(settings):
        entry = settings.cache.store / name
        why = entry_damage(entry)
        if why and settings.cache.inside(entry, settings.cache.store, follow=False):
            aside = set_aside(entry)
            if aside is not None:
                moved.append(f"set aside {entry}: {why}; it is at {aside} now (kept), its next build makes it again")
    return moved


def reconstruct(settings: Settings, old: dict[str, dict[str, Any]]) -> tuple[list[ToolRecord], list[str]]:
    """The records the workspaces and the store entries prove; and why each other workspace gives none.

    ``old`` holds what could still be read of the damaged inventory (records by name, as JSON).
    """
    records: list[ToolRecord] = []
    skipped: list[str] = []
    workspaces = settings.cache.workspaces
    if not workspaces.is_dir():
        return records, skipped
    runner = ProcessRunner()
    for workspace in sorted(workspaces.iterdir()):
        if workspace.name.startswith(".") or workspace.is_symlink() or not workspace.is_dir():
            continue
        record, why = _from_card(settings, workspace, runner)
        if record is None:
            record, why = _from_manifest(settings, workspace, runner, why)
        if record is None:
            skipped.append(f"{workspace}: {why}")
            continue
        before = old.get(record.name)
        if (
            before is not None
            and before.get("commit") == record.commit
            and before.get("store_path") == record.store_path
        ):
            merged = {**record.to_json(), **{k: before[k] for k in _KEPT_FROM_OLD if k in before}}
            record = ToolRecord.from_json(merged)
        # a process the old record named is no business of the new one: it is started again when called
        record.status, record.pid, record.url, record.token = (
            ("ready" if record.kind == "cli" else "stopped"),
            None,
            "",
            "",
        )
        log = settings.cache.logs / f"{record.name}.log"
        if not record.log_path and log.is_file():
            record.log_path = str(log)
        records.append(record)
    return records, skipped


def _manifest(entry: Path) -> dict[str, Any] | None:
    try:
        return read_cache_json(entry / "manifest.json")
    except (OSError, StorageError):
        return None


def _has_commit(workspace: Path, commit: str, runner: ProcessRunner) -> bool:
    return bool(commit) and bool(
        Git(workspace, runner)("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
    )


def _entry_of(settings: Settings, record: ToolRecord) -> tuple[dict[str, Any] | None, str]:
    """The manifest of ``record``'s store entry, or None and why it is not the record's."""
    store = Path(record.store_path)
    try:
        inside = store.resolve().parent == settings.cache.store.resolve()
    except OSError:
        inside = False
    if not inside:
        return None, f"its store entry {store} is not in {settings.cache.store}"
    if not store.is_dir():
        return None, f"its store entry {store} is gone"
    damage = entry_damage(store)
    if damage:
        return None, f"its store entry {store} is damaged: {damage}"
    manifest = _manifest(store)
    if manifest is None:
        return None, f"its store entry {store} is gone"
    if manifest.get("hash") != record.source_hash:
        return None, f"its store entry {store} holds another build (hash {manifest.get('hash')})"
    deployed = {store, Path(str(manifest.get("nix_store_path") or store))}
    binary = Path(record.binary)
    if binary.parent.name != "bin" or binary.parent.parent not in deployed:
        return None, f"its binary {binary} is not in its store entry"
    if binary.name not in (manifest.get("binaries") or []):
        return None, f"its store entry built no binary {binary.name!r}"
    return manifest, ""


def _from_card(settings: Settings, workspace: Path, runner: ProcessRunner) -> tuple[ToolRecord | None, str]:
    card = read_card(workspace)
    if card is None:
        return None, "no tool card"
    try:
        record = ToolRecord.from_json(dict(card["record"])).rebased(settings.cache.root)
    except (TypeError, ValueError) as exc:
        return None, f"its tool card does not parse ({exc})"
    if record.name != workspace.name or Path(record.workspace) != workspace:
        return None, f"its tool card names another tool ({record.name!r} at {record.workspace})"
    _, why = _entry_of(settings, record)
    if why:
        return None, why
    if not _has_commit(workspace, record.commit, runner):
        return None, f"its commit {record.commit[:12]} is not in its history"
    return record, ""


def _from_manifest(
    settings: Settings, workspace: Path, runner: ProcessRunner, why: str
) -> tuple[ToolRecord | None, str]:
    """A record for a workspace without a (usable) tool card: the store entry whose manifest names its HEAD."""
    state = Workspace.load(workspace)
    if state is None:
        return None, f"{why}, and no readable .git/flakebot.json (not a whole fork)"
    head = Git(workspace, runner)("rev-parse", "HEAD", check=False)
    name = workspace.name
    for entry_name in store_entries(settings):
        entry = settings.cache.store / entry_name
        manifest = _manifest(entry)
        if manifest is None:
            continue
        tools = manifest.get("tools")
        own = tools.get(name) if isinstance(tools, dict) else None
        own = own if isinstance(own, dict) else None
        if own is not None:
            if own.get("commit") != head:
                continue
        elif not (manifest.get("commit") == head and manifest.get("crate") == state.crate.name):
            continue
        record = _record_from(entry, manifest, name, workspace, head, str((own or {}).get("forked_by") or name))
        if record is not None:
            return record, ""
    return None, f"{why}, and no store entry was built from its HEAD {head[:12] or '(none)'}"


def _record_from(
    entry: Path, manifest: dict[str, Any], name: str, workspace: Path, commit: str, forked_by: str
) -> ToolRecord | None:
    binaries = [str(b) for b in manifest.get("binaries") or []]
    if not binaries:
        return None
    contract = manifest.get("contract")
    contract = contract if isinstance(contract, dict) else {}
    crate = str(manifest.get("crate", ""))
    main = str(contract.get("bin") or "")
    if main not in binaries:
        main = crate if crate in binaries else sorted(binaries)[0]
    deployed = Path(str(manifest.get("nix_store_path") or entry))
    return ToolRecord.of_entry(
        name,
        entry,
        manifest,
        binary=str(deployed / "bin" / main),
        workspace=str(workspace),
        commit=commit,
        kind=str(contract.get("kind") or "cli"),
        created=entry.stat().st_mtime,
        extra={"rebuilt_by_doctor": time.time()},
        forked_by=forked_by,
    )


def _disagreements(settings: Settings, record: ToolRecord, runner: ProcessRunner) -> list[str]:
    """How ``record`` disagrees with its store entry and workspace (nothing: it is whole)."""
    name = record.name
    _, why = _entry_of(settings, record)
    problems = [f"{name}: {why}; {typed(f'rebuild {name}')} builds it again"] if why else []
    if not Path(record.binary).is_file() and not why:
        problems.append(f"{name}: its binary {record.binary} is gone; {typed(f'rebuild {name}')} builds it again")
    if not record.workspace:  # pulled from a team's cache (manage/team.py): its source is the proof's, not here
        return problems
    workspace = Path(record.workspace)
    if not settings.cache.inside(workspace, settings.cache.workspaces):  # git there would harden (write) it
        problems.append(f"{name}: its workspace {workspace} is not under {settings.cache.workspaces}; not looked at")
        return problems
    if not workspace.is_dir():
        problems.append(f"{name}: its workspace {workspace} is gone, so its source history cannot be shown")
        return problems
    if not _has_commit(workspace, record.commit, runner):  # its objects lost: HEAD's name alone proves nothing
        problems.append(
            f"{name}: its recorded commit {record.commit[:12]} is not in its workspace {workspace} (its git "
            f"objects are damaged or gone); {typed(f'rebuild {name}')} forks and builds it again"
        )
        return problems
    head = Git(workspace, runner)("rev-parse", "HEAD", check=False)
    if head != record.commit:
        problems.append(
            f"{name}: its workspace {workspace} is at {head[:12] or '(no commit)'}, not at the recorded "
            f"{record.commit[:12]} (edited by hand, or a build there did not finish)"
        )
    return problems
