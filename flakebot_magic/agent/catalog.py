"""Every built tool's functions, for agents: names, input schemas, calls; read from the shared tool inventory.

The catalog reads the SQLite tool inventory (:mod:`flakebot_magic.records.inventory`)
on every listing, so a tool built anywhere (this server, a notebook, the
``flakebot`` command) is there the moment its record is. Each tool's client is
the one its kind already has (:func:`flakebot_magic.manage.tools.tool_of`): a
command-line tool's functions come from its ``--help`` (the MCP bridge's
schema), an MCP server's from its own ``tools/list`` (proxied), an HTTP
service's from its OpenAPI operations. A client is made once per store entry
and kept; a rebuilt tool (a new store entry) gets a new one.

A function is offered as ``NAME`` when the tool has one function of its own
name (a command-line tool), else as ``NAME_FUNCTION`` (``calc_add``): the
names ``tool.openai_tools()`` uses.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..clients import ToolClient
from ..clients.agents import ToolFunction, openai_tool, result_text
from ..clients.schema import check_arguments
from ..config import Settings
from ..host.fsutil import load_json
from ..manage.tools import tool_of
from ..records.inventory import DB_NAME, Inventory, ToolRecord
from ..untrusted import safe_text

__all__ = ["CatalogEntry", "ToolCatalog", "call_text", "decode_arguments", "exposed_name"]


def exposed_name(tool: str, fn: ToolFunction, count: int) -> str:
    """What an agent calls ``fn`` of ``tool`` (which has ``count`` functions)."""
    return tool if count == 1 and fn.name == tool else f"{tool}_{fn.name}"


@dataclass(frozen=True)
class CatalogEntry:
    """One function of one built tool, as an agent sees it."""

    name: str
    tool: str
    function: ToolFunction
    client: ToolClient

    def mcp(self) -> dict[str, Any]:
        """The ``tools/list`` entry: the schema the tool's client has."""
        description = self.function.description.strip() or self.client.description or f"Call {self.name}."
        return {
            "name": self.name,
            "title": f"{self.tool}: {self.client.crate} {self.client.version}",
            "description": description,
            # what is enforced, as the bridge says it: extra arguments are refused unless the tool takes them
            "inputSchema": self.function.enforced_schema,
        }

    def openai(self) -> tuple[dict[str, Any], tuple[str, ...]]:
        """The strict-mode OpenAI function, and its parameters written as JSON text."""
        return openai_tool(self.name, self.function)

    def invoke(self, arguments: Mapping[str, Any]) -> Any:
        """Call the function with arguments named as in its schema (checked first); its value."""
        fn, args = self.function, dict(arguments)
        if fn.wire is not None:
            check_arguments(args, fn.parameters, self.name)
            return fn.wire(args)
        return fn.function(**args)


def _record_key(record: ToolRecord) -> tuple[str, str, str, str]:
    return (record.store_path, record.source_hash, record.binary, record.kind)


