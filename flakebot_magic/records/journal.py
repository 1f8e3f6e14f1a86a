"""The journal of an edit session: every message, reply, check run and steering message, as JSON lines that survive ``kill -9``.

One file per session, ``<cache>/journals/<name>/<session>.jsonl`` (mode
0600, in 0700 directories: in the private cache, outside every sandbox
bind, so no code the model writes can touch it). One JSON object a line,
``"t"`` its type:

``start``
    request, follow_up, model, base_url, candidate, workspace, base_commit,
    run (the build it belongs to: candidates of one build share it),
    resumes (the session this one continues, or null), at
``message``
    one message appended to the conversation (``m``), in order; a message
    over :data:`MAX_RECORD_BYTES` is kept cut in the middle, ``"capped": true``
``reply``
    the usage of one model reply (:meth:`flakebot_magic.llm.usage.Usage.to_json`)
``check``
    iteration, run, commit (where the check run left the workspace), tree,
    green, report (the text the model read)
``steer``
    text, source
``end``
    status (``finished``, ``failed``, ``cancelled``, ``budget``), error

Each line is written with one ``write`` and ``fsync``-ed before the session
goes on; a line torn by a crash is the last one and is skipped when read.

A resumed session writes a journal of its own whose ``start`` names the
session it resumes, and records only what it adds: its conversation
continues the resumed one's. :meth:`Journal.last_unfinished` follows that
chain back, so a session resumed twice still carries the whole conversation,
its check results (by tree) and its usage.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from ..host.cache import CacheLayout
from ..host.fsutil import check_no_symlinks, fsync_dir, load_json, private_dir, read_regular
from ..host.names import check_tool_name
from ..llm.context import cap_middle
from ..llm.usage import Usage

__all__ = [
    "MAX_RECORD_BYTES",
    "STATUSES",
    "Journal",
    "KnownCheck",
    "ResumePoint",
    "journals_dir",
    "race_points",
    "spent",
]

#: a record longer than this (a message holding a whole file, 5 MB of test output) is cut in the middle
MAX_RECORD_BYTES = 256 * 1024
#: how the sessions end; all but "finished" can be resumed
STATUSES = ("finished", "failed", "cancelled", "budget")
EndStatus = Literal["finished", "failed", "cancelled", "budget"]
#: the journals kept per tool (the oldest beyond are removed when a session starts, never a chain being resumed)
KEEP_JOURNALS = 32
#: a journal larger than this is read only this far (a session of thousands of turns)
_MAX_JOURNAL_BYTES = 1 << 30
_SESSION = re.compile(r"\d{8}-\d{6}-\d{9}-\d+(-\d+)?")


def journals_dir(cache_dir: Path, name: str) -> Path:
    """``<cache>/journals/<name>``: the journals of tool ``name``'s edit sessions."""
    return CacheLayout(Path(cache_dir)).journals / check_tool_name(name)


def _cap_strings(value: Any, limit: int) -> Any:
    """``value`` with every string longer than ``limit`` bytes cut in the middle (dicts and lists walked)."""
    if isinstance(value, str):
        return cap_middle(value, limit) if len(value) > limit // 4 else value
    if isinstance(value, Mapping):
        return {key: _cap_strings(item, limit) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_cap_strings(item, limit) for item in value]
    return value


def _encode(record: Mapping[str, Any]) -> bytes:
    # ASCII: a lone surrogate (a file's undecodable byte, kept by surrogateescape) survives as an escape
    return json.dumps(record, separators=(",", ":"), default=str).encode("ascii")


def _bounded(record: dict[str, Any], field_name: str) -> dict[str, Any]:
    """``record`` with its ``field_name`` cut until the whole record is under :data:`MAX_RECORD_BYTES`."""
    if len(_encode(record)) <= MAX_RECORD_BYTES:
        return record
    limit = MAX_RECORD_BYTES // 2
    while True:  # escaping can make JSON longer than its text: halve the strings until the record fits
        capped = {**record, field_name: _cap_strings(record[field_name], limit), "capped": True}
        if len(_encode(capped)) <= MAX_RECORD_BYTES or limit < 256:
            return capped
        limit //= 2


