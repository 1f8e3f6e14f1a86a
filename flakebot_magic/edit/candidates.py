"""The records of a race of candidates: each candidate's result, the session's outcome, what a candidate says.

Used by :mod:`.team`, the manager's module.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..events import CandidateUpdate, Event, EventBus, IterationResult, LogLine, Notice, SteeringMessage
from ..registry.base import CrateCandidate
from ..stages.accept import Example
from .checkrun import CheckRun
from .judge import Score
from .state import EditOutcome

__all__ = ["CandidateBus", "CandidateResult", "Fanout", "TeamOutcome"]


@dataclass
class CandidateResult:
    """One engineer's session in a speculative run: its state, its score, what stopped it."""

    index: int
    path: Path
    state: str = "waiting"
    iteration: int = 0
    outcome: EditOutcome | None = None
    error: BaseException | None = None
    score: Score | None = None
    #: the crate it started from when not the workspace's (a close second in the search)
    crate: CrateCandidate | None = None
    #: the commit its diff is measured from, and clippy's warnings there
    base_commit: str = ""
    base_clippy: int = 0
    #: its check runs as they came (a stopped candidate's too)
    runs: list[CheckRun] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "status": self.state,
            "iterations": self.outcome.iterations if self.outcome else self.iteration,
            "score": self.score.to_json() if self.score else None,
            "error": str(self.error).splitlines()[0][:300] if self.error else "",
            "workspace": str(self.path),
            # what its first check run after the clone compiled of the dependencies (0: the clone was warm)
            "first_check_dependency_units": next(
                (r.dependency_units for r in self.runs if r.iteration > 0 and not r.reverted), None
            ),
            **({"crate": self.crate.id} if self.crate is not None else {}),
        }


@dataclass
class TeamOutcome:
    """A finished session: the winner's outcome, and every candidate's (one, without ``--candidates``)."""

    outcome: EditOutcome
    winner: int | None
    candidates: list[CandidateResult]
    plan: str = ""
    examples: list[Example] = field(default_factory=list)
    #: the winner started from another crate: its workspace (a fork of that crate) replaces the tool's
    switched: CandidateResult | None = None


class CandidateBus(EventBus):
    """What one candidate says, for the run's bus: its check runs as candidate rows, its lines marked with its index."""

    def __init__(self, parent: EventBus, index: int, crate: str, delivered: set[tuple[str, float]]) -> None:
        super().__init__()
        self.parent, self.index, self.crate = parent, index, crate
        #: steering messages some candidate already delivered (each reaches every candidate; it is shown once)
        self.delivered = delivered

    def emit(self, event: Event) -> None:
        if isinstance(event, IterationResult):
            self.parent.emit(
                CandidateUpdate(
                    self.index, "editing", iteration=event.iteration, detail=event.summary, crate=self.crate
                )
            )
        elif isinstance(event, LogLine):
            self.parent.emit(LogLine(event.stage, f"[#{self.index}] {event.line}", event.stream))
        elif isinstance(event, SteeringMessage) and event.delivered:
            key = (event.text, event.at)
            if key not in self.delivered:
                self.delivered.add(key)
                self.parent.emit(event)
        elif isinstance(event, Notice):
            self.parent.emit(Notice(event.stage, f"candidate #{self.index}: {event.message}", event.level))
        else:
            self.parent.emit(event)


class Fanout:
    """Steering for several engineers: the manager takes each message once and gives every engineer a copy."""

    def __init__(self) -> None:
        self._items: queue.Queue[Any] = queue.Queue()

    def put(self, item: Any) -> None:
        self._items.put(item)

    def take(self) -> list[Any]:
        taken = []
        while True:
            try:
                taken.append(self._items.get_nowait())
            except queue.Empty:
                return taken
