"""An attempt's outcome: every error of the pipeline has its failure class; a session that never went green after the
ratchet undid a change to the tests is the ratchet's, whatever ended it."""

from __future__ import annotations

import pytest

from flakebot_magic.errors import (
    BudgetExhausted,
    BuildError,
    Cancelled,
    ConfigError,
    DeployError,
    EditError,
    FlakeError,
    ForkError,
    ModelError,
    NeedsModelError,
    PolicyError,
    RegistryError,
    SearchError,
    StageTimeout,
    TestError,
    UsageError,
)
from flakebot_magic.eval.outcome import Meter, TimedOut, cause_of, classify, failure_message, hidden_verdict
from flakebot_magic.eval.results import FAILURES, FAULTS, AttemptResult, HiddenResult
from flakebot_magic.events import IterationResult


@pytest.mark.parametrize(
    ("error", "failure"),
    [
        (NeedsModelError("x"), "no-crate"),
        (SearchError("x"), "no-crate"),
        (RegistryError("x"), "no-crate"),
        (ForkError("x"), "fork"),
        (PolicyError("x"), "policy"),
        (BudgetExhausted("x", reason="tokens"), "budget"),
        (EditError("x", reason="stuck"), "edit-stuck"),
        (ModelError("x"), "model"),
        (BuildError("x"), "build"),
        (TestError("x"), "build"),
        (DeployError("x"), "deploy"),
        (FlakeError("x"), "deploy"),
        (StageTimeout("x"), "timeout"),
        (TimedOut("x"), "timeout"),
        (UsageError("x"), "bad-task"),
        (ConfigError("x"), "error"),
        (Cancelled("x"), "error"),
        (RuntimeError("x"), "harness"),
    ],
)
def test_every_error_has_its_class(error: Exception, failure: str) -> None:
    assert classify(error, Meter()) == failure
    assert failure in FAILURES


def test_the_ratchet_is_named_when_it_undid_a_change_and_the_session_never_went_green() -> None:
    meter = Meter()
    meter(IterationResult(iteration=1, passed=0, failed=0, errors=0, reverted=True, reason="deleted test `adds`"))
    for error in (
        ModelError("script ran out"),
        EditError("stuck", reason="stuck"),
        BudgetExhausted("x", reason="iterations"),
    ):
        assert classify(error, meter) == "ratchet"
        assert failure_message(error, "ratchet", meter).startswith("The ratchet reverted: deleted test `adds`")
    assert classify(BuildError("x"), meter) == "build"  # a later failure is its own


def test_a_policy_revert_is_not_the_ratchet() -> None:
    meter = Meter()
    meter(
        IterationResult(
            iteration=1, passed=0, failed=0, errors=0, reverted=True, reason="the build policy refuses build.rs"
        )
    )
    assert meter.reverts and not meter.ratchet_reverts
    assert classify(EditError("stuck", reason="stuck"), meter) == "edit-stuck"


def test_every_failure_class_says_whose_fault_it_is() -> None:
    assert set(FAULTS) == set(FAILURES)
    assert set(FAULTS.values()) == {"model", "environment", "harness", "task"}
    # the model's: a wrong answer, not compiling against the tests, giving up, the budget
    for failure in ("hidden-tests-failed", "hidden-tests-compile", "edit-stuck", "budget"):
        assert FAULTS[failure] == "model"
    assert FAULTS["timeout"] == FAULTS["fork"] == "environment"
    assert FAULTS["hidden-tests-error"] == FAULTS["harness"] == "harness"
    # in a replay the "model" is the task's own script: its running out is the task's fault
    assert AttemptResult("t", "replay", 1, True, False, False, failure="model").fault == "task"
    assert AttemptResult("t", "m", 1, False, False, False, failure="model").fault == "environment"
    assert AttemptResult("t", "m", 1, False, True, True).to_json()["fault"] is None


@pytest.mark.parametrize(
    "error",
    [EditError("", reason="stuck"), ModelError(""), BuildError(""), RuntimeError(), TimedOut(""), UsageError("")],
)
def test_a_failure_message_is_never_empty(error: Exception) -> None:
    failure = classify(error, Meter())
    message = failure_message(error, failure, Meter())
    assert message.strip()
    assert cause_of(error, message).strip()


@pytest.mark.parametrize(
    "hidden",
    [
        HiddenResult(0, 3),
        HiddenResult(2, 3),
        HiddenResult(3, 3, error="x"),
        HiddenResult(0, 0),
        HiddenResult(0, 0, error="the code does not compile", compile=True),
        HiddenResult(1, 3, output="FAILED a::b\n  thread 'a::b' panicked", cause="a::b: assertion failed"),
    ],
)
def test_a_hidden_verdict_that_fails_always_says_why(hidden: HiddenResult) -> None:
    failure, message = hidden_verdict(hidden)
    assert failure in FAILURES and message.strip()
    if hidden.cause:
        assert hidden.cause in message
    assert failure == (
        "hidden-tests-compile" if hidden.compile else "hidden-tests-error" if hidden.error else "hidden-tests-failed"
    )
    assert hidden_verdict(HiddenResult(3, 3)) == (None, "")


STUCK_REPORT = """Check run 3: build failed (1 error)

error[E0425] src/lib.rs:3:5: cannot find value `x` in this scope
   |
 3 |     x + 1
   |     ^ not found in this scope

Contract: ok (cli, bin reverse)"""


def test_the_cause_of_a_stuck_edit_loop_is_its_first_error_not_the_words_before_it() -> None:
    error = EditError(
        "The edit loop is stuck: check runs 2 and 3 failed the same way. Last diagnostics:\n" + STUCK_REPORT,
        diagnostics=STUCK_REPORT,
        reason="stuck",
    )
    message = failure_message(error, "edit-stuck", Meter())
    assert cause_of(error, message) == "error[E0425] src/lib.rs:3:5: cannot find value `x` in this scope"
    failing = "Check run 2: 1 test failed\n\nTests: 1 passed, 1 failed\n---- tests::adds ----\n  left: 1\n  right: 2\n"
    assert (
        cause_of(EditError("x", diagnostics=failing, reason="stuck"), "x") == "---- tests::adds ---- left: 1 right: 2"
    )
    # a message without a report: its first line, with the next when the first only introduces it
    assert cause_of(ModelError("endpoint said:\n\nHTTP 500"), "endpoint said:\n\nHTTP 500") == "endpoint said: HTTP 500"
