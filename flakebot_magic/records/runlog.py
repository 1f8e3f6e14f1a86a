"""A run's log (every stage, notice and line of cargo, git and nix output) and, for a run that made no tool, its record.

The widget shows the same lines live; the logs are what ``%flakebot logs``,
``flakebot logs`` and the Jupyter dashboard show afterwards. A tool's log is
the log of the build that made it; later runs keep theirs beside it::

    logs/NAME.log           the build that made the tool NAME (its record's ``log_path``)
    logs/NAME.cached.log    the last run that found NAME in the cache and built nothing
    logs/NAME.failed.log    the last run for NAME that failed
    logs/NAME.cancelled.log the last run for NAME that was cancelled
    logs/NAME.unfit.log     the last run for NAME whose search found no crate that fits

A run that fails or is cancelled changes no tool: its log goes to
``NAME.<outcome>.log``, named by :func:`flakebot_magic.events.outcome_of` (a
cancel is not a failure; caches written before this rule hold a cancelled
run's log as ``NAME.failed.log``, still read), and what is known of it (the request, the error, the
kept workspace) to an :class:`Attempt` in ``<tools>/attempts/NAME.json``,
beside the tool inventory, so ``list``, ``show`` and the dashboard show it
(``clean --all`` removes it with the inventory). A run that succeeds removes
both. A log may hold whatever a crate's tests printed, so it is the user's
alone: mode 0600 in a 0700 directory, written atomically (a planted symlink
is replaced, never followed). Every line is made safe to show before it is
kept (:func:`flakebot_magic.untrusted.safe_text`): ``flakebot logs`` prints it
to a terminal, the dashboard to a page.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ..config import Settings
from ..errors import CacheFileDamaged, StorageError
from ..events import Event, LogLine, Notice, Outcome, RunFinished, StageFinished, StageStarted, outcome_of
from ..host.fsutil import atomic_write, private_dir
from ..host.storage import read_cache_file, read_cache_json
from ..untrusted import safe_line, safe_text
from .inventory import Inventory, ToolRecord

__all__ = [
    "Attempt",
    "RunLog",
    "attempt_log_path",
    "attempt_of",
    "attempts",
    "cached_log_path",
    "last_attempt_log",
    "log_part",
    "log_path",
]

#: lines kept per run (the head of a huge log is rarely what matters)
MAX_LINES = 20_000


def log_path(settings: Settings, name: str) -> Path:
    """The log of the build that made tool ``name``."""
    return settings.cache.logs / f"{name}.log"


#: how a run that made no tool ended (:func:`~flakebot_magic.events.outcome_of`), each naming its log
ATTEMPT_OUTCOMES: tuple[Outcome, ...] = ("failed", "cancelled", "unfit")


def attempt_log_path(settings: Settings, name: str, outcome: Outcome) -> Path:
    """Where the last run for ``name`` that ended as ``outcome`` (failed, cancelled, unfit) left its log; the tool's
    own log is kept."""
    return settings.cache.logs / f"{name}.{outcome}.log"


def last_attempt_log(settings: Settings, name: str) -> Path:
    """The newest of the logs an attempt for ``name`` may have left (an older cache kept a cancelled run's as
    ``NAME.failed.log``); ``NAME.failed.log`` when there is none."""
    found = [attempt_log_path(settings, name, outcome) for outcome in ATTEMPT_OUTCOMES]
    return max(found, key=lambda path: path.stat().st_mtime if path.is_file() else 0.0)


def cached_log_path(settings: Settings, name: str) -> Path:
    """Where the last run that found ``name`` in the cache (and built nothing) left its log."""
    return settings.cache.logs / f"{name}.cached.log"


@dataclass(frozen=True)
class Attempt:
    """A run for ``name`` that made no tool: how it ended and where to look.

    ``outcome`` is ``failed``, ``cancelled`` or ``unfit``; ``error`` the error's first
    line (``kind`` its class); ``crate`` what the search chose (``tinyhex
    0.1.0``), when it got that far; ``workspace`` the kept workspace, when
    there is one; ``at`` when it ended (epoch seconds); ``log`` its log.
    """

    name: str
    outcome: str
    error: str
    kind: str
    request: str = ""
    crate: str = ""
    workspace: str = ""
    at: float = 0.0
    log: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Attempt | None:
        """The attempt a JSON record holds; None for anything else (a damaged or foreign file)."""
        if not isinstance(data, dict):
            return None
        known = {f.name: f.type for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        try:
            attempt = cls(**values)
        except TypeError:
            return None
        text_fields = ("name", "outcome", "error", "kind", "request", "crate", "workspace", "log")
        if not all(isinstance(getattr(attempt, f), str) for f in text_fields):
            return None
        if not isinstance(attempt.at, int | float) or attempt.outcome not in ATTEMPT_OUTCOMES:
            return None
        return attempt

    def as_record(self) -> ToolRecord:
        """The attempt as a tool record (never saved: ``status`` is its outcome), for listings and JSON.

        What a tool has and an attempt has not is empty; the error is its
        ``description`` and, with its class, in ``extra``.
        """
        crate, _, version = self.crate.partition(" ")
        return ToolRecord.stand_in(
            self.name,
            crate=crate,
            version=version,
            workspace=self.workspace,
            backend="",
            kind="",
            description=f"{self.kind}: {self.error}" if self.kind else self.error,
            created=self.at,
            started=self.at,
            status=self.outcome,
            log_path=self.log,
            request=self.request,
            extra={"error": self.error, "error_kind": self.kind},
        )

    @property
    def ended(self) -> str:
        """``failed`` / ``was cancelled`` / ``found no crate that fits``, for a sentence."""
        return {"cancelled": "was cancelled", "unfit": "found no crate that fits"}.get(self.outcome, "failed")


def _attempt_file(settings: Settings, name: str) -> Path:
    return settings.cache.attempts / f"{name}.json"


def attempt_of(settings: Settings, name: str) -> Attempt | None:
    """The last run for ``name`` that made no tool, when it is recorded."""
    try:
        data = read_cache_json(_attempt_file(settings, name))
    except (OSError, StorageError):
        return None
    attempt = Attempt.from_json(data)
    return attempt if attempt is not None and attempt.name == name else None


def attempts(settings: Settings) -> list[Attempt]:
    """Every recorded run that made no tool, by name."""
    directory = settings.cache.attempts
    if not directory.is_dir():
        return []
    found = (attempt_of(settings, path.stem) for path in sorted(directory.glob("*.json")))
    return [attempt for attempt in found if attempt is not None]


class RunLog:
    """A pipeline observer that keeps the run's log and saves it under the tool's name."""

    def __init__(self, settings: Settings, *, max_lines: int = MAX_LINES) -> None:
        self.settings = settings
        self.lines: deque[str] = deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        #: whether the run finished well (None: it has not said, as when it was interrupted)
        self.ok: bool | None = None
        #: the run deployed nothing new: the store already had its tool (a cache hit)
        self.cached = False
        #: what the search chose, as its row said (``tinyhex 0.1.0``)
        self.crate = ""
        #: a stage started: the run was a build, not an argument refused before any (which is no attempt)
        self.started = False

    def _add(self, at: float, text: str) -> None:
        with self._lock:
            self.lines.append(safe_text(f"{at - self._t0:7.1f}s {text}"))

    def __call__(self, event: Event) -> None:
        if isinstance(event, LogLine):
            self._add(event.at, f"{event.stage}| {event.line}")
        elif isinstance(event, StageStarted):
            self.started = True
            self._add(event.at, f"== {event.stage} started {event.detail}".rstrip())
        elif isinstance(event, StageFinished):
            if event.stage == "deploy":
                self.cached = event.status == "cached"
            elif event.stage == "search" and event.status == "done":
                self.crate = event.detail
            self._add(event.at, f"== {event.stage} {event.status} ({event.elapsed:.1f}s) {event.detail}".rstrip())
        elif isinstance(event, Notice):
            self._add(event.at, f"!! {event.stage}: {event.message}")
        elif isinstance(event, RunFinished):
            self.ok = event.ok
            self._add(event.at, f"== run {event.said} ({event.elapsed:.1f}s)")
        else:  # events added later (iteration results): their repr is better than nothing
            self._add(getattr(event, "at", time.monotonic()), f"== {event!r}")

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines) + ("\n" if self.lines else "")

    def _write(self, path: Path, text: str) -> None:
        private_dir(path.parent)
        atomic_write(path, text, mode=0o600, root=self.settings.cache_dir)

    def save(self, name: str | None, *, request: str | None = None, error: BaseException | None = None) -> Path | None:
        """Write the log where its outcome says (see the module's docstring); return where.

        A build that made the tool points the tool's record at its log; a
        cache hit leaves the record's log as it is; a run that did not
        succeed records an :class:`Attempt` (``request`` and ``error`` say
        what it was and how it ended; none when it was refused before any
        stage started) and leaves the tool, if there is one, as it was.
        """
        if not name:
            return None
        settings = self.settings
        if self.ok is not True:
            outcome = outcome_of(error)
            path = attempt_log_path(settings, name, outcome)
            self._write(path, self.text())
            for other in ATTEMPT_OUTCOMES:  # one attempt's log per name: the last one's
                if other != outcome:
                    attempt_log_path(settings, name, other).unlink(missing_ok=True)
            if not self.started:  # refused before it began (a bad argument): the user saw why; nothing to list
                return path
            kept = getattr(error, "workspace", None)
            attempt = Attempt(
                name=name,
                outcome=outcome,
                error=(str(error).splitlines() or [""])[0] if error is not None else "the run was interrupted",
                kind=type(error).__name__ if error is not None else "",
                request=(request or "").strip(),
                crate=self.crate if outcome != "unfit" else "",  # its search row says why none was chosen
                workspace=str(kept) if kept is not None else "",
                at=time.time(),
                log=str(path),
            )
            self._write(_attempt_file(settings, name), json.dumps(attempt.to_json(), indent=1))
            return path
        path = cached_log_path(settings, name) if self.cached else log_path(settings, name)
        self._write(path, self.text())
        # this name has a tool now: an earlier failed attempt is history
        for outcome in ATTEMPT_OUTCOMES:
            attempt_log_path(settings, name, outcome).unlink(missing_ok=True)
        _attempt_file(settings, name).unlink(missing_ok=True)
        if not self.cached:
            changes: dict[str, object] = {"log_path": str(path)}
            if request is not None:
                changes["request"] = request.strip()
            Inventory(settings.cache.tools).update(name, **changes)
        return path


def log_part(title: str, path: Path, last: int | None) -> str:
    """``== title (path)`` and the log's last ``last`` lines; "" when there is no such log."""
    try:
        # the log file may be older than the rule, or written by another process: made safe as it is read
        text = safe_text(read_cache_file(path).decode("utf-8", errors="replace"))
    except OSError:
        return ""
    except CacheFileDamaged as exc:  # a FIFO, a device, a link, a huge file: a notice, never a hang
        return f"== {title} ({safe_line(str(path))})\n{exc}"
    lines = text.splitlines()
    if last and len(lines) > last:
        lines = [f"… {len(lines) - last} earlier lines in {path}", *lines[-last:]]
    return f"== {title} ({path})\n" + "\n".join(lines) if text else ""
