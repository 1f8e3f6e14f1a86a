"""Stage 1: find the crate that is the best starting point for a request."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from ..errors import SearchError
from ..registry.base import CrateCandidate, Registry

__all__ = ["BIN_BOOST", "open_registry", "rank", "search", "wants_tool"]

#: how much a binary target multiplies a candidate's score when a tool is wanted
BIN_BOOST = 1.75

_TOOL_WORDS = re.compile(
    r"\b(tool|command|cli|binary|program|app|utility|executable|convert|render|print|"
    r"view|viewer|show|dump|format|compute|hash|encode|decode)\w*\b",
    re.I,
)


def open_registry(spec: str | None, cache_dir: Path) -> Registry:
    """A registry from a user's ``--registry``: a directory path, ``crates.io``, or None.

    None means Debian's registry when it is installed, crates.io otherwise.
    """
    from ..config import default_registry

    spec = spec if spec is not None else default_registry()
    if spec is None or spec in ("crates.io", "https://crates.io"):
        from ..registry.cratesio import CratesIoRegistry

        return CratesIoRegistry()
    if spec.startswith(("http://", "https://")):
        from ..registry.cratesio import CratesIoRegistry

        return CratesIoRegistry(api_url=spec.rstrip("/"))
    from ..registry.directory import DirectoryRegistry

    return DirectoryRegistry(spec, cache_dir)


def wants_tool(query: str) -> bool:
    """Does the request ask for something to run (rather than a library to read about)?"""
    return bool(_TOOL_WORDS.search(query))


def rank(candidates: list[CrateCandidate], *, prefer_bin: bool) -> list[CrateCandidate]:
    """Re-rank a registry's candidates: binaries first among equals when a tool is wanted."""
    if not prefer_bin:
        return sorted(candidates, key=lambda c: -c.score)
    boosted = [replace(c, score=round(c.score * BIN_BOOST, 4)) if c.has_bin else c for c in candidates]
    return sorted(boosted, key=lambda c: -c.score)


def search(
    registry: Registry, query: str, *, limit: int = 10, prefer_bin: bool | None = None
) -> list[CrateCandidate]:
    """Ranked candidates for ``query``; ``prefer_bin=None`` decides from the query's words."""
    if not query.strip():
        raise SearchError("The search query is empty. Say what the tool should do, e.g. 'render markdown to html'.")
    prefer = wants_tool(query) if prefer_bin is None else prefer_bin
    # ask for more than needed: the binary boost may lift a lower-ranked crate into the top
    found = registry.search(query, limit=max(limit * 3, 20))
    return rank(found, prefer_bin=prefer)[:limit]