class ToolCatalog:
    """The built tools' functions, kept fresh from the inventory.

    Parameters
    ----------
    settings
        Where the inventory is; the tools' timeout, environment and confinement.
    reserved
        Names that are flakebot's own (``build_tool`` ...): a tool function
        with such a name is left out, with a note on stderr.
    """

    def __init__(self, settings: Settings, *, reserved: frozenset[str] = frozenset()) -> None:
        self.settings = settings
        self.reserved = reserved
        self.inventory = Inventory(settings.cache.tools)
        self._clients: dict[str, tuple[tuple[str, str, str, str], ToolClient]] = {}
        self._entries: dict[str, tuple[tuple[str, str, str, str], list[CatalogEntry]]] = {}
        self._failed: dict[str, tuple[str, str, str, str]] = {}
        self._lock = threading.RLock()
        self._by_name: dict[str, CatalogEntry] = {}

    # -- the inventory ------------------------------------------------------------

    def stamp(self) -> tuple[int, ...]:
        """Changes whenever the inventory's files change (cheap: two stats, no SQLite)."""
        parts: list[int] = []
        for suffix in ("", "-wal"):
            try:
                stat = os.stat(self.inventory.dir / f"{DB_NAME}{suffix}")
            except OSError:
                parts += [0, 0]
                continue
            parts += [stat.st_mtime_ns, stat.st_size]
        return tuple(parts)

    def signature(self) -> tuple[tuple[str, str, str], ...]:
        """The tools as far as an agent's tool list goes: names and store entries."""
        return tuple((r.name, r.store_path, r.source_hash) for r in self.inventory.all())

    def adopt(self, tool: ToolClient) -> None:
        """Use ``tool`` (a client a build here just returned, already started) for its inventory record."""
        record = self.inventory.get(tool.name)
        if record is None:
            return
        with self._lock:
            key = _record_key(record)
            old = self._clients.get(tool.name)
            if old is not None and old[1] is not tool:
                old[1].close()
            self._clients[tool.name] = (key, tool)
            self._entries.pop(tool.name, None)
            self._failed.pop(tool.name, None)

    def client(self, record: ToolRecord) -> ToolClient:
        """The client of ``record``'s tool (made once per store entry)."""
        key = _record_key(record)
        with self._lock:
            held = self._clients.get(record.name)
            if held is not None and held[0] == key:
                return held[1]
            if held is not None:
                held[1].close()
            client: ToolClient = tool_of(record, self.settings)
            self._clients[record.name] = (key, client)
            self._entries.pop(record.name, None)
            return client

    # -- functions ---------------------------------------------------------------

    def entries(self) -> list[CatalogEntry]:
        """Every function of every built tool, by tool name (a tool that fails to start is left out)."""
        found: list[CatalogEntry] = []
        names: set[str] = set()
        with self._lock:
            records = self.inventory.all()
            for record in records:
                found += self._entries_of(record, names)
            for gone in set(self._clients) - {r.name for r in records}:
                self._clients.pop(gone)[1].close()
                self._entries.pop(gone, None)
            self._by_name = {e.name: e for e in found}
        return found

    def _entries_of(self, record: ToolRecord, taken: set[str]) -> list[CatalogEntry]:
        key = _record_key(record)
        cached = self._entries.get(record.name)
        if cached is not None and cached[0] == key:
            entries = cached[1]
        else:
            if self._failed.get(record.name) == key:
                return []
            try:
                client = self.client(record)
                functions = client.functions()
            except Exception as exc:  # one broken tool must not hide the others
                self._failed[record.name] = key
                print(safe_text(f"flakebot: tool {record.name} left out of the list: {exc}"), file=sys.stderr)
                return []
            entries = [
                CatalogEntry(exposed_name(record.name, fn, len(functions)), record.name, fn, client)
                for fn in functions.values()
            ]
            self._entries[record.name] = (key, entries)
        kept = []
        for entry in entries:
            if entry.name in self.reserved or entry.name in taken:
                print(f"flakebot: {entry.name} ({record.name}) left out: the name is taken", file=sys.stderr)
                continue
            taken.add(entry.name)
            kept.append(entry)
        return kept

    def find(self, name: str) -> CatalogEntry | None:
        """The function an agent calls ``name`` (the inventory is read again when it is not known yet)."""
        with self._lock:
            entry = self._by_name.get(name)
        if entry is not None:
            return entry
        return next((e for e in self.entries() if e.name == name), None)

    def close(self) -> None:
        """Stop the tool processes this catalog started."""
        with self._lock:
            for _, client in self._clients.values():
                client.close()
            self._clients.clear()
            self._entries.clear()


def call_text(entry: CatalogEntry, arguments: Mapping[str, Any]) -> tuple[str, Any]:
    """Run ``entry`` and give its value as text (what a model reads) and as itself."""
    value = entry.invoke(arguments)
    return result_text(value), value


def decode_arguments(text: str, json_text: tuple[str, ...] = ()) -> dict[str, Any]:
    """A model's arguments: a JSON object; ``null`` means not given; ``json_text`` names hold JSON as text."""
    args = load_json(text or "{}")
    if not isinstance(args, dict):
        raise ValueError("the arguments must be a JSON object")
    args = {k: v for k, v in args.items() if v is not None}
    for key in json_text:
        if isinstance(args.get(key), str):
            args[key] = load_json(args[key])
    return args
