"""The stub crate: a workspace's dependencies without a line of its code, so they can be built (and cached) alone.

A dependency unit's identity in cargo (its ``-C metadata`` hash, the suffix of
``libNAME-HASH.rlib``) depends on the package, its features, the profile, the
target, rustc and its dependencies' hashes, and, through feature unification
and the profile, on the root manifest that asks for it. :func:`stub_of` writes a
root that asks for exactly what the workspace asks for: the same
``[dependencies]``, ``[dev-dependencies]`` and ``[build-dependencies]`` (under
every ``[target.<cfg>]`` too), the same ``[features]``, ``[profile]``, edition
and resolver, the same kinds of targets (a lib if it has one, a bin of the same
name and ``required-features`` for each of its binaries, so link-time
optimisation marks the dependencies as it does for the crate) and the same
``Cargo.lock``, but empty sources and no build script of the crate's (a trivial
``build.rs`` only when the crate has one and build-dependencies to build for it).
So a ``cargo build --release`` and a ``cargo test --no-run`` of the stub compile
the very dependency units the crate's own builds would, and nothing of the crate
under test runs.

A workspace whose dependencies are not all from the registry (a ``path``
dependency, ``[patch]``, workspace members, inherited ``workspace = true``
specs, ``cargo-features``) has no stub: :func:`stub_of` says why, and it is
built as before.

:func:`lock_packages` reads a ``Cargo.lock`` into its registry packages and
their dependencies (the graph the cache's keys are computed over).

Examples
--------
>>> import tempfile
>>> ws = Path(tempfile.mkdtemp())
>>> _ = (ws / "Cargo.toml").write_text('[package]\\nname = "t"\\nversion = "0.1.0"\\n[dependencies]\\nmemchr = "2"\\n')
>>> (ws / "src").mkdir(); _ = (ws / "src" / "main.rs").write_text("fn main() {}")
>>> _ = (ws / "Cargo.lock").write_text('version = 4\\n\\n[[package]]\\nname = "t"\\nversion = "0.1.0"\\n')
>>> stub = stub_of(ws)
>>> sorted(stub.files)
['Cargo.lock', 'Cargo.toml', 'src/bin/0.rs']
>>> stub_of(ws / "nowhere")
'it has no Cargo.toml'
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit

from ..host.fsutil import load_toml, read_regular
from .manifest import DEPENDENCY_TABLES, dependencies, package_table

__all__ = ["STUB_MARK", "STUB_NAME", "LockPackage", "Stub", "lock_packages", "stub_of"]

#: a manifest or lock larger than this is not stubbed (built as before)
_MAX_MANIFEST = 1 << 20
_MAX_LOCK = 16 << 20
#: package keys the stub keeps: what decides how the dependencies resolve and compile
_PACKAGE_KEYS = ("edition", "resolver")
#: the stub's package (and its lock's root) under a name of no crate: two crates asking for the very same
#: dependencies have the same stub, so they share its units (and, with nix, its derivation)
STUB_NAME, STUB_VERSION = "flakebot-deps", "0.0.0"
#: the first line of a stub's manifest (what marks a ``flakebot-deps/`` directory as flakebot's)
STUB_MARK = "# flakebot's stub: the dependencies alone (docs/dependency-cache.md)"
#: the crate's own source files in the stub: nothing
_EMPTY_LIB = "// flakebot's stub: the crate's dependencies, none of its code\n"
_EMPTY_MAIN = "// flakebot's stub: the crate's dependencies, none of its code\nfn main() {}\n"


@dataclass(frozen=True)
class Stub:
    """The stub crate's files (path relative to its root -> content)."""

    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """SHA-256 over every file's path and bytes: the same stub, the same digest."""
        digest = hashlib.sha256()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return digest.hexdigest()

    @property
    def lock(self) -> bytes:
        return self.files["Cargo.lock"]


@dataclass(frozen=True)
class LockPackage:
    """One registry package of a ``Cargo.lock``: ``name version``, its checksum claim, what it depends on."""

    name: str
    version: str
    checksum: str
    dependencies: tuple[str, ...]  # ids ("name version") of other packages of the lock

    @property
    def id(self) -> str:
        return f"{self.name} {self.version}"


def _read(path: Path, limit: int) -> bytes | None:
    try:
        data, more = read_regular(path, limit)
    except OSError:
        return None
    return None if more else data


