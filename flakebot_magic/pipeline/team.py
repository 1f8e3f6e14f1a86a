"""A team's tools: ``push`` a nix-built tool and its proof to a signed binary cache, ``pull`` one pinned by hash.

``pull NAME --from NOTEBOOK.ipynb`` reads the provenance a ``%%flakebot``
cell's output recorded (the tool's and its proof's store paths and NAR
hashes), fetches exactly those paths from the configured substituters
(:func:`flakebot_magic.backends.nix_cache.fetch_pinned`: refused unless a
trusted key signed them and their hashes are the recorded ones), reads the
proof (it names this tool and says its tests passed) and registers the tool:
no fork, no cargo, no model. What is refused is never fetched nor injected;
``if_untrusted="rebuild"`` then builds the tool here from the recorded request
and says whether the result is bit-identical to what the notebook recorded.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.nix_cache import (
    TrustedKeys,
    check_pins,
    fetch_derivation,
    fetch_pinned,
    path_info,
    push_tool,
    read_proof,
    real_path,
)
from ..backends.nix_command import Nix, NixOptions
from ..clients import ToolClient, make_tool
from ..commands import IF_UNTRUSTED, typed
from ..config import Settings
from ..errors import DeployError, FlakebotError, UntrustedPath, UsageError
from ..host.fsutil import load_json, read_regular
from ..host.process import ProcessRunner
from ..manage.tools import Answer, CommandResult, find, load
from ..manage.transaction import tool_entry
from ..manage.verify import manifest_of
from ..records.inventory import Inventory, ToolRecord
from ..request import RunFlags
from ..stages.deploy import StorePath, add_tool, write_entry

__all__ = [
    "Pin",
    "Pulled",
    "line_command",
    "load_pinned",
    "notebook_provenance",
    "pull",
    "pull_for_cell",
    "push",
    "saved_pin",
]

#: what :func:`flakebot_magic.stages.deploy.store_key` makes
_STORE_KEY = re.compile(r"[0-9a-f]{32}")
#: the provenance fields a pull pins
PINNED = ("nix_store_path", "nar_hash", "proof_store_path", "proof_nar_hash")


def _nix(settings: Settings, runner: ProcessRunner | None = None) -> Nix:
    options = NixOptions.of(settings)
    return Nix(runner or ProcessRunner(), options=options)


def push(settings: Settings, name: str, *, to: str | None = None, secret_key: str | None = None) -> CommandResult:
    """``push NAME``: the tool's store path and its proof's, signed, to ``to`` (default: the ``push_to`` setting)."""
    to = to or settings.push_to
    secret_key = secret_key or settings.nix_secret_key
    if not to:
        raise UsageError(
            f"Where to? {typed('push NAME --to file:///srv/cache', '%flakebot push NAME --push-to file:///srv/cache')} "
            "(or set push_to / FLAKEBOT_PUSH_TO)."
        )
    if not secret_key:
        raise UsageError(
            "Pushes are signed: --secret-key FILE (from `nix key generate-secret`; or set nix_secret_key)."
        )
    record = find(settings, name)
    manifest = manifest_of(record)
    paths = [str(manifest.get(k) or "") for k in ("nix_store_path", "proof_store_path")]
    if record.backend != "nix" or not all(paths):
        raise UsageError(
            f"{name!r} was not built by the nix backend with a proof; only those can be pushed. "
            f"Build it again with --backend nix "
            f"({typed(f'build ... --backend nix --rebuild --name {name}', f'%%flakebot --backend nix --rebuild --name {name}')})."
        )
    pushed = push_tool(_nix(settings), manifest, to, Path(secret_key))
    data = {
        "name": name,
        "to": to,
        "paths": list(pushed.paths),
        "derivation": pushed.derivation,
        "signed_by": list(pushed.signed_by),
    }
    with_recipe = (
        f", with its derivation {pushed.derivation}"
        if pushed.derivation
        else " (its derivation is no longer in this store: a teammate cannot rebuild it)"
    )
    text = (
        f"pushed {name} ({paths[0]}) and its proof ({paths[1]}) to {to}{with_recipe}, "
        f"signed by {', '.join(pushed.signed_by)}"
    )
    return CommandResult(data, text)


#: the largest notebook ``pull`` reads for a tool's recorded provenance (outputs and images included)
MAX_NOTEBOOK_BYTES = 512 * 1024 * 1024


def notebook_provenance(notebook: Path, name: str) -> dict[str, Any]:
    """The provenance the last output of tool ``name`` in ``notebook`` recorded (``metadata.flakebot``)."""
    try:
        data, more = read_regular(Path(notebook), MAX_NOTEBOOK_BYTES)  # a shared file: capped, never a FIFO
        if more:
            raise ValueError(f"it is larger than {MAX_NOTEBOOK_BYTES >> 20} MiB")
        cells = load_json(data)["cells"]
    except FileNotFoundError:
        where = Path(notebook) if Path(notebook).is_absolute() else Path.cwd() / notebook
        raise UsageError(
            f"No notebook at {where}: give the path of the notebook whose output recorded {name!r} "
            "(relative to the kernel's working directory, or absolute)."
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"Cannot read {notebook} as a notebook: {exc}") from None
    found: dict[str, Any] | None = None
    names = []
    for cell in cells if isinstance(cells, list) else []:
        outputs = cell.get("outputs") if isinstance(cell, dict) else None
        for output in outputs if isinstance(outputs, list) else []:  # a notebook file is data: any shape
            metadata = output.get("metadata") if isinstance(output, dict) else None
            recorded = metadata.get("flakebot") if isinstance(metadata, dict) else None
            if isinstance(recorded, dict):
                names.append(str(recorded.get("name", "")))
                if recorded.get("name") == name:
                    found = recorded
    if found is None:
        known = ", ".join(sorted(set(filter(None, names)))) or "none"
        raise UsageError(f"{notebook} records no tool named {name!r} (tools it records: {known}).")
    return found


def saved_pin(settings: Settings, notebook: object, name: str | None, request: str, crate: str | None) -> Pin | None:
    """What a saved notebook pins for re-running its ``%%flakebot`` cell here: the provenance of tool ``name``
    built from this very request (and crate) by the nix backend with a proof, when this machine has no tool of
    that name; None otherwise (then the cell builds as it always did).

    ``notebook`` is the kernel's notebook path as Jupyter gives it (``__session__``); anything else is None.
    """
    if not name or not isinstance(notebook, str) or not notebook.endswith(".ipynb"):
        return None
    if Inventory(settings.cache.tools).get(name) is not None:
        return None  # a tool of that name here: the cell's own cache decides, as without a pin
    try:
        provenance = notebook_provenance(Path(notebook), name)
    except UsageError:
        return None
    if str(provenance.get("request", "")).strip() != request.strip():
        return None  # the cell was edited since: it asks for something else
    if crate and str(provenance.get("crate", "")) != crate:
        return None
    if not all(provenance.get(key) for key in PINNED):
        return None  # built by the cargo backend, or without a proof: nothing to pull
    return Pin(Path(notebook), provenance)


def pull_for_cell(
    settings: Settings, notebook: object, name: str | None, request: str, crate: str | None
) -> tuple[ToolClient | None, list[str]]:
    """A re-run ``%%flakebot`` cell of a saved notebook, on a machine without the tool: the exact tool the
    notebook pinned (:func:`saved_pin`), pulled from the team's cache instead of built; and the lines to show.

    None (the cell then builds, as it always did) when the notebook pins nothing for this cell, when no cache
    is set (a line says how to pull) or when the pull is refused (a line says why).
    """
    try:
        pin = saved_pin(settings, notebook, name, request, crate)
    except FlakebotError:
        return None, []  # an unreadable tool record: the build says what is wrong with it
    if pin is None or not name:
        return None, []
    if not (settings.nix_substituters and settings.nix_trusted_public_keys):
        return None, [
            f"{pin.notebook.name} pins `{name}` at {pin.store_path}; building it here. To pull that exact tool "
            "instead, set the team's cache and key (FLAKEBOT_NIX_SUBSTITUTERS and FLAKEBOT_NIX_TRUSTED_PUBLIC_KEYS, "
            "or --substituters and --trusted-public-keys) and run the cell again."
        ]
    try:
        pulled = pull(settings, name, pin.provenance)
    except FlakebotError as exc:
        reason = exc.reason if isinstance(exc, UntrustedPath) else str(exc)
        return None, [
            f"{pin.notebook.name} pins `{name}`, but it was not pulled: {reason}",
            "building it here instead.",
        ]
    return pulled.tool, [f"{pulled.text}, as {pin.notebook.name} pinned it (no build)", *pulled.notes]


@dataclass(frozen=True)
class Pin:
    """A tool as a saved notebook pinned it (:func:`saved_pin`)."""

    notebook: Path
    provenance: Mapping[str, Any]

    @property
    def store_path(self) -> str:
        return str(self.provenance["nix_store_path"])


@dataclass
class Pulled:
    """What a pull gave: the tool, where it came from and who signed it; or, after a refusal, a local rebuild.

    An :class:`~flakebot_magic.manage.tools.Answer` (``data``, ``text``, ``notes``) for the front doors.
    """

    tool: ToolClient
    cache: str = ""
    signed_by: str = ""
    #: a refusal the user chose to answer with a local build; then whether it matches the recorded hash
    refused: str = ""
    identical: bool | None = None
    notes: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        if self.refused:
            same = "bit-identical to" if self.identical else "NOT the same as"
            return f"{self.tool.name}: refused ({self.refused}); rebuilt here: {same} the recorded store path"
        return f"{self.tool.name}: pulled {self.tool.store_path} from {self.cache}, signed by {self.signed_by}"

    @property
    def data(self) -> dict[str, Any]:
        return {
            "name": self.tool.name,
            "store_path": str(self.tool.store_path),
            "substituted_from": self.cache,
            "signed_by": self.signed_by,
            "refused": self.refused,
            "identical": self.identical,
            "provenance": dict(getattr(self.tool, "provenance", {}) or {}),
        }


def line_command(settings: Settings, command: str, rest: Sequence[str], *, rebuild: bool = False) -> Answer:
    """``%flakebot push NAME`` and ``%flakebot pull NAME NOTEBOOK [--rebuild]``: their answers.

    The magic's ``--rebuild`` is the pull's ``if_untrusted="rebuild"`` (a build that uses no cache).
    """
    if command == "push":
        if len(rest) != 1:
            raise UsageError(
                "Usage: %flakebot push NAME (with --push-to URL and --secret-key FILE, or their settings)."
            )
        return push(settings, rest[0])
    if len(rest) != 2:
        raise UsageError("Usage: %flakebot pull NAME NOTEBOOK.ipynb (with --substituters and --trusted-public-keys).")
    provenance = notebook_provenance(Path(rest[1]), rest[0])
    if not rebuild:
        return pull(settings, rest[0], provenance)
    return pull(settings, rest[0], provenance, if_untrusted="rebuild", flags=RunFlags(rebuild=True))


def pull(
    settings: Settings,
    name: str,
    provenance: Mapping[str, Any],
    *,
    if_untrusted: str = "stop",
    runner: ProcessRunner | None = None,
    flags: RunFlags | None = None,
) -> Pulled:
    """Tool ``name`` as ``provenance`` recorded it, fetched from the substituters and checked; see the module.

    ``flags``: how the build after a refusal goes (``if_untrusted="rebuild"``).
    """
    if if_untrusted not in IF_UNTRUSTED:
        raise UsageError(f"if_untrusted must be one of {', '.join(IF_UNTRUSTED)}, not {if_untrusted!r}.")
    missing = [key for key in PINNED if not provenance.get(key)]
    if missing:
        raise UsageError(
            f"The recorded provenance of {name!r} has no {', '.join(missing)}: it was not built by the nix "
            "backend with a proof, so it cannot be pulled. Build it with the notebook's cell instead."
        )
    tool_path, proof_path = str(provenance["nix_store_path"]), str(provenance["proof_store_path"])
    pins = {proof_path: str(provenance["proof_nar_hash"]), tool_path: str(provenance["nar_hash"])}
    check_pins(pins, where=f"the recorded provenance of {name!r}")  # before any nix command, the rebuild's too
    caches = (settings.nix_substituters or "").split()
    if not caches:
        raise UsageError("Pulling needs a binary cache: --substituters URL (or FLAKEBOT_NIX_SUBSTITUTERS).")
    trusted = TrustedKeys(settings.nix_trusted_public_keys or "")
    nix = _nix(settings, runner)
    refusal: UntrustedPath | None = None
    for cache in caches:
        try:
            signers = fetch_pinned(nix, cache, pins, trusted)
        except UntrustedPath as exc:
            if refusal is None or "does not hold" in str(refusal):  # a bad signature or hash says more
                refusal = exc
            continue
        tool, rebuildable = _install(settings, nix, name, provenance, cache, signers[tool_path], trusted)
        return Pulled(tool, cache, signers[tool_path], notes=(rebuildable,))
    assert refusal is not None
    if if_untrusted == "stop":
        raise UntrustedPath(
            f"{refusal} Nothing was fetched or injected. To build {name!r} here instead, pull again with "
            f"--if-untrusted rebuild ({typed('pull NAME --from NOTEBOOK --if-untrusted rebuild', '%flakebot pull NAME NOTEBOOK --rebuild')}); it says whether "
            "the result is bit-identical to the recorded store path.",
            path=refusal.path,
            cache=refusal.cache,
            reason=str(refusal),
        )
    return _rebuild(settings, nix, name, provenance, str(refusal), flags or RunFlags())


def load_pinned(settings: Settings, name: str, provenance: Mapping[str, Any]) -> ToolClient:
    """Tool ``name`` as ``provenance`` pinned it: the tool registered here when it is that very store path and
    narHash, else pulled (:func:`pull`, which refuses what no trusted key signed)."""
    record = Inventory(settings.cache.tools).get(name)
    if record is not None:
        here = manifest_of(record)
        if here.get("nix_store_path") == provenance.get("nix_store_path") and here.get("nar_hash") == provenance.get(
            "nar_hash"
        ):
            return load(settings, name)  # type: ignore[no-any-return]
    return pull(settings, name, provenance).tool


def _install(
    settings: Settings,
    nix: Nix,
    name: str,
    provenance: Mapping[str, Any],
    cache: str,
    signer: str,
    trusted: TrustedKeys,
) -> tuple[ToolClient, str]:
    """The pulled tool registered here, and a sentence on whether ``verify`` can rebuild it here."""
    tool_path = str(provenance["nix_store_path"])
    proof = read_proof(nix, str(provenance["proof_store_path"]))
    if proof.tool != tool_path or proof.nar_hash != provenance["nar_hash"]:
        raise UntrustedPath(
            f"The proof {provenance['proof_store_path']} is about {proof.tool} ({proof.nar_hash}), "
            f"not the recorded {tool_path}: refused.",
            path=tool_path,
            cache=cache,
        )
    if not proof.passed:
        raise UntrustedPath(f"The proof of {tool_path} records failed tests ({proof.tests}): refused.", path=tool_path)
    for path, root in ((tool_path, name), (str(provenance["proof_store_path"]), f".proofs/{name}")):
        if not nix.add_root(Path(path), settings.cache.gcroots / root):
            raise DeployError(f"Could not make {settings.cache.gcroots / root} a GC root for {path}.")
    if proof.derivation:
        why_not = fetch_derivation(nix, cache, proof.derivation, tool_path, trusted)
    else:
        why_not = "its proof names no derivation (it was made before proofs did)"
    derivation = "" if why_not else proof.derivation
    rebuildable = (
        f"its derivation came with it: {typed(f'verify {name}')} rebuilds it here and compares bit for bit"
        if derivation
        else f"it cannot be rebuilt here to verify it: {why_not}"
    )
    real = real_path(nix, tool_path)
    manifest = {
        "backend": "nix",
        "binaries": sorted(p.name for p in (real / "bin").iterdir()),
        "checksum": proof.checksum,
        "contract": proof.contract,
        "crate": proof.crate,
        "version": proof.version,
        "rustc": proof.key.toolchain,
        "lock_hash": proof.flake_lock,
        "tests": proof.tests,
        "nix_store_path": tool_path,
        "derivation": derivation,
        "nar_hash": proof.nar_hash,
        "proof_store_path": provenance["proof_store_path"],
        "proof_nar_hash": provenance["proof_nar_hash"],
        "gcroot": str(settings.cache.gcroots / name),
        "substituted_from": cache,
        "signed_by": signer,
        "model": str(proof.session.get("model", "")),
        "iterations": int(proof.session.get("iterations", 0) or 0),
    }
    # the builder's own key, so the tool's entry and source hash are the same as there (a key is 32 hex digits:
    # anything else in a proof is not used as a directory name here)
    key = proof.store_key if _STORE_KEY.fullmatch(proof.store_key) else proof.key.digest().removeprefix("sha256-")[:32]
    entry: StorePath = write_entry(
        settings.cache.store,
        key,
        proof.crate,
        proof.version,
        lambda staging: (staging / "bin").symlink_to(real / "bin"),
        manifest,
    )
    tool = make_tool(
        contract=proof.contract,
        start=False,
        name=name,
        binary=real / "bin" / proof.main,
        crate=proof.crate,
        version=proof.version,
        source_hash=key,
        store_path=Path(tool_path),
        checksum=proof.checksum,
        backend="nix",
        timeout=settings.tool_timeout,
        provenance={**entry.manifest, "proof": proof.to_json(), "request": str(provenance.get("request", ""))},
        lock_hash=proof.flake_lock,
        env=settings.tool_env,
        confine=settings.confine_tools,
        home=settings.cache.root,
    )
    record = ToolRecord.of_entry(
        name,
        entry.path,
        manifest,
        # through the entry's bin (a link to the store path's, wherever that store keeps it), as doctor expects
        binary=str(entry.path / "bin" / proof.main),
        workspace="",
        commit=str(provenance.get("commit", "")),
        kind=tool.kind,
        created=time.time(),
        extra={"nix_store_path": tool_path, "substituted_from": cache, "signed_by": signer},
        source_hash=key,
        checksum_kind=str(provenance.get("checksum_kind", "")),
        registry=str(provenance.get("registry", "")),
        request=str(provenance.get("request", "")),
    )
    Inventory(settings.cache.tools).save(record)
    try:  # its store entry names it as a build's does: with the inventory lost, the entry brings it back
        add_tool(entry, name, tool_entry(record))
    except DeployError:
        pass  # the record has it; the doctor needs the naming only when the inventory is lost
    return tool, rebuildable


def _rebuild(
    settings: Settings, nix: Nix, name: str, provenance: Mapping[str, Any], refused: str, flags: RunFlags
) -> Pulled:
    """The user's other choice after a refusal: build here from the recorded request, and compare."""
    from ..request import BuildRequest, UntrustedText
    from .background import start_build

    # the notebook's recorded request is somebody's shared file: its ">>>" lines are words, never examples
    request = BuildRequest(
        UntrustedText(str(provenance.get("request", ""))),
        name=name,
        crate=str(provenance.get("crate") or "") or None,
        flags=flags,
    )
    here = dataclasses.replace(settings, nix_store=None)  # builds go to nix's own store (nix.py refuses others)
    tool = start_build(here, request).wait([])
    info = path_info(Nix(nix.runner, options=NixOptions.of(here)), str(tool.store_path))
    identical = (
        str(tool.store_path) == provenance["nix_store_path"]
        and info is not None
        and info.nar_hash == provenance["nar_hash"]
    )
    return Pulled(tool, refused=refused, identical=identical)
