"""Plain-text progress: for the terminal, and for notebooks where widgets cannot render."""

from __future__ import annotations

import sys
from collections import deque
from typing import TextIO

from ..events import (
    INDEXING,
    CandidateUpdate,
    Event,
    IterationResult,
    LogLine,
    ModelUsage,
    Notice,
    RunFinished,
    StageFinished,
    StageStarted,
    SteeringMessage,
)
from ..untrusted import safe_text
from .rows import CandidateTable, SteerLog, UsageTotals

__all__ = ["TextProgress"]

_MARK = {"done": "ok", "cached": "cached", "skipped": "skipped", "failed": "FAILED", "cancelled": "cancelled"}


class TextProgress:
    """An observer that prints one line per finished stage, and the log tail on failure.

    Also a line when a candidate (``--candidates``) changes state, one per
    steering message queued or delivered, and at the end what the model
    spent (tokens, cost when priced), summed over candidates and roles.

    Parameters
    ----------
    stream
        Where to write (stderr for the command, stdout in a notebook).
    verbose
        Also print every line of cargo's output as it comes.
    """

    def __init__(self, stream: TextIO | None = None, *, verbose: bool = False, tail: int = 20) -> None:
        self.stream = stream
        self.verbose = verbose
        self.logs: dict[str, deque[str]] = {}
        self.tail = tail
        self.usage = UsageTotals()
        self.candidates = CandidateTable()
        self.steering = SteerLog()

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(safe_text(text) + "\n")  # a terminal, or a notebook's output: obeys escape sequences
        stream.flush()

    def __call__(self, event: Event) -> None:
        if isinstance(event, LogLine):
            self.logs.setdefault(event.stage, deque(maxlen=self.tail)).append(event.line)
            if self.verbose:
                self._write(f"    {event.stage}| {event.line}")
            elif event.line.startswith(INDEXING):  # a first wait is never silent
                self._write(f"flakebot: {event.line}")
        elif isinstance(event, StageStarted):
            if self.verbose:
                self._write(f"flakebot: {event.stage} ...")
        elif isinstance(event, StageFinished):
            mark = _MARK.get(event.status, event.status)
            detail = f"  {event.detail}" if event.detail else ""
            self._write(f"flakebot: {event.stage:<7} {mark}{event.timing}{detail}")
            if event.status == "failed" and not self.verbose:
                for line in self.logs.get(event.stage, ()):
                    self._write(f"    | {line}")
        elif isinstance(event, Notice):
            prefix = "warning: " if event.level == "warning" else ""
            self._write(f"flakebot: {prefix}{event.message}")
        elif isinstance(event, IterationResult):
            label = "baseline" if event.iteration == 0 else f"run {event.run}"
            undone = f"  reverted: {event.reason}" if event.reverted else ""
            timing = f" ({event.elapsed:.1f}s)" if event.elapsed is not None else ""
            error = f"; {event.first_error}" if event.first_error else ""
            self._write(f"flakebot: edit    {label}: {event.summary}{error}{undone}{timing}")
        elif isinstance(event, ModelUsage):
            self.usage.add(event)
        elif isinstance(event, CandidateUpdate):
            before = self.candidates.rows.get(event.index)
            state = before.state if before is not None else None
            row = self.candidates.update(event)
            if row.state != state:
                self._write(f"flakebot: edit    candidate {self.candidates.line(row, self.usage)}")
        elif isinstance(event, SteeringMessage):
            steer, _ = self.steering.record(event)
            self._write(f"flakebot: edit    {steer}")
        elif isinstance(event, RunFinished):
            if self.usage.total().spent:
                self._write(f"flakebot: model   {self.usage.total().text()}")
            if event.ok:
                self._write(f"flakebot: done in {event.elapsed:.2f}s")
