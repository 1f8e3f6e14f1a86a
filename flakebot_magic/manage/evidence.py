"""What the disk proves of each tool: the records a rebuilt tool inventory holds, and what the inventory misses.

Three kinds of evidence, strongest first:

* a workspace's tool card (``.git/flakebot-tool.json``, written by the
  transaction), believed only when its store entry is there, whole, with the
  same hash and binary, and its commit is in the workspace's history;
* a workspace without a usable card: its crate (``.git/flakebot.json``) and
  HEAD, matched with the store entry whose manifest names that commit;
* a store entry alone: its manifest names each tool it was deployed as
  (``tools[NAME]``: commit, workspace, who forked it, the transaction's id).
  A whole entry (its binaries as deployed) is a tool whatever else is lost
  (its workspace, its git objects, its card, the inventory): the tool is
  re-registered from it, and what is missing of its provenance is said
  (:attr:`Evidence.notes`).

When two entries name one tool (it was built again), the one named last
wins: a naming carries its transaction's id, which starts with the time
(``txn_time``); a manifest from before that, its file's mtime.

:func:`unaccounted` is the one judgement of what the store names that the
inventory does not account for: a tool an intact-looking manifest names with
no record (the inventory lost it), or named by a newer transaction than its
record's (the inventory is older than the store: restored from a copy). The
doctor's health check (:func:`~flakebot_magic.manage.doctor.health`) repairs
it, and ``clean`` keeps every entry it names.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..clients.base import ToolContract
from ..clients.kinds import is_server
from ..commands import typed
from ..config import Settings
from ..errors import StorageError
from ..host.git import Git
from ..host.names import is_tool_name
from ..host.process import ProcessRunner
from ..host.storage import read_cache_json
from ..records.inventory import ToolRecord
from ..stages.deploy import entry_damage
from ..stages.workspace import Workspace
from .transaction import read_card

__all__ = [
    "Evidence",
    "Naming",
    "entry_of",
    "has_commit",
    "namings",
    "reconstruct",
    "store_entries",
    "txn_time",
    "unaccounted",
]

#: what the damaged inventory may still tell of a build the rebuilt record describes
_KEPT_FROM_OLD = ("created", "log_path", "request", "requested_by", "description", "extra")


def store_entries(settings: Settings) -> list[str]:
    """The names of the store's complete entries (those with a manifest)."""
    store = settings.cache.store
    try:
        return sorted(e.name for e in store.iterdir() if not e.name.startswith(".") and (e / "manifest.json").is_file())
    except OSError:
        return []


def txn_time(txn: object) -> int:
    """When the transaction ``txn`` (``<time_ns hex>-<random>``) started, in ns; 0 when it is no such id."""
    head = str(txn or "").partition("-")[0]
    try:
        return int(head, 16) if head else 0
    except ValueError:
        return 0


@dataclass(frozen=True)
class Naming:
    """One store entry's manifest naming one tool (``tools[name]``)."""

    entry: Path
    name: str
    data: Mapping[str, Any]
    #: when it was named: its transaction's time, else the manifest file's mtime (ns)
    stamp: int

    @property
    def txn(self) -> str:
        return str(self.data.get("txn") or "")

    @property
    def key(self) -> str:
        """What the inventory remembers as accounted for (:meth:`Inventory.replace_all`'s ``namings``)."""
        return f"{self.entry.name}/{self.name}/{self.txn}"


def _manifest(entry: Path) -> dict[str, Any] | None:
    try:
        return read_cache_json(entry / "manifest.json")
    except (OSError, StorageError):
        return None


def namings(settings: Settings, entries: Collection[str] | None = None) -> dict[str, list[Naming]]:
    """Every tool the store's manifests name, by tool name, newest naming first (manifests parsed, nothing hashed)."""
    found: dict[str, list[Naming]] = {}
    for entry_name in store_entries(settings) if entries is None else entries:
        entry = settings.cache.store / entry_name
        manifest = _manifest(entry)
        tools = manifest.get("tools") if manifest is not None else None
        if not isinstance(tools, dict):
            continue
        try:
            mtime = (entry / "manifest.json").stat().st_mtime_ns
        except OSError:
            continue
        for name, data in tools.items():
            if is_tool_name(name) and isinstance(data, dict):  # a name no build writes is no tool of this cache
                found.setdefault(name, []).append(Naming(entry, name, data, txn_time(data.get("txn")) or mtime))
    for each in found.values():
        each.sort(key=lambda naming: naming.stamp, reverse=True)
    return found