@dataclass(frozen=True)
class KnownCheck:
    """A check run's result as the journal kept it: what the model read, and whether it was green."""

    report: str
    green: bool
    commit: str = ""
    iteration: int = 0
    run: int = 0
    #: the record as written (what the session added: the ratchet's state, the binaries built, test counts)
    record: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class ResumePoint:
    """Where an unfinished session stopped, read from its journal and those of the sessions it resumed.

    ``path`` and ``session``: the newest journal (name it with
    ``Journal.create(..., resumes=point)``); ``start``: the first session's
    start record (the request and ``base_commit`` of the work);
    ``messages``: the whole conversation; ``last_commit``: where the last
    check run left the workspace (the start's ``base_commit`` before any);
    ``checks_by_tree``: the known check results by git tree hash;
    ``iterations`` and ``runs``: the highest numbers used; ``usage``: tokens
    spent over the chain; ``status``: the newest session's end status (None:
    it never ended, killed or crashed) and ``error``; ``chain``: the journals,
    oldest first.
    """

    path: Path
    session: str
    start: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    last_commit: str = ""
    checks_by_tree: dict[str, KnownCheck] = field(default_factory=dict)
    iterations: int = 0
    runs: int = 0
    usage: Usage = field(default_factory=Usage)
    steers: list[dict[str, str]] = field(default_factory=list)
    status: str | None = None
    error: str = ""
    chain: list[Path] = field(default_factory=list)
    #: some message records were kept cut (over MAX_RECORD_BYTES)
    capped: bool = False
    #: the last check run of the chain
    last_check: KnownCheck | None = None


