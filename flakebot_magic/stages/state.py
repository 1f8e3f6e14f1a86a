"""What one run computes and what every run needs: :class:`RunState`, :class:`RunDeps`, the stage rows.

A pipeline's dependencies (:class:`RunDeps`: settings, registry, process
runner, event bus) are the same for every run; what one run computes (the
request, the model, the crate, the workspace, the backend chosen, its
journal and race) is its :class:`RunState`, passed explicitly to every step
(pydantic-graph's split of state and dependencies). Every field has its real
type: this module sits beside the stages and the edit loop whose records it
carries. :class:`Stage` is one stage's row (started, then finished or failed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..config import Settings
from ..events import EventBus, StageFinished, StageStarted, StageStatus
from ..host.process import ProcessRunner
from ..llm.budget import Budget
from ..llm.model import ModelConfig
from ..records.journal import Journal, ResumePoint
from ..records.races import RacePoint, RaceRecord
from ..registry.base import CrateCandidate, Registry
from ..request import BuildRequest, RunFlags
from ..sandbox.policy import TreePolicy
from .accept import Example
from .deploy import StorePath
from .fork import Workspace

__all__ = ["BackendChoice", "RunDeps", "RunState", "Stage"]


@dataclass(frozen=True)
class RunDeps:
    """What every run of a pipeline uses and none changes."""

    settings: Settings
    registry: Registry
    runner: ProcessRunner
    bus: EventBus


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run builds with, decided once before the search.

    ``fallback`` is set when ``auto`` took cargo although nix is installed and
    builds in its sandbox (nix cannot lock the flake's nixpkgs here): it says
    why, for the warning a build then shows.
    """

    name: str  # "cargo" or "nix"
    why: str
    auto: bool = False
    fallback: str = ""


@dataclass
class RunState:
    """Everything one run computes, passed from step to step (never kept on the pipeline)."""

    request: BuildRequest  # its text stripped
    model: ModelConfig | None
    choice: BackendChoice
    candidate: CrateCandidate | None = None
    name: str = ""
    workspace: Workspace | None = None
    rustc: str = ""
    #: the binary the flake runs (the tool contract's ``bin``, else by name); set before the build
    main_program: str = ""
    #: the edit loop's check runs (0: no model)
    iterations: int = 0
    store: StorePath | None = None
    #: what the edit session recorded for the manifest: ``usage``, and ``winner``, ``candidates``, ``plan``
    session: dict[str, Any] = field(default_factory=dict)
    #: the cell's ``>>>`` examples (the judge runs them against every candidate)
    examples: list[Example] = field(default_factory=list)
    #: the session's journal (None: no model, or a speculative session), and what a ``--resume`` continues:
    #: one session's journal, or an interrupted race (each candidate's)
    journal: Journal | None = None
    resume: ResumePoint | RacePoint | None = None
    #: a race of candidates, journalled
    race: RaceRecord | None = None
    #: crates the search found close to the chosen one (with ``--candidates``, some candidates start from them)
    alternatives: list[CrateCandidate] = field(default_factory=list)
    #: what the run's model requests may spend together (None without a model)
    budget: Budget | None = None
    #: the tree policy the workspace passed before its build (the published commit is its baseline);
    #: cargo's downloads run only right after it passes again
    policy: TreePolicy | None = None
    #: the request the run started from, when ``request`` is a follow-up a failure wrote (its failing examples'
    #: output): what the tool's record keeps, never the follow-up
    origin: BuildRequest | None = None

    @property
    def recorded_request(self) -> str:
        """The request the tool's record keeps: the one the run started from, never a failure's follow-up."""
        return (self.origin or self.request).text

    @property
    def follow_up(self) -> bool:
        return self.request.follow_up

    @property
    def flags(self) -> RunFlags:
        """How this run goes (rebuild, resume, candidates, plan): the request's."""
        return self.request.flags

    def crate(self) -> CrateCandidate:
        if self.workspace is not None:
            return self.workspace.crate
        if self.candidate is None:
            raise RuntimeError("the run has no crate yet")
        return self.candidate

    def forked(self) -> Workspace:
        if self.workspace is None:
            raise RuntimeError("the run has no workspace yet")
        return self.workspace

    def checked(self) -> TreePolicy:
        """The tree policy the build is held to (set by the pipeline before any backend builds)."""
        if self.policy is None:
            raise RuntimeError("the run's tree was not checked yet")
        return self.policy


class Stage:
    """A stage row: ``StageStarted`` on entry, ``StageFinished`` on exit (``failed`` on an exception, ``cancelled``
    when the exception is a cancel).

    Set ``status`` (``cached``, ``skipped``) and ``detail`` inside the block.
    """

    def __init__(self, bus: EventBus, name: str, detail: str = "") -> None:
        self.bus, self.name, self.detail = bus, name, detail
        self.status: StageStatus = "done"
        self.started = 0.0

    def __enter__(self) -> Stage:
        self.started = time.monotonic()
        self.bus.emit(StageStarted(self.name, self.detail))
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        elapsed = time.monotonic() - self.started
        if exc is not None:
            self.bus.emit(StageFinished.stopped_by(self.name, exc, elapsed))
        else:
            self.bus.emit(StageFinished(self.name, self.status, self.detail, elapsed))
