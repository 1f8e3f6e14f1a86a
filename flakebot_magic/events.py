"""Pipeline events: the only thing front ends (magic, command, widgets) observe.

The pipeline calls each observer with every event, in order, from the thread
that runs the pipeline. Observers must be quick and must not raise; an
observer that raises is reported once on stderr and then ignored.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from .untrusted import make_fields_safe

__all__ = [
    "INDEXING",
    "STAGES",
    "CandidateUpdate",
    "Event",
    "EventBus",
    "IterationResult",
    "LogLine",
    "ModelUsage",
    "Notice",
    "Observer",
    "Outcome",
    "RunFinished",
    "StageFinished",
    "StageStarted",
    "SteeringMessage",
    "is_cancel",
    "outcome_of",
]

#: how a log line telling the search index's progress starts (:func:`flakebot_magic.stages.search.indexing`): the
#: widget shows it on the search row, printed progress prints it even when not verbose
INDEXING = "Indexing the registry"

#: the stages in pipeline order (build and test run side by side; edit only with a model)
STAGES = ("search", "fork", "edit", "build", "test", "flake", "deploy", "client")

StageStatus = Literal["done", "failed", "cancelled", "skipped", "cached"]
#: how a run ended; :func:`outcome_of` decides it, and every view, log and record names it with this word
#: (``unfit``: the search answered that no crate does the request as published, an answer and not a failure)
Outcome = Literal["success", "failed", "cancelled", "unfit"]


def is_cancel(error: BaseException | None) -> bool:
    """Did ``error`` stop a run because someone stopped it (the Cancel button, Ctrl-C, a kernel interrupt)?

    >>> from .errors import BuildError, Cancelled
    >>> is_cancel(Cancelled("stopped")), is_cancel(KeyboardInterrupt()), is_cancel(BuildError("no"))
    (True, True, False)
    """
    import asyncio

    from .errors import Cancelled

    return isinstance(error, (Cancelled, KeyboardInterrupt, asyncio.CancelledError))


def outcome_of(error: BaseException | None, *, ok: bool = False) -> Outcome:
    """How a run (or a stage) ended: the one place a cancel, and an honest "no crate fits", are told from a failure.

    ``ok``: it finished well (``success``); else ``error`` says how it ended, and a run that ended without
    saying why (no error) failed. :class:`~flakebot_magic.errors.NeedsModelError` is the search's answer that no
    crate does the request as published (``unfit``): nothing broke, a model or ``--crate`` is the way on.

    >>> from .errors import BuildError, Cancelled, NeedsModelError
    >>> outcome_of(None, ok=True), outcome_of(Cancelled("stopped")), outcome_of(BuildError("no")), outcome_of(None)
    ('success', 'cancelled', 'failed', 'failed')
    >>> outcome_of(NeedsModelError("No crate does 'wrap text' as published"))
    'unfit'
    """
    from .errors import NeedsModelError

    if ok:
        return "success"
    if is_cancel(error):
        return "cancelled"
    return "unfit" if isinstance(error, NeedsModelError) else "failed"


class _ShownText:
    """An event's text is made safe to show when the event is made (:mod:`flakebot_magic.untrusted`).

    A log line is whatever a build script or a test printed; a notice or a
    detail may quote it. Made safe here, it is safe in the widget, the printed
    progress, the run log and everything that reads those.
    """

    def __post_init__(self) -> None:
        make_fields_safe(self)


@dataclass(frozen=True)
class StageStarted(_ShownText):
    stage: str
    detail: str = ""
    at: float = field(default_factory=time.monotonic)
    #: how many units (crates) cargo may compile in this stage, 0 when unknown: a progress bar counts its
    #: ``Compiling`` lines against it (the packages of the workspace's Cargo.lock: a ceiling, as features,
    #: targets and dev-dependencies leave some out)
    units: int = 0


@dataclass(frozen=True)
class StageFinished(_ShownText):
    stage: str
    status: StageStatus
    detail: str = ""
    elapsed: float = 0.0
    at: float = field(default_factory=time.monotonic)

    @property
    def timing(self) -> str:
        """`` (2.5s)`` for a stage that ran (done, failed or cancelled); "" for one skipped or taken from the cache."""
        return f" ({self.elapsed:.1f}s)" if self.status in ("done", "failed", "cancelled") else ""

    @classmethod
    def stopped_by(cls, stage: str, error: BaseException, elapsed: float) -> StageFinished:
        """The stage ended with ``error``: ``cancelled`` when someone stopped it, ``done`` when it answered that no
        crate fits (``unfit``: the search did its job), else ``failed``; its first line."""
        outcome = outcome_of(error)
        status: StageStatus = "cancelled" if outcome == "cancelled" else "done" if outcome == "unfit" else "failed"
        return cls(stage, status, (str(error).splitlines() or [type(error).__name__])[0], elapsed)


@dataclass(frozen=True)
class LogLine(_ShownText):
    """One line of a child process's output (cargo, git, nix); its colours and style (SGR) kept, nothing else."""

    stage: str
    line: str
    stream: Literal["stdout", "stderr"] = "stderr"
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        make_fields_safe(self, styled=("line",))  # a test's coloured output shows coloured (views/record.py)


