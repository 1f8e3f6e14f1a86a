"""A run's log: every stage, notice and line of cargo, git and nix output, kept as ``<cache>/logs/NAME.log``.

The widget shows the same lines live; this file is what ``%flakebot logs``,
``flakebot logs`` and the Jupyter dashboard show afterwards. A run that fails
(or is cancelled) for a name that already has a tool leaves the tool's log
and record as they were: its own log goes beside, as ``NAME.failed.log``. A log may hold
whatever a crate's tests printed, so it is the user's alone: mode 0600 in a
0700 directory, written atomically (a planted symlink is replaced, never
followed). Every line is made safe to show before it is kept
(:func:`flakebot_magic.untrusted.safe_text`): ``flakebot logs`` prints it to a
terminal, the dashboard to a page.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from pathlib import Path

from .config import Settings
from .events import Event, LogLine, Notice, RunFinished, StageFinished, StageStarted
from .fsutil import atomic_write, private_dir
from .inventory import Inventory
from .untrusted import safe_text

__all__ = ["RunLog", "failed_log_path", "log_path", "logs_dir"]

#: lines kept per run (the head of a huge log is rarely what matters)
MAX_LINES = 20_000


def logs_dir(settings: Settings) -> Path:
    return settings.logs_dir


def log_path(settings: Settings, name: str) -> Path:
    """Where the last run of tool ``name`` left its log."""
    return logs_dir(settings) / f"{name}.log"


def failed_log_path(settings: Settings, name: str) -> Path:
    """Where the last failed run for the existing tool ``name`` left its log (the tool's own log is kept)."""
    return logs_dir(settings) / f"{name}.failed.log"


class RunLog:
    """A pipeline observer that keeps the run's log and saves it under the tool's name."""

    def __init__(self, settings: Settings, *, max_lines: int = MAX_LINES) -> None:
        self.settings = settings
        self.lines: deque[str] = deque(maxlen=max_lines)
        self._lock = threading.Lock()
        self._t0 = time.monotonic()
        #: whether the run finished well (None: it has not said, as when it was interrupted)
        self.ok: bool | None = None

    def _add(self, at: float, text: str) -> None:
        with self._lock:
            self.lines.append(safe_text(f"{at - self._t0:7.1f}s {text}"))

    def __call__(self, event: Event) -> None:
        if isinstance(event, LogLine):
            self._add(event.at, f"{event.stage}| {event.line}")
        elif isinstance(event, StageStarted):
            self._add(event.at, f"== {event.stage} started {event.detail}".rstrip())
        elif isinstance(event, StageFinished):
            self._add(event.at, f"== {event.stage} {event.status} ({event.elapsed:.1f}s) {event.detail}".rstrip())
        elif isinstance(event, Notice):
            self._add(event.at, f"!! {event.stage}: {event.message}")
        elif isinstance(event, RunFinished):
            self.ok = event.ok
            outcome = "ok" if event.ok else f"failed: {type(event.error).__name__}: {event.error}"
            self._add(event.at, f"== run {outcome} ({event.elapsed:.1f}s)")
        else:  # events added later (iteration results): their repr is better than nothing
            self._add(getattr(event, "at", time.monotonic()), f"== {event!r}")

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines) + ("\n" if self.lines else "")

    def save(self, name: str | None, *, request: str | None = None) -> Path | None:
        """Write the log as ``logs/NAME.log`` and point the tool's record at it (when it has one).

        A run that did not succeed, for a name that has a tool, writes
        ``logs/NAME.failed.log`` instead and leaves the tool's record and log
        as they were; a run that succeeds removes that file.
        """
        if not name:
            return None
        inventory = Inventory(self.settings.tools_dir)
        failed = failed_log_path(self.settings, name)
        if self.ok is not True and inventory.get(name) is not None:
            path = failed
        else:
            path = log_path(self.settings, name)
        private_dir(path.parent)
        atomic_write(path, self.text(), mode=0o600, root=self.settings.cache_dir)
        if path == failed:
            return path
        if self.ok:
            failed.unlink(missing_ok=True)
        changes: dict[str, object] = {"log_path": str(path)}
        if request is not None:
            changes["request"] = request
        inventory.update(name, **changes)
        return path
