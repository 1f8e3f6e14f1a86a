"""A team's binary cache: the proof as a store path, push signed, pull pinned by hash and checked before it is used.

::

    build ─► proof.json ─► nix store add-path ─► /nix/store/…-flakebot-proof-CRATE-VER
    push:  nix copy --to CACHE?secret-key=SK  TOOL PROOF ; nix store sign  (both signed by the team's key)
    pull:  nix path-info --store CACHE --sigs  (narHash == the notebook's, a trusted key's signature checked here)
           ─► nix copy --from CACHE  (nix checks the signature and the NAR hash again)
           ─► proof.json read: it names this tool, this narHash, tests passed

Signatures are checked twice: by nix (``require-sigs``, with the trusted
keys given on its command line) and by :func:`signer_of`, which verifies the
Ed25519 signature over nix's fingerprint of the path
(``1;PATH;sha256:NIXBASE32;SIZE;REFS``) with ``cryptography``. The second is
not redundant: nix accepts a content-addressed path (the proof) unsigned, and
the provenance must say who signed what was injected.
"""

from __future__ import annotations

import base64
import binascii
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from ..commands import typed
from ..errors import DeployError, UntrustedPath, UsageError
from ..host.crashpoints import crash_point
from ..host.fsutil import load_json, read_regular
from ..host.git import Git
from ..records.proof import PROOF_FILE, Proof
from ..sandbox.stub import STUB_NAME
from ..stages.build import proof_key
from ..stages.state import RunState
from ..untrusted import safe_line
from .base import Built
from .nix_command import Nix

__all__ = [
    "PathInfo",
    "Pushed",
    "TrustedKeys",
    "add_proof",
    "fetch_derivation",
    "fetch_pinned",
    "nix_base32",
    "path_info",
    "path_infos",
    "prove",
    "public_key",
    "push_derivation",
    "push_paths",
    "push_tool",
    "read_proof",
    "real_path",
    "signer_of",
    "store_root",
    "with_query",
]

#: nix's base-32 alphabet (no e, o, t, u)
_NIX32 = "0123456789abcdfghijklmnpqrsvwxyz"


def nix_base32(data: bytes) -> str:
    """Nix's base-32 of ``data`` (what ``sha256:…`` in a narinfo is written in).

    >>> nix_base32(bytes(32)) == "0" * 52
    True
    >>> nix_base32(bytes([1]))
    '01'
    """
    length = (len(data) * 8 - 1) // 5 + 1
    out = []
    for n in range(length - 1, -1, -1):
        bit = n * 5
        i, j = divmod(bit, 8)
        c = data[i] >> j
        if i + 1 < len(data):
            c |= data[i + 1] << (8 - j)
        out.append(_NIX32[c & 0x1F])
    return "".join(out)


@dataclass(frozen=True)
class PathInfo:
    """What a store (or a binary cache) says of one of its paths: ``nix path-info --json --sigs``."""

    path: str
    nar_hash: str  # "sha256-<base64>" (SRI), as nix 2.8's --json writes it
    nar_size: int
    references: tuple[str, ...]
    signatures: tuple[str, ...]
    #: the derivation that built it ("" when the store does not say, e.g. a content-addressed path)
    deriver: str = ""

    def fingerprint(self) -> bytes:
        """What nix signs: ``1;PATH;sha256:NIXBASE32;NARSIZE;REF,REF``."""
        algo, _, encoded = self.nar_hash.partition("-")
        digest = base64.b64decode(encoded)
        refs = ",".join(sorted(self.references))
        return f"1;{self.path};{algo}:{nix_base32(digest)};{self.nar_size};{refs}".encode()


def _nix_key(text: str, size: int) -> tuple[str, bytes] | None:
    """``name:base64`` of ``size`` bytes (nix's key format, public 32, secret 64) as its parts; None if it is not."""
    name, _, encoded = text.strip().partition(":")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    return (name, raw) if name and len(raw) == size else None


