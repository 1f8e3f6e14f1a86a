"""Stage 6: the Python client for a deployed tool, chosen by its contract.

The store manifest records the tool contract (``[package.metadata.flakebot]``
in the crate's Cargo.toml; see :mod:`flakebot_magic.clients.contract`):

* ``cli`` (also a crate with a binary and no table): :class:`Tool`, which
  runs the binary per call. ``tool(*args, input=None, timeout=..., **options)``
  returns its standard output; options parsed from ``--help`` are keyword
  arguments. Tools that read standard input also take the text itself as the
  first argument: ``md("# Hi")`` sends ``# Hi`` to the binary's standard
  input, and ``md("# Hi", "-T")`` passes ``-T`` as an option. Pass
  ``pathlib.Path`` objects for file arguments.
* ``mcp``: :class:`~flakebot_magic.clients.mcp.McpTool`, one server process
  and a Python function per MCP tool.
* ``http``: :class:`~flakebot_magic.clients.http.HttpTool`, a service on
  127.0.0.1 and an httpx client bound to it.

Every kind starts with the allowlisted environment plus ``env`` (the
``tool_env`` setting): the kernel's API keys never reach a tool implicitly.
A deployed tool runs as the user, outside the sandbox, unless ``confine``
(the ``confine_tools`` setting) asks for the sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..clients.base import ToolClient
from ..clients.cli import CliTool, reads_stdin
from ..clients.contract import ToolContract, read_contract

__all__ = ["Tool", "ToolClient", "ToolContract", "contract_of", "make_tool", "reads_stdin"]

#: the reader of the contract (the name the pipeline uses)
contract_of = read_contract

#: the command-line tool's client (the name front ends and tests have always used)
Tool = CliTool


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
    timeout: float = 60.0,
    provenance: Mapping[str, Any] | None = None,
    lock_hash: str = "",
    start: bool = True,
    env: Mapping[str, str] | None = None,
    confine: bool = False,
) -> ToolClient:
    """The client for a deployed tool: CLI, MCP or HTTP, by ``contract``.

    With ``start``, an MCP server or HTTP service is started now (and its
    functions read); a CLI tool has nothing to start. ``env`` is added to the
    allowlisted environment of every start; ``confine`` runs the tool in the
    sandbox.
    """
    if not isinstance(contract, ToolContract):
        contract = ToolContract.from_json(contract, default_bin=binary.name)
    common: dict[str, Any] = dict(
        name=name, binary=binary, crate=crate, version=version, source_hash=source_hash, store_path=store_path,
        checksum=checksum, backend=backend, timeout=timeout, provenance=provenance, lock_hash=lock_hash,
        env=env, confine=confine,
    )
    if contract.kind == "mcp":
        from ..clients.mcp import McpTool

        mcp = McpTool(contract=contract, **common)
        return mcp.start() if start else mcp
    if contract.kind == "http":
        from ..clients.http import HttpTool

        http = HttpTool(contract=contract, **common)
        return http.start() if start else http
    return CliTool(**common)
