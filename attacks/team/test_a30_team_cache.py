# Claim 1 (SECURITY §12): a pull takes only the recorded tool with a trusted-signed proof naming this very tool and saying its tests passed; forged/replayed/failed proofs, a tampered NAR and a path-injecting pin are refused with a clear error and nothing fetched. Run: .venv/bin/python -m pytest attacks/team -p no:cacheprovider --basetemp=artifacts/rt3-tmp -q
from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import test_nix_cache as T  # the project's Team fixture, reused
from flakebot_magic.errors import FlakebotError
from flakebot_magic.manage import team
from flakebot_magic.records.inventory import Inventory

built = T.built
pushed = T.pushed


def _forged_proof(tmp: Path, pushed: Any, change: dict[str, Any], key: Path) -> tuple[str, str, str]:
    """A proof.json like the real one with `change` applied, added to the store as a path and pushed signed by `key`."""
    real = json.loads((Path(pushed.provenance["proof_store_path"]) / "proof.json").read_text())
    def apply(d: dict[str, Any], ch: dict[str, Any]) -> None:
        for k, v in ch.items():
            if isinstance(v, dict) and isinstance(d.get(k), dict):
                apply(d[k], v)
            else:
                d[k] = v
    apply(real, change)
    folder = tmp / "flakebot-proof-tinyecho-0.2.0"
    folder.mkdir(parents=True)
    (folder / "proof.json").write_text(json.dumps(real))
    path = T._nix("store", "add-path", str(folder)).stdout.strip()
    cache = f"file://{tmp / 'cache'}"
    T._nix("copy", "--to", f"{cache}?secret-key={pushed.secret}", pushed.provenance["nix_store_path"])
    T._nix("copy", "--to", f"{cache}?secret-key={key}", path)
    info = json.loads(T._nix("path-info", "--json", path).stdout)[0]
    return cache, path, info["narHash"]


def _attempt(mate: Any, provenance: dict[str, Any]) -> str:
    root = Path(str(mate.nix_store).partition("root=")[2])
    try:
        team.pull(mate, "echo", provenance)
    except FlakebotError as exc:
        assert Inventory(mate.cache.tools).get("echo") is None, "registered despite refusal"
        return f"refused: {type(exc).__name__}: {str(exc)[:160]}"
    return "ACCEPTED"


def _report(attack: str, outcome: str) -> None:
    print(f"\n{attack}: {'BLOCKED' if outcome != 'ACCEPTED' else 'GOT THROUGH'} -- {outcome}")
    assert outcome != "ACCEPTED", f"{attack} got through"


def test_a30_proof_signed_by_attacker_key(pushed: Any, tmp_path: Path) -> None:
    cache, path, nar = _forged_proof(tmp_path, pushed, {"tests": {"passed": 999}}, pushed.evil_secret)
    _report("A30 forged proof signed by an untrusted key, real tool signed by the team",
            _attempt(pushed.mate("m30", cache=cache), {**pushed.provenance, "proof_store_path": path, "proof_nar_hash": nar}))


def test_a31_trusted_proof_for_another_tool(pushed: Any, tmp_path: Path) -> None:
    other = "/nix/store/" + "0" * 32 + "-echo-0.1.0"
    cache, path, nar = _forged_proof(tmp_path, pushed, {"tool": other}, pushed.secret)
    _report("A31 replayed/other-tool proof (team-signed) for this tool",
            _attempt(pushed.mate("m31", cache=cache), {**pushed.provenance, "proof_store_path": path, "proof_nar_hash": nar}))


def test_a32_trusted_proof_whose_tests_did_not_pass(pushed: Any, tmp_path: Path) -> None:
    real = json.loads((Path(pushed.provenance["proof_store_path"]) / "proof.json").read_text())
    change: dict[str, Any] = {"tests": {"passed": 0, "failed": 3}}
    if "passed" in real and not isinstance(real["passed"], dict):
        change["passed"] = False
    cache, path, nar = _forged_proof(tmp_path, pushed, change, pushed.secret)
    _report("A32 team-signed proof whose tests failed",
            _attempt(pushed.mate("m32", cache=cache), {**pushed.provenance, "proof_store_path": path, "proof_nar_hash": nar}))


def test_a33_nar_swapped_in_cache(pushed: Any, tmp_path: Path) -> None:
    cache_dir = tmp_path / "c"
    cache = f"file://{cache_dir}"
    T._nix("copy", "--to", f"{cache}?secret-key={pushed.secret}", pushed.provenance["nix_store_path"], pushed.provenance["proof_store_path"])
    nars = sorted((cache_dir / "nar").iterdir(), key=lambda p: p.stat().st_size)
    # the tool's NAR (largest) replaced by the proof's (smallest): narinfo and signature untouched
    nars[-1].write_bytes(nars[0].read_bytes())
    _report("A33 NAR replaced under a valid narinfo", _attempt(pushed.mate("m33", cache=cache), pushed.provenance))


@pytest.mark.parametrize("bad", ["/nix/store/../../etc/passwd", "/nix/store/" + "a" * 32 + "-x\n--option\nsandbox false",
                                 "--option=substituters=file:///tmp", "/nix/store/" + "a" * 32 + "-x --store /"])
def test_a34_injecting_pins(pushed: Any, bad: str) -> None:
    outcome = _attempt(pushed.mate("m34"), {**pushed.provenance, "proof_store_path": bad})
    outcome2 = _attempt(pushed.mate("m34b"), {**pushed.provenance, "nix_store_path": bad})
    _report(f"A34 pin {bad!r}", "ACCEPTED" if "ACCEPTED" in (outcome, outcome2) else outcome)
