"""The deployed tools by name: list, show, logs, stop, rebuild, for the magic, the command and the Jupyter server.

Everything here reads the SQLite tool registry (:mod:`flakebot_magic.inventory`),
so a kernel, the ``flakebot`` command and the Jupyter server extension see the
same tools. Tools with a process of their own (``http``, ``mcp``) are stopped
through :mod:`flakebot_magic.clients.lifecycle` when this interpreter started
them, and by their recorded process group otherwise.
"""

from __future__ import annotations

import html
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import Settings
from .errors import UsageError
from .inventory import Inventory, ToolRecord
from .process import kill_tree, process_started_at
from .provenance import WorkspaceDiff, provenance_of, render_text, workspace_diff
from .runlog import log_path

__all__ = [
    "ToolTable", "describe", "diff_of", "find", "logs", "show_text", "status_of", "stop", "stop_all", "table", "tool_of",
]

#: the columns of ``%flakebot list``
COLUMNS = ("name", "kind", "crate@version", "hash", "backend", "status", "started")


def find(settings: Settings, name: str) -> ToolRecord:
    """The record of tool ``name``; a :class:`UsageError` naming the known tools when there is none."""
    record = Inventory(settings.tools_dir).get(name)
    if record is None:
        known = ", ".join(r.name for r in Inventory(settings.tools_dir).all()) or "none yet"
        raise UsageError(f"No tool named {name!r} (tools: {known}). `%flakebot list` shows them.")
    return record


def _manifest(record: ToolRecord) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((Path(record.store_path) / "manifest.json").read_text())
    except (OSError, ValueError):
        data = {}
    return data


def tool_of(record: ToolRecord, settings: Settings | None = None) -> Any:
    """A callable :class:`~flakebot_magic.stages.client.Tool` for a command-line tool's record."""
    from .stages.client import Tool

    return Tool(
        name=record.name, binary=Path(record.binary), crate=record.crate, version=record.version,
        source_hash=record.source_hash, store_path=Path(record.store_path), checksum=record.checksum,
        backend=record.backend, timeout=settings.tool_timeout if settings else 60.0,
        provenance=_manifest(record),
        env=settings.tool_env if settings else None, confine=settings.confine_tools if settings else False,
    )


def describe(settings: Settings, name: str) -> dict[str, Any]:
    """The provenance of tool ``name`` (what ``%flakebot show`` prints)."""
    record = find(settings, name)
    data = provenance_of(tool_of(record, settings), record)
    data.update(kind=record.kind, status=record.status, built=_when(record.created))
    if record.url:
        data["url"] = record.url
    return data


def diff_of(settings: Settings, tool: Any) -> WorkspaceDiff | None:
    """What flakebot changed in ``tool``'s workspace against the published crate (None without a workspace)."""
    record = Inventory(settings.tools_dir).get(tool.name)
    workspace = Path(record.workspace) if record is not None and record.workspace else settings.workspaces_dir / tool.name
    commit = (getattr(tool, "provenance", None) or {}).get("commit") or "HEAD"
    return workspace_diff(workspace, commit)


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else ""


def _started(record: ToolRecord) -> str:
    return _when(record.started or record.created)


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _same_process(pid: int, record: ToolRecord) -> bool:
    """Whether ``pid`` is still the process the record names: it started no later than recorded."""
    started = process_started_at(pid)
    if started is None or not record.started:
        return False
    return started <= record.started + 1.0  # a reused PID started after the record was written


def status_of(record: ToolRecord) -> str:
    """The record's status, corrected when a recorded process is gone."""
    # a recorded "running" whose process is gone (kernel restarted, machine rebooted) is stale
    if record.status == "running" and record.pid and not (_alive(record.pid) and _same_process(record.pid, record)):
        return "stopped"
    return record.status