def _not_from_registry(doc: Mapping[str, Any]) -> str:
    """Why the manifest's dependencies are not all registry packages cargo resolves alone ("" when they are)."""
    for key in ("patch", "replace", "cargo-features"):
        if key in doc:
            return f"it has [{key}]"
    workspace = doc.get("workspace")
    if isinstance(workspace, Mapping) and any(k in workspace for k in ("members", "dependencies", "package")):
        return "it is a cargo workspace of several packages"
    for dependency in dependencies(doc):
        spec = dependency.spec
        if isinstance(spec, Mapping) and any(k in spec for k in ("path", "git", "registry", "workspace", "base")):
            return f"its dependency {dependency.name!r} is not a registry package"
        if not isinstance(spec, (str, Mapping)):
            return f"its dependency {dependency.name!r} is not a version or a table"
    return ""


def _bins(workspace: Path, doc: Mapping[str, Any], package: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The crate's binaries as the stub declares them: name and ``required-features``."""
    found: dict[str, dict[str, Any]] = {}
    declared = doc.get("bin")
    for table in declared if isinstance(declared, list) else []:
        if isinstance(table, Mapping) and isinstance(table.get("name"), str):
            found[table["name"]] = {"name": table["name"], **_required(table)}
    if package.get("autobins", True) is not False:
        if (workspace / "src" / "main.rs").is_file():
            found.setdefault(str(package.get("name")), {"name": str(package.get("name"))})
        bin_dir = workspace / "src" / "bin"
        for entry in sorted(os.listdir(bin_dir)) if bin_dir.is_dir() else []:
            stem = entry[:-3] if entry.endswith(".rs") else entry
            if entry.endswith(".rs") or (bin_dir / entry / "main.rs").is_file():
                found.setdefault(stem, {"name": stem})
    return list(found.values())


def _required(table: Mapping[str, Any]) -> dict[str, Any]:
    features = table.get("required-features")
    return {"required-features": [str(f) for f in features]} if isinstance(features, list) else {}


def _lib(workspace: Path, doc: Mapping[str, Any], package: Mapping[str, Any]) -> dict[str, Any] | None:
    lib = doc.get("lib")
    if isinstance(lib, Mapping):
        kept = {k: lib[k] for k in ("crate-type", "crate_type", "proc-macro", "proc_macro") if k in lib}
        return {"path": "src/lib.rs", **kept}
    if package.get("autolib", True) is not False and (workspace / "src" / "lib.rs").is_file():
        return {"path": "src/lib.rs"}
    return None


def _has_build_script(workspace: Path, package: Mapping[str, Any]) -> bool:
    build = package.get("build")
    if build is False:
        return False
    return isinstance(build, (str, list)) or (workspace / "build.rs").is_file()


def _has_build_dependencies(doc: Mapping[str, Any]) -> bool:
    return any(d.where.endswith(("build-dependencies", "build_dependencies")) for d in dependencies(doc))


def stub_of(workspace: Path) -> Stub | str:
    """The stub of the crate in ``workspace`` (its ``Cargo.toml`` and ``Cargo.lock``), or why it has none."""
    workspace = Path(workspace)
    text = _read(workspace / "Cargo.toml", _MAX_MANIFEST)
    if text is None:
        return "it has no Cargo.toml"
    lock = _read(workspace / "Cargo.lock", _MAX_LOCK)
    if lock is None:
        return "it has no Cargo.lock"
    try:
        doc = load_toml(text.decode("utf-8"))
    except ValueError:
        return "its Cargo.toml is not TOML"
    package = package_table(doc)
    if not isinstance(package.get("name"), str) or not isinstance(package.get("version"), str):
        return "its Cargo.toml names no package and version"
    why = _not_from_registry(doc)
    if why:
        return why
    neutral = _neutral_lock(lock, str(package["name"]), str(package["version"]))
    if neutral is None:
        return "its Cargo.lock does not name it once"
    stub: dict[str, Any] = {
        "package": {
            "name": STUB_NAME,
            "version": STUB_VERSION,
            **{k: package[k] for k in _PACKAGE_KEYS if k in package},
            "publish": False,
            "autobins": False,
            "autoexamples": False,
            "autotests": False,
            "autobenches": False,
            "build": False,
        },
    }
    files: dict[str, bytes] = {"Cargo.lock": neutral}
    if _has_build_script(workspace, package) and _has_build_dependencies(doc):
        stub["package"]["build"] = "build.rs"
        files["build.rs"] = _EMPTY_MAIN.encode()
    lib = _lib(workspace, doc, package)
    if lib is not None:
        stub["lib"] = lib
        files["src/lib.rs"] = _EMPTY_LIB.encode()
    bins = _bins(workspace, doc, package)
    if bins:
        stub["bin"] = []
        for i, table in enumerate(bins):
            stub["bin"].append({**table, "name": f"{STUB_NAME}-{i}", "path": f"src/bin/{i}.rs"})
            files[f"src/bin/{i}.rs"] = _EMPTY_MAIN.encode()
    if lib is None and not bins:
        return "it has neither a library nor a binary"
    for key in (*DEPENDENCY_TABLES, "features", "profile", "target"):
        if key in doc:
            stub[key] = doc[key]
    workspace_table = doc.get("workspace")
    resolver = workspace_table.get("resolver") if isinstance(workspace_table, Mapping) else None
    stub["workspace"] = {"resolver": resolver} if resolver is not None else {}

    files["Cargo.toml"] = (f"{STUB_MARK}\n" + tomlkit.dumps(stub)).encode()
    return Stub(files)


def _neutral_lock(lock: bytes, name: str, version: str) -> bytes | None:
    """``lock`` with its root package (the one of no source) renamed :data:`STUB_NAME` :data:`STUB_VERSION`, its
    packages in cargo's order again (by name, version, source), so the same dependencies give the same bytes."""
    root = re.compile(
        rb'^(\[\[package\]\]\nname = )"'
        + re.escape(name.encode())
        + rb'"\nversion = "'
        + re.escape(version.encode())
        + rb'"\n(?!source)',
        re.MULTILINE,
    )
    renamed, count = root.subn(
        rb'\1"' + STUB_NAME.encode() + rb'"\nversion = "' + STUB_VERSION.encode() + rb'"\n', lock
    )
    if count != 1:
        return None
    head, *stanzas = renamed.split(b"\n[[package]]\n")
    if not stanzas or any(b"\n[" in s.rstrip(b"\n").replace(b"\n[[", b"") for s in stanzas):
        return renamed  # another table among the packages (an old lock's [metadata]): left in its order
    ordered = sorted((stanza.rstrip(b"\n") for stanza in stanzas), key=_package_order)
    return head + b"".join(b"\n[[package]]\n" + s + b"\n" for s in ordered)


def _package_order(stanza: bytes) -> tuple[bytes, tuple[int, ...], bytes]:
    """Cargo's order of a lock's packages: by name, then version (numerically), then the rest."""
    name = re.search(rb'^name = "([^"]*)"', stanza, re.MULTILINE)
    version = re.search(rb'^version = "([0-9]+)\.([0-9]+)\.([0-9]+)', stanza, re.MULTILINE)
    numbers = tuple(int(part) for part in version.groups()) if version else ()
    return (name.group(1) if name else b"", numbers, stanza)


def lock_packages(lock: bytes) -> dict[str, LockPackage]:
    """The registry packages of a ``Cargo.lock`` by id (``name version``), each with its dependencies' ids.

    The root and other packages without a registry source are left out (and
    so is every dependency on them). Raises ``ValueError`` for a lock that is
    not one.
    """
    try:
        doc = load_toml(lock.decode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"not a Cargo.lock: {exc}") from None
    entries = [p for p in doc.get("package", []) if isinstance(p, Mapping)]
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        by_name.setdefault(str(entry.get("name")), []).append(entry)
    packages: dict[str, LockPackage] = {}
    for entry in entries:
        if not str(entry.get("source", "")).startswith("registry+"):
            continue
        ids = []
        for spec in entry.get("dependencies", []):
            parts = str(spec).split(" ")
            named = by_name.get(parts[0], [])
            if len(parts) > 1:
                named = [n for n in named if str(n.get("version")) == parts[1]]
            if len(named) != 1:
                raise ValueError(f"Cargo.lock: {spec!r} of {entry.get('name')} names no single package")
            if str(named[0].get("source", "")).startswith("registry+"):
                ids.append(f"{named[0]['name']} {named[0]['version']}")
        package = LockPackage(str(entry["name"]), str(entry["version"]), str(entry.get("checksum", "")), tuple(ids))
        packages[package.id] = package
    return packages
