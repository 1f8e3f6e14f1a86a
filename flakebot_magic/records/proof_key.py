"""What a proof proves: the key a proof (a crate's own tests passing) is kept under, here and in any shared cache.

The same :class:`ProofKey` proven once need not be proven again: not under a
new tool name, not after ``clean``, not on another machine that trusts this
one's proofs. Every field is machine-independent text, so the key (and its
:meth:`~ProofKey.digest`) means the same wherever it is computed; nothing in
it names a tool, a path or a time.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["PROOF_KEY_FORMAT", "ProofKey"]

#: bumped when a field's meaning changes: a key of another format never matches
PROOF_KEY_FORMAT = 1


@dataclass(frozen=True)
class ProofKey:
    """Everything that decides whether ``cargo test`` passes, and nothing else.

    Attributes
    ----------
    source
        SHA-256 of the source tree's build inputs: git's listing of the
        committed tree (each path with its blob hash) and any uncommitted
        edits (:func:`flakebot_magic.stages.deploy.source_digest`).
    lock
        SHA-256 of ``Cargo.lock`` (the exact dependencies).
    toolchain
        ``rustc -vV`` of the toolchain that compiled and ran the tests.
    flags
        The cargo command line and environment of the test run (profile
        settings, lint caps).
    selection
        Which tests ran: ``"all"`` is every test ``cargo test`` runs (unit,
        integration, doc tests).
    """

    source: str
    lock: str
    toolchain: str
    flags: tuple[str, ...]
    selection: str = "all"
    format: int = PROOF_KEY_FORMAT

    def digest(self) -> str:
        """The key as one hex string (SHA-256 of its canonical JSON): the name of its record.

        Examples
        --------
        >>> a = ProofKey("s", "l", "rustc 1.95", ("test",))
        >>> a.digest() == ProofKey("s", "l", "rustc 1.95", ("test",)).digest() != ProofKey("t", "l", "rustc 1.95", ("test",)).digest()
        True
        """
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values."""
        data = asdict(self)
        data["flags"] = list(self.flags)
        return data

    @classmethod
    def from_dict(cls, data: Any) -> ProofKey | None:
        """The key :meth:`as_dict` wrote, or None for anything else (another format, a missing or wrong field)."""
        if not isinstance(data, dict) or data.get("format") != PROOF_KEY_FORMAT:
            return None
        text = ("source", "lock", "toolchain", "selection")
        flags = data.get("flags")
        if not all(isinstance(data.get(name), str) for name in text) or not isinstance(flags, list):
            return None
        if not all(isinstance(flag, str) for flag in flags):
            return None
        return cls(data["source"], data["lock"], data["toolchain"], tuple(flags), data["selection"])
