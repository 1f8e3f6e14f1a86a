"""The proofs this machine has made: a passing ``cargo test`` kept by what it proved, so it is never made twice.

``<cache>/proofs/DIGEST.json`` holds one proof: its :class:`ProofKey`, what
the tests counted, when they passed and how long they took. Only passing
proofs are kept (a failure is always run again). A record is written in one
step (:func:`~flakebot_magic.host.fsutil.atomic_write`: a temporary file,
fsync, rename, fsync of the directory), so a reader sees a whole proof or
none; a record that does not parse, or whose key is not the key asked for, is
no proof (the tests run again and write it anew).

Crash points (:mod:`flakebot_magic.host.crashpoints`): ``proof.proven`` (the
tests passed, nothing written), ``proof.recorded`` (the record is in place).
A kill at the first loses the proof (the next build proves again); at the
second, the proof is kept. ``clean`` leaves proofs alone: they are a few
hundred bytes each, and a rebuild after ``clean`` is what they are for.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..host.crashpoints import crash_point
from ..host.fsutil import atomic_write, load_json, read_regular
from .proof_key import ProofKey

__all__ = ["ProofRecord", "ProofStore"]

#: a record is small; anything bigger is not one of ours
_MAX_RECORD = 64 * 1024


@dataclass(frozen=True)
class ProofRecord:
    """A passing ``cargo test`` of :attr:`key`: what it counted, when (UTC, ISO 8601) and how long it took.

    ``reused`` is True when this run did not run the tests but found the proof.
    """

    key: ProofKey
    passed: int
    ignored: int
    suites: int
    proven_at: str
    seconds: float
    reused: bool = False

    def summary(self) -> dict[str, Any]:
        """What a tool's record says about its proof."""
        return {
            "key": self.key.digest(),
            "reused": self.reused,
            "proven_at": self.proven_at,
            "seconds": round(self.seconds, 3),
        }


class ProofStore:
    """The proofs under ``directory`` (made on first write)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def _path(self, key: ProofKey) -> Path:
        return self.directory / f"{key.digest()}.json"

    def find(self, key: ProofKey) -> ProofRecord | None:
        """The proof of ``key`` made before (``reused=True``), or None."""
        try:
            raw, more = read_regular(self._path(key), _MAX_RECORD)
            data = None if more else load_json(raw)
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or ProofKey.from_dict(data.get("key")) != key:
            return None
        counts = [data.get(name) for name in ("passed", "ignored", "suites")]
        when, seconds = data.get("proven_at"), data.get("seconds")
        if not all(isinstance(n, int) and n >= 0 for n in counts) or not isinstance(when, str):
            return None
        if not isinstance(seconds, (int, float)):
            return None
        passed, ignored, suites = (int(n) for n in counts)  # type: ignore[arg-type]
        return ProofRecord(key, passed, ignored, suites, when, float(seconds), reused=True)

    def record(self, key: ProofKey, *, passed: int, ignored: int, suites: int, seconds: float) -> ProofRecord:
        """Keep a passing proof of ``key`` (made now, in ``seconds``); returns it."""
        when = datetime.fromtimestamp(time.time(), timezone.utc).isoformat(timespec="seconds")
        proof = ProofRecord(key, passed, ignored, suites, when, seconds)
        data = {
            "key": key.as_dict(),
            "passed": passed,
            "ignored": ignored,
            "suites": suites,
            "proven_at": when,
            "seconds": round(seconds, 3),
        }
        crash_point("proof.proven")
        atomic_write(self._path(key), json.dumps(data, indent=1, sort_keys=True) + "\n", make_parents=True)
        crash_point("proof.recorded")
        return proof