class Journal:
    """An open journal, appended to as the session goes; make one with :meth:`create`."""

    def __init__(self, path: Path, fd: int, session: str, run: str) -> None:
        self.path = path
        self.session = session
        self.run = run
        self._fd: int | None = fd
        self._lock = threading.Lock()

    # -- writing ------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        cache_dir: Path,
        name: str,
        *,
        request: str = "",
        follow_up: str = "",
        model: str = "",
        base_url: str = "",
        candidate: int | None = None,
        workspace: Path | str = "",
        base_commit: str = "",
        resumes: ResumePoint | str | None = None,
        run: str | None = None,
        **extra: Any,
    ) -> Journal:
        """A new journal for a session of tool ``name``, its ``start`` record written.

        ``resumes``: the session this one continues (its :class:`ResumePoint`
        or session id); ``run``: the build it belongs to (sessions of one
        build, such as candidates, share it; by default the resumed session's
        run, else this session). ``extra``: more start fields (JSON values).
        """
        folder = private_dir(CacheLayout(Path(cache_dir)).create().journals / check_tool_name(name))
        check_no_symlinks(Path(cache_dir), folder / "x")
        resumed = resumes.session if isinstance(resumes, ResumePoint) else resumes
        if resumed is not None and not _SESSION.fullmatch(resumed):
            raise ValueError(f"not a session id: {resumed!r}")
        stamp = time.time_ns()
        base = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime(stamp // 10**9))}-{stamp % 10**9:09d}-{os.getpid()}"
        session, attempt = base, 0
        while True:
            path = folder / f"{session}.jsonl"
            try:
                fd = os.open(
                    path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
                )
                break
            except FileExistsError:
                attempt += 1
                session = f"{base}-{attempt}"
        fsync_dir(folder)
        if run is None:
            run = (resumes.start.get("run") if isinstance(resumes, ResumePoint) else None) or session
        journal = cls(path, fd, session, str(run))
        start = {
            "request": request,
            "follow_up": follow_up,
            "model": model,
            "base_url": base_url,
            "candidate": candidate,
            "workspace": str(workspace),
            "base_commit": base_commit,
            "run": journal.run,
            "resumes": resumed,
            **extra,
        }
        journal._append({"t": "start", **start})
        protected = set(_chain_sessions(folder, resumed)) | {session}
        _prune(folder, protected)
        return journal

    def _append(self, record: dict[str, Any]) -> None:
        line = _encode({**record, "at": time.time()}) + b"\n"
        with self._lock:
            if self._fd is None:
                raise ValueError(f"the journal {self.path} is closed")
            view = memoryview(line)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
            os.fsync(self._fd)

    def message(self, message: Mapping[str, Any]) -> None:
        """Record one message appended to the conversation (cut in the middle past :data:`MAX_RECORD_BYTES`)."""
        self._append(_bounded({"t": "message", "m": dict(message)}, "m"))

    def reply(self, usage: Usage | Mapping[str, Any], **extra: Any) -> None:
        """Record the usage of one model reply: a :class:`Usage`, or the reply's ``usage`` as the API sent it."""
        data = (usage if isinstance(usage, Usage) else Usage.of_reply(usage)).to_json()
        self._append({"t": "reply", "usage": data, **extra})

    def check(
        self, *, iteration: int, run: int, commit: str, tree: str, green: bool, report: str = "", **extra: Any
    ) -> None:
        """Record a check run: where it left the workspace (commit, tree), whether green, the report the model read."""
        record = {
            "t": "check",
            "iteration": iteration,
            "run": run,
            "commit": commit,
            "tree": tree,
            "green": green,
            "report": report,
            **extra,
        }
        self._append(_bounded(record, "report"))

    def steer(self, text: str, source: str = "api") -> None:
        """Record a steering message handed to the model."""
        self._append(_bounded({"t": "steer", "text": text, "source": source}, "text"))

    def end(self, status: EndStatus, error: str = "") -> None:
        """Record how the session ended, and close the journal."""
        if status not in STATUSES:
            raise ValueError(f"unknown end status {status!r} (one of {', '.join(STATUSES)})")
        self._append(_bounded({"t": "end", "status": status, "error": error}, "error"))
        self.close()

    def close(self) -> None:
        """Close the file (without an ``end`` record the session counts as unfinished, resumable)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    # -- reading ------------------------------------------------------------------------

    @staticmethod
    def read(path: Path) -> list[dict[str, Any]]:
        """The records of a journal, in order; a torn or unreadable line (a crash mid-write) is skipped."""
        try:
            data, _ = read_regular(path, _MAX_JOURNAL_BYTES)
        except OSError:
            return []
        records = []
        lines = data.split(b"\n")
        for line in lines[:-1]:  # what follows the last newline is a line the crash tore, if anything
            try:
                record = load_json(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("t"), str):
                records.append(record)
        return records

    @staticmethod
    def last_unfinished(cache_dir: Path, name: str) -> ResumePoint | None:
        """The newest build's unfinished session of tool ``name``, with what it resumed; None when it finished.

        The newest journal decides: when its build (its ``run``) has a
        session that ended ``finished``, there is nothing to resume; else the
        newest session of that build without an end, or ended otherwise
        (failed, cancelled, budget), is returned with its resume chain.
        """
        folder = journals_dir(cache_dir, name)
        build: list[str] = []
        newest_run: str | None = None
        for session in reversed(_sessions(folder)):
            start = _start_of(folder / f"{session}.jsonl")
            if start is None:
                continue  # torn at its creation: nothing happened in it
            run = str(start.get("run") or session)
            newest_run = run if newest_run is None else newest_run
            if run == newest_run:
                build.append(session)
        for session in build:
            ends = [r for r in Journal.read(folder / f"{session}.jsonl") if r["t"] == "end"]
            if ends and ends[-1].get("status") == "finished":
                return None
        if not build:
            return None
        return _resume_point(folder, build[0])


def race_points(cache_dir: Path, name: str, race: str) -> dict[int, ResumePoint]:
    """Each candidate of the race ``race`` (the ``run`` its journals share): where its newest session stopped."""
    folder = journals_dir(cache_dir, name)
    newest: dict[int, str] = {}
    for session in _sessions(folder):  # oldest first: the last one seen per candidate is its newest
        start = _start_of(folder / f"{session}.jsonl")
        index = start.get("candidate") if start is not None else None
        if start is not None and start.get("run") == race and isinstance(index, int) and not isinstance(index, bool):
            newest[index] = session
    return {index: _resume_point(folder, session) for index, session in sorted(newest.items())}


def spent(cache_dir: Path, name: str) -> tuple[Usage, int]:
    """What every journalled session of tool ``name`` spent (the newest kept ones), and how many sessions."""
    folder = journals_dir(cache_dir, name)
    total, sessions = Usage(), 0
    for session in _sessions(folder):
        records = Journal.read(folder / f"{session}.jsonl")
        if records:
            sessions += 1
        for record in records:
            if record.get("t") == "reply":
                total = total + Usage.from_json(record.get("usage"))
    return total, sessions


def _start_of(path: Path) -> dict[str, Any] | None:
    """A journal's start record (its first line), or None when it has none."""
    try:
        data, _ = read_regular(path, 2 * MAX_RECORD_BYTES)
    except OSError:
        return None
    first, newline, _ = data.partition(b"\n")
    try:
        record = load_json(first) if newline else None
    except ValueError:
        return None
    return record if isinstance(record, dict) and record.get("t") == "start" else None


def _sessions(folder: Path) -> list[str]:
    """The session ids in ``folder``, oldest first."""
    try:
        names = [entry.name.removesuffix(".jsonl") for entry in folder.iterdir() if entry.name.endswith(".jsonl")]
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(name for name in names if _SESSION.fullmatch(name))


def _chain_sessions(folder: Path, session: str | None) -> list[str]:
    """``session`` and the sessions it resumes, newest first (a loop or a missing journal ends the chain)."""
    chain: list[str] = []
    while session is not None and session not in chain and _SESSION.fullmatch(session):
        path = folder / f"{session}.jsonl"
        if not path.is_file():
            break
        chain.append(session)
        records = Journal.read(path)
        start = records[0] if records and records[0]["t"] == "start" else {}
        resumed = start.get("resumes")
        session = resumed if isinstance(resumed, str) else None
    return chain


def _resume_point(folder: Path, newest: str) -> ResumePoint:
    chain = list(reversed(_chain_sessions(folder, newest)))
    paths = [folder / f"{session}.jsonl" for session in chain]
    first = _start_of(paths[0]) or {}
    point = ResumePoint(path=folder / f"{newest}.jsonl", session=newest, start=first, chain=paths)
    point.last_commit = str(point.start.get("base_commit") or "")
    for path in paths:
        for record in Journal.read(path):
            kind = record["t"]
            if kind == "message" and isinstance(record.get("m"), dict):
                point.messages.append(record["m"])
                point.capped = point.capped or bool(record.get("capped"))
            elif kind == "reply":
                point.usage = point.usage + Usage.from_json(record.get("usage"))
            elif kind == "check":
                _add_check(point, record)
            elif kind == "steer" and isinstance(record.get("text"), str):
                point.steers.append({"text": record["text"], "source": str(record.get("source") or "")})
            elif kind == "end" and path == point.path:
                point.status = str(record.get("status") or "")
                point.error = str(record.get("error") or "")
    return point


def _add_check(point: ResumePoint, record: dict[str, Any]) -> None:
    def number(key: str) -> int:
        value = record.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    commit = str(record.get("commit") or "")
    known = KnownCheck(
        report=str(record.get("report") or ""),
        green=record.get("green") is True,
        commit=commit,
        iteration=number("iteration"),
        run=number("run"),
        record=record,
    )
    tree = record.get("tree")
    if isinstance(tree, str) and tree:
        point.checks_by_tree[tree] = known
    if commit:
        point.last_commit = commit
    point.last_check = known
    point.iterations = max(point.iterations, known.iteration)
    point.runs = max(point.runs, known.run)


def _prune(folder: Path, protected: set[str]) -> None:
    """Remove the oldest journals beyond :data:`KEEP_JOURNALS`, never one in ``protected``."""
    sessions = _sessions(folder)
    for session in sessions[: max(len(sessions) - KEEP_JOURNALS, 0)]:
        if session not in protected:
            (folder / f"{session}.jsonl").unlink(missing_ok=True)
