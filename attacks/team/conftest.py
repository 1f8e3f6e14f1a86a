"""Borrow the project's nix fixtures (tests/backends) for the team-cache attacks."""
from __future__ import annotations
import importlib.util
import sys
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "backends"))
spec = importlib.util.spec_from_file_location("backends_conftest", ROOT / "tests" / "backends" / "conftest.py")
mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)  # type: ignore[union-attr]
session_registry = mod.session_registry
nix_ready = mod.nix_ready
