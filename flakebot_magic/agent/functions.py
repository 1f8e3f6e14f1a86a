"""flakebot's own functions for agents: build_tool, search_crates, list_tools, tool_info (schemas and bodies).

The MCP server and the notebook's :func:`flakebot_magic.call` offer the same
functions with the same schemas; each answers with an :class:`Outcome`: the
text a model reads and, where there is one, a JSON object
(``structuredContent`` in MCP).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..clients import ToolClient
from ..config import Settings
from ..manage.crates import search_crates
from ..manage.tools import describe, table
from ..records.provenance import provenance_of

__all__ = ["BUILTINS", "BUILTIN_NAMES", "Outcome", "build_outcome", "list_tools", "search", "tool_info"]

#: name -> (description, input schema)
BUILTINS: dict[str, tuple[str, dict[str, Any]]] = {
    "build_tool": (
        "Build a new tool from a request in words: flakebot searches the Rust crate registry, forks the best "
        "crate, builds and tests it in a sandbox (with a model configured, the model writes what is missing) "
        "and deploys it. The new tool's functions join this tool list at once. Returns how to call it and "
        "where it came from. Takes seconds to minutes; ask for a tool only when no listed one does the job.",
        {
            "type": "object",
            "properties": {
                "request": {
                    "type": "string",
                    "description": "What the tool should do, in words (e.g. 'show a file as a hex dump').",
                },
                "name": {
                    "type": "string",
                    "description": "The tool's name, a Python identifier (default: from the crate's name).",
                },
                "crate": {"type": "string", "description": "Build this crate instead of searching for one."},
            },
            "required": ["request"],
            "additionalProperties": False,
        },
    ),
    "search_crates": (
        "Rank the registry's crates for a query (binaries first): name, version, description, score. "
        "Use it to pick a crate for build_tool.",
        {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What you are looking for, in words."},
                "limit": {"type": "integer", "description": "How many candidates (default 10).", "minimum": 1},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    ),
    "list_tools": (
        "The tools built on this machine: name, kind, crate and version, status.",
        {"type": "object", "properties": {}, "additionalProperties": False},
    ),
    "tool_info": (
        "One built tool's provenance (crate, checksum, commit, store path, who asked for it) and usage.",
        {
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The tool's name (list_tools shows them)."}},
            "required": ["name"],
            "additionalProperties": False,
        },
    ),
}
BUILTIN_NAMES = frozenset(BUILTINS)


@dataclass
class Outcome:
    """What a function answers: text for the model, a JSON object beside it."""

    text: str
    data: dict[str, Any] = field(default_factory=dict)


def search(settings: Settings, arguments: Mapping[str, Any]) -> Outcome:
    limit = int(arguments.get("limit") or 10)
    answer = search_crates(settings, str(arguments["query"]), limit=max(1, min(limit, 50)))
    text = answer.text or "\n".join(answer.notes)
    return Outcome(text, {"candidates": answer.data})


def list_tools(settings: Settings) -> Outcome:
    answer = table(settings, empty="No tools yet. Build one with build_tool.")
    tools = [
        {key: item.get(key) for key in ("name", "kind", "crate", "version", "status", "description", "requested_by")}
        for item in answer.data
    ]
    return Outcome(answer.text, {"tools": tools})


def tool_info(settings: Settings, name: str, client: ToolClient | None) -> Outcome:
    data = describe(settings, name)
    lines = [f"{key}: {value}" for key, value in data.items() if value not in (None, "")]
    usage = client.usage() if client is not None else ""
    return Outcome("\n".join(lines) + ("\n\n" + usage if usage else ""), {"provenance": data, "usage": usage})


def build_outcome(tool: ToolClient, functions: list[str], requested_by: str, tokens: int) -> Outcome:
    """What build_tool answers: the new functions, the tool's usage, its provenance in brief."""
    provenance = provenance_of(tool)
    origin = f"{provenance['crate']} {provenance['version']}"
    if provenance.get("model"):
        origin += f", written by {provenance['model']} in {provenance['iterations']} check runs"
    summary = (
        f"Built `{tool.name}` ({tool.kind}) from {origin}; store path {provenance['store_path']}, "
        f"source hash {str(provenance['source_hash'])[:16]}, requested by {requested_by}."
    )
    listed = ", ".join(functions) or "(none)"
    text = f"{summary}\nNew functions in this tool list: {listed}.\n\n{tool.usage()}"
    data = {
        "name": tool.name,
        "kind": tool.kind,
        "functions": functions,
        "requested_by": requested_by,
        "model_tokens": tokens,
        "provenance": {**provenance, "requested_by": requested_by},
    }
    return Outcome(text, data)
