"""How a run ends: the tool's client, its record and its workspace installed together, or a clear error.

* :func:`deployed_tool`: the client of a store entry, and the transaction
  (:func:`~flakebot_magic.manage.transaction.install`) that makes it the tool: the
  tool card, the workspace swap and the record, recoverable at any point.
  The record carries the tool's own provenance: its workspace, the commit in
  it the entry was built from, and the tool that forked the source
  (``forked_by``); once saved, the entry's manifest names it among its ``tools``.
* :func:`from_cache`: a recipe hit. Under the name that built it nothing
  moves; under a new name the tool gets a workspace of its own, a copy of the
  workspace the entry was built from at that commit (never a record that
  names a workspace or a commit that does not exist).
* :func:`disk_full`: a build that failed on a full disk frees its build
  outputs and says how much it needs and what ``clean`` can free.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..backends.base import cached_rows
from ..clients import ToolClient, make_tool
from ..clients.contract import read_contract
from ..clients.kinds import asked_kinds
from ..commands import typed
from ..config import Settings
from ..errors import DeployError, DiskFull, FlakebotError, ForkError, StorageError, UsageError
from ..host.cache import CacheLayout
from ..host.git import Git
from ..host.names import is_tool_name
from ..host.storage import CLEAN_HINT, amount, free_bytes, is_full, no_space, read_cache_json
from ..host.trees import remove_tree
from ..manage.cleanup import clean, size_of
from ..manage.transaction import install
from ..records.inventory import Inventory, ToolRecord
from ..registry.base import CrateCandidate
from ..registry.directory import read_manifest
from ..request import BuildRequest
from ..sandbox.command import release_target
from ..stages.choose import Choice
from ..stages.deploy import StorePath
from ..stages.state import RunDeps, RunState, Stage
from ..stages.workspace import Workspace, clone_at, next_path

__all__ = [
    "answered_choice",
    "check_agent_may_replace",
    "contract_of",
    "deployed_tool",
    "disk_full",
    "from_cache",
    "main_binary",
]


def deployed_tool(
    deps: RunDeps,
    run: RunState,
    store: StorePath,
    choice: Choice,
    workspace: Workspace,
    *,
    commit: str,
    forked_by: str,
    recipe: tuple[Path, dict[str, Any]] | None = None,
    keep_replaced: bool | None = None,
    reused: bool = False,
) -> ToolClient:
    """The tool ``store`` holds, installed as ``run.name`` with ``workspace`` (where it is now) at ``commit``.

    ``keep_replaced``: move the workspace this one replaces to ``.old/``
    (default: unless ``workspace`` is a ``--continue`` copy, whose history
    holds the replaced one's). ``reused``: the store already had this tool
    (a cache hit): when it is ``run.name``'s tool already, its record keeps
    when it was built and that build's log.
    """
    settings, bus, name, candidate = deps.settings, deps.bus, run.name, run.crate()
    final = workspace.replaces or workspace.path
    with Stage(bus, "client", name) as stage:
        manifest = store.manifest
        main = main_binary(candidate, manifest["binaries"], workspace.path)
        # nix: the tool is the /nix/store path; the cache entry only records it
        deployed = Path(manifest.get("nix_store_path") or store.path)
        contract = manifest.get("contract") or contract_of(workspace.path, manifest["binaries"], main)
        # the request too: a saved notebook's pin is for the cell that asked it (pipeline/team.saved_pin)
        own = {"commit": commit, "workspace": str(final), "forked_by": forked_by, "request": run.recorded_request}
        previous = Inventory(settings.cache.tools).get(name) if reused else None
        kept = previous if previous is not None and previous.store_path == str(store.path) else None
        tool = make_tool(
            contract=contract,
            start=False,
            name=name,
            binary=deployed / "bin" / main,
            crate=candidate.name,
            version=candidate.version,
            source_hash=store.hash,
            store_path=deployed,
            checksum=manifest.get("checksum", ""),
            backend=manifest.get("backend", "cargo"),
            timeout=settings.tool_timeout,
            # the entry may be shared: this tool's commit and workspace are its own, not the entry's first builder's
            provenance={**manifest, **own, "choice": choice.to_json()},
            lock_hash=manifest.get("lock_hash", ""),
            env=settings.tool_env,
            confine=settings.confine_tools,
            home=settings.cache.root,
        )
        record = ToolRecord.of_entry(
            name,
            store.path,
            manifest,
            binary=str(tool.binary),
            workspace=str(final),
            commit=commit,
            kind=tool.kind,
            created=kept.created if kept is not None else time.time(),
            extra={"choice": choice.to_json()},
            # the run's candidate, not the entry's first builder's (the entry may be shared)
            crate=candidate.name,
            version=candidate.version,
            source_hash=store.hash,
            registry=candidate.registry,
            description=candidate.description,
            backend=tool.backend,
            forked_by=forked_by,
            log_path=kept.log_path if kept is not None else "",
            request=run.recorded_request,
            requested_by=run.request.requested_by,
        )
        if kept is not None and recipe is None and workspace.replaces is None and _same_tool(kept, record):
            # a cache hit that is the tool already: nothing to install, only what the request adds to its record
            # (which a full disk may refuse: the tool is whole all the same)
            _note_request(deps, kept, record)
        else:
            install(
                settings,
                record,
                workspace.path,
                replaces=workspace.replaces,
                keep_replaced=not workspace.reused if keep_replaced is None else keep_replaced,
                recipe=recipe,
                notice=lambda message: bus.notice("fork", message),
            )
        run.workspace = replace(workspace, path=final, replaces=None)
        stage.detail = _after_install(tool, name, settings.cache.tools) or stage.detail
        if tool.kind not in asked_kinds(run.request.text):
            bus.notice(
                "client",
                f'{name} is {tool.a_noun}: its Cargo.toml says kind = "{tool.kind}", and the request did not ask '
                f"for {tool.a_noun}. flakebot starts it only in the sandbox; your own calls run it "
                + ("in the sandbox too (confine_tools)." if tool.confine else "as you, as any tool's do."),
            )
    return tool


def _after_install(tool: ToolClient, name: str, tools: Path) -> str:
    """What a build does with a tool it just installed, by its kind; the client stage's detail.

    A server's record follows its process from now on, and its functions are
    read now, in the sandbox whatever ``confine_tools`` says (a build runs
    nothing of a tool unconfined); it starts as the setting says at the first
    call. A tool that runs only while called is not started.
    """
    if not tool.server:
        return ""
    with tool.confined():
        functions = tool.functions()
        tool.stop()
    inventory = Inventory(tools)  # the record follows the process from the person's first call on
    tool.on_state = lambda **changes: inventory.update(name, **changes)
    return f"{name}: {tool.kind}, {len(functions)} function(s)"


#: what makes a record the same tool: a cache hit that changes none of these installs nothing
_IDENTITY = ("binary", "store_path", "source_hash", "workspace", "commit", "forked_by", "kind", "backend")


def _same_tool(kept: ToolRecord, record: ToolRecord) -> bool:
    return all(getattr(kept, key) == getattr(record, key) for key in _IDENTITY) and bool(kept.extra.get("txn"))


def _note_request(deps: RunDeps, kept: ToolRecord, record: ToolRecord) -> None:
    """The request of a cache hit that is ``kept`` already, saved in its record; a disk too full for that is said."""
    changes = {"request": record.request, "requested_by": record.requested_by, "description": record.description}
    changes = {key: value for key, value in changes.items() if getattr(kept, key) != value}
    if not changes:
        return
    try:
        Inventory(deps.settings.cache.tools).update(kept.name, **changes)
    except StorageError as exc:
        deps.bus.notice("client", f"{kept.name!r} is the cached build, whole; its record keeps its old request ({exc})")


def _builders(store: StorePath, cache: CacheLayout) -> list[tuple[str, str, str]]:
    """(workspace, commit, forked_by) of every tool known to have built ``store``: its manifest's, the inventory's.

    A tool's workspace is ``workspaces/NAME`` of the cache it is in: the manifest's path is where it was written
    (a cache copied elsewhere names the original's), so its name is what counts.
    """
    manifest = store.manifest
    found = [
        (
            str(cache.workspaces / tool) if data.get("workspace") else "",
            str(data.get("commit", "")),
            str(data.get("forked_by") or tool),
        )
        for tool, data in sorted((manifest.get("tools") or {}).items())
        if isinstance(data, dict) and is_tool_name(tool)
    ]
    try:
        records = Inventory(cache.tools).all()
    except FlakebotError:
        records = []
    found += [
        (r.workspace, r.commit, r.forked_by or r.name) for r in records if Path(r.store_path) == store.path and r.commit
    ]
    return [entry for entry in found if entry[0] and entry[1]]


def _has_commit(git: Git, commit: str) -> bool:
    return bool(git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False))


def from_cache(deps: RunDeps, run: RunState, store: StorePath, choice: Choice) -> ToolClient | None:
    """The tool for a recipe hit, installed as ``run.name``; None when no workspace holds the commit that built it.

    When ``workspaces/NAME`` already stands at a commit that built the
    entry, only the record is written. Otherwise ``NAME`` gets a copy of a
    builder's workspace at its commit, swapped in like any rebuild.
    """
    settings, name = deps.settings, run.name
    final = settings.cache.workspaces / name
    builders = _builders(store, settings.cache)
    current = Workspace.load(final)
    if current is not None:
        head = Git(final, deps.runner)("rev-parse", "HEAD", check=False)
        for _, commit, forked_by in builders:
            if commit == head:
                run.workspace = current
                cached_rows(deps.bus, ("fork", "build", "test", "flake", "deploy"), store, where=_where(store))
                return deployed_tool(deps, run, store, choice, current, commit=head, forked_by=forked_by, reused=True)
    for source, commit, forked_by in builders:
        if Workspace.load(Path(source)) is None or not _has_commit(Git(Path(source), deps.runner), commit):
            continue
        try:
            copy = clone_at(Path(source), commit, next_path(settings.cache.workspaces, name), deps.runner)
        except (ForkError, OSError):
            continue
        run.workspace = workspace = replace(copy, replaces=final)
        deps.bus.notice(
            "fork",
            f"{name} is the cached build of {forked_by!r}: its workspace is a copy of {source} at {commit[:12]}",
        )
        cached_rows(deps.bus, ("fork", "build", "test", "flake", "deploy"), store, where=_where(store))
        return deployed_tool(
            deps, run, store, choice, workspace, commit=commit, forked_by=forked_by, keep_replaced=True, reused=True
        )
    return None


def _where(store: StorePath) -> str:
    """Where the tool of ``store`` is: its /nix/store path (nix), else the entry."""
    return str(store.manifest.get("nix_store_path") or store.path)


def check_agent_may_replace(settings: Settings, request: BuildRequest, name: str) -> None:
    """An agent's build never replaces a tool that the user (or another agent) asked for: a UsageError.

    Checked under the tool's lock, before anything is forked: the tool's name
    is the agent's to choose (or comes from a crate it chose), so without this
    an agent acting on text it read could swap the binary behind a name the
    user calls, unconfined.
    """
    if not request.requested_by:
        return
    record = Inventory(settings.cache.tools).get(name)
    if record is None or record.requested_by == request.requested_by:
        return
    owner = f"the agent {record.requested_by!r}" if record.requested_by else "the user"
    raise UsageError(
        f"There is already a tool named {name!r}, built for {owner}; an agent's build may not replace it. "
        "Build it under another name (name=...), or ask the user to rebuild or remove that tool."
    )


def answered_choice(deps: RunDeps, run: RunState) -> Choice | None:
    """The choice the tool ``run.request.name`` was built from, when it was built for this very request; else None.

    A warm re-run (the same name and words, or the same ``--crate``, no model, no ``--rebuild`` or
    ``--continue``) then needs no search: its recipe is looked up as the search's answer's would be (the
    registry, toolchain, flags and backend still decide whether it is a hit), and the sentence-embedding model is
    never loaded. The record's choice is taken as it was recorded; the crate's facts come from the registry.
    """
    request = run.request
    if not request.name or run.flags.rebuild or run.follow_up or run.model is not None:
        return None
    record = Inventory(deps.settings.cache.tools).get(request.name)
    if record is None or record.status != "ready" or record.model or record.request != request.text:
        return None
    if request.crate and request.crate != record.crate:
        return None
    chosen = record.extra.get("choice")
    if not isinstance(chosen, dict) or (chosen.get("crate"), chosen.get("version")) != (record.crate, record.version):
        return None
    try:
        candidate = deps.registry.get(record.crate, record.version)
    except FlakebotError:
        return None
    return Choice(candidate, str(chosen.get("by", "")), str(chosen.get("reason", "")))


def disk_full(deps: RunDeps, run: RunState, exc: FlakebotError, attempt: Path | None) -> DiskFull | None:
    """The error for a build of ``run`` that failed (``exc``) on a full disk; None when the disk is not full.

    The attempt's build outputs (``target/``) are removed; the message says
    how much the build needs (what an earlier build of the crate took here,
    or at least what the attempt had written), what is free now and what
    ``flakebot clean`` would free.
    """
    settings = deps.settings
    cache = settings.cache_dir
    if not isinstance(exc, DiskFull) and not is_full(cache) and no_space("a build", cache, str(exc)) is None:
        return None
    outputs = (attempt / "target", release_target(attempt)) if attempt is not None else ()
    written = sum(size_of(path) for path in outputs if path.is_dir())
    for path in outputs:  # nothing of a failed build stays on a full disk but its sources
        remove_tree(path, ignore_errors=True)
    before = _built_before(settings.cache.store, run.candidate)
    reclaimable = clean(settings, dry_run=True).freed
    free = free_bytes(cache)
    if isinstance(exc, DiskFull):
        first = (str(exc).split(". ")[0].splitlines() or [type(exc).__name__])[0][:400]  # what met it, where
    else:  # cargo or git failing for want of space: what it said (a "compile" or "test" error) is not the crate's
        first = f"a step failed while the disk was full; its output is in the build log, {typed(f'logs {run.name}')}"
    if before:
        needs = f"It needs about {amount(before)} free (what a build of {run.crate().id} took here before)"
    else:
        needs = f"It needs more than {amount(written)} free (what it had written when the disk filled)"
    return DiskFull(
        f"The disk holding {cache} is full: the build of {run.name!r} stopped ({first}). {needs}; its build "
        f"outputs were removed, so {amount(free)} is free now. {typed('clean')} can free {amount(reclaimable)} "
        f"more. {CLEAN_HINT[0].upper() + CLEAN_HINT[1:]}; then build again.",
        path=cache,
        free=free,
        needed=max(before, written),
        reclaimable=reclaimable,
        workspace=attempt,
    )


def _built_before(store_dir: Path, candidate: CrateCandidate | None) -> int:
    """The most bytes a build of ``candidate``'s crate wrote, as the store entries of its builds recorded."""
    if candidate is None or not store_dir.is_dir():
        return 0
    most = 0
    for entry in store_dir.glob(f"*-{candidate.name}-{candidate.version}"):
        try:
            recorded = read_cache_json(entry / "manifest.json").get("build_bytes")
        except (OSError, StorageError, AttributeError):
            continue
        if isinstance(recorded, int):
            most = max(most, recorded)
    return most


def contract_of(workspace: Path, binaries: list[str], main: str = "") -> dict[str, object]:
    """The tool contract in the workspace's Cargo.toml (a crate without one is a CLI tool)."""
    try:
        manifest = read_manifest(workspace / "Cargo.toml")
    except (OSError, ValueError):
        manifest = {}
    return read_contract(manifest, binaries, main).to_json()


def main_binary(
    candidate: CrateCandidate, binaries: list[str], workspace: Path | None = None, *, built: bool = True
) -> str:
    """The binary a tool runs: the tool contract's ``bin`` when the workspace has one, else by name.

    ``built``: ``binaries`` were built (the contract's must be among them);
    else they are the registry's names, from before any edit.
    """
    main = candidate.name if candidate.name in binaries else (sorted(binaries)[0] if binaries else candidate.name)
    if workspace is None:
        return main
    try:
        return read_contract(workspace / "Cargo.toml", binaries if built else (), main).bin
    except DeployError:  # no Cargo.toml, or a contract naming a binary that was not built
        return main