def unaccounted(
    records: Mapping[str, ToolRecord], named: Mapping[str, list[Naming]], reconciled: Collection[str]
) -> dict[str, str]:
    """The store entries naming a tool the inventory does not account for, each with why (see the module).

    A naming is accounted for by a record of its tool that names its entry, or that a later transaction made
    (the tool was built again since: the entry is an old build). One transaction names one entry, so a record
    of the same transaction naming another entry (gone, or another tool's) is damaged (unless that entry names
    it so too: then this one is a copy), and so is a record older than the naming (the inventory is older than
    the store: restored from a copy). A naming from before
    namings carried their transaction is accounted for by any record of its tool whose entry is there.

    ``reconciled``: the namings the last rebuild of the inventory considered (:attr:`Naming.key`): what it could
    not make a tool of is not asked about again.
    """
    found: dict[str, str] = {}
    for name, each in named.items():
        record = records.get(name)
        for naming in each:
            if naming.key in reconciled:
                continue
            entry = naming.entry
            why = _unaccounted(record, naming, each)
            if why:
                found.setdefault(entry.name, f"the store entry {entry} {why}")
    return found


def _unaccounted(record: ToolRecord | None, naming: Naming, each: list[Naming]) -> str:
    """Why the inventory's ``record`` does not account for ``naming`` ("" when it does); ``each``: every naming of
    its tool."""
    name = naming.name
    if record is None:
        return f"names the tool {name!r}, which it has no record of"
    own = Path(record.store_path)
    if own.name == naming.entry.name:
        return ""
    if not naming.txn:
        return "" if own.is_dir() else f"holds a build of {name!r}, whose record names a store entry that is gone"
    made, named = txn_time(record.extra.get("txn")), txn_time(naming.txn)
    if made > named:
        return ""  # built again since: an old build
    if made == named:  # one transaction, two entries: the one the record names, when it says so, and a copy
        if any(other.entry.name == own.name and other.txn == naming.txn for other in each) and own.is_dir():
            return ""
        return f"holds the build of {name!r} its record names elsewhere ({own})"
    return f"holds a newer build of {name!r} than its record (restored from a copy?)"