@dataclass
class ToolTable:
    """``%flakebot list``: a table as text, and as HTML in a notebook."""

    records: list[ToolRecord]

    def rows(self) -> list[tuple[str, ...]]:
        return [
            (r.name, r.kind, f"{r.crate}@{r.version}", r.source_hash[:12], r.backend, status_of(r), _started(r))
            for r in self.records
        ]

    def __repr__(self) -> str:
        if not self.records:
            return "No tools yet. Build one with %%flakebot."
        rows = [COLUMNS, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)

    def _repr_html_(self) -> str:
        if not self.records:
            return "<p>No tools yet. Build one with <code>%%flakebot</code>.</p>"
        head = "".join(f"<th style='text-align:left'>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td><code>{html.escape(cell)}</code></td>" for cell in row) + "</tr>"
            for row in self.rows()
        )
        return f"<table class='flakebot-tools'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def table(settings: Settings) -> ToolTable:
    return ToolTable(Inventory(settings.tools_dir).all())


def _lifecycle() -> Any:
    try:
        from .clients import lifecycle
    except ImportError:
        return None
    return lifecycle


def logs(settings: Settings, name: str, *, last: int | None = 200) -> str:
    """The tool's build log and, for a tool with a process this interpreter started, its output.

    A failed build has no tool record but keeps its log: that log is shown.
    """
    record = Inventory(settings.tools_dir).get(name)
    if record is None:
        failed = log_path(settings, name)
        if not failed.is_file():
            find(settings, name)  # raises, naming the tools there are
        record = ToolRecord(name=name, crate="", version="", binary="", store_path="", source_hash="",
                            checksum="", checksum_kind="", registry="", workspace="", commit="")
    parts = []
    path = Path(record.log_path) if record.log_path else log_path(settings, name)
    try:
        text = path.read_text()
    except OSError:
        text = ""
    if text:
        lines = text.splitlines()
        if last and len(lines) > last:
            lines = [f"… {len(lines) - last} earlier lines in {path}", *lines[-last:]]
        parts.append(f"== build log ({path})\n" + "\n".join(lines))
    else:
        parts.append(f"== no build log kept for {name} (built before logs were kept, or cleaned)")
    if record.kind != "cli":
        lifecycle = _lifecycle()
        output = None
        if lifecycle is not None:
            try:
                output = lifecycle.logs(name, last)
            except KeyError:
                output = None
        if output is not None:
            parts.append(f"== {record.kind} process output\n{output.rstrip()}")
        else:
            parts.append(f"== {name}'s process output is kept by the interpreter that started it")
    return "\n".join(parts)


def stop(settings: Settings, name: str, *, grace: float = 2.0) -> str:
    """Stop tool ``name``'s process; return what happened, in words."""
    record = find(settings, name)
    inventory = Inventory(settings.tools_dir)
    if record.kind == "cli":
        return f"{name} is a command-line tool: it runs only while called, so there is nothing to stop."
    lifecycle = _lifecycle()
    if lifecycle is not None and lifecycle.stop(name):
        inventory.update(name, status="stopped", pid=None)
        return f"stopped {name}"
    pid = record.pid
    if record.status == "running" and _alive(pid):
        assert pid is not None
        if not _same_process(pid, record):
            # the tool is gone and its PID now belongs to another process: never signal that one
            inventory.update(name, status="stopped", pid=None)
            return f"{name} is not running (its recorded pid {pid} now belongs to another process)."
        try:
            kill_tree(pid, grace=grace)
        except PermissionError:
            return f"{name} (pid {pid}) belongs to another user; not stopped."
        inventory.update(name, status="stopped", pid=None)
        return f"stopped {name} (process group {pid})"
    if record.status == "running":
        inventory.update(name, status="stopped", pid=None)
    return f"{name} is not running."


def stop_all(settings: Settings) -> list[str]:
    """Stop every tool that has a running process; return what happened to each."""
    return [
        stop(settings, r.name)
        for r in Inventory(settings.tools_dir).all()
        if r.kind != "cli" and status_of(r) == "running"
    ]


def show_text(settings: Settings, name: str) -> str:
    return render_text(describe(settings, name))
