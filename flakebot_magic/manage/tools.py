"""The deployed tools by name: list, show, logs, stop, search, for the magic, the command and the Jupyter server.

Everything here reads the SQLite tool inventory (:mod:`flakebot_magic.records.inventory`), so a kernel, the
``flakebot`` command and the Jupyter server extension see the same tools. Tools with a process of their own
(``http``, ``mcp``) are stopped through :mod:`flakebot_magic.clients.lifecycle` when this interpreter started them,
and by their recorded process group otherwise.

Each management command is written here once and answers with an
:class:`Answer`: ``data`` (what ``--json`` and the REST API give), ``text``
(what a person reads) and ``notes`` (what happened on the way). The front
doors only parse their arguments and print or display the answer: the magic
raises IPython's ``UsageError`` and displays tables, the command prints JSON
and returns exit codes. :func:`tool_json` is the one JSON shape of a tool.

An answer's ``text`` and ``notes`` are made safe to show when it is made
(:mod:`flakebot_magic.untrusted`): a crate's description, a log line, a
tool's output may be in them. Its ``data`` is made safe where it leaves as
JSON (the command's ``--json``, the REST API).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..clients import lifecycle, revisions, tool_from_record
from ..clients.kinds import a_noun, is_server, proxied
from ..commands import typed
from ..config import Settings
from ..errors import StorageError, UsageError
from ..host.process import alive, kill_tree
from ..host.storage import read_cache_json
from ..options import option
from ..records.inventory import Inventory, ToolRecord
from ..records.provenance import WorkspaceDiff, provenance_of, render_text, workspace_diff
from ..records.runlog import Attempt, attempt_of, attempts, cached_log_path, last_attempt_log, log_part, log_path
from ..records.sessions import SESSION_KEYS, render_with_sessions, session_parts
from ..untrusted import make_fields_safe, safe_html, safe_line, safe_text
from .status import BROKEN, same_process, status_of, why_gone

__all__ = [
    "BROKEN",
    "NO_TOOLS",
    "SESSION_KEYS",
    "TOOL_JSON_KEYS",
    "Answer",
    "CommandResult",
    "ToolTable",
    "describe",
    "diff_of",
    "diffs_of",
    "find",
    "load",
    "load_all",
    "logs",
    "show",
    "show_text",
    "status_of",
    "steer",
    "stop",
    "stop_all",
    "stop_tools",
    "table",
    "tool_json",
    "tool_logs",
    "tool_of",
]

#: the width ``search`` wraps its lines at (a terminal's, a notebook's)
SEARCH_WIDTH = 88
#: the columns of ``%flakebot list``
COLUMNS = ("name", "kind", "crate@version", "hash", "backend", "status", "started")


def find(settings: Settings, name: str) -> ToolRecord:
    """The record of tool ``name``; a :class:`UsageError` naming the known tools when there is none.

    A name whose last build made no tool (failed, cancelled, unfit) says so, and how to look at it.
    """
    record = Inventory(settings.cache.tools).get(name)
    if record is None:
        attempt = attempt_of(settings, name)
        if attempt is not None:
            raise UsageError(
                f"{name!r} is not a tool: its last build {attempt.ended} ({_when(attempt.at)}): {attempt.error} "
                f"{typed(f'show {name}')} and {typed(f'logs {name}')} say more; build it again with %%flakebot."
            )
        known = ", ".join(r.name for r in Inventory(settings.cache.tools).all()) or "none yet"
        raise UsageError(f"No tool named {name!r} (tools: {known}). {typed('list')} shows them.")
    return record


def _manifest(record: ToolRecord) -> dict[str, Any]:
    """The store entry's manifest, with the record's own commit: a shared entry's top level is its last builder's."""
    try:
        data: dict[str, Any] = read_cache_json(Path(record.store_path) / "manifest.json")
    except (OSError, StorageError):
        data = {}
    if record.commit:
        data["commit"] = record.commit
    data["request"] = record.request
    return data


def tool_of(record: ToolRecord, settings: Settings | None = None, *, check: bool = True) -> Any:
    """A record's client (not started), its entry checked first unless ``check=False`` (show, tool_json only)."""
    return tool_from_record(
        record,
        provenance=_manifest(record),
        timeout=settings.tool_timeout if settings else option("tool_timeout").default,
        env=settings.tool_env if settings else None,
        confine=settings.confine_tools if settings else option("confine_tools").default,
        home=settings.cache.root if settings else None,
        check=check,
    )


