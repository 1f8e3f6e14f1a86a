"""The tool contract: ``[package.metadata.flakebot]`` in a tool's Cargo.toml says how flakebot runs it.

::

    [package.metadata.flakebot]
    kind = "mcp"          # a tool kind: a key of clients/kinds.KINDS (the list; today "cli", the default, "mcp", "http")
    bin = "demo-mcp"      # which binary target is the tool (default: the crate's main binary)
    health = "/health"    # a service: the readiness path (default "/health")
    ready_timeout = 10    # a server: seconds allowed to start (default 10)

A crate with a binary and no such table is of the default kind (a ``cli`` tool). This module is
the one reader of the table: the edit loop asks it whether the model's
manifest will deploy, the deploy stage asks it which client to give. See
``docs/tool-contract.md`` for what each kind must do.

The API:

* :data:`KINDS` (the table of tool kinds, :mod:`.kinds`), :data:`KEYS` and the ``DEFAULT_*`` constants;
* :func:`read_contract` ``(source, binaries=(), main="", *, required=False)
  -> ToolContract``, raising :class:`~flakebot_magic.errors.DeployError`
  with a message that says what is wrong and how to fix it;
* :class:`ToolContract` (defined in :mod:`.base`), frozen, with ``to_json()`` / ``from_json()`` (the
  store manifest's ``"contract"``) and ``str()`` (``kind = "cli", bin = "x"``).

Examples
--------
>>> read_contract({"package": {"name": "demo"}}, ["demo"])
ToolContract(kind='cli', bin='demo', health='/health', ready_timeout=10.0)
>>> str(read_contract({"package": {"metadata": {"flakebot": {"kind": "mcp", "bin": "srv"}}}}))
'kind = "mcp", bin = "srv"'
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import DeployError
from ..host.fsutil import UnsafePath, load_toml, read_regular
from .base import DEFAULT_HEALTH, DEFAULT_KIND, DEFAULT_READY_TIMEOUT, ToolContract
from .kinds import KINDS

#: a service's readiness path: plain parts only (no query, no escapes, nothing a browser would normalise away:
#: the dashboard's "open" link is the proxy's prefix and this path)
_HEALTH_PATH = re.compile(r"/|(/[A-Za-z0-9._~-]+)+/?")

__all__ = [
    "DEFAULT_HEALTH",
    "DEFAULT_KIND",
    "DEFAULT_READY_TIMEOUT",
    "KEYS",
    "KINDS",
    "MAX_MANIFEST_BYTES",
    "TABLE",
    "ToolContract",
    "read_contract",
]

#: where the contract lives in Cargo.toml
TABLE = "[package.metadata.flakebot]"
#: every key the table may hold, and what it means (other keys are ignored)
KEYS = {
    "kind": f"one of {', '.join(KINDS)} (default {DEFAULT_KIND}): {', '.join(k.a_noun for k in KINDS.values())}",
    "bin": "the binary target that is the tool (default: the crate's main binary)",
    "health": f"a service's readiness path, starting with '/' (default {DEFAULT_HEALTH})",
    "ready_timeout": f"a server's seconds allowed to start, a positive number (default {DEFAULT_READY_TIMEOUT:g})",
}
#: a manifest larger than this is not read (the edit loop reads what a model wrote)
MAX_MANIFEST_BYTES = 1 << 20


def _load(source: Path | str | Mapping[str, Any]) -> Mapping[str, Any]:
    """A parsed Cargo.toml: ``source`` itself, or the regular file at that path (bounded, no symlink followed).

    Crate code (a build script, a model's edit) can leave anything named
    Cargo.toml: :func:`~flakebot_magic.host.fsutil.read_regular` refuses a symlink,
    a FIFO or a device before a byte is read.
    """
    if isinstance(source, Mapping):
        return source
    path = Path(source)
    try:
        data, more = read_regular(path, MAX_MANIFEST_BYTES)
    except UnsafePath as exc:
        raise DeployError(f"Cargo.toml cannot be read: {exc}, and a crate's manifest must be a regular file") from None
    except OSError as exc:
        raise DeployError(f"Cargo.toml cannot be read: {exc.strerror or exc}") from None
    if more:
        raise DeployError(f"Cargo.toml is larger than {MAX_MANIFEST_BYTES} bytes; it cannot be a crate's manifest")
    try:
        return load_toml(data.decode("utf-8", errors="replace"))
    except ValueError as exc:
        raise DeployError(f"Cargo.toml is not valid TOML: {exc}") from None


def read_contract(
    source: Path | str | Mapping[str, Any],
    binaries: Sequence[str] = (),
    main: str = "",
    *,
    required: bool = False,
) -> ToolContract:
    """The tool contract a Cargo.toml declares, every key checked.

    Parameters
    ----------
    source
        The Cargo.toml's path, or its parsed TOML data.
    binaries
        The binary targets the crate builds. When given, ``bin`` must name
        one of them; the default ``bin`` is chosen among them.
    main
        The default ``bin`` when the table names none (else the crate's
        name when it is a binary, else the first binary, else the crate's name).
    required
        The table must be there and name ``kind`` and ``bin`` (what the edit
        loop asks of a model); otherwise a crate without one is a ``cli`` tool.

    Raises
    ------
    DeployError
        The manifest cannot be read, is not TOML, or its table is wrong
        (not a table, an unknown kind, a binary the crate does not build, a
        health path without a leading ``/``, a ``ready_timeout`` that is
        not a positive number). The message says what to write instead.
    """
    manifest = _load(source)
    package = manifest.get("package")
    package = package if isinstance(package, Mapping) else {}
    metadata = package.get("metadata")
    table = metadata.get("flakebot") if isinstance(metadata, Mapping) else None
    name = str(package.get("name", ""))
    where = f" in {name}'s Cargo.toml" if name else ""
    default_bin = main or (name if name in binaries else (sorted(binaries)[0] if binaries else name))
    if table is None or table == {}:
        if required:
            raise DeployError(
                f"Cargo.toml has no {TABLE} table; add one with "
                f'kind = "{DEFAULT_KIND}" and bin = "<the binary target to deploy>"'
            )
        return ToolContract(kind=DEFAULT_KIND, bin=default_bin)
    if not isinstance(table, Mapping):
        raise DeployError(f'{TABLE}{where} must be a table, like: kind = "mcp", bin = "{default_bin}"')
    kind = table.get("kind", None if required else DEFAULT_KIND)
    if not isinstance(kind, str) or kind not in KINDS:
        raise DeployError(
            f"{TABLE} kind must be one of {', '.join(KINDS)}, not {kind!r}{where}. See docs/tool-contract.md."
        )
    bin_name = table.get("bin", None if required else default_bin)
    if not isinstance(bin_name, str) or not bin_name:
        raise DeployError(f'{TABLE} needs bin = "<binary target name>"{where}, not {bin_name!r}')
    if binaries and bin_name not in binaries:
        raise DeployError(
            f"{TABLE} bin = {bin_name!r}{where}, but the crate builds "
            f"{', '.join(sorted(binaries))}. Name one of those, or add src/main.rs or a [[bin]] target named {bin_name}."
        )
    health = table.get("health", DEFAULT_HEALTH)
    if not isinstance(health, str) or not _HEALTH_PATH.fullmatch(health) or {".", ".."} & set(health.split("/")):
        raise DeployError(
            f"{TABLE} health = {health!r}{where} must be a plain path starting with '/' (letters, digits and "
            "'.', '_', '~', '-' between slashes; no '.' or '..' part), like \"/health\"."
        )
    timeout = table.get("ready_timeout", DEFAULT_READY_TIMEOUT)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout < float("inf"):
        raise DeployError(f"{TABLE} ready_timeout = {timeout!r}{where} must be a positive number of seconds, like 10.")
    return ToolContract(kind=str(kind), bin=bin_name, health=health, ready_timeout=float(timeout))
