"""flakebot for agents: ``flakebot mcp`` (an MCP server whose tool list grows as tools are built) and, in a
notebook, :func:`agent_tools` and :func:`call` (OpenAI function calling).

* :mod:`.builds`: an agent's builds, within the agent limits, recording who asked;
* :mod:`.catalog`: every built tool's functions, from the shared tool inventory;
* :mod:`.functions`: flakebot's own functions (build_tool, search_crates, list_tools, tool_info);
* :mod:`.mcp`: one MCP session (JSON-RPC), :mod:`.stdio` and :mod:`.http` its transports;
* :mod:`.notebook`: the same functions as OpenAI tools in a kernel (:func:`call`, and :func:`acall` to await);
* :mod:`.command`: the ``flakebot mcp`` subcommand.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .builds import AgentSession
    from .notebook import acall, agent_tools, call, mcp_config

__all__ = ["AgentSession", "acall", "agent_tools", "call", "mcp_config"]

# imported on first use: `flakebot --help` (which reads .command) must not load the pipeline
_HOMES = {
    "AgentSession": "builds",
    "acall": "notebook",
    "agent_tools": "notebook",
    "call": "notebook",
    "mcp_config": "notebook",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
