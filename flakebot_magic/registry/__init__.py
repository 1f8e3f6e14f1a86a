"""Crate registries: a local cargo directory source, or crates.io over HTTP."""

from __future__ import annotations

from .base import CrateCandidate, FetchedSource, Registry

__all__ = ["CrateCandidate", "FetchedSource", "Registry"]