def load(settings: Settings, name: str) -> Any:
    """Tool ``name``, built earlier, ready to call: never rebuilt, started when its kind has a process.

    A command-line tool is its client; an MCP server or HTTP service is
    started (its record follows its process, as after a build). This is how a
    tool comes back after a kernel restart. A tool whose store entry was removed (``clean``) is a
    :class:`UsageError`, a damaged one :class:`~flakebot_magic.errors.CacheFileDamaged`; both say how to rebuild it.
    """
    record = find(settings, name)
    if not (binary := Path(record.binary)).is_file():
        raise UsageError(
            f"The tool {name!r} is registered, but its binary {binary} is gone ({why_gone(record)}). "
            f"Build it again with {typed(f'rebuild {name}')}."
        )
    tool = tool_of(record, settings)
    if tool.server:  # an MCP server or HTTP service runs from now on, as after its build
        inventory = Inventory(settings.cache.tools)
        tool.on_state = lambda **changes: inventory.update(name, **changes)
        tool.start()
    return tool


def load_all(settings: Settings) -> tuple[dict[str, Any], list[str]]:
    """Every registered tool :func:`load` can load, by name; and why each other one could not be."""
    loaded: dict[str, Any] = {}
    problems: list[str] = []
    for record in Inventory(settings.cache.tools).all():
        try:
            loaded[record.name] = load(settings, record.name)
        except Exception as exc:  # one broken tool must not keep the others out
            problems.append(f"{record.name}: not loaded: {exc}")
    return loaded, problems


def describe(settings: Settings, name: str) -> dict[str, Any]:
    """The provenance of tool ``name`` (what ``%flakebot show`` prints)."""
    record = find(settings, name)
    data = _provenance(tool_of(record, settings, check=False), record)
    data.update(kind=record.kind, status=record.status, built=_when(record.created))
    if record.protocol:  # an MCP server: the revision it spoke at its last start
        data["protocol"] = revisions.describe(record.protocol)
    if record.url:
        data["url"] = record.url
    from ..llm.usage import cost_usd
    from ..records.journal import spent  # the edit loop's modules load only when asked

    total, sessions = spent(settings.cache_dir, name)
    if sessions:  # every edit session of the tool, not only the last build's
        cost = cost_usd(total, record.model, settings.prices) if record.model else None
        data["usage_all_sessions"] = {**total.to_json(), "sessions": sessions, "cost_usd": cost}
    return data


def _workspace_of(settings: Settings, tool: Any) -> tuple[Path, str]:
    record = Inventory(settings.cache.tools).get(tool.name)
    workspace = (
        Path(record.workspace) if record is not None and record.workspace else settings.cache.workspaces / tool.name
    )
    return workspace, (getattr(tool, "provenance", None) or {}).get("commit") or "HEAD"


def diff_of(settings: Settings, tool: Any) -> WorkspaceDiff | None:
    """What flakebot changed in ``tool``'s workspace against the published crate (None without a workspace)."""
    return workspace_diff(*_workspace_of(settings, tool))


def diffs_of(settings: Settings, tool: Any, *, since: str = "") -> list[WorkspaceDiff]:
    """:func:`diff_of`; with ``since`` (a follow-up's starting commit), also the changes since that version."""
    workspace, commit = _workspace_of(settings, tool)
    found = [workspace_diff(workspace, commit)]
    if since:
        found.append(workspace_diff(workspace, commit, base=since))
    return [diff for diff in found if diff is not None]


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else ""


def _started(record: ToolRecord) -> str:
    return _when(record.started or record.created)


#: what ``list`` says when there is no tool yet, in a notebook
NO_TOOLS = "No tools yet. Build one with %%flakebot."