def has_commit(workspace: Path, commit: str, runner: ProcessRunner) -> bool:
    """Whether ``commit`` is a commit in ``workspace``'s history."""
    return bool(commit) and bool(
        Git(workspace, runner)("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
    )


def entry_of(settings: Settings, record: ToolRecord) -> tuple[dict[str, Any] | None, str]:
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
    damage = entry_damage(store, modes=False)  # its modes are the tool's check (doctor gives them back)
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


@dataclass
class Evidence:
    """What :func:`reconstruct` found."""

    records: list[ToolRecord] = field(default_factory=list)
    #: workspaces that gave no record, and why (none of them named by a whole store entry either)
    skipped: list[str] = field(default_factory=list)
    #: tools re-registered from their store entry alone, each with what is missing of its provenance
    notes: list[str] = field(default_factory=list)
    #: every naming considered (:attr:`Naming.key`), for the inventory to remember
    considered: list[str] = field(default_factory=list)


def reconstruct(settings: Settings, old: dict[str, dict[str, Any]]) -> Evidence:
    """The records the workspaces and the store entries prove, and the readable ``old`` records they do not replace.

    ``old`` holds what could still be read of the damaged inventory (records by name, as JSON). A record the disk
    does not prove is kept as it was (the doctor says what disagrees): a rebuild never drops a tool.
    """
    found = Evidence()
    runner = ProcessRunner()
    proven: dict[str, ToolRecord] = {}
    why_not: dict[str, tuple[Path | None, str]] = {}
    workspaces = settings.cache.workspaces
    for workspace in sorted(workspaces.iterdir()) if workspaces.is_dir() else ():
        if workspace.name.startswith(".") or workspace.is_symlink() or not workspace.is_dir():
            continue
        try:
            record, why = _from_card(settings, workspace, runner)
            if record is None:
                record, why = _from_head(settings, workspace, runner, why)
        except (OSError, StorageError) as exc:  # one damaged workspace stops no other
            record, why = None, f"it cannot be read ({exc})"
        if record is None:
            why_not[workspace.name] = (workspace, why)
        else:
            proven[record.name] = record
    named = namings(settings)
    whole: dict[Path, bool] = {}
    for name, each in sorted(named.items()):
        found.considered += [naming.key for naming in each]
        if name in proven:
            continue
        record = _from_store(settings, each, old.get(name), whole)
        if record is None:
            continue
        proven[name] = record
        place = Path(record.workspace) if record.workspace else None
        missing = why_not.pop(name, (place, ""))[1] or (
            f"its workspace {place} is gone" if place is not None and not place.is_dir() else ""
        )
        if place is not None and missing:
            found.notes.append(
                f"{name}: re-registered from its store entry {record.store_path} alone ({missing}): its source "
                f"history cannot be shown; {typed(f'rebuild {name}')} forks and builds it again"
            )
    found.skipped = [f"{place}: {why}" for place, why in (why_not[name] for name in sorted(why_not))]
    for name in sorted({*proven, *old}):
        record = proven.get(name)
        before = old.get(name)
        if record is None:
            kept = _readable(before)
            if kept is not None:
                found.records.append(kept)
            continue
        if (
            before is not None
            and before.get("commit") == record.commit
            and Path(str(before.get("store_path"))).name == Path(record.store_path).name
        ):
            merged = {**record.to_json(), **{k: before[k] for k in _KEPT_FROM_OLD if k in before}}
            record = ToolRecord.from_json(merged)
        # a process the old record named is no business of the new one: it is started again when called
        record.status, record.pid, record.url, record.token = (
            ("stopped" if is_server(record.kind) else "ready"),
            None,
            "",
            "",
        )
        log = settings.cache.logs / f"{record.name}.log"
        if not record.log_path and log.is_file():
            record.log_path = str(log)
        found.records.append(record)
    return found


def _readable(data: dict[str, Any] | None) -> ToolRecord | None:
    """A readable old record, as it was (its process forgotten)."""
    if data is None:
        return None
    try:
        record = ToolRecord.from_json(dict(data))
    except (TypeError, ValueError):
        return None
    if record.status not in ("ready", "stopped") or record.pid:
        record.status, record.pid, record.url, record.token = (
            ("stopped" if is_server(record.kind) else "ready"),
            None,
            "",
            "",
        )
    return record


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
    _, why = entry_of(settings, record)
    if why:
        return None, why
    if not has_commit(workspace, record.commit, runner):
        return None, f"its commit {record.commit[:12]} is not in its history"
    return record, ""


def _from_head(settings: Settings, workspace: Path, runner: ProcessRunner, why: str) -> tuple[ToolRecord | None, str]:
    """A record for a workspace without a (usable) tool card: the store entry whose manifest names its HEAD."""
    state = Workspace.load(workspace)
    if state is None:
        return None, f"{why}, and no readable .git/flakebot.json (not a whole fork)"
    head = Git(workspace, runner)("rev-parse", "HEAD", check=False)
    name = workspace.name
    for entry_name in store_entries(settings):
        entry = settings.cache.store / entry_name
        manifest = _manifest(entry)
        if manifest is None or entry_damage(entry, modes=False):
            continue
        tools = manifest.get("tools")
        own = tools.get(name) if isinstance(tools, dict) else None
        own = own if isinstance(own, dict) else None
        if own is not None:
            if own.get("commit") != head:
                continue
        elif not (manifest.get("commit") == head and manifest.get("crate") == state.crate.name):
            continue
        record = _record_from(entry, manifest, name, str(workspace), head, own or {})
        if record is not None:
            return record, ""
    return None, f"{why}, and no store entry was built from its HEAD {head[:12] or '(none)'}"


def _from_store(
    settings: Settings, each: list[Naming], before: dict[str, Any] | None, whole: dict[Path, bool]
) -> ToolRecord | None:
    """The tool a whole store entry names (the old record's entry first, then the newest naming)."""
    if before is not None:
        entry = Path(str(before.get("store_path") or "")).name
        each = sorted(each, key=lambda naming: naming.entry.name != entry)
    for naming in each:
        if naming.entry not in whole:
            whole[naming.entry] = not entry_damage(naming.entry, modes=False)
        manifest = _manifest(naming.entry) if whole[naming.entry] else None
        if manifest is None:
            continue
        data = naming.data
        # a tool's workspace is always workspaces/NAME of the cache it is in (a pulled tool has none)
        workspace = str(settings.cache.workspaces / naming.name) if data.get("workspace") else ""
        record = _record_from(naming.entry, manifest, naming.name, workspace, str(data.get("commit") or ""), data)
        if record is not None:
            return record
    return None


def _record_from(
    entry: Path, manifest: dict[str, Any], name: str, workspace: str, commit: str, own: Mapping[str, Any]
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
    if not workspace and manifest.get("nix_store_path"):  # pulled: reached through the entry's bin (pipeline/team.py)
        deployed = entry
    extra: dict[str, Any] = {"rebuilt_by_doctor": time.time()}
    if own.get("txn"):
        extra["txn"] = str(own["txn"])
    if not workspace:
        extra.update({k: manifest[k] for k in ("nix_store_path", "substituted_from", "signed_by") if manifest.get(k)})
    try:
        created = entry.stat().st_mtime
    except OSError:
        created = 0.0
    return ToolRecord.of_entry(
        name,
        entry,
        manifest,
        binary=str(deployed / "bin" / main),
        workspace=workspace,
        commit=commit,
        kind=ToolContract.from_json(contract).kind,
        created=created,
        extra=extra,
        forked_by=str(own.get("forked_by") or name),
    )
