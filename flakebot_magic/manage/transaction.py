"""A build becomes the tool in one recoverable transaction: its workspace, its tool card and its record together.

The store entry is written first (:mod:`flakebot_magic.stages.deploy`: content
addressed and swapped in one step, it is whole whichever tool uses it). Then::

    intent   <cache>/intents/NAME.json: the new record, where the new workspace is, written and fsync-ed
    card     the record as JSON in the new workspace's .git/flakebot-tool.json (its "tool card")
    swap     the new workspace takes workspaces/NAME (renameat2 RENAME_EXCHANGE); the replaced one is
             where the new one was
    record   the inventory's record of NAME is saved                 <- the commit point
    named    the store entry's manifest names NAME (its commit, workspace, who forked it)
    aside    the replaced workspace moves to .old/ (a --continue copy's stays to go with the attempt)
    recipe   the recipe names the store entry
    attempt  what is left of the attempt under .next/ is removed
    done     the intent is removed

Every command starts with :func:`recover`: an intent whose tool lock nobody
holds belongs to a process that died. When its store entry and new
workspace are whole, the steps are done again from the first one not yet
done (each is idempotent: the card's transaction id says which workspace
is the new one), so the build that finished becomes the tool; otherwise
(something was removed by hand) the swap is undone and the tool stays the
one before. Either way record, workspace HEAD and store entry agree: the
next command sees the old tool or the new one, whole. Each step is followed
by a :func:`~flakebot_magic.host.crashpoints.crash_point` (``txn.*``) where a
test kills the process.

The tool card also lets ``flakebot doctor`` rebuild a record from the
workspace alone (:mod:`flakebot_magic.manage.doctor`).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..commands import typed
from ..config import Settings
from ..errors import DeployError, StorageError, ToolBusy
from ..host.cache import make_private
from ..host.crashpoints import crash_point
from ..host.fsutil import atomic_write, fsync_dir
from ..host.locks import tool_lock
from ..host.names import is_tool_name
from ..host.storage import read_cache_json, storage_errors
from ..host.trees import remove_tree
from ..records.inventory import Inventory, ToolRecord
from ..stages.deploy import StorePath, add_tool, swap_in
from ..stages.workspace import NEXT_DIR, OLD_DIR, aside_path

__all__ = [
    "CARD_FILE",
    "Intent",
    "confinement",
    "install",
    "pending",
    "read_card",
    "recover",
    "tool_entry",
    "write_card",
]

#: the tool card, in a tool's workspace: ``.git/`` is read-only to the code that runs in the workspace
CARD_FILE = "flakebot-tool.json"
INTENT_FORMAT = 1


@dataclass
class Intent:
    """What a transaction is about to do, written (and fsync-ed) before it does anything."""

    id: str
    name: str
    #: the new record, whole (``extra["txn"]`` is :attr:`id`)
    record: dict[str, Any]
    #: ``workspaces/NAME``
    final: str
    #: the new workspace when it was built beside the tool's (``.next/NAME-<pid>-<ns>/NAME``); "" when in place
    next: str = ""
    #: where the replaced workspace goes (``.old/NAME-<time>``); "": it goes with the attempt (its history is
    #: in the new one)
    aside: str = ""
    recipe: str = ""
    recipe_data: dict[str, Any] = field(default_factory=dict)
    pid: int = 0
    created: float = 0.0
    format: int = INTENT_FORMAT

    def rebased(self, root: Path) -> Intent:
        """This intent with its paths in the cache dir ``root``: the cache dir was moved (or copied) while a
        transaction was pending, and its intent names the old place. The old place is ``final``'s
        (``<old>/workspaces/NAME``); every path under it moves under ``root``, the record's as
        :meth:`~flakebot_magic.records.inventory.ToolRecord.rebased` moves them."""
        final = Path(self.final)
        old = final.parent.parent
        if not final.is_absolute() or final.parent.name != "workspaces" or old == root:
            return self

        def moved(value: Any) -> Any:
            if isinstance(value, str) and Path(value).is_absolute():
                try:
                    return str(root / Path(value).relative_to(old))
                except ValueError:
                    return value
            if isinstance(value, dict):
                return {key: moved(item) for key, item in value.items()}
            if isinstance(value, list):
                return [moved(item) for item in value]
            return value

        try:
            record = ToolRecord.from_json(dict(self.record)).rebased(root).to_json()
        except TypeError:  # a record missing a field: its paths are moved as the intent's
            record = moved(self.record)
        return replace(
            self,
            record=record,
            final=moved(self.final),
            next=moved(self.next),
            aside=moved(self.aside),
            recipe=moved(self.recipe),
            recipe_data=moved(self.recipe_data),
        )

    @classmethod
    def parse(cls, path: Path) -> Intent:
        """The intent in ``path``; raises :class:`~flakebot_magic.errors.StorageError` when it cannot be read or
        is damaged (not of this format, a field missing, unknown or of the wrong type)."""
        data = read_cache_json(path)
        if data.get("format") != INTENT_FORMAT:
            raise StorageError(f"the intent {path} is of another format ({data.get('format')!r})", path=path)
        wrong = _wrong_type(cls, data) or _wrong_type(ToolRecord, data.get("record") or {}, "record's ")
        if wrong:
            raise StorageError(f"the intent {path} is damaged: {wrong}", path=path)
        try:
            return cls(**data)
        except TypeError as exc:  # a field missing
            raise StorageError(f"the intent {path} is damaged: {exc}", path=path) from exc

    @classmethod
    def load(cls, path: Path) -> Intent | None:
        """The intent in ``path``, or None when it cannot be read or is damaged (:meth:`parse` says why)."""
        try:
            return cls.parse(path)
        except (OSError, StorageError):
            return None


def confinement(settings: Settings, intent: Intent) -> str:
    """Why ``intent`` names a path outside its place ("": every path is where such a path belongs).

    The one decision of which paths an intent may act on, symlinks resolved (:meth:`CacheLayout.inside`): the
    tool's workspace ``workspaces/NAME``, the new one under ``workspaces/.next/ATTEMPT/``, the replaced one's
    place under ``workspaces/.old/``, the recipe under ``recipes/``, the store entry under ``store/``.
    """
    cache = settings.cache
    workspaces = cache.workspaces
    try:
        record = ToolRecord.from_json(dict(intent.record))
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return f"its record is damaged ({exc})"
    final = Path(intent.final)
    if final != workspaces / intent.name or not cache.inside(final, workspaces, follow=False):
        return f"its workspace {intent.final!r} is not {workspaces / intent.name}"
    if record.name != intent.name or Path(record.workspace) != final:
        return f"its record is of {record.name!r} at {record.workspace!r}"
    if not cache.inside(record.store_path, cache.store):
        return f"its store entry {record.store_path!r} is not under {cache.store}"
    nexts = workspaces / NEXT_DIR
    if intent.next and not (cache.inside(intent.next, nexts) and cache.inside(Path(intent.next).parent, nexts)):
        return f"its new workspace {intent.next!r} is not in an attempt under {nexts}"
    if intent.aside and not cache.inside(intent.aside, workspaces / OLD_DIR):
        return f"its place for the replaced workspace {intent.aside!r} is not under {workspaces / OLD_DIR}"
    if intent.recipe and not cache.inside(intent.recipe, cache.recipes):
        return f"its recipe {intent.recipe!r} is not under {cache.recipes}"
    return ""


def _confined(settings: Settings, intent: Intent) -> None:
    """Raise :class:`~flakebot_magic.errors.StorageError` when ``intent`` names a path outside its place."""
    why = confinement(settings, intent)
    if why:
        where = _intent_path(settings, intent.name)
        raise StorageError(f"the intent {where} is damaged: {why}; nothing was done", path=where)


#: what a field declared of each type may hold, as JSON gives it
_KINDS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "int | None": (int, type(None)),
    "dict[str, Any]": (dict,),
}


def _wrong_type(cls: type, data: dict[str, Any], whose: str = "") -> str:
    """Which key of ``data`` (JSON for the dataclass ``cls``) is unknown or of a type ``cls`` does not declare,
    in words; "" when none (keys missing are the constructor's to say)."""
    declared = {f.name: str(f.type) for f in fields(cls)}
    for key, value in data.items():
        if cls is ToolRecord and key not in declared:
            continue  # a record keeps keys it does not know (in extra)
        kinds = _KINDS.get(declared.get(key, ""))
        if kinds is None or isinstance(value, bool) or not isinstance(value, kinds):
            return f"its {whose}{key!r} is {type(value).__name__}" if kinds else f"it has an unknown {whose}{key!r}"
    return ""


def _intent_path(settings: Settings, name: str) -> Path:
    return settings.cache.intents / f"{name}.json"


def read_card(workspace: Path) -> dict[str, Any] | None:
    """The tool card of ``workspace`` (``{"txn", "record"}``), or None."""
    try:
        data = read_cache_json(workspace / ".git" / CARD_FILE)
    except (OSError, StorageError):
        return None
    return data if isinstance(data.get("record"), dict) else None


def _card_txn(workspace: Path) -> str:
    card = read_card(workspace)
    return str(card.get("txn", "")) if card else ""


def write_card(workspace: Path, record: dict[str, Any], txn: str) -> None:
    """Write the tool card into ``workspace/.git`` (atomically; a planted symlink is replaced, never followed)."""
    public = {k: v for k, v in record.items() if k != "token"}
    atomic_write(workspace / ".git" / CARD_FILE, json.dumps({"txn": txn, "record": public}, indent=2), root=workspace)


def tool_entry(record: ToolRecord) -> dict[str, str]:
    """What a store entry's manifest keeps of one tool (``tools[NAME]``): with its transaction's id, which says
    which of two entries naming one tool named it last (:mod:`flakebot_magic.manage.evidence`)."""
    entry = {"commit": record.commit, "workspace": record.workspace, "forked_by": record.forked_by or record.name}
    txn = record.extra.get("txn")
    return {**entry, "txn": txn} if isinstance(txn, str) and txn else entry


def install(
    settings: Settings,
    record: ToolRecord,
    workspace: Path,
    *,
    replaces: Path | None = None,
    keep_replaced: bool = True,
    recipe: tuple[Path, dict[str, Any]] | None = None,
    notice: Callable[[str], None] = lambda message: None,
) -> ToolRecord:
    """Make ``record`` the tool, with ``workspace`` as its workspace, in one recoverable transaction.

    ``workspace`` is where the new workspace is now: the record's own
    workspace (a build in place), or one built beside it that ``replaces``
    the record's (moved to ``.old/`` when ``keep_replaced``, else removed: a
    ``--continue`` copy's history is all in the new one). ``recipe`` is
    written once the record is. The caller holds the tool's lock. On an
    error before the record is saved, everything is put back as it was and
    the error raised; after it, what is left is finished at the next
    command's :func:`recover`.
    """
    name = record.name
    txn = f"{time.time_ns():x}-{secrets.token_hex(4)}"
    record.extra = {**record.extra, "txn": txn}
    final = Path(record.workspace)
    beside = replaces is not None and workspace != final
    aside = ""
    if beside and keep_replaced and (final.exists() or final.is_symlink()):
        aside = str(aside_path(final.parent, name))
    intent = Intent(
        id=txn,
        name=name,
        record=record.to_json(),
        final=str(final),
        next=str(workspace) if beside else "",
        aside=aside,
        recipe=str(recipe[0]) if recipe else "",
        recipe_data=dict(recipe[1]) if recipe else {},
        pid=os.getpid(),
        created=time.time(),
    )
    _confined(settings, intent)  # the record's paths may come from the cache's files (a rebuild's record)
    where = _intent_path(settings, name)
    with storage_errors(f"starting to install {name!r}", where):
        atomic_write(where, json.dumps(asdict(intent), indent=2), make_parents=True)
    crash_point("txn.intent")
    progress: set[str] = set()
    try:
        _forward(settings, intent, progress, notice)
    except BaseException:
        if "record" not in progress:
            _back(intent)
            where.unlink(missing_ok=True)
        raise
    return record


def _forward(settings: Settings, intent: Intent, progress: set[str], notice: Callable[[str], None]) -> None:
    """Do every step of ``intent`` not done yet, in order (each one idempotent); ``progress`` names those done."""
    _confined(settings, intent)
    final = Path(intent.final)
    beside = Path(intent.next) if intent.next else None
    new = final if beside is None or _card_txn(final) == intent.id else beside
    if not new.is_dir():
        raise FileNotFoundError(f"the new workspace of {intent.name!r} is gone ({new})")
    if _card_txn(new) != intent.id:
        write_card(new, intent.record, intent.id)
    crash_point("txn.card")
    if new != final:
        if final.exists() or final.is_symlink():
            swap_in(new, final)  # the replaced workspace is now where the new one was
        else:
            os.rename(new, final)
        fsync_dir(final.parent)
    crash_point("txn.swapped")
    inventory = Inventory(settings.cache.tools)
    current = inventory.get(intent.name)
    if current is None or current.extra.get("txn") != intent.id:
        inventory.save(ToolRecord.from_json(intent.record))
    progress.add("record")
    crash_point("txn.record")
    record = ToolRecord.from_json(intent.record)
    try:
        add_tool(StorePath(Path(record.store_path), record.source_hash), record.name, tool_entry(record))
    except DeployError as exc:
        notice(f"{exc} (the record has it; {typed('doctor')} needs it only when the inventory is lost)")
    crash_point("txn.named")
    # after the commit point nothing may fail the run: what cannot be done is said, and left for `clean`
    leftover = False
    if beside is not None and intent.aside and (beside.exists() or beside.is_symlink()):
        try:
            os.rename(beside, intent.aside)
            notice(f"the previous workspace for {intent.name!r} was moved to {intent.aside}")
        except OSError as exc:
            leftover = True
            notice(f"the previous workspace for {intent.name!r} stays at {beside} ({exc})")
    crash_point("txn.aside")
    if intent.recipe:
        try:
            atomic_write(Path(intent.recipe), json.dumps(intent.recipe_data), make_parents=True)
        except OSError as exc:
            notice(f"the recipe {intent.recipe} was not written ({exc}); the next run builds again")
    crash_point("txn.recipe")
    if beside is not None and not leftover:
        remove_tree(beside.parent, ignore_errors=True)  # the attempt: a --continue's old copy, the cargo home
    crash_point("txn.attempt")
    _intent_path(settings, intent.name).unlink(missing_ok=True)
    fsync_dir(settings.cache.intents)
    crash_point("txn.done")


def _back(intent: Intent) -> bool:
    """Undo the swap of ``intent`` (the record was not saved); False when the replaced workspace is gone."""
    final = Path(intent.final)
    beside = Path(intent.next) if intent.next else None
    if beside is None or _card_txn(final) != intent.id:
        return True  # nothing was swapped: the tool's workspace is as it was
    if not (beside.exists() or beside.is_symlink()):
        return False
    swap_in(beside, final)  # the new workspace goes back beside, the replaced one back in place
    fsync_dir(final.parent)
    return True


def _whole(intent: Intent) -> str:
    """Why the new tool of ``intent`` cannot be finished ("" when it can): its store entry or workspace is gone."""
    record = ToolRecord.from_json(intent.record)
    try:
        manifest = read_cache_json(Path(record.store_path) / "manifest.json")
    except (OSError, StorageError):
        return f"its store entry {record.store_path} is gone"
    if manifest.get("hash") != record.source_hash:
        return f"its store entry {record.store_path} holds another build"
    if not Path(record.binary).is_file():
        return f"its binary {record.binary} is gone"
    final = Path(intent.final)
    if _card_txn(final) == intent.id:
        return ""
    new = Path(intent.next) if intent.next else final
    return "" if new.is_dir() else f"its workspace {new} is gone"


def pending(settings: Settings) -> list[Intent]:
    """The transactions not finished yet (their process may still be running them)."""
    directory = settings.cache.intents
    if not directory.is_dir():
        return []
    found = []
    for path in sorted(directory.glob("*.json")):
        intent = Intent.load(path)
        if intent is not None:
            found.append(intent)
    return found


def recover(settings: Settings) -> list[str]:
    """Finish or undo every transaction a dead process left; return what was done, in words.

    A transaction whose tool lock is held is still running and left alone.
    """
    notes: list[str] = []
    directory = settings.cache.intents
    if not directory.is_dir():
        return notes
    for path in sorted(directory.glob("*.json")):
        name = path.stem
        try:
            if not is_tool_name(name):  # no build writes it: nothing of it is acted on
                note = _set_aside(settings, path, f"{name!r} is no tool name")
            else:
                with tool_lock(settings.cache, name, wait=0):
                    note = _recover_one(settings, path)
        except ToolBusy:
            continue  # its build is still running
        except (OSError, StorageError) as exc:  # each intent on its own: one that cannot be handled stops no other
            note = f"the unfinished build in {path} could not be finished or undone now ({exc})"
        if note:
            notes.append(note)
    return notes


def _set_aside(settings: Settings, path: Path, why: str) -> str:
    """Move the damaged intent ``path`` (a file, or a directory in its place) into the cache's ``damaged/`` (kept
    for a look, never acted on)."""
    aside = settings.cache.damaged / f"intent-{path.stem[:80]}-{time.time_ns()}.json"
    with storage_errors("setting a damaged intent aside", path):
        make_private(aside.parent)
        os.rename(path, aside)
    crash_point("txn.intent_aside")
    return f"set aside the damaged intent {path} ({why}): it is at {aside} now (kept), nothing was done"


def _recover_one(settings: Settings, path: Path) -> str:
    try:
        intent = Intent.parse(path)
    except StorageError as exc:
        if path.is_symlink():
            path.unlink(missing_ok=True)  # a symlink goes, its target stays (never followed)
            crash_point("txn.intent_unlinked")
            return f"removed {path}: it was no intent but a symlink ({exc})"
        if not path.is_file():  # a directory (a FIFO...) in its place
            return _set_aside(settings, path, "it is no file")
        return _set_aside(settings, path, str(exc))  # a file that does not parse
    intent = intent.rebased(settings.cache.root)  # the cache dir may have moved since it was written
    why = confinement(settings, intent)
    if why or intent.name != path.stem:
        return _set_aside(settings, path, why or f"it is of {intent.name!r}")
    who = f"the build of {intent.name!r} that process {intent.pid} left unfinished"
    why_not = _whole(intent)
    if not why_not:
        try:
            _forward(settings, intent, set(), lambda message: None)
            return f"finished {who}: {intent.name!r} is the new build now"
        except (OSError, StorageError, ValueError) as exc:  # ValueError: a record the registry refuses
            why_not = f"finishing it failed ({exc})"
    try:
        current = Inventory(settings.cache.tools).get(intent.name)
    except StorageError:
        current = None
    if current is not None and current.extra.get("txn") == intent.id:
        return f"could not finish {who} ({why_not}); it stays for the next command"
    if not _back(intent):
        return f"could not undo {who}: its replaced workspace is gone; {typed('doctor')} checks the tool"
    path.unlink(missing_ok=True)
    return f"undid {who} ({why_not}): {intent.name!r} is the tool it was before"