@dataclass
class ToolTable:
    """``list``: the tools as a table (text, and HTML in a notebook); ``data`` is each one's :func:`tool_json`.

    ``empty`` is what the table says without tools (each front door says how
    to build one there).
    """

    records: list[ToolRecord]
    settings: Settings | None = None
    empty: str = NO_TOOLS
    notes: tuple[str, ...] = ()
    #: builds that made no tool (failed, cancelled, unfit), for names without one: listed with their outcome
    attempts: list[Attempt] = field(default_factory=list)

    def _entries(self) -> list[ToolRecord | Attempt]:
        return sorted([*self.records, *self.attempts], key=lambda entry: entry.name)

    def rows(self) -> list[tuple[str, ...]]:
        rows: list[tuple[str, ...]] = []
        for entry in self._entries():
            if isinstance(entry, Attempt):
                cells = (entry.name, "-", entry.crate.replace(" ", "@") or "-", "", "", entry.outcome, _when(entry.at))
                rows.append(tuple(safe_line(cell) for cell in cells))
            else:
                r = entry
                cells = (
                    r.name,
                    r.kind,
                    f"{r.crate}@{r.version}",
                    r.source_hash[:12],
                    r.backend,
                    status_of(r),
                    _started(r),
                )
                rows.append(tuple(safe_line(cell) for cell in cells))
        return rows

    @property
    def data(self) -> list[dict[str, Any]]:
        return [tool_json(e, self.settings) for e in self._entries()]

    @property
    def text(self) -> str:
        if not self.records and not self.attempts:
            return self.empty
        rows = [COLUMNS, *self.rows()]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        if not self.records and not self.attempts:
            return f"<p>{safe_html(self.empty).replace('%%flakebot', '<code>%%flakebot</code>')}</p>"
        head = "".join(f"<th style='text-align:left'>{safe_html(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>"
            + "".join(
                f"<td style='text-align:left'>{f'<code>{safe_html(cell)}</code>' if cell.strip('-') else cell}</td>"
                for cell in row
            )
            + "</tr>"
            for row in self.rows()
        )
        return f"<table class='flakebot-tools'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def table(settings: Settings, *, empty: str = NO_TOOLS) -> ToolTable:
    """``list``: every tool, and every name whose last build made no tool (its status ``failed``, ``cancelled`` or ``unfit``)."""
    records = Inventory(settings.cache.tools).all()
    names = {r.name for r in records}
    return ToolTable(records, settings, empty, attempts=[a for a in attempts(settings) if a.name not in names])


def logs(settings: Settings, name: str, *, last: int | None = 200) -> str:
    """The log of the build that made tool ``name`` and, for a tool with a process this interpreter started, its output.

    A later run that only found the tool in the cache, or that failed or
    was cancelled, has its own log: the text says where. A name whose build
    made no tool shows that build's log.
    """
    record = Inventory(settings.cache.tools).get(name)
    attempt = attempt_of(settings, name)
    parts = []
    if record is None:
        if attempt is None:
            # a run killed between writing its log and its record; older versions kept a failed build's log as NAME.log
            found = log_part("the last build's log", last_attempt_log(settings, name), last)
            found = found or log_part("build log", log_path(settings, name), last)
            if not found:
                find(settings, name)  # raises, naming the tools there are
            return found
        parts.append(f"== {name} is not a tool: its last build {attempt.ended} ({_when(attempt.at)}): {attempt.error}")
        parts.append(log_part("that build's log", Path(attempt.log), last) or f"== its log is gone: {attempt.log}")
        return safe_text("\n".join(parts))
    if attempt is not None:
        parts.append(
            f"== a later build of {name} {attempt.ended} ({_when(attempt.at)}); {name} is still the tool built "
            f"before, whose log follows. That attempt's log: {attempt.log}"
        )
    path = Path(record.log_path) if record.log_path else log_path(settings, name)
    parts.append(
        log_part("build log", path, last)
        or f"== no build log kept for {name} (built before logs were kept, or cleaned)"
    )
    cached = cached_log_path(settings, name)
    if cached.is_file():
        parts.append(
            f"== later runs found {name} in the cache and built nothing; the last one's log: {cached} "
            f"({_when(cached.stat().st_mtime)})"
        )
    if is_server(record.kind):
        try:
            output = lifecycle.logs(name, settings.cache.root, last)
            parts.append(f"== {record.kind} process output\n{output.rstrip()}")
        except KeyError:  # no process of it started here
            parts.append(f"== {name}'s process output is kept by the interpreter that started it")
    return safe_text("\n".join(parts))  # a tool process's output too


def stop(settings: Settings, name: str, *, grace: float = 2.0) -> str:
    """Stop tool ``name``'s process; return what happened, in words."""
    record = find(settings, name)
    inventory = Inventory(settings.cache.tools)
    if not is_server(record.kind):
        return f"{name} is {a_noun(record.kind)}: it runs only while called, so there is nothing to stop."
    if lifecycle.stop(name, settings.cache.root):
        inventory.update(name, status="stopped", pid=None)
        return f"stopped {name}"
    pid = record.pid
    if record.status == "running" and alive(pid):
        assert pid is not None
        if not same_process(pid, record):
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
    return [result["message"] for result in stop_tools(settings).data]


