"""The proof of a build: what was built from what, and which tests passed, as data that travels with the tool.

A :class:`Proof` is written next to a nix-built tool as a store path of its
own (``/nix/store/…-flakebot-proof-CRATE-VERSION/proof.json``, see
:func:`flakebot_magic.backends.nix_cache.add_proof`), so ``flakebot push``
signs it with the tool and a teammate's ``flakebot pull`` reads it before the
tool is injected. It names the tool's store path and NAR hash, so the proof
binds to exactly one tool; its own store path is content-addressed.

Its ``key`` is the one :class:`~flakebot_magic.records.proof_key.ProofKey`
(source, ``Cargo.lock``, toolchain, test flags, selection) that this machine's
proof cache (:mod:`flakebot_magic.records.proofs`) keys passing test runs by,
so a proof pulled from a team's cache and one proven here are looked up alike;
the backend and the flake's lock, which decide the binary but not the tests,
are fields of the proof beside it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from .._version import __version__
from ..errors import DeployError
from ..host.fsutil import load_json
from .proof_key import ProofKey

__all__ = ["PROOF_FILE", "PROOF_FORMAT", "Proof"]

#: the file a proof's store path holds
PROOF_FILE = "proof.json"
#: bumped when the proof's fields change meaning
PROOF_FORMAT = 1


@dataclass(frozen=True)
class Proof:
    """What a build proved about one tool (deterministic: no time stamps, so equal builds give equal paths)."""

    key: ProofKey
    #: what built the binary: the backend, and the flake.lock's hash (nix: pins nixpkgs) or ""
    backend: str
    flake_lock: str
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
    #: the ``.drv`` nix built the tool from (its sources and build recipe, by hash); a teammate who fetches it
    #: can rebuild the tool and compare bit for bit (``flakebot verify``); "" in proofs made before it was kept
    derivation: str = ""
    #: the builder's store key for the tool (:func:`flakebot_magic.stages.deploy.store_key`): a pulled tool's entry
    #: and "source hash" are the same as on the machine that built it; "" in proofs made before it was kept
    store_key: str = ""
    #: the git tree the binary was built from (the proven commit's, exported from git's objects; the same files
    #: give the same id on any machine, as the commit's id would not); "" in proofs made before it was kept
    tree: str = ""

    @property
    def passed(self) -> bool:
        """Did the build's tests pass (some ran, none failed)?"""
        return self.tests.get("failed", 0) == 0 and self.tests.get("passed", 0) > 0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["key"] = self.key.as_dict()
        data["format"] = PROOF_FORMAT
        return data

    def text(self) -> str:
        """The proof file's content (canonical JSON)."""
        return json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_text(cls, text: str, *, where: str = "the proof") -> Proof:
        """A proof from its file; a :class:`DeployError` saying what is wrong when it is not one."""
        try:
            data = load_json(text)
            if data.get("format") != PROOF_FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {PROOF_FORMAT}")
            return cls(
                key=_key(data["key"]),
                backend=str(data["backend"]),
                flake_lock=str(data.get("flake_lock", "")),
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
                derivation=str(data.get("derivation", "")),
                store_key=str(data.get("store_key", "")),
                tree=str(data.get("tree", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:  # 1e999 as a count
            raise DeployError(f"{where} is not a flakebot proof ({exc}).") from exc


def _key(data: Any) -> ProofKey:
    key = ProofKey.from_dict(data)
    if key is None:
        raise ValueError("its key is not a ProofKey of this flakebot")
    return key
