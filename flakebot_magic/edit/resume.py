"""Resuming an interrupted edit session: its conversation made valid, the ratchet where it stood, known check runs.

A session's journal (:mod:`~flakebot_magic.records.journal`) holds every message and every check run
with its commit and git tree. :func:`paired` answers the calls the session died
before answering; :func:`ratchet_of` finds the best commit and its passing
tests; :func:`known_check` reuses a green check run of the same tree instead of
running cargo again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..events import EventBus
from ..records.journal import ResumePoint
from ..sandbox.diagnostics import TestReport
from ..sandbox.layout import SOURCE_PATHSPEC
from ..sandbox.policy import Violation
from .checkrun import LOOP_TARGET, CheckRun, CheckRunner, workspace_contract

__all__ = ["known_check", "paired", "ratchet_of"]


def known_check(
    point: ResumePoint | None, checks: CheckRunner, root: Path, bus: EventBus, iteration: int
) -> tuple[CheckRun, list[Violation]] | None:
    """A resumed session's check run on a tree the interrupted session already checked: its result, no cargo.

    Only a green result is reused (a failing one is cheap to see again, and its diagnostics are the
    model's to read afresh), and only while the binaries it built are still in the target dir.
    """
    if point is None or not point.checks_by_tree:
        return None
    checks.git("add", "-A", "-f", "--", *SOURCE_PATHSPEC)
    tree = checks.git("write-tree")
    known = point.checks_by_tree.get(tree)
    if known is None or not known.green:
        return None
    record = known.record
    target = root.joinpath(*LOOP_TARGET, "debug")
    names = [n for n in record.get("binaries") or [] if isinstance(n, str)]
    binaries = {n: target / n for n in names}
    if not names or not all(p.is_file() for p in binaries.values()):
        return None
    run = checks.new_run(iteration)
    run.built = True
    run.tests = TestReport(passed=int(record.get("passed") or 0), failed=0, ignored=int(record.get("ignored") or 0))
    run.binaries = binaries
    run.contract, run.contract_problem = workspace_contract(
        root / "Cargo.toml", sorted(names), built=True, kind_rule=checks.kind_rule
    )
    run.note = ""
    checks.runs.append(run)
    bus.notice(
        "edit",
        f"check run {run.run}: the tree is the one check run {known.run} of the interrupted session found "
        "green; its result is reused, no check run repeated",
    )
    return run, checks.policy()


def ratchet_of(point: ResumePoint) -> tuple[str, int] | None:
    """Where the ratchet stood after the interrupted session's last check run: (best commit, passing tests)."""
    record = point.last_check.record if point.last_check is not None else {}
    best, passed = record.get("best_commit"), record.get("best_passed")
    if not isinstance(best, str) or not best:
        return None
    return best, passed if isinstance(passed, int) else 0


def paired(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The journal's conversation, made valid: calls the session died before answering get an answer saying so."""
    out: list[dict[str, Any]] = []
    waiting: list[str] = []
    for message in messages:
        if waiting and message.get("role") != "tool":
            out += [_unanswered(call) for call in waiting]
            waiting = []
        if message.get("role") == "tool" and message.get("tool_call_id") in waiting:
            waiting.remove(message["tool_call_id"])
        out.append(message)
        if message.get("role") == "assistant":
            waiting = [str(c.get("id")) for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    return out + [_unanswered(call) for call in waiting]


def _unanswered(call_id: str) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": call_id,
        "content": "interrupted: the session stopped around this call, so it may or may not have been carried out; "
        "read the files again before relying on them",
    }
