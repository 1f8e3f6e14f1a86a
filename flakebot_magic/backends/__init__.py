"""Build backends behind one interface (:class:`Backend`): cargo and nix.

:func:`decide` turns the ``backend`` setting into a :class:`BackendChoice`
once per run (``auto`` from cached probes); :func:`backend_for` gives the
backend that choice names.
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
    "nixpkgs_lockable",
]

BACKENDS: dict[str, type[Backend]] = {"cargo": CargoBackend, "nix": NixBackend}


def backend_for(name: str, deps: RunDeps, choice: BackendChoice) -> Backend:
    """The backend called ``name`` (``cargo`` or ``nix``) for one run."""
    return BACKENDS[name](deps, choice)
