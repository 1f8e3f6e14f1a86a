"""The judge: code, not a model. Scores a candidate structurally and picks the best of several.

A candidate's :class:`Score` is, in order of priority: a green check run,
the tool contract met, the cell's acceptance examples passed (run against the
candidate's own binary, confined, before anything is deployed), passing tests
(the ratchet's measure), fewer clippy warnings, then the smaller diff from
where every candidate started. :func:`best` picks the highest; ties go to the
lower index (the candidate that started first).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..clients import make_tool
from ..errors import FlakebotError
from ..host.git import Git
from ..host.names import tool_name
from ..host.trees import remove_tree
from ..stages.accept import Example, run_examples
from .checkrun import CheckRun

__all__ = ["Score", "best", "diff_lines", "judge"]


@dataclass(frozen=True)
class Score:
    """How good one candidate is, by structure alone. :meth:`key` orders scores: higher is better.

    Examples
    --------
    >>> a = Score(contract_met=True, green=True, examples_passed=2, examples_total=2, tests_passed=3)
    >>> b = Score(contract_met=True, green=True, examples_passed=1, examples_total=2, tests_passed=9)
    >>> a.key() > b.key(), a.perfect, b.perfect
    (True, True, False)
    """

    contract_met: bool
    examples_passed: int = 0
    examples_total: int = 0
    tests_passed: int = 0
    tests_failed: int = 0
    clippy_warnings: int = 0
    #: lines added plus lines removed since the commit every candidate started from
    diff_lines: int = 0
    #: the check run built, its tests ran and passed, the contract holds, nothing was reverted
    green: bool = False
    #: why the examples did not run, or ""
    note: str = ""

    def key(self) -> tuple[int, ...]:
        """Green, contract, examples passed, tests passed (fewer failed), fewer clippy warnings, smaller diff."""
        return (
            int(self.green),
            int(self.contract_met),
            self.examples_passed,
            self.tests_passed,
            -self.tests_failed,
            -self.clippy_warnings,
            -self.diff_lines,
        )

    @property
    def perfect(self) -> bool:
        """Everything met: green, the contract, every example, no failing test, no clippy warning."""
        return (
            self.green
            and self.contract_met
            and self.examples_passed == self.examples_total
            and self.tests_failed == 0
            and self.clippy_warnings == 0
        )

    def describe(self) -> str:
        """One line for the widget's candidate row and the log."""
        parts = ["green" if self.green else "not green"]
        if not self.contract_met:
            parts.append("contract NOT met")
        if self.examples_total:
            parts.append(f"examples {self.examples_passed}/{self.examples_total}")
        parts.append(
            f"tests {self.tests_passed} passed" + (f", {self.tests_failed} failed" if self.tests_failed else "")
        )
        parts.append(f"clippy {self.clippy_warnings}")
        parts.append(f"diff {self.diff_lines} lines")
        return " · ".join(parts) + (f" ({self.note})" if self.note else "")

    def to_json(self) -> dict[str, Any]:
        """The score's parts and ``perfect``, for provenance and ``flakebot show --json``."""
        return {**asdict(self), "perfect": self.perfect}


def best(scores: Mapping[int, Score]) -> int:
    """The index of the best score (ties: the lowest index). Raises ValueError when there is none."""
    if not scores:
        raise ValueError("no candidate has a score")
    return max(sorted(scores), key=lambda index: scores[index].key())


def diff_lines(git: Git, base_commit: str, head: str = "HEAD") -> int:
    """Lines added plus removed from ``base_commit`` to ``head`` (a binary file counts as one line)."""
    total = 0
    for line in git("diff", "--numstat", "--no-renames", base_commit, head, "--").splitlines():
        added, _, rest = line.partition("\t")
        removed = rest.partition("\t")[0]
        total += int(added) + int(removed) if added.isdigit() and removed.isdigit() else 1
    return total


def judge(
    run: CheckRun,
    workspace: Path,
    base_commit: str,
    examples: list[Example],
    *,
    git: Git,
    name: str | None = None,
    confine: bool = True,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    clippy_baseline: int = 0,
) -> Score:
    """Score the candidate in ``workspace`` whose last check run is ``run``.

    The diff is measured from ``base_commit`` to the candidate's HEAD with
    ``git`` (the candidate's repository). The ``examples`` run only when the
    run is green: against a copy of the candidate's binary, through the same
    client a deployed tool gets (:func:`~flakebot_magic.clients.make_tool`),
    named ``name`` in the examples' namespace (the tool's name in the cell;
    default: the contract's binary name), and with ``confine`` (the default)
    in the sandbox. ``timeout`` is the seconds one call of the tool may take,
    ``env`` what is added to its environment (the ``tool_env`` setting).
    ``clippy_baseline``: clippy's warnings at check run 0; only those beyond
    it count against the candidate.
    """
    contract_met = run.contract is not None and not run.contract_problem
    passed, note = 0, ""
    if examples and run.green and run.contract is not None:
        called = name or tool_name(run.contract.bin or "tool")
        try:
            passed = _examples_passed(run, Path(workspace), examples, called, confine, timeout, env)
        except (FlakebotError, OSError) as exc:
            note = f"the examples could not run: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    elif examples:
        note = "examples not run: the check run is not green"
    return Score(
        contract_met=contract_met,
        examples_passed=passed,
        examples_total=len(examples),
        tests_passed=run.passed,
        tests_failed=run.failed,
        # the crate's own warnings at check run 0 are not the candidate's doing
        clippy_warnings=max(0, len(run.clippy) - clippy_baseline),
        diff_lines=diff_lines(git, base_commit),
        green=run.green,
        note=note,
    )


def _examples_passed(
    run: CheckRun,
    workspace: Path,
    examples: list[Example],
    name: str,
    confine: bool,
    timeout: float,
    env: Mapping[str, str] | None,
) -> int:
    assert run.contract is not None
    built = run.binaries.get(run.contract.bin)
    if built is None:
        raise FileNotFoundError(f"the check run built no binary named {run.contract.bin}")
    source = Path(built).resolve()
    if workspace.resolve() not in source.parents:
        raise FileNotFoundError(f"the binary {source} is not inside the candidate's workspace {workspace}")
    # a copy: the engineer's next build may replace the binary while the examples run
    scratch = Path(tempfile.mkdtemp(prefix="flakebot-judge-"))
    try:
        binary = scratch / "bin" / source.name
        binary.parent.mkdir()
        shutil.copyfile(source, binary, follow_symlinks=False)
        os.chmod(binary, stat.S_IRWXU)
        tool = make_tool(
            name,
            binary,
            crate=run.contract.bin,
            version="candidate",
            source_hash="",
            store_path=scratch,
            contract=run.contract,
            start=False,
            timeout=timeout,
            env=env,
            confine=confine,
        )
        try:
            return run_examples(examples, {name: tool}, confine=confine).passed
        finally:
            tool.close()
    finally:
        remove_tree(scratch, ignore_errors=True)