def show_text(settings: Settings, name: str) -> str:
    """``show`` for a person: the provenance as aligned ``key: value`` lines (an edit's usage and candidates in words)."""
    return render_with_sessions(describe(settings, name))


# -- one JSON shape of a tool ------------------------------------------------------------


#: the keys :func:`tool_json` adds to the record's own (:meth:`ToolRecord.public_json`)
TOOL_JSON_KEYS = ("status", "provenance", "links", "usage", "example", "reads_stdin", "lock_hash")


def tool_json(subject: ToolRecord | Attempt | Any, settings: Settings | None = None) -> dict[str, Any]:
    """A tool as JSON: what ``flakebot build/list/show --json``, the REST API and the dashboard give.

    ``subject`` is a :class:`~flakebot_magic.records.inventory.ToolRecord` or a
    loaded tool (what a build returns; its record is read from ``settings``' tool
    inventory). The keys are the record's fields without its secret token
    (``name``, ``kind``, ``crate``, ``version``, ``binary``, ``store_path``,
    ``source_hash``, ``checksum``, ``backend``, ``workspace``, ``commit``,
    ``request``, ``url``, ``pid``, ...; see
    :class:`~flakebot_magic.records.inventory.ToolRecord`), and :data:`TOOL_JSON_KEYS`:

    ``status``
        ``ready``, ``running``, ``stopped`` or ``failed``; a recorded process
        that is gone reads ``stopped``.
    ``provenance``
        :func:`~flakebot_magic.records.provenance.provenance_of`: crate, checksum,
        commit, store path, flake lock, backend, model, iterations, rustc;
        and, when its edit sessions recorded them (:data:`SESSION_KEYS`),
        ``usage`` (``prompt_tokens``, ``completion_tokens``,
        ``cached_tokens``, ``calls``, ``cost_usd``: null without a price),
        ``winner`` (the index of the candidate deployed) and ``candidates``
        (each with ``index``, ``status``, ``crate`` and its score's parts).
    ``links``
        The Jupyter server extension's paths for the tool: ``self``,
        ``logs``, ``stop``, and ``proxy`` for an http tool.
    ``usage``, ``example``, ``reads_stdin``
        How to call it. Known only from a loaded tool (learning them may run
        the tool); null when rendering a record (listings never start a tool).
    ``lock_hash``
        ``sha256-...`` of the flake.lock it was built with, or ``""``.

    A name whose last build made no tool (an
    :class:`~flakebot_magic.records.runlog.Attempt`) has the same keys: ``status``
    ``failed``, ``cancelled`` or ``unfit``, the error in ``description`` and ``extra``
    (``error``, ``error_kind``), its ``request``, kept ``workspace`` and
    ``log_path``; what only a tool has is empty.

    Examples
    --------
    >>> tool_json(record, settings)["links"]["self"]             # doctest: +SKIP
    '/flakebot/api/tools/md'
    """
    if isinstance(subject, Attempt):
        data = subject.as_record().public_json()
        api = f"/flakebot/api/tools/{subject.name}"
        data.update(provenance={}, links={"self": api, "logs": f"{api}/logs"}, lock_hash="")
        return data | {key: None for key in ("usage", "example", "reads_stdin")}
    loaded = None if isinstance(subject, ToolRecord) else subject
    record = subject if isinstance(subject, ToolRecord) else _record_of(subject, settings)
    data = record.public_json()
    data["status"] = status_of(record)
    data["provenance"] = _provenance(loaded if loaded is not None else tool_of(record, settings, check=False), record)
    api = f"/flakebot/api/tools/{record.name}"
    links = {"self": api, "logs": f"{api}/logs", "stop": f"{api}/stop"}
    if proxied(record.kind):
        links["proxy"] = f"/flakebot/proxy/{record.name}/"
    data["links"] = links
    data["usage"] = loaded.usage() if loaded is not None else None
    data["example"] = loaded.example() if loaded is not None else None
    data["reads_stdin"] = bool(loaded.reads_stdin) if loaded is not None else None
    data["lock_hash"] = getattr(loaded, "lock_hash", "") or data["provenance"].get("flake_lock") or ""
    return data


