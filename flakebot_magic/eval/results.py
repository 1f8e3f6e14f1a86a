"""What an eval found: one record per attempt (journalled atomically), the summary per model, ``results.json``.

Each finished attempt is written to ``OUT/records/<model>/<task>/attempt-<i>.json``
in one step (:func:`~flakebot_magic.host.fsutil.atomic_write`): an eval that is
killed keeps every attempt that finished, and ``--resume`` runs only the
others. :func:`document` turns the records into ``results.json``, whose schema
(:data:`SCHEMA`) is documented in ``docs/eval.md`` and only ever grows: a
reader of version 1 reads every later version 1 file.

pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large
Language Models Trained on Code", the Codex paper): with ``n`` independent
attempts at a task of which ``c`` passed, ``1 - C(n-c, k) / C(n, k)``,
averaged over the tasks. With ``--feedback`` the attempts are not
independent (each sees the last one's failures), so pass@k is then the share
of tasks solved within ``k`` tries, as aider reports its second try.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..host.fsutil import atomic_write, load_json
from .task import Suite

__all__ = [
    "FAILURES",
    "FAULTS",
    "REFERENCE_LABEL",
    "REFERENCE_MODEL",
    "REPLAY_LABEL",
    "REPLAY_MODEL",
    "SCHEMA",
    "AttemptResult",
    "HiddenResult",
    "ResultStore",
    "document",
    "pass_at_k",
    "slug",
    "summarize",
]

#: the version of results.json (docs/eval.md); a change that removes or renames a field needs a new version
SCHEMA = "flakebot-eval/1"
#: the "model" of a replay: each task's solution.json served by the fake server
REPLAY_MODEL = "replay"
#: what every view of a replay says about it
REPLAY_LABEL = (
    "REPLAY: each task's solution.json served by the fake OpenAI-compatible server (a test double), not a model"
)
#: the "model" of a reference run: each task's reference solution sent by the fake server
REFERENCE_MODEL = "reference"
#: what every view of a reference run says about it
REFERENCE_LABEL = (
    "REFERENCE: each task's reference solution sent by the fake OpenAI-compatible server (a test double), not a "
    "model: every task that can run here must pass"
)
#: why an attempt failed: its class, and what the class means (docs/eval.md lists them too)
FAILURES: dict[str, str] = {
    "no-crate": "no crate fits the request (the search found none, or the named crate is not in the registry)",
    "fork": "the crate could not be forked into a workspace",
    "edit-stuck": "the edit loop stopped short of green: the same errors twice in a row, or no more tool calls",
    "budget": "the edit loop ran out of iterations, tokens or cost",
    "policy": "the workspace broke the build policy (a build script, .cargo/, a path outside, ...)",
    "ratchet": "the ratchet reverted deleted, emptied, ignored or failing tests, and the session never went green",
    "model": "the model's endpoint failed (in a replay: the script ran out before the session was green)",
    "build": "the release build or the crate's tests failed after the session",
    "deploy": "the tool could not be deployed",
    "timeout": "the task's time limit passed",
    "hidden-tests-failed": "the tool was deployed and some hidden tests failed",
    "hidden-tests-compile": "the final code does not compile against the hidden tests (its public items are not "
    "what they call)",
    "hidden-tests-error": "the hidden tests could not run against the tool (the harness: the message says why)",
    "bad-task": "the task itself is wrong (its solution.json or reference, its starting crate)",
    "harness": "the eval harness failed (a bug in flakebot: the message says where)",
    "error": "another flakebot error (the message says which)",
}
#: whose fault each failure class is: the model's answer, this machine (what it lacks, its time), the harness, the task
FAULTS: dict[str, str] = {
    "no-crate": "environment",
    "fork": "environment",
    "edit-stuck": "model",
    "budget": "model",
    "policy": "model",
    "ratchet": "model",
    "model": "environment",
    "build": "model",
    "deploy": "environment",
    "timeout": "environment",
    "hidden-tests-failed": "model",
    "hidden-tests-compile": "model",
    "hidden-tests-error": "harness",
    "bad-task": "task",
    "harness": "harness",
    "error": "harness",
}
#: a message kept in a record is cut to this many characters
MESSAGE_CHARS = 4000


def slug(text: str) -> str:
    """A file name for ``text`` (a model's name may hold ``/`` or ``:``): safe characters, and a hash if any changed."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", text).strip("._") or "model"
    if safe != text:
        import hashlib

        safe = f"{safe[:60]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return safe


def cut(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` cut to ``limit`` characters, head and tail kept."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} characters cut ...]\n{text[-half:]}"


@dataclass(frozen=True)
class HiddenResult:
    """The hidden checks of one attempt: how many passed of how many, and what the failures said."""

    passed: int
    total: int
    #: the failing checks' names and output (capped); what --feedback shows the next attempt
    output: str = ""
    #: the checks could not run (the tool would not load, the Rust tests did not compile, ...)
    error: str = ""
    #: each test's result by its key (Rust: ``tests/forth.rs::dup::can_dup``): passed, failed, did not report
    tests: dict[str, str] = field(default_factory=dict)
    #: one line: the first failing test and its assertion, or the first compile error
    cause: str = ""
    #: the tests did not compile against the model's code (its public items are not what they call)
    compile: bool = False

    @property
    def ok(self) -> bool:
        return self.total > 0 and self.passed == self.total and not self.error

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "total": self.total,
            "output": self.output,
            "error": self.error,
            "tests": dict(self.tests),
            "cause": self.cause,
            "compile": self.compile,
        }

    @classmethod
    def from_json(cls, data: Any) -> HiddenResult | None:
        if not isinstance(data, Mapping):
            return None
        tests = data.get("tests")
        return cls(
            int(data.get("passed", 0)),
            int(data.get("total", 0)),
            str(data.get("output", "")),
            str(data.get("error", "")),
            {str(k): str(v) for k, v in tests.items()} if isinstance(tests, Mapping) else {},
            str(data.get("cause", "")),
            bool(data.get("compile", False)),
        )


@dataclass(frozen=True)
class AttemptResult:
    """One attempt of one model at one task (a record of ``results.json``'s ``attempts``)."""

    task: str
    model: str
    attempt: int
    replay: bool
    passed: bool
    green: bool
    hidden: HiddenResult | None = None
    #: the green check run's commit, the deployed store entry, the crate's tests in the final build
    proof: dict[str, Any] = field(default_factory=dict)
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    calls: int = 0
    cost_usd: float | None = None
    seconds: float = 0.0
    failure: str | None = None
    message: str = ""
    reverts: list[str] = field(default_factory=list)
    workspace: str = ""
    cache_dir: str = ""
    finished_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    #: one line of ``message``: the first error, or the first failing test and its assertion
    cause: str = ""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def fault(self) -> str | None:
        """Whose fault the failure is (:data:`FAULTS`); in a replay the script is the task's, not an endpoint's."""
        if self.failure is None:
            return None
        if self.replay and self.failure == "model":
            return "task"
        return FAULTS.get(self.failure, "harness")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["hidden"] = self.hidden.to_json() if self.hidden is not None else None
        data["tokens"] = self.tokens
        data["fault"] = self.fault
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AttemptResult:
        known = {f for f in cls.__dataclass_fields__}
        values = {key: value for key, value in data.items() if key in known}
        values["hidden"] = HiddenResult.from_json(data.get("hidden"))
        return cls(**values)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one task with ``n`` attempts of which ``c`` passed (Chen et al. 2021).

    >>> pass_at_k(10, 3, 1)
    0.3
    >>> round(pass_at_k(10, 3, 5), 4)
    0.9167
    >>> pass_at_k(4, 0, 2), pass_at_k(2, 1, 2)
    (0.0, 1.0)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, not n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))  # exact, rounded once


def summarize(
    attempts: Sequence[AttemptResult], *, tasks: Iterable[str], attempts_per_task: int, feedback: bool
) -> dict[str, Any]:
    """One model's summary over ``tasks``: pass@1 and pass@k, iterations, tokens and cost per solved task."""
    by_task: dict[str, list[AttemptResult]] = {task: [] for task in tasks}
    for result in attempts:
        by_task.setdefault(result.task, []).append(result)
    for results in by_task.values():
        results.sort(key=lambda r: r.attempt)

    def done(results: list[AttemptResult]) -> bool:  # with feedback, a task that passed gets no more tries
        return len(results) >= attempts_per_task or (feedback and any(r.passed for r in results))

    complete = all(done(results) for results in by_task.values())
    pass_at: dict[str, float | None] = {}
    for k in range(1, attempts_per_task + 1):
        scores = []
        for results in by_task.values():
            if feedback:  # sequential tries: solved within k
                if len(results) >= k or done(results):
                    scores.append(1.0 if any(r.passed for r in results[:k]) else 0.0)
            elif len(results) >= k:
                scores.append(pass_at_k(len(results), sum(r.passed for r in results), k))
        pass_at[str(k)] = round(sum(scores) / len(scores), 6) if scores else None
    passing = [r for r in attempts if r.passed]
    green = [r.iterations for r in attempts if r.green]
    tokens = sum(r.tokens for r in attempts)
    unpriced = any(r.cost_usd is None and r.tokens > 0 for r in attempts)
    cost = None if unpriced else round(sum(r.cost_usd or 0.0 for r in attempts), 6)
    failures: dict[str, int] = {}
    faults: dict[str, int] = {}
    for result in attempts:
        if result.failure:
            failures[result.failure] = failures.get(result.failure, 0) + 1
            faults[str(result.fault)] = faults.get(str(result.fault), 0) + 1
    return {
        "tasks": len(by_task),
        "attempts": len(attempts),
        "attempts_per_task": attempts_per_task,
        "complete": complete,
        "solved": sum(1 for results in by_task.values() if any(r.passed for r in results)),
        "passed_attempts": len(passing),
        "pass_at_1": pass_at.get("1"),
        "pass_at_k": pass_at,
        "pass_at_k_meaning": "solved within k tries (--feedback)"
        if feedback
        else "unbiased estimator (Chen et al. 2021)",
        "median_iterations_to_green": statistics.median(green) if green else None,
        "prompt_tokens": sum(r.prompt_tokens for r in attempts),
        "completion_tokens": sum(r.completion_tokens for r in attempts),
        "tokens": tokens,
        "cost_usd": cost,
        "tokens_per_solved": round(tokens / len(passing), 1) if passing else None,
        "cost_per_solved_usd": round(cost / len(passing), 6) if passing and cost is not None else None,
        "seconds": round(sum(r.seconds for r in attempts), 3),
        "failures": dict(sorted(failures.items())),
        "faults": dict(sorted(faults.items())),
    }


def document(
    *,
    suite: Suite,
    models: Sequence[Mapping[str, Any]],
    attempts: Sequence[AttemptResult],
    config: Mapping[str, Any],
    started: str,
    finished: str | None,
) -> dict[str, Any]:
    """``results.json``: the eval's settings, each model with its summary, every attempt (schema :data:`SCHEMA`)."""
    replay = bool(config.get("replay"))
    reference = bool(config.get("reference"))
    task_ids = [task.id for task in suite.tasks]
    entries = []
    for model in models:
        mine = [a for a in attempts if a.model == model["model"]]
        entries.append(
            {
                **model,
                "summary": summarize(
                    mine,
                    tasks=task_ids,
                    attempts_per_task=int(config.get("attempts", 1)),
                    feedback=bool(config.get("feedback")),
                ),
            }
        )
    return {
        "schema": SCHEMA,
        "kind": "replay" if replay else "models",
        "replay": replay,
        "reference": reference,
        "notice": REFERENCE_LABEL if reference else REPLAY_LABEL if replay else "",
        "suite": {
            "path": str(suite.path),
            "tasks": task_ids,
            "problems": [p.to_json() for p in suite.problems],
            # written right, but needing what this machine lacks: out of every score
            "not_runnable": [p.to_json() for p in suite.unrunnable],
        },
        "config": dict(config),
        "started": started,
        "finished": finished,
        "complete": finished is not None and all(e["summary"]["complete"] for e in entries),
        "models": entries,
        "attempts": [a.to_json() for a in sorted(attempts, key=lambda a: (a.model, a.task, a.attempt))],
    }


class ResultStore:
    """The records of one eval under ``OUT``: one JSON file per finished attempt, and the eval's settings."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)

    @property
    def config_path(self) -> Path:
        return self.out / "eval.json"

    @property
    def results_path(self) -> Path:
        return self.out / "results.json"

    def record_path(self, model: str, task: str, attempt: int) -> Path:
        return self.out / "records" / slug(model) / task / f"attempt-{attempt}.json"

    def work_dir(self, model: str, task: str, attempt: int) -> Path:
        """Where attempt ``attempt`` builds: its own flakebot cache and its hidden checks."""
        return self.out / "work" / slug(model) / task / f"attempt-{attempt}"

    def has_results(self) -> bool:
        return (self.out / "records").is_dir() and any((self.out / "records").rglob("attempt-*.json"))

    def read_config(self) -> dict[str, Any] | None:
        try:
            data = load_json(self.config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def write_config(self, config: Mapping[str, Any]) -> None:
        atomic_write(self.config_path, json.dumps(dict(config), indent=2) + "\n", make_parents=True)

    def read(self, model: str, task: str, attempt: int) -> AttemptResult | None:
        """The record of a finished attempt, or None (never run, interrupted, or unreadable)."""
        path = self.record_path(model, task, attempt)
        try:
            data = load_json(path.read_text(encoding="utf-8"))
            return AttemptResult.from_json(data)
        except (OSError, ValueError, TypeError):
            return None

    def write(self, result: AttemptResult) -> None:
        """Journal a finished attempt, in one step: it is there whole, or not at all."""
        path = self.record_path(result.model, result.task, result.attempt)
        atomic_write(path, json.dumps(result.to_json(), indent=2) + "\n", make_parents=True)

    def write_results(self, data: Mapping[str, Any]) -> None:
        atomic_write(self.results_path, json.dumps(dict(data), indent=2) + "\n", mode=0o644, make_parents=True)
