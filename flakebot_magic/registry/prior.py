"""The popularity prior of a crate: how many crates of the registry build on it.

:func:`reverse_dependencies` over the registry's dependency graph gives a
popularity prior, computed once when the index is built: a crate much of the
registry builds on (``toml``, ``url``) is more often what a user means than
one that merely repeats the query's words. (PageRank over the same graph was
measured too and ranked worse: it piles its weight on infrastructure such as
``proc-macro2``, which no request asks for.) :func:`prior_factor` is how
much it multiplies a crate's relevance (:func:`.ranking.combine`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["PRIOR_WEIGHT", "dependency_names", "prior_factor", "reverse_dependencies"]

#: how strongly the popularity prior lifts a relevant crate (``w`` in :func:`.ranking.combine`'s score)
PRIOR_WEIGHT = 0.3


def dependency_names(manifest: Mapping[str, Any]) -> set[str]:
    """The crates a manifest builds on: ``[dependencies]`` and ``[build-dependencies]``,
    also under ``[target.*]``, by their registry name (``package = "..."`` renames
    followed). Dev-dependencies are left out: they say what a crate is tested
    with, not what it is built on."""
    tables: list[Any] = [
        manifest.get("dependencies"),
        manifest.get("build-dependencies"),
        manifest.get("build_dependencies"),
    ]
    targets = manifest.get("target")
    if isinstance(targets, Mapping):
        for target in targets.values():
            if isinstance(target, Mapping):
                tables += [target.get("dependencies"), target.get("build-dependencies")]
    names: set[str] = set()
    for table in tables:
        if not isinstance(table, Mapping):
            continue
        for key, spec in table.items():
            renamed = spec.get("package") if isinstance(spec, Mapping) else None
            names.add(renamed if isinstance(renamed, str) else str(key))
    return names


def reverse_dependencies(edges: Mapping[str, Iterable[str]]) -> dict[str, float]:
    """How many crates build on each crate, scaled so that the mean crate has 1.0.

    ``edges`` maps each crate to the crates it depends on. Names outside
    ``edges`` (dependencies the registry does not hold) and a crate's
    dependency on itself are ignored.

    Examples
    --------
    >>> reverse_dependencies({"app": ["toml", "log"], "lib": ["log"], "toml": [], "log": []})
    {'app': 0.0, 'lib': 0.0, 'log': 2.6666666666666665, 'toml': 1.3333333333333333}
    """
    counts = dict.fromkeys(sorted(edges), 0)
    for name, dependencies in edges.items():
        for dependency in set(dependencies):
            if dependency in counts and dependency != name:
                counts[dependency] += 1
    mean = sum(counts.values()) / len(counts) if counts else 0
    return {name: (count / mean if mean else 0.0) for name, count in counts.items()}


def prior_factor(prior: float, weight: float | None = None) -> float:
    """``1 + weight * log(1 + prior)``: how much the prior multiplies relevance
    (``weight`` defaults to :data:`PRIOR_WEIGHT`)."""
    w = PRIOR_WEIGHT if weight is None else weight
    return 1.0 + w * math.log1p(max(prior, 0.0))