@dataclass(frozen=True)
class Notice(_ShownText):
    """Something the user should read: an offline fix-up, a skipped test target."""

    stage: str
    message: str
    level: Literal["info", "warning"] = "info"
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class RunFinished(_ShownText):
    """The last event of a run: ``tool`` on success, ``error`` otherwise; :attr:`outcome` says which way it ended."""

    ok: bool
    tool: Any = None
    error: BaseException | None = None
    elapsed: float = 0.0
    at: float = field(default_factory=time.monotonic)

    @property
    def outcome(self) -> Outcome:
        """``success``, ``cancelled`` (someone stopped it), ``unfit`` (no crate fits) or ``failed`` (:func:`outcome_of`)."""
        return outcome_of(self.error, ok=self.ok)

    @property
    def said(self) -> str:
        """The run's end for a log line: ``ok``, ``cancelled: Cancelled: …`` or ``failed: BuildError: …``."""
        if self.ok:
            return "ok"
        word = self.outcome
        return f"{word}: {type(self.error).__name__}: {self.error}" if self.error is not None else word


@dataclass(frozen=True)
class IterationResult(_ShownText):
    """One check run of the edit loop (stage ``edit``): cargo's verdict and the ratchet's.

    ``iteration`` counts the model's check runs (0 is the baseline before any
    edit); ``run`` numbers every check run, including those flakebot starts
    itself after applying compiler suggestions. ``reverted`` with ``reason``:
    the ratchet undid the change. ``commit`` records the run in the
    workspace's history. ``first_error``: the first compiler error
    (``error[E0308] src/main.rs:8:5: mismatched types``), when it did not
    build; ``elapsed``: the run's seconds (cargo and flakebot).
    """

    iteration: int
    passed: int
    failed: int
    errors: int
    reverted: bool = False
    reason: str = ""
    commit: str = ""
    run: int = 0
    green: bool = False
    warnings: int = 0
    auto_fixed: int = 0
    summary: str = ""
    first_error: str = ""
    elapsed: float | None = None
    stage: str = "edit"
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class ModelUsage(_ShownText):
    """What one edit session cost in model tokens, sent once when it ends: green, failed or stopped.

    ``tokens``: prompt and completion tokens together, summed over the
    session's model calls, as the model's API reported them (estimated from
    the text for a reply that reported none); ``calls``: the completions it
    asked for. A session that fails still says what it spent, so a caller
    counting a budget (the agent limits) charges that, not a guess.
    """

    tokens: int
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    #: None when no price is known for the model
    cost_usd: float | None = None
    #: False for the running totals sent after each reply; True once, when the session ends
    final: bool = True
    #: the candidate (``--candidates``) or role that spent it; None for a plain session
    candidate: int | None = None
    role: str = "engineer"
    stage: str = "edit"
    at: float = field(default_factory=time.monotonic)


CandidateState = Literal["waiting", "editing", "green", "failed", "cancelled", "winner", "lost"]


@dataclass(frozen=True)
class CandidateUpdate(_ShownText):
    """One candidate of a speculative session (``--candidates N``): where it is and how it scores.

    ``score`` is the judge's score as text (``contract ✓ · 3/3 examples · 12 tests · 0 clippy · 40 lines``),
    empty before the candidate's first green check run.
    """

    index: int
    state: CandidateState
    iteration: int = 0
    score: str = ""
    detail: str = ""
    crate: str = ""
    stage: str = "edit"
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class SteeringMessage(_ShownText):
    """A message a person (or an agent) sent to a running edit session; the model reads it in its next request."""

    text: str
    source: str = "api"
    #: True once it went out in a request to the model
    delivered: bool = False
    stage: str = "edit"
    at: float = field(default_factory=time.monotonic)


Event = (
    StageStarted
    | StageFinished
    | LogLine
    | Notice
    | RunFinished
    | IterationResult
    | ModelUsage
    | CandidateUpdate
    | SteeringMessage
)
Observer = Callable[[Event], None]


class EventBus:
    """Fans events out to observers; thread-safe, never lets an observer break a run."""

    def __init__(self, observers: Iterable[Observer] = ()) -> None:
        self._observers = list(observers)
        self._broken: set[int] = set()
        self._lock = threading.Lock()

    def subscribe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def emit(self, event: Event) -> None:
        with self._lock:
            for index, observer in enumerate(self._observers):
                if index in self._broken:
                    continue
                try:
                    observer(event)
                except Exception as exc:  # an observer must never stop a build
                    self._broken.add(index)
                    print(
                        f"flakebot: progress observer {observer!r} failed ({exc!r}); it gets no further events",
                        file=sys.stderr,
                    )

    def log(self, stage: str, line: str, stream: Literal["stdout", "stderr"] = "stderr") -> None:
        self.emit(LogLine(stage, line, stream))

    def notice(self, stage: str, message: str, level: Literal["info", "warning"] = "info") -> None:
        self.emit(Notice(stage, message, level))
