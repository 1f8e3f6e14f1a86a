"""Clients for deployed tools: CLI binaries, MCP servers, HTTP services; their contract and lifecycle.

A leaf layer: it imports only foundation modules (errors, process, sandbox,
provenance, inventory, fsutil), never a stage, the pipeline or a front door.

* :mod:`.kinds`: the table of tool kinds (``KINDS``: each kind's client class, whose attributes are its
  behaviour); no other module compares kind names.
* :mod:`.contract`: ``[package.metadata.flakebot]``, read and checked
  (:func:`~.contract.read_contract`).
* :mod:`.factory`: the client of a tool, by its kind (:func:`make_tool`,
  :func:`tool_from_record`).
* :mod:`.base` (what every client has), :mod:`.cli_tool` with :mod:`.cli_tool_help` (a call is a
  :class:`~flakebot_magic.host.exchange.Exchange`), :mod:`.mcp`, :mod:`.http`; :mod:`.lifecycle` (the tools'
  processes), :mod:`.bridge` (any tool over MCP), :mod:`.agents` and
  :mod:`.schema` (function schemas).

Importing this package is cheap (httpx is imported by the HTTP client only).
Front ends manage running tools by name::

    from flakebot_magic import clients
    clients.running()        # ["calc", "svc"]
    clients.logs("svc")      # the service's recent output
    clients.stop("svc")      # what %flakebot stop svc calls
"""

from __future__ import annotations

from .base import ToolClient
from .contract import ToolContract, read_contract
from .factory import make_tool, tool_from_record
from .lifecycle import logs, running, stop, stop_all

__all__ = [
    "ToolClient",
    "ToolContract",
    "logs",
    "make_tool",
    "read_contract",
    "running",
    "stop",
    "stop_all",
    "tool_from_record",
]
