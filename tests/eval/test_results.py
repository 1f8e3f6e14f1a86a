"""Results: pass@k is the Codex paper's unbiased estimator; the summary's numbers; records journalled whole or not at all."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flakebot_magic.eval.results import (
    REPLAY_LABEL,
    SCHEMA,
    AttemptResult,
    HiddenResult,
    ResultStore,
    document,
    pass_at_k,
    slug,
    summarize,
)
from flakebot_magic.eval.task import HiddenCheck, Suite, Task


def _codex(n: int, c: int, k: int) -> float:
    """The paper's numerically stable form: 1 - prod(1 - k / i) for i in n-c+1 .. n."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def test_pass_at_k_is_the_unbiased_estimator_for_every_small_case() -> None:
    for n in range(1, 13):
        for c in range(n + 1):
            previous = -1.0
            for k in range(1, n + 1):
                value = pass_at_k(n, c, k)
                assert value == pytest.approx(_codex(n, c, k), abs=1e-12), (n, c, k)
                assert 0.0 <= value <= 1.0 and value >= previous  # more tries never lower it
                previous = value
            assert pass_at_k(n, c, 1) == pytest.approx(c / n)
            assert pass_at_k(n, c, n) == (1.0 if c else 0.0)


@pytest.mark.parametrize(("n", "c", "k"), [(0, 0, 1), (3, 4, 1), (3, 1, 0), (3, 1, 4), (3, -1, 1)])
def test_pass_at_k_refuses_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def _attempt(task: str, attempt: int, passed: bool, **more: object) -> AttemptResult:
    fields: dict[str, object] = {
        "task": task,
        "model": "m",
        "attempt": attempt,
        "replay": False,
        "passed": passed,
        "green": passed,
        "iterations": 2,
        "prompt_tokens": 1000,
        "completion_tokens": 100,
        "calls": 2,
        "cost_usd": 0.01,
        "seconds": 10.0,
        "failure": None if passed else "hidden-tests-failed",
    }
    fields.update(more)
    return AttemptResult(**fields)  # type: ignore[arg-type]


def test_the_summary_of_independent_attempts() -> None:
    attempts = [
        _attempt("a", 1, True, iterations=1),
        _attempt("a", 2, True, iterations=3),
        _attempt("b", 1, False, green=True),  # deployed, but its hidden tests failed
        _attempt("b", 2, True, iterations=5),
        _attempt("c", 1, False, green=False, failure="edit-stuck", iterations=8),
        _attempt("c", 2, False, green=False, failure="budget", iterations=8),
    ]
    s = summarize(attempts, tasks=["a", "b", "c"], attempts_per_task=2, feedback=False)
    assert s["pass_at_1"] == pytest.approx((1.0 + 0.5 + 0.0) / 3, abs=1e-6)
    assert s["pass_at_k"]["2"] == pytest.approx((1.0 + 1.0 + 0.0) / 3, abs=1e-6)
    assert s["solved"] == 2 and s["passed_attempts"] == 3 and s["complete"] is True
    assert s["median_iterations_to_green"] == 2.5  # the green attempts took 1, 3, 2 and 5
    assert s["tokens"] == 6 * 1100 and s["tokens_per_solved"] == pytest.approx(6 * 1100 / 3, abs=0.1)
    assert s["cost_usd"] == pytest.approx(0.06) and s["cost_per_solved_usd"] == pytest.approx(0.02)
    assert s["failures"] == {"budget": 1, "edit-stuck": 1, "hidden-tests-failed": 1}


def test_with_feedback_pass_at_k_is_solved_within_k_tries() -> None:
    # b passed at once and got no second try; c never passed
    attempts = [_attempt("a", 1, False), _attempt("a", 2, True), _attempt("b", 1, True)]
    attempts += [_attempt("c", 1, False), _attempt("c", 2, False)]
    s = summarize(attempts, tasks=["a", "b", "c"], attempts_per_task=2, feedback=True)
    assert s["pass_at_k"]["1"] == pytest.approx(1 / 3, abs=1e-6) and s["pass_at_k"]["2"] == pytest.approx(
        2 / 3, abs=1e-6
    )
    assert s["complete"] is True and "within" in s["pass_at_k_meaning"]


def test_an_unpriced_attempt_makes_the_cost_unknown_not_zero() -> None:
    s = summarize(
        [_attempt("a", 1, True), _attempt("b", 1, True, cost_usd=None)],
        tasks=["a", "b"],
        attempts_per_task=1,
        feedback=False,
    )
    assert s["cost_usd"] is None and s["cost_per_solved_usd"] is None
    # an attempt that spent nothing costs nothing, priced or not
    s = summarize(
        [_attempt("a", 1, False, cost_usd=None, prompt_tokens=0, completion_tokens=0)],
        tasks=["a"],
        attempts_per_task=1,
        feedback=False,
    )
    assert s["cost_usd"] == 0.0 and s["tokens_per_solved"] is None


def test_a_summary_while_attempts_are_missing_says_so() -> None:
    s = summarize([_attempt("a", 1, True)], tasks=["a", "b"], attempts_per_task=2, feedback=False)
    assert s["complete"] is False and s["pass_at_k"]["2"] is None and s["pass_at_1"] == 1.0


def test_records_round_trip_and_are_written_whole(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    result = _attempt("a", 1, True, hidden=HiddenResult(3, 3), proof={"commit": "abc"}, reverts=["x"])
    store.write(result)
    assert store.read("m", "a", 1) == result
    assert store.has_results()
    path = store.record_path("m", "a", 1)
    assert json.loads(path.read_text())["tokens"] == 1100
    # a record torn by a crash (not possible with the atomic write, but a disk may lie) is not a result
    path.write_text(path.read_text()[:40])
    assert store.read("m", "a", 1) is None
    assert [p.name for p in path.parent.iterdir()] == ["attempt-1.json"]  # no temporary file left behind


def test_model_names_become_distinct_safe_file_names() -> None:
    names = ["gpt-4.1", "openai/gpt-4.1", "openai:gpt-4.1", "../../etc", "qwen2.5-coder:14b", ""]
    slugs = [slug(n) for n in names]
    assert len(set(slugs)) == len(slugs)
    assert all("/" not in s and s not in (".", "..") and not s.startswith(".") for s in slugs)
    assert slug("gpt-4.1") == "gpt-4.1"


def test_the_document_of_a_replay_says_replay(tmp_path: Path) -> None:
    task = Task("a", tmp_path, "a", "words", HiddenCheck("pytest", (tmp_path / "t.py",)))
    data = document(
        suite=Suite(tmp_path, (task,)),
        models=[{"model": "replay", "kind": "replay", "label": "replay (not a model)"}],
        attempts=[_attempt("a", 1, True, model="replay", replay=True)],
        config={"replay": True, "attempts": 1},
        started="then",
        finished="now",
    )
    assert data["schema"] == SCHEMA and data["kind"] == "replay" and data["replay"] is True
    assert data["notice"] == REPLAY_LABEL and "not a model" in data["notice"]
    assert data["models"][0]["summary"]["pass_at_1"] == 1.0 and data["complete"] is True
    assert all(a["replay"] for a in data["attempts"])
