"""Shared helpers for the red-team attacks: a tiny directory registry and a flakebot CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
PY = str(ROOT / ".venv" / "bin" / "python")
WORK = ROOT / "artifacts" / "redteam3"

from tinycrates import CRATES, _manifest, crate, write_registry  # noqa: E402

__all__ = ["CRATES", "_manifest", "PY", "ROOT", "WORK", "crate", "fb", "registry", "verdict", "write_registry"]


def registry(name: str, crates: list) -> Path:
    root = WORK / name / "registry"
    write_registry(root, crates)
    return root


def fb(cache: Path, *args: str, timeout: int = 600, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ)
    e["FLAKEBOT_CACHE_DIR"] = str(cache)
    e.setdefault("FLAKEBOT_BACKEND", "cargo")
    e.pop("FLAKEBOT_NIX_SUBSTITUTERS", None)
    if env:
        e.update(env)
    return subprocess.run([PY, "-m", "flakebot_magic.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, input=stdin, errors="replace")


def verdict(attack: str, blocked: bool, evidence: str) -> None:
    print(f"{attack}: {'BLOCKED' if blocked else 'GOT THROUGH'} -- {evidence}")
    sys.exit(0 if blocked else 1)
