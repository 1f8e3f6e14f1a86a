"""The one place a deployed tool's client is made: the client class of the tool contract's kind (:mod:`.kinds`).

* :func:`make_tool`: from a store entry (what the pipeline's ``client``
  stage has just deployed or found in the store).
* :func:`tool_from_record`: from a tool inventory record
  (:class:`~flakebot_magic.records.inventory.ToolRecord`), for ``%flakebot show``,
  the command and the Jupyter server.

Every kind starts with the allowlisted environment plus ``env`` (the
``tool_env`` setting): the kernel's API keys never reach a tool implicitly.
A deployed tool runs as the user, outside the sandbox, unless ``confine``
(the ``confine_tools`` setting) asks for the sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import CacheFileDamaged, StorageError
from ..host.entry import remedy, runnable_damage
from ..host.storage import read_cache_json
from ..records.inventory import ToolRecord
from .base import TOOL_TIMEOUT, ToolClient, ToolContract
from .kinds import kind_of

__all__ = ["check_runnable", "make_tool", "tool_from_record"]

NIX_STORE = Path("/nix/store")


def make_tool(
    name: str,
    binary: Path,
    *,
    crate: str,
    version: str,
    source_hash: str,
    store_path: Path,
    contract: ToolContract | Mapping[str, Any] | None = None,
    checksum: str = "",
    backend: str = "cargo",
    timeout: float = TOOL_TIMEOUT,
    provenance: Mapping[str, Any] | None = None,
    lock_hash: str = "",
    start: bool = True,
    env: Mapping[str, str] | None = None,
    confine: bool = False,
    home: Path | None = None,
) -> ToolClient:
    """The client for a deployed tool: its kind's client class, by ``contract`` (a stored contract's JSON is fine).

    With ``start``, a server (an MCP server, an HTTP service) is started now
    (and its functions read); a tool that runs only while called has nothing to start. ``env`` is added to the
    allowlisted environment of every start; ``confine`` runs the tool in the
    sandbox; ``home`` is the cache dir that registers it (its process is
    known by home and name; default: its store entry).

    Examples
    --------
    >>> tool = make_tool("calc", Path("/store/x/bin/calc"), crate="calc", version="1.0.0", source_hash="0",
    ...                  store_path=Path("/store/x"), contract={"kind": "mcp"}, start=False)
    >>> type(tool).__name__, tool.contract.bin
    ('McpTool', 'calc')
    """
    binary = Path(binary)
    if not isinstance(contract, ToolContract):
        contract = ToolContract.from_json(contract, default_bin=binary.name)
    common: dict[str, Any] = dict(
        name=name,
        binary=binary,
        crate=crate,
        version=version,
        source_hash=source_hash,
        store_path=Path(store_path),
        checksum=checksum,
        backend=backend,
        timeout=timeout,
        provenance=provenance,
        lock_hash=lock_hash,
        env=env,
        confine=confine,
        home=home,
    )
    tool = kind_of(contract.kind)(contract=contract, **common)
    return tool.start() if start else tool


def _stored_manifest(store_path: str) -> dict[str, Any]:
    try:
        data = read_cache_json(Path(store_path) / "manifest.json")
    except (OSError, StorageError):
        return {}
    return data if isinstance(data, dict) else {}


def check_runnable(record: ToolRecord) -> None:
    """Raise :class:`~flakebot_magic.errors.CacheFileDamaged` unless the record's binary may run (its entry is whole).

    A nix tool's record names its ``/nix/store`` output, which nix keeps
    read-only and content-addressed (``flakebot verify NAME`` checks it by narHash
    with ``nix store verify``): here its binary must be a regular file inside
    that output; every other entry is checked as a cache hit is.
    """
    store_path, binary = Path(record.store_path), Path(record.binary)
    if record.backend == "nix" and NIX_STORE in store_path.parents:
        inside = store_path in binary.parents and binary.is_file()
        why = "" if inside else f"its binary {binary} is not a file in its nix store path {store_path}"
    else:
        why = runnable_damage(store_path, binary)
    if why:
        raise CacheFileDamaged(
            f"The tool {record.name!r} cannot run: {why}. Its binary was not run. {remedy(record.name, why)}.",
            path=Path(record.store_path),
        )


def tool_from_record(
    record: ToolRecord,
    *,
    provenance: Mapping[str, Any] | None = None,
    timeout: float = TOOL_TIMEOUT,
    env: Mapping[str, str] | None = None,
    confine: bool = False,
    start: bool = False,
    home: Path | None = None,
    check: bool = True,
) -> ToolClient:
    """The client for a registered tool, of the kind it was deployed as (not started unless ``start``).

    ``provenance`` is the store entry's manifest (read from the record's
    store path when not given); its ``"contract"`` says the kind, else the
    record's ``kind`` does.

    No binary runs unless its store entry is whole: the record's binary is
    checked as a cache hit checks it (:func:`~flakebot_magic.host.entry.runnable_damage`:
    size and sha256 of each binary against the manifest) before the client
    is made; damage is :class:`~flakebot_magic.errors.CacheFileDamaged`
    naming the tool and ``flakebot rebuild``. ``check=False`` is for what only
    describes the tool (``show``); such a client still checks before each run
    (:meth:`~flakebot_magic.clients.base.ToolClient.require_binary`).
    """
    if check or start:
        check_runnable(record)
    manifest = dict(provenance) if provenance is not None else _stored_manifest(record.store_path)
    binary = Path(record.binary)
    stored = manifest.get("contract")
    contract = stored if isinstance(stored, Mapping) and stored else {"kind": record.kind, "bin": binary.name}
    return make_tool(
        record.name,
        binary,
        crate=record.crate,
        version=record.version,
        source_hash=record.source_hash,
        store_path=Path(record.store_path),
        contract=contract,
        checksum=record.checksum,
        backend=record.backend,
        timeout=timeout,
        provenance=manifest,
        lock_hash=str(record.extra.get("lock_hash") or manifest.get("lock_hash") or ""),
        start=start,
        env=env,
        confine=confine,
        home=home,
    )