class TrustedKeys:
    """Public keys by name, from nix's ``trusted-public-keys`` text (``name:base64`` separated by spaces)."""

    def __init__(self, text: str) -> None:
        self.text = " ".join(text.split())
        self.keys: dict[str, bytes] = {}
        for word in self.text.split():
            parts = _nix_key(word, 32)
            if parts is None:
                raise UsageError(
                    f"{word!r} is not a nix public key (name:base64 of 32 bytes). "
                    "Make one with `nix key convert-secret-to-public < SECRET_KEY_FILE`."
                )
            self.keys[parts[0]] = parts[1]


def signer_of(info: PathInfo, trusted: TrustedKeys) -> str | None:
    """The name of a trusted key whose signature on ``info`` verifies; None when there is none."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    message = info.fingerprint()
    for sig in info.signatures:
        name, _, encoded = sig.partition(":")
        key = trusted.keys.get(name)
        if key is None:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(base64.b64decode(encoded), message)
        except (InvalidSignature, binascii.Error, ValueError):
            continue
        return name
    return None


def with_query(url: str, name: str, value: str) -> str:
    """``url`` with ``name=value`` added to its query (nix store URLs take parameters so).

    >>> with_query("file:///c", "secret-key", "/k"), with_query("s3://b?region=x", "secret-key", "/k")
    ('file:///c?secret-key=/k', 's3://b?region=x&secret-key=/k')
    """
    return f"{url}{'&' if '?' in url else '?'}{name}={value}"


def store_root(store: str | None) -> Path | None:
    """Where a local chroot store keeps /nix/store (``local?root=R`` or ``/R``); None for the system's store.

    >>> store_root("local?root=/tmp/mate"), store_root("/tmp/mate"), store_root(None)
    (PosixPath('/tmp/mate'), PosixPath('/tmp/mate'), None)
    """
    if not store:
        return None
    if store.startswith("/"):
        return Path(store.partition("?")[0])
    scheme, _, query = store.partition("?")
    if scheme == "local":
        roots = parse_qs(query).get("root")
        if roots:
            return Path(roots[0])
    return None


def real_path(nix: Nix, path: str) -> Path:
    """Where the store ``path`` is on this machine's file system (under a chroot store's root)."""
    root = store_root(nix.options.store)
    return Path(f"{root}{path}") if root is not None else Path(path)


#: a store path as nix writes one: the store dir, 32 characters of nix's base32, a name
STORE_PATH = re.compile(r"/nix/store/[0-9a-df-np-sv-z]{32}-[A-Za-z0-9+\-._?=]{1,211}")
#: a NAR hash as ``nix path-info --json`` writes it (SRI sha256)
NAR_HASH = re.compile(r"sha256-[A-Za-z0-9+/]{43}=")


def check_pins(pins: Mapping[str, str], *, where: str = "the recorded provenance") -> None:
    """Refuse (:class:`UntrustedPath`) unless every key of ``pins`` is a store path and every value a NAR hash.

    Pins come from notebooks and provenance someone else may have written: a
    value such as ``-f file.nix`` or ``--store /dir`` would be an option of
    the nix command it reaches. Every pin passes here before any command runs
    (and nix commands put ``--`` before their paths as well).
    """
    for path, nar_hash in pins.items():
        if not STORE_PATH.fullmatch(str(path)):
            raise UntrustedPath(
                f"{where} names {safe_line(str(path))!r} as a store path, which is not one "
                "(/nix/store/<32 base-32 characters>-<name>): refused; nothing was run or fetched."
            )
        if not NAR_HASH.fullmatch(str(nar_hash)):
            raise UntrustedPath(
                f"{where} gives {safe_line(str(nar_hash))!r} as the NAR hash of {path}, which is not one "
                "(sha256-<base64>): refused; nothing was run or fetched."
            )


def path_infos(nix: Nix, paths: Iterable[str], *, store: str | None = None) -> dict[str, PathInfo]:
    """``nix path-info --json --sigs`` of ``paths`` in ``store`` (default: nix's), in one command; the paths it holds.

    ``.drv`` paths are asked about as themselves (``--derivation``), never as the outputs they build.
    """
    paths = list(paths)
    drv = ["--derivation"] if any(p.endswith(".drv") for p in paths) else []
    if drv and not all(p.endswith(".drv") for p in paths):
        return {
            **path_infos(nix, [p for p in paths if p.endswith(".drv")], store=store),
            **path_infos(nix, [p for p in paths if not p.endswith(".drv")], store=store),
        }
    done = (nix.on_store(store) if store else nix).run("path-info", "--json", "--sigs", *drv, "--", *paths, timeout=120)
    if done.returncode != 0:
        raise DeployError(f"nix path-info {' '.join(paths)} failed: {done.stderr.strip()[-500:]}")
    found: dict[str, PathInfo] = {}
    try:
        for entry in load_json(done.stdout):
            if entry.get("valid") is False:
                continue
            found[str(entry["path"])] = PathInfo(
                path=str(entry["path"]),
                nar_hash=str(entry["narHash"]),
                nar_size=int(entry["narSize"]),
                references=tuple(str(r) for r in entry.get("references") or ()),
                signatures=tuple(str(s) for s in entry.get("signatures") or ()),
                deriver=str(entry.get("deriver") or ""),
            )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DeployError(f"nix path-info printed no usable JSON ({exc}): {done.stdout[-300:]}") from exc
    return found


def path_info(nix: Nix, path: str, *, store: str | None = None) -> PathInfo | None:
    """:func:`path_infos` of one path; None when the store does not hold it."""
    return path_infos(nix, [path], store=store).get(path)


def add_proof(nix: Nix, proof: Proof, root: Path) -> Path:
    """``proof`` as a store path of its own (content-addressed), rooted at ``root``; its /nix/store path."""
    with tempfile.TemporaryDirectory(prefix="flakebot-proof-") as tmp:
        folder = Path(tmp) / "proof"
        folder.mkdir()
        (folder / PROOF_FILE).write_text(proof.text())
        done = nix.run("store", "add-path", str(folder), "--name", f"flakebot-proof-{proof.crate}-{proof.version}")
    if done.returncode != 0:
        raise DeployError(f"nix could not add the build's proof to the store: {done.stderr.strip()[-500:]}")
    path = Path(done.stdout.strip())
    if not nix.add_root(path, root):
        raise DeployError(f"Could not make {root} a GC root for the proof {path}.")
    return path


def prove(
    nix: Nix, run: RunState, built: Built, contract: Mapping[str, Any], git: Git, gcroots: Path
) -> dict[str, str]:
    """The proof of ``built`` (its tests, toolchain, source, flakebot's version; the session's summary for a
    model-edited tool) added to the store beside it and rooted at ``gcroots/.proofs/NAME``.

    Returns the manifest's keys for it: the tool's narHash, the proof's path and narHash.
    """
    assert built.out_path is not None
    info = path_info(nix, str(built.out_path))
    if info is None:
        raise DeployError(f"nix built {built.out_path}, but its store does not hold it.")
    workspace = run.forked()
    crate = workspace.crate
    tests = built.tests
    session: dict[str, Any] = {}
    if run.model is not None:
        session = {
            "model": run.model.model,
            "iterations": run.iterations,
            "summaries": [str(s.get("summary", "")) for s in _edit_sessions(workspace.path)],
            **{k: v for k, v in run.session.items() if k in ("usage", "winner", "plan")},
        }
    binaries = sorted(built.binaries)
    proof = Proof(
        key=proof_key(workspace.path, git, run.rustc, tuple(built.flags)),
        backend="nix",
        flake_lock=str(built.lock.get("lock_hash", "")),
        tool=info.path,
        nar_hash=info.nar_hash,
        crate=crate.name,
        version=crate.version,
        checksum=workspace.checksum,
        tests={"passed": tests.passed, "failed": tests.failed, "ignored": tests.ignored} if tests else {},
        main=str(contract.get("bin") or (binaries[0] if binaries else "")),
        contract=dict(contract),
        session=session,
        derivation=info.deriver,
        store_key=built.key,
        tree=built.source.tree if built.source is not None else "",
    )
    path = add_proof(nix, proof, gcroots / ".proofs" / run.name)
    proof_info = path_info(nix, str(path))
    return {
        "derivation": info.deriver,
        "nar_hash": info.nar_hash,
        "proof_store_path": str(path),
        "proof_nar_hash": proof_info.nar_hash if proof_info is not None else "",
    }


def read_proof(nix: Nix, path: str) -> Proof:
    """The proof a store path holds."""
    where = real_path(nix, path) / PROOF_FILE
    try:  # a pulled proof is a teammate's file: a regular file only, never through a link, capped
        data, more = read_regular(where, _MAX_PROOF)
    except OSError as exc:
        raise DeployError(f"The proof {path} holds no {PROOF_FILE}: {exc}") from exc
    if more:
        raise DeployError(f"The proof {path} is larger than {_MAX_PROOF:,} bytes: it is no flakebot proof.")
    return Proof.from_text(data.decode("utf-8", errors="replace"), where=str(path))


#: a proof is a few KiB of JSON
_MAX_PROOF = 1 << 20


def public_key(secret_key: Path) -> TrustedKeys:
    """The public half of a nix secret key file (``name:base64(seed ‖ public)``, 64 bytes), as a trusted key."""
    try:
        parts = _nix_key(secret_key.read_text(), 64)
    except OSError as exc:
        raise UsageError(
            f"Cannot read the signing key {secret_key}: {exc.strerror}. "
            "Make one with `nix key generate-secret --key-name NAME > FILE` (scripts/team-cache.sh does)."
        ) from None
    if parts is None:
        raise UsageError(
            f"{secret_key} is not a nix secret key (NAME:base64 of 64 bytes, from `nix key generate-secret`)."
        )
    name, raw = parts  # an Ed25519 secret key as libsodium keeps it: the seed, then the public key
    return TrustedKeys(f"{name}:{base64.b64encode(raw[32:]).decode()}")


def push_derivation(nix: Nix, derivation: str, to: str, secret_key: Path) -> str:
    """Copy the ``.drv`` ``derivation`` and its closure (the sources, the build recipe, the derivations of its
    inputs) to the cache ``to``, signed with ``secret_key``; who signed it.

    With it a teammate can rebuild a pulled tool and compare it bit for bit
    (:func:`fetch_derivation`, ``flakebot verify``).
    """
    trusted = public_key(secret_key)
    store = with_query(to, "secret-key", str(secret_key))
    copied = nix.run("copy", "--to", store, "--derivation", "--", derivation, timeout=1800)
    if copied.returncode != 0:
        raise DeployError(f"nix copy --derivation --to {to} failed: {copied.stderr.strip()[-800:]}")
    key = str(secret_key)
    signed = nix.run("store", "sign", "--store", to, "--key-file", key, "--derivation", "-r", "--", derivation)
    if signed.returncode != 0:
        raise DeployError(f"nix store sign --store {to} failed: {signed.stderr.strip()[-800:]}")
    info = path_info(nix, derivation, store=to)
    signer = signer_of(info, trusted) if info is not None else None
    if signer is None:
        raise DeployError(f"{to} does not serve {derivation} signed by {trusted.text} after the push.")
    return signer


def fetch_derivation(nix: Nix, cache: str, derivation: str, tool: str, trusted: TrustedKeys) -> str:
    """Fetch the ``.drv`` that builds the store path ``tool`` (and its closure) from ``cache``; "" when it is
    here now, else why not, in words (the tool stays usable: its own hash is pinned; it is only not
    rebuildable here).

    The derivation must be a store path, signed in ``cache`` by a key in
    ``trusted`` (nix checks every path of its closure the same way), and must
    name ``tool`` among its outputs. nix's store checks, as it registers a
    derivation, that its output paths are the ones its content gives, so a
    derivation that names ``tool`` is the one that builds it.
    """
    if not (STORE_PATH.fullmatch(derivation) and derivation.endswith(".drv")):
        return f"its proof names {safe_line(derivation)!r} as its derivation, which is not a .drv store path"
    try:
        info = path_info(nix, derivation, store=cache)
    except DeployError:  # nix path-info fails on a path the cache does not hold
        info = None
    if info is None:  # a push puts it there before the tool and its proof, both here: that push did not carry it
        return (
            f"{cache} does not hold its derivation {derivation} (the push did not carry it: the pusher's store "
            "no longer held it, or it was pushed by hand or by a flakebot from before pushes carried derivations)"
        )
    if signer_of(info, trusted) is None:
        return f"its derivation {derivation} in {cache} is not signed by a trusted key"
    done = nix.trusting(trusted.text).run("copy", "--from", cache, "--derivation", "--", derivation, timeout=1800)
    if done.returncode != 0:
        return f"nix copy --from {cache} refused its derivation: {safe_line(done.stderr.strip()[-300:])}"
    shown = nix.run("show-derivation", "--", derivation, timeout=120)
    try:
        outputs = {str(o.get("path")) for d in load_json(shown.stdout).values() for o in d["outputs"].values()}
    except (ValueError, KeyError, TypeError, AttributeError):
        outputs = set()
    if tool not in outputs:
        return f"its derivation {derivation} does not build {tool}"
    return ""


@dataclass(frozen=True)
class Pushed:
    """What :func:`push_tool` put in a cache: the paths, who signed them, and the derivation ("" when this store
    no longer holds it: then a teammate can use the tool but not rebuild it)."""

    paths: tuple[str, ...]
    signed_by: tuple[str, ...]
    derivation: str


def push_tool(nix: Nix, manifest: Mapping[str, Any], to: str, secret_key: Path) -> Pushed:
    """A nix-built tool to the cache ``to``, signed: the derivation that builds it with its sources
    (:func:`push_derivation`, so a teammate can rebuild it), then its store path with the output of its
    dependencies' own derivation (:func:`deps_output`: a teammate building any tool that asks for the same
    dependencies substitutes it), then its proof's (``manifest``'s), in that order: a cache that holds the
    proof holds all a push puts there, and a push that did not finish (killed, a network gone) is known by its
    missing proof (:func:`fetch_pinned` says so). The one push: ``flakebot push`` and ``--push`` both come here."""
    tool, proof = str(manifest["nix_store_path"]), str(manifest["proof_store_path"])
    derivation = str(manifest.get("derivation") or "")
    if not derivation:  # a tool built before proofs named it: nix's own record, if it has one
        info = path_info(nix, tool)
        derivation = info.deriver if info is not None else ""
    deps = deps_output(nix, derivation) if derivation else ""
    try:
        here = bool(derivation) and path_info(nix, derivation) is not None
    except DeployError:  # nix path-info fails on a path the store does not hold (collected)
        here = False
    if here:
        push_derivation(nix, derivation, to, secret_key)
    crash_point("push.derivation")
    signers = push_paths(nix, [tool, *([deps] if deps else [])], to, secret_key)
    crash_point("push.tool")
    signers.update(push_paths(nix, [proof], to, secret_key))  # last: its presence says the push finished
    crash_point("push.proof")
    paths = (tool, proof, *([deps] if deps else []))
    return Pushed(paths, tuple(sorted(set(signers.values()))), derivation if here else "")


def deps_output(nix: Nix, derivation: str) -> str:
    """The output of the dependencies' derivation (the flake's ``packages.deps``) that ``derivation`` builds on,
    when this store holds it; "" otherwise (a crate without one, a store that collected it)."""
    inputs = _derivation(nix, derivation).get("inputDrvs", {})
    for drv in inputs if isinstance(inputs, dict) else ():
        if str(drv).endswith(f"-{STUB_NAME}-0.0.0.drv"):
            try:
                out = str(_derivation(nix, str(drv))["outputs"]["out"]["path"])
                return out if STORE_PATH.fullmatch(out) and path_info(nix, out) is not None else ""
            except (KeyError, TypeError, DeployError):
                return ""
    return ""


def _derivation(nix: Nix, drv: str) -> dict[str, Any]:
    """What ``nix show-derivation`` says of the ``.drv`` ``drv`` (empty when it cannot)."""
    shown = nix.run("show-derivation", "--", drv, timeout=60)
    try:
        data = load_json(shown.stdout) if shown.returncode == 0 else {}
        found = next(iter(data.values())) if isinstance(data, dict) and data else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def push_paths(nix: Nix, paths: Iterable[str], to: str, secret_key: Path) -> dict[str, str]:
    """Copy ``paths`` (with their closures) to the cache ``to``, signed with ``secret_key``; each path's signer.

    Paths the cache held already are signed there too (``nix store sign``).
    Checks afterwards that the cache serves every path with a signature that
    verifies against the key's public half.
    """
    paths = list(paths)
    trusted = public_key(secret_key)
    copied = nix.run("copy", "--to", with_query(to, "secret-key", str(secret_key)), "--", *paths, timeout=1800)
    if copied.returncode != 0:
        raise DeployError(f"nix copy --to {to} failed: {copied.stderr.strip()[-800:]}")
    signed = nix.run("store", "sign", "--store", to, "--key-file", str(secret_key), "--", *paths, timeout=600)
    if signed.returncode != 0:
        raise DeployError(f"nix store sign --store {to} failed: {signed.stderr.strip()[-800:]}")
    signers: dict[str, str] = {}
    served = path_infos(nix, paths, store=to)
    for path in paths:
        info = served.get(path)
        signer = signer_of(info, trusted) if info is not None else None
        if signer is None:
            raise DeployError(f"{to} does not serve {path} signed by {trusted.text} after the push.")
        signers[path] = signer
    return signers


def fetch_pinned(nix: Nix, cache: str, pins: Mapping[str, str], trusted: TrustedKeys) -> dict[str, str]:
    """Fetch the store paths ``pins`` (path → the narHash recorded for it) from ``cache``; each path's signer.

    Before anything is copied, every path must be in the cache with the
    recorded narHash and a signature by a key in ``trusted``; otherwise
    :class:`UntrustedPath` and nothing is fetched. nix then copies them
    (checking signatures and NAR hashes itself), and the store's own record
    of each is checked once more.
    """
    if not trusted.keys:
        raise UsageError(
            "Pulling needs the cache's public key: --trusted-public-keys NAME:KEY (or FLAKEBOT_NIX_TRUSTED_PUBLIC_KEYS)."
        )
    check_pins(pins)
    signers: dict[str, str] = {}
    served = path_infos(nix, pins, store=cache)
    for path, recorded in pins.items():
        info = served.get(path)
        if info is None:
            raise UntrustedPath(
                f"{cache} does not hold {path}: it was not pushed there, or its push did not finish (a push puts "
                "the derivation, the tool, then its proof there, the proof last); whoever pushed it runs "
                f"{typed('push NAME')} again.",
                path=path,
                cache=cache,
            )
        if info.nar_hash != recorded:
            raise UntrustedPath(
                f"{cache} serves {path} with narHash {info.nar_hash}, not the recorded {recorded}: refused.",
                path=path,
                cache=cache,
            )
        signer = signer_of(info, trusted)
        if signer is None:
            names = ", ".join(s.partition(":")[0] for s in info.signatures) or "nobody"
            raise UntrustedPath(
                f"{path} in {cache} is signed by {names}, not by a trusted key ({', '.join(trusted.keys)}): refused.",
                path=path,
                cache=cache,
            )
        signers[path] = signer
    done = nix.trusting(trusted.text).run("copy", "--from", cache, "--", *pins, timeout=1800)
    if done.returncode != 0:
        raise UntrustedPath(f"nix copy --from {cache} refused: {done.stderr.strip()[-800:]}", cache=cache)
    copied = path_infos(nix, pins)
    for path, recorded in pins.items():
        info = copied.get(path)
        if info is None or info.nar_hash != recorded:
            raise UntrustedPath(f"{path} is not in the store with narHash {recorded} after the copy.", path=path)
    return signers


def _edit_sessions(workspace: Path) -> list[dict[str, Any]]:
    """The edit sessions recorded in ``workspace`` (the edit loop's modules load only when asked)."""
    from ..edit.state import EditState

    return list(EditState.load(workspace).sessions)
