"""The popularity prior: which crates a manifest builds on, and how many crates build on each."""

from __future__ import annotations

import doctest

from flakebot_magic.registry import prior
from flakebot_magic.registry.prior import dependency_names, prior_factor, reverse_dependencies


def test_doctests() -> None:
    assert doctest.testmod(prior).failed == 0


def test_dependency_names_follow_renames_and_targets_and_skip_dev() -> None:
    manifest = {
        "dependencies": {"serde": "1", "json": {"package": "serde_json", "version": "1"}},
        "build-dependencies": {"cc": "1"},
        "dev-dependencies": {"tempfile": "3"},
        "target": {"cfg(unix)": {"dependencies": {"libc": "0.2"}}},
    }
    assert dependency_names(manifest) == {"serde", "serde_json", "cc", "libc"}


def test_reverse_dependencies_count_distinct_dependents() -> None:
    prior = reverse_dependencies({"a": ["log", "log", "a"], "b": ["log", "missing"], "log": []})
    # log has two dependents; the mean over three crates is 2/3
    assert prior == {"a": 0.0, "b": 0.0, "log": 3.0}
    assert reverse_dependencies({}) == {}


def test_the_factor_grows_with_the_prior_and_is_one_without_it() -> None:
    assert prior_factor(0.0) == 1.0 == prior_factor(-1.0)
    assert 1.0 < prior_factor(1.0) < prior_factor(10.0)
    assert prior_factor(10.0, weight=0.0) == 1.0
