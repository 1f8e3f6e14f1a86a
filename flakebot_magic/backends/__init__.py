"""Build backends behind one interface (:class:`Backend`): cargo and nix.

:func:`decide` turns the ``backend`` setting into a :class:`BackendChoice`
once per run (``auto`` from cached probes); :func:`backend_for` gives the
backend that choice names, and :func:`fallback_for` the one ``auto`` falls back to (the pipeline asks it, and
names no backend).
"""

from __future__ import annotations

from ..stages.state import BackendChoice, RunDeps
from .base import MANIFEST_KEYS, Backend, Built
from .cargo import CargoBackend
from .nix import NixBackend, decide, nixpkgs_lockable

__all__ = [
    "MANIFEST_KEYS",
    "Backend",
    "Built",
    "CargoBackend",
    "NixBackend",
    "backend_for",
    "decide",
    "fallback_for",
    "nixpkgs_lockable",
]

BACKENDS: dict[str, type[Backend]] = {"cargo": CargoBackend, "nix": NixBackend}


def backend_for(name: str, deps: RunDeps, choice: BackendChoice) -> Backend:
    """The backend called ``name`` (``cargo`` or ``nix``) for one run."""
    return BACKENDS[name](deps, choice)


def fallback_for(backend: Backend, deps: RunDeps, choice: BackendChoice) -> Backend | None:
    """The backend ``auto`` falls back to after ``backend`` (after nix: cargo, which may have built the tool on an
    earlier, offline run, and builds when nix could not lock nixpkgs after all); None when ``backend`` was chosen
    by name, or has none (:attr:`Backend.falls_back_to`)."""
    name = backend.falls_back_to if choice.auto else None
    return None if name is None else backend_for(name, deps, choice)
