"""``verify NAME``: rebuild a nix-built tool and say whether it is bit-identical to what was deployed or pulled.

::

    the tool's /nix/store path ─► nix store verify (the copy here still has its registered narHash)
        ─► what to rebuild from: its derivation, when this store holds it (a pull fetches it with the tool,
           signed, when the cache has it); else its workspace's flake at the recorded commit; else a clear
           error, nothing recorded
        ─► nix build --rebuild (nix builds it again and compares bit for bit) ─► identical, or nix's words
        ─► the answer in the tool's record (``extra["verified"]``), which ``show NAME`` prints

The recorded narHash (the one the notebook pinned, the one a pull checked) is
compared with the store's before the rebuild: a store that holds something
else under the recorded path is not identical, whatever a rebuild says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends.nix_cache import path_info
from ..backends.nix_command import Nix, NixOptions, sandbox_off_error
from ..commands import typed
from ..config import Settings
from ..errors import DeployError, StorageError, UsageError
from ..host.git import Git
from ..host.process import Completed, ProcessRunner
from ..host.storage import read_cache_json
from ..records.inventory import Inventory, ToolRecord
from ..records.provenance import verification_text
from ..stages.flake import FLAKE_FILE, check_lock_sources
from ..untrusted import make_fields_safe
from .tools import find

__all__ = ["NOT_DETERMINISTIC", "Verified", "rebuild", "rebuild_source", "verify"]

#: what nix 2.8 says when a rebuilt output differs from the store's (``nix build --rebuild``)
NOT_DETERMINISTIC = "may not be deterministic"


@dataclass
class Verified:
    """What a verify found (an :class:`~flakebot_magic.manage.tools.Answer`): ``data`` is what the record keeps."""

    name: str
    identical: bool
    path: str
    nar_hash: str
    rebuilt_from: str
    at: float
    #: nix's words on a difference ("" when identical)
    message: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        make_fields_safe(self)

    @property
    def data(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "identical": self.identical,
            "path": self.path,
            "nar_hash": self.nar_hash,
            "rebuilt_from": self.rebuilt_from,
            "at": self.at,
            "message": self.message,
        }

    @property
    def text(self) -> str:
        return f"{self.name}: {verification_text(self.data)}"


def manifest_of(record: ToolRecord) -> dict[str, Any]:
    """The manifest of ``record``'s store entry (the nix store path, narHash, proof...); {} when it has none."""
    try:
        data: dict[str, Any] = read_cache_json(Path(record.store_path) / "manifest.json")
    except (OSError, StorageError):
        data = {}
    return data


def rebuild_source(nix: Nix, record: ToolRecord, path: str, deriver: str, commit: str) -> tuple[str, Path | None]:
    """What to rebuild ``path`` from, and where nix runs: its derivation when the store holds it, else the
    workspace's flake at ``commit``. A :class:`UsageError` when there is neither (a pulled tool)."""
    if deriver and nix.run("path-info", "--derivation", "--", deriver, timeout=60).returncode == 0:
        return deriver, None
    workspace = Path(record.workspace) if record.workspace else None
    if workspace is not None and (workspace / FLAKE_FILE).is_file() and commit:
        # nix evaluates the flake at that commit on this machine: its lock may name nothing fetched here
        shown = Git(workspace, ProcessRunner())("show", f"{commit}:Cargo.lock", check=False)
        check_lock_sources(workspace, shown.encode())
        return f"git+file://{workspace}?rev={commit}", workspace
    where = f"pulled from {record.extra['substituted_from']}" if record.extra.get("substituted_from") else "here"
    raise UsageError(
        f"Nothing to rebuild {record.name!r} from: it was {where}, and this machine has neither its derivation "
        f"({deriver or 'not recorded'}) nor a workspace with its flake. Verify it where it was built "
        f"({typed(f'verify {record.name}')} there), or build it here from the notebook "
        f"({typed(f'pull {record.name} --from NOTEBOOK --if-untrusted rebuild', f'%flakebot pull {record.name} NOTEBOOK --rebuild')} "
        "compares with the recorded hash)."
    )


def rebuild(nix: Nix, installable: str, *, cwd: Path | None, timeout: float) -> Completed:
    """``nix build --rebuild INSTALLABLE``: build it again and let nix compare the result with the store's copy.

    nix exits 0 when every output is bit-identical to the one in the store,
    and says ``may not be deterministic: output ... differs`` when one is
    not. The store must hold the outputs (else nix says it cannot check).
    Refuses (:class:`~flakebot_magic.errors.ConfigError`) when nix's sandbox is off.
    """
    if not nix.sandbox.on:
        raise sandbox_off_error(nix.sandbox)
    return nix.run("build", installable, "--rebuild", "--no-link", "--print-build-logs", cwd=cwd, timeout=timeout)


def verify(settings: Settings, name: str, *, runner: ProcessRunner | None = None) -> Verified:
    """``verify NAME``: see the module. Records the answer in the tool's record and returns it."""
    record = find(settings, name)
    manifest = manifest_of(record)
    path = str(manifest.get("nix_store_path") or "")
    if record.backend != "nix" or not path:
        why = f"was built by {record.backend}" if record.backend != "nix" else "records no nix store path"
        raise UsageError(
            f"verify needs the nix backend: {name!r} {why}, so there is no derivation to rebuild and compare. "
            f"Build it with nix "
            f"({typed(f'build ... --backend nix --rebuild --name {name}', f'%%flakebot --backend nix --rebuild --name {name}')}), "
            "then verify."
        )
    nix = Nix(runner or ProcessRunner(), options=NixOptions.of(settings))
    info = path_info(nix, path)
    if info is None:
        raise UsageError(
            f"The store no longer holds {name!r} ({path}): nothing to compare a rebuild with. "
            f"{typed('doctor')} says more; build it again to verify it."
        )
    recorded = str(manifest.get("nar_hash") or info.nar_hash)
    at = time.time()
    message = ""
    if info.nar_hash != recorded:
        message = f"the store registers {path} with narHash {info.nar_hash}, not the recorded {recorded}"
    else:
        checked = nix.run("store", "verify", "--no-trust", path, timeout=600)
        if checked.returncode != 0:
            message = f"the store's copy no longer matches its narHash: {checked.stderr.strip()[-500:]}"
    rebuilt_from = ""
    if not message:
        # a pulled tool's derivation came with it (checked to build this path); a local build's is the store's
        deriver = str(manifest.get("derivation") or info.deriver)
        # the commit the release build compiled (exported from git's objects), as the manifest names it
        built_from = str(manifest.get("source_commit") or manifest.get("commit") or "")
        installable, cwd = rebuild_source(nix, record, path, deriver, built_from)
        rebuilt_from = installable
        done = rebuild(nix, installable, cwd=cwd, timeout=settings.build_timeout)
        if done.returncode != 0:
            said = [line.strip() for line in done.stderr.splitlines() if NOT_DETERMINISTIC in line]
            if not said:
                raise DeployError(
                    f"nix could not rebuild {name!r} from {installable}, so it is not verified: "
                    f"{done.stderr.strip()[-800:]}"
                )
            message = said[-1].removeprefix("error: ")
    verified = Verified(name, not message, path, recorded, rebuilt_from, at, message)
    Inventory(settings.cache.tools).update(name, extra={**record.extra, "verified": verified.data})
    return verified
