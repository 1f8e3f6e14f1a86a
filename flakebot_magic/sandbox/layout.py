"""What counts as a workspace's source: the entries of its root that are not (git, build outputs, clones).

Named once, here; the tree policy, the edit loop's commits, listings and
walks, the candidates' clones, the flake's ``src`` and the eval's copies all
use these names (a test reads the package to hold it so).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable

__all__ = [
    "BUILD_DIR",
    "CANDIDATES_DIR",
    "DEPS_DIR",
    "GIT_DIR",
    "NIX_RESULTS",
    "NOT_SOURCE",
    "NOT_WALKED",
    "OUTPUT_DIRS",
    "SOURCE_PATHSPEC",
    "is_source",
    "not_committed",
    "source_dirs",
]

#: git's own directory
GIT_DIR = ".git"
#: cargo's build outputs
BUILD_DIR = "target"
#: where ``--candidates`` keeps each candidate's clone of the workspace (edit/forks.py)
CANDIDATES_DIR = ".flakebot-candidates"
#: the stub the flake's dependencies' derivation builds (stages/flake.py writes it beside flake.nix; source to nix,
#: none to cargo)
DEPS_DIR = "flakebot-deps"
#: ``nix build``'s result links
NIX_RESULTS = ("result", "result-*")
#: directories of the workspace root that hold build outputs or candidates' clones
OUTPUT_DIRS = (BUILD_DIR, CANDIDATES_DIR)
#: directories of the root never walked as source (listings, the ratchet, the policy's walk, copies)
NOT_WALKED = (GIT_DIR, *OUTPUT_DIRS)
#: top-level entries never committed, nor removed by a revert: build outputs, nix's result links, candidates
NOT_SOURCE = (BUILD_DIR, *NIX_RESULTS, CANDIDATES_DIR)
#: git's pathspec for the source: the whole tree but :data:`NOT_SOURCE` (``git add -A -- *SOURCE_PATHSPEC``)
SOURCE_PATHSPEC = (".", *(f":(exclude,top){name}" for name in NOT_SOURCE))


def is_source(name: str) -> bool:
    """Whether the root's entry ``name`` may hold source (is walked, listed, copied).

    >>> [is_source(n) for n in ("src", ".git", "target", ".flakebot-candidates", "Cargo.toml")]
    [True, False, False, False, True]
    """
    return name not in NOT_WALKED


def not_committed(name: str) -> bool:
    """Whether the root's entry ``name`` is left out of a check run's commit (:data:`NOT_SOURCE`, as
    :data:`SOURCE_PATHSPEC` leaves it out of ``git add``).

    >>> [not_committed(n) for n in ("target", "result", "result-bin", "src", "results")]
    [True, True, True, False, False]
    """
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in NOT_SOURCE)


def source_dirs(names: Iterable[str]) -> list[str]:
    """The directories among the root's ``names`` that may hold source, in their order (``os.walk``'s pruning)."""
    return [name for name in names if is_source(name)]
