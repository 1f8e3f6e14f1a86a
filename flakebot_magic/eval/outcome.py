"""What one attempt's build says: its check runs and reverts, why it failed, what proves it green.

An observer (:class:`Meter`) watches the build's events; when the build
raises, :func:`classify` names the failure class (:data:`~.results.FAILURES`).
"""

from __future__ import annotations

import traceback
from typing import Any

from ..errors import (
    BudgetExhausted,
    BuildError,
    DeployError,
    EditError,
    FlakebotError,
    FlakeError,
    ForkError,
    ModelError,
    NeedsModelError,
    PolicyError,
    SearchError,
    StageTimeout,
    UsageError,
)
from ..events import Event, IterationResult, ModelUsage
from ..llm.usage import Usage
from .results import FAILURES, AttemptResult, HiddenResult, cut

__all__ = [
    "Meter",
    "TimedOut",
    "cause_of",
    "classify",
    "failure_message",
    "feedback_request",
    "headline",
    "hidden_verdict",
    "proof_of",
    "usage_fields",
]


class TimedOut(Exception):
    """The task's time limit passed."""


class Meter:
    """An observer of one build: its check runs, the ratchet's reverts, the architect's tokens."""

    def __init__(self) -> None:
        self.iterations = 0
        self.reverts: list[str] = []
        self.architect = Usage()

    def __call__(self, event: Event) -> None:
        if isinstance(event, IterationResult):
            self.iterations = max(self.iterations, event.iteration)
            if event.reverted:
                self.reverts.append(event.reason)
        elif isinstance(event, ModelUsage) and event.final and event.role == "architect":
            self.architect = self.architect + Usage(
                event.prompt_tokens, event.completion_tokens, event.cached_tokens, event.calls
            )

    @property
    def ratchet_reverts(self) -> list[str]:
        return [r for r in self.reverts if not r.startswith("the build policy refuses")]


def classify(exc: BaseException, meter: Meter) -> str:
    """The failure class (:data:`~.results.FAILURES`) of a build that raised ``exc``."""
    if isinstance(exc, TimedOut | StageTimeout):
        return "timeout"
    if isinstance(exc, EditError | ModelError) and meter.ratchet_reverts:
        return "ratchet"  # the session never went green after the ratchet undid a change to the tests
    table: list[tuple[type[BaseException] | tuple[type[BaseException], ...], str]] = [
        ((NeedsModelError, SearchError), "no-crate"),
        (ForkError, "fork"),
        (PolicyError, "policy"),
        (BudgetExhausted, "budget"),
        (EditError, "edit-stuck"),
        (ModelError, "model"),
        (BuildError, "build"),
        ((DeployError, FlakeError), "deploy"),
        (UsageError, "bad-task"),
        (FlakebotError, "error"),
    ]
    for kinds, name in table:
        if isinstance(exc, kinds):
            return name
    return "harness"


def usage_fields(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "calls": usage.calls,
    }


def proof_of(tool: Any) -> dict[str, Any]:
    """What shows the attempt ended green: the green check run's commit, the store entry, the final tests."""
    provenance = dict(getattr(tool, "provenance", {}) or {})
    return {
        "commit": provenance.get("commit", ""),
        "store_hash": getattr(tool, "source_hash", ""),
        "crate": f"{provenance.get('crate', '')}@{provenance.get('version', '')}",
        "tests": provenance.get("tests", {}),
        "backend": provenance.get("backend", ""),
    }


def failure_message(exc: BaseException, failure: str, meter: Meter) -> str:
    """What the attempt's record says of a build that raised ``exc``: never empty."""
    text = str(exc) if isinstance(exc, FlakebotError | TimedOut) else "".join(traceback.format_exception(exc))
    if failure == "ratchet":
        text = "The ratchet reverted: " + "; ".join(meter.ratchet_reverts[:5]) + "\n" + text
    if not text.strip():
        text = f"{FAILURES.get(failure, failure)} ({type(exc).__name__}, which said nothing more)"
    return cut(text)


def cause_of(exc: BaseException, message: str) -> str:
    """One line of what went wrong: the first compiler error, failing test or contract problem of the last check
    run when the edit loop stopped (its report), else the message's first line (with the next when it ends in ':')."""
    report = getattr(exc, "diagnostics", None)
    if isinstance(report, str) and report.strip():
        lines = report.splitlines()
        for i, line in enumerate(lines):
            text = line.strip()
            if text.startswith(("error", "---- ")):
                said = [
                    more.strip()
                    for more in lines[i + 1 : i + 4]
                    if more.strip() and not more.strip().startswith(("-->", "|"))
                ]
                return _one_line(" ".join([text, *said[:2]]) if text.startswith("---- ") else text)
            if text.startswith("Contract:") and not text.startswith("Contract: ok"):
                return _one_line(text)
    return headline(message)


def headline(message: str) -> str:
    """``message``'s first line, with the next when the first only introduces it (ends in ':'), on one line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return ""
    head = lines[0]
    if head.endswith(":") and len(lines) > 1:
        head += " " + lines[1]
    return _one_line(head)


def _one_line(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def hidden_verdict(hidden: HiddenResult) -> tuple[str | None, str]:
    """The failure class of a deployed tool's hidden checks (None when they passed), and the message: never empty."""
    if hidden.ok:
        return None, ""
    if hidden.compile:
        return "hidden-tests-compile", cut(hidden.error, 2000)
    if hidden.error:
        return "hidden-tests-error", cut(hidden.error, 2000)
    failed = hidden.total - hidden.passed
    head = f"{failed} of {hidden.total} hidden tests failed" if hidden.total else "no hidden test ran"
    if hidden.cause:
        head += f"; the first: {hidden.cause}"
    return "hidden-tests-failed", cut(head + ("\n\n" + hidden.output if hidden.output else ""), 2000)


def feedback_request(previous: AttemptResult) -> str:
    """A follow-up's instructions: what the hidden checks said of the last attempt (``--feedback``)."""
    hidden = previous.hidden
    said = (hidden.error or hidden.output) if hidden is not None else previous.message
    return (
        "The tool was checked with tests you cannot see, and some of them failed:\n\n"
        f"{cut(said, 6000)}\n\n"
        "The tests are correct. Change the tool so that they pass, and keep what already works."
    )
