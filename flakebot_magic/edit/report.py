"""A check run's report for the model: errors with their source lines, failing tests, clippy, the contract; capped."""

from __future__ import annotations

from pathlib import Path

from ..sandbox.diagnostics import MAX_FAILURE_LINES, Diagnostic
from .checkrun import MAX_ERRORS, CheckRun
from .files import read_text

__all__ = ["MAX_REPORT", "cap", "report"]

#: characters of one check-run report sent to the model
MAX_REPORT = 6000
MAX_WARNINGS = 6


def report(run: CheckRun, root: Path, *, best_passed: int, limit: int = MAX_REPORT) -> str:
    """The compact text the model gets back after ``run``, at most ``limit`` characters."""
    out: list[str] = [f"Check run {run.run}: {run.headline()}"]
    if run.auto_fixed:
        fixes = "; ".join(run.auto_fixed[:5])
        out.append(f"(flakebot first applied {len(run.auto_fixed)} compiler suggestion(s) itself: {fixes})")
    if run.reverted and run.policy:
        out.append(
            "After this check run the workspace held what flakebot does not build (written while cargo "
            "ran, by a test or a build script?):"
        )
        out += [f"  - {line}" for line in run.policy[:10]]
        out.append(
            f"It was reverted with git: the workspace is back at the best commit {run.reverted_to[:12]} "
            f"({best_passed} tests passing). Tests and build scripts must not write these files. "
            "Re-read the files you changed before editing them again."
        )
        return cap("\n".join(out), limit)
    if run.reverted:
        out.append(
            "The change was reverted with git: the workspace is back at the best commit "
            f"{run.reverted_to[:12]} ({best_passed} tests passing). Passing tests may not go "
            "down, and existing tests may not be deleted, emptied or ignored. Re-read the files "
            "you changed before editing them again."
        )
        return cap("\n".join(out), limit)
    if run.note:
        out.append(run.note)
    for message in run.errors[:MAX_ERRORS]:
        out.append("")
        out.extend(_render(message, root))
    if len(run.errors) > MAX_ERRORS:
        out.append(f"... and {len(run.errors) - MAX_ERRORS} more error(s)")
    if run.warnings and not run.errors:
        out.append("")
        out.append("Warnings:")
        out += [f"  {w.headline()}" for w in run.warnings[:MAX_WARNINGS]]
    if run.tests is not None and not run.errors:
        tests = run.tests
        out.append("")
        out.append(
            f"Tests: {tests.passed} passed, {tests.failed} failed, {tests.ignored} ignored "
            f"(the best so far: {best_passed} passing)."
        )
        for name in tests.failures[:5]:
            out.append(f"---- {name} ----")
            out += [f"  {line}" for line in tests.output.get(name, [])[:MAX_FAILURE_LINES]]
    if run.clippy:
        out.append("")
        out.append("Clippy (information, not required):")
        out += [f"  {c.headline()}" for c in run.clippy[:MAX_WARNINGS]]
    out.append("")
    out.append(f"Contract: {run.contract_problem or f'ok ({run.contract})'}")
    if run.green:
        out.append("All checks pass. Call finish(summary) if the tool does what was asked.")
    return cap("\n".join(out), limit)


def cap(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying so."""
    if len(text) <= limit:
        return text
    return text[: limit - 60].rstrip() + f"\n... (cut: the report passed {limit} characters)"


def _render(message: Diagnostic, root: Path) -> list[str]:
    lines = [message.headline()]
    if message.file and message.line:
        path = root / message.file
        try:
            inside = path.resolve().is_relative_to(root.resolve())
            source = read_text(path.resolve()).splitlines() if inside else []
        except OSError:
            source = []
        for number in range(max(1, message.line - 2), min(len(source), message.line + 2) + 1):
            mark = ">" if number == message.line else " "
            lines.append(f"{mark}{number:>5} | {source[number - 1][:160]}")
    if message.label:
        lines.append(f"  label: {message.label}")
    lines += [f"  {note[:300]}" for note in message.notes[:3]]
    return lines
