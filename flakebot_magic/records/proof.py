"""The proof of a build: what was built from what, and which tests passed, as data that travels with the tool.

A :class:`Proof` is written next to a nix-built tool as a store path of its
own (``/nix/store/…-flakebot-proof-CRATE-VERSION/proof.json``, see
:func:`flakebot_magic.backends.nix_cache.add_proof`), so ``flakebot push``
signs it with the tool and a teammate's ``flakebot pull`` reads it before the
tool is injected. It names the tool's store path and NAR hash, so the proof
binds to exactly one tool; its own store path is content-addressed.

:class:`ProofKey` is what decides whether a proof still holds: the same
source tree, locks, toolchain, flags and backend build the same tool and run
the same tests. It is one small dataclass so that whatever caches proofs keys
them the same way (:meth:`ProofKey.digest`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .._version import __version__
from ..errors import DeployError

__all__ = ["PROOF_FILE", "PROOF_FORMAT", "Proof", "ProofKey"]

#: the file a proof's store path holds
PROOF_FILE = "proof.json"
#: bumped when the proof's fields change meaning
PROOF_FORMAT = 1


@dataclass(frozen=True)
class ProofKey:
    """Everything that decides the built binary and its test run; equal keys, equal proofs.

    >>> key = ProofKey("4b825dc6", "sha256-ab", "rustc 1.95.0", ("nix", "build"), "nix")
    >>> key.digest() == ProofKey.from_json(key.to_json()).digest()
    True
    """

    #: ``git rev-parse HEAD^{tree}`` of the workspace the tool was built from (Cargo.lock and flake files included)
    source_tree: str
    #: the flake.lock's hash (nix: pins nixpkgs, hence the toolchain's inputs); "" for cargo
    lock_hash: str
    #: ``rustc -vV``'s first line
    toolchain: str
    #: the build command's flags (part of the store key)
    flags: tuple[str, ...]
    backend: str

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "flags": list(self.flags)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProofKey:
        return cls(
            source_tree=str(data.get("source_tree", "")),
            lock_hash=str(data.get("lock_hash", "")),
            toolchain=str(data.get("toolchain", "")),
            flags=tuple(str(f) for f in data.get("flags", ())),
            backend=str(data.get("backend", "")),
        )

    def digest(self) -> str:
        """``sha256-<hex>`` of the key's canonical JSON: what a proof cache looks proofs up by."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return "sha256-" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Proof:
    """What a build proved about one tool (deterministic: no time stamps, so equal builds give equal paths)."""

    key: ProofKey
    #: the tool's /nix/store path and its NAR hash (``sha256-…``, as ``nix path-info --json`` says)
    tool: str
    nar_hash: str
    crate: str
    version: str
    checksum: str
    #: passed, failed, ignored (cargo test's counts)
    tests: dict[str, int]
    #: the binary the client runs and the contract it speaks (what a pulled tool is injected with)
    main: str
    contract: dict[str, Any]
    flakebot_version: str = __version__
    #: for a model-edited tool: the model, its check runs and the session's own summary
    session: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Did the build's tests pass (some ran, none failed)?"""
        return self.tests.get("failed", 0) == 0 and self.tests.get("passed", 0) > 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["key"] = self.key.to_json()
        data["format"] = PROOF_FORMAT
        return data

    def text(self) -> str:
        """The proof file's content (canonical JSON)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_text(cls, text: str, *, where: str = "the proof") -> Proof:
        """A proof from its file; a :class:`DeployError` saying what is wrong when it is not one."""
        try:
            data = json.loads(text)
            if data.get("format") != PROOF_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {PROOF_FORMAT}")
            return cls(
                key=ProofKey.from_json(data["key"]),
                tool=str(data["tool"]),
                nar_hash=str(data["nar_hash"]),
                crate=str(data["crate"]),
                version=str(data["version"]),
                checksum=str(data.get("checksum", "")),
                tests={k: int(v) for k, v in dict(data["tests"]).items()},
                main=str(data["main"]),
                contract=dict(data.get("contract") or {}),
                flakebot_version=str(data.get("flakebot_version", "")),
                session=dict(data.get("session") or {}),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DeployError(f"{where} is not a flakebot proof ({exc}).") from exc
