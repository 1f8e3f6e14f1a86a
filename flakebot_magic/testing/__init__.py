"""Test doubles for the seams that cannot be reached offline.

Everything here is a *test double* and says so wherever it shows:
``fake_openai`` is a scripted stand-in for a language model, ``fake_cratesio``
a stand-in for crates.io. Both speak the real protocol over real HTTP on
127.0.0.1.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["REPLAY_SCRIPTS"]

#: the replay scripts the notebooks and examples give the fake OpenAI server (``sha256.json``, ...);
#: they ship with the package, so a notebook finds them wherever it is copied
REPLAY_SCRIPTS = Path(__file__).resolve().parent / "scripts"
