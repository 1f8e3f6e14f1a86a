"""The tool contract: ``[package.metadata.flakebot]`` in a tool's Cargo.toml says how flakebot runs it.

::

    [package.metadata.flakebot]
    kind = "mcp"          # "cli" (the default), "mcp" or "http"
    bin = "demo-mcp"      # which binary target is the tool (default: the crate's main binary)
    health = "/health"    # http only: the readiness path (default "/health")
    ready_timeout = 10    # http and mcp: seconds allowed to start (default 10)

A crate with a binary and no such table is a ``cli`` tool. See
``docs/tool-contract.md`` for what each kind must do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import DeployError
from .base import KINDS

__all__ = ["ToolContract", "contract_of"]


@dataclass(frozen=True)
class ToolContract:
    """How to run a deployed tool."""

    kind: str = "cli"
    bin: str = ""
    health: str = "/health"
    ready_timeout: float = 10.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None, default_bin: str = "") -> ToolContract:
        """Read a stored contract; an entry without one is a CLI tool."""
        if not data:
            return cls(kind="cli", bin=default_bin)
        return cls(
            kind=str(data.get("kind") or "cli"),
            bin=str(data.get("bin") or default_bin),
            health=str(data.get("health") or "/health"),
            ready_timeout=float(data.get("ready_timeout") or 10.0),
        )


def contract_of(manifest: Mapping[str, Any], binaries: Sequence[str], main: str = "") -> ToolContract:
    """The contract a parsed Cargo.toml declares, checked against the binaries cargo built.

    Raises
    ------
    DeployError
        The table names an unknown kind, or a binary the crate does not build.
    """
    package = manifest.get("package") or {}
    metadata = (package.get("metadata") or {}) if isinstance(package, Mapping) else {}
    table = metadata.get("flakebot") if isinstance(metadata, Mapping) else None
    name = str(package.get("name", "")) if isinstance(package, Mapping) else ""
    default_bin = main or (name if name in binaries else (sorted(binaries)[0] if binaries else name))
    if not table:
        return ToolContract(kind="cli", bin=default_bin)
    if not isinstance(table, Mapping):
        raise DeployError(f"[package.metadata.flakebot] of {name} must be a table, like: kind = \"mcp\", bin = \"{default_bin}\"")
    kind = str(table.get("kind", "cli"))
    if kind not in KINDS:
        raise DeployError(
            f"[package.metadata.flakebot] kind = {kind!r} in {name}'s Cargo.toml is not one of "
            f"{', '.join(map(repr, KINDS))}. See docs/tool-contract.md."
        )
    bin_name = str(table.get("bin") or default_bin)
    if binaries and bin_name not in binaries:
        raise DeployError(
            f"[package.metadata.flakebot] bin = {bin_name!r} in {name}'s Cargo.toml, but the crate builds "
            f"{', '.join(sorted(binaries)) or 'no binaries'}. Name one of those."
        )
    health = str(table.get("health", "/health"))
    if not health.startswith("/"):
        raise DeployError(f"[package.metadata.flakebot] health = {health!r} must be a path starting with '/'.")
    timeout = table.get("ready_timeout", 10.0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise DeployError(f"[package.metadata.flakebot] ready_timeout = {timeout!r} must be a positive number of seconds.")
    return ToolContract(kind=kind, bin=bin_name, health=health, ready_timeout=float(timeout))