def _provenance(tool: Any, record: ToolRecord | None) -> dict[str, Any]:
    """:func:`provenance_of`, with what the tool's edit sessions recorded (:data:`SESSION_KEYS`)."""
    data = provenance_of(tool, record)
    for key, value in session_parts(getattr(tool, "provenance", None), record.extra if record else None).items():
        if data.get(key) is None:
            data[key] = value
    return data


def _record_of(tool: Any, settings: Settings | None) -> ToolRecord:
    """The inventory's record of a loaded tool; one made from the tool when the inventory has none."""
    record = Inventory(settings.cache.tools).get(tool.name) if settings is not None else None
    if record is not None:
        return record
    manifest: dict[str, Any] = dict(getattr(tool, "provenance", None) or {})
    return ToolRecord.stand_in(
        tool.name,
        crate=tool.crate,
        version=tool.version,
        binary=str(tool.binary),
        store_path=str(tool.store_path),
        source_hash=tool.source_hash,
        checksum=tool.checksum,
        checksum_kind=str(manifest.get("checksum_kind") or ""),
        registry=str(manifest.get("registry") or ""),
        commit=str(manifest.get("commit") or ""),
        backend=tool.backend,
        kind=tool.kind,
        description=str(getattr(tool, "description", "") or ""),
    )


# -- the management commands, written once ------------------------------------------------


class Answer(Protocol):
    """What a management command answers; the front doors only print or display it.

    ``data`` is JSON-able (``--json``, the REST API), ``text`` is for a person
    (may be empty), ``notes`` say what happened on the way (the command
    prints them on stderr, the magic before the text).
    """

    @property
    def data(self) -> Any: ...

    @property
    def text(self) -> str: ...

    @property
    def notes(self) -> Sequence[str]: ...


@dataclass(frozen=True)
class CommandResult:
    """An :class:`Answer` that is just its parts."""

    data: Any
    text: str
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        make_fields_safe(self)

    def __str__(self) -> str:
        return self.text


def show(settings: Settings, name: str) -> CommandResult:
    """``show NAME``: the tool as :func:`tool_json`; as text, its provenance.

    A name whose last build made no tool: that build (its :func:`tool_json`).
    """
    if Inventory(settings.cache.tools).get(name) is None:
        attempt = attempt_of(settings, name)
        if attempt is not None:
            error = f"{attempt.kind}: {attempt.error}" if attempt.kind else attempt.error
            shown = {"name": name, "status": attempt.outcome, "error": error, "request": attempt.request}
            shown |= {"crate": attempt.crate, "workspace": attempt.workspace, "ended": _when(attempt.at)}
            return CommandResult(tool_json(attempt, settings), render_text({**shown, "log": attempt.log}))
    record = find(settings, name)
    return CommandResult(tool_json(record, settings), show_text(settings, name))


def steer(settings: Settings, name: str, text: str, *, source: str = "cli") -> CommandResult:
    """``steer NAME TEXT``: queue ``text`` for the running edit session of ``name``.

    The session gives it to the model as a user message in its next
    request. Any process on the machine may steer (the queue is in the cache
    dir). No running session, empty or too long text: a
    :class:`~flakebot_magic.errors.UsageError` that says what to do. The
    data is ``{"name", "text", "source", "queued"}``.
    """
    from ..records.steering import send

    path = send(settings.cache, name, text, source=source)
    return CommandResult(
        {"name": name, "text": text, "source": source, "queued": str(path)},
        f"Queued for {name}'s edit session; the model reads it in its next request.",
    )


def tool_logs(settings: Settings, name: str, *, last: int | None = 200) -> CommandResult:
    """``logs NAME``: :func:`logs` as text; as data ``{"name", "text"}``."""
    text = logs(settings, name, last=last)
    return CommandResult({"name": name, "text": text}, text)


def stop_tools(settings: Settings, name: str | None = None) -> CommandResult:
    """``stop NAME`` (or every running tool, when ``name`` is None).

    The data is a list of ``{"name", "message", "status"}``, one per tool stopped or asked to stop.
    """
    inventory = Inventory(settings.cache.tools)
    if name is not None:
        names = [name]
    else:
        names = [r.name for r in inventory.all() if is_server(r.kind) and status_of(r) == "running"]
    results = []
    for each in names:
        message = stop(settings, each)
        record = inventory.get(each)
        results.append({"name": each, "message": message, "status": status_of(record) if record else "stopped"})
    text = "\n".join(r["message"] for r in results) or "No tool is running."
    return CommandResult(results, text)
