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
from flakebot_magic.eval.outcome import Meter, TimedOut, classify, failure_message
from flakebot_magic.eval.results import FAILURES
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
