"""What cargo reads from a ``Cargo.toml``, table by table: the one map of a manifest the build policy walks.

A manifest is untrusted data (model-written, or rewritten by a crate's test).
The policy does not search it for suspicious *names* (a dependency may be
called anything, ``metadata`` included); it walks the tables cargo
interprets, the way cargo does, and says what it does not know:

* :func:`dependencies`: every dependency cargo reads, whatever its name:
  ``[dependencies]``, ``[dev-dependencies]``, ``[build-dependencies]`` (and
  their ``_`` spellings), the same under every ``[target.<cfg>]``, and
  ``[workspace.dependencies]``;
* :func:`dependency_problems`: what in one dependency's table fetches code
  from elsewhere (``git``, ``registry-index``, ``registry``, ``base``,
  artifact dependencies) or is a key this map does not know (cargo may read
  it: refused rather than guessed);
* :func:`paths`: every path cargo reads from the manifest when it builds:
  target ``path`` s, ``package.build``, ``package.workspace``, dependency
  ``path`` s, workspace members;
* :func:`unknown_keys`: top-level tables and ``[target.<cfg>]`` or
  ``[workspace]`` keys cargo 1.x does not define. Cargo ignores them with a
  warning today; the policy refuses them, so a key a later cargo reads can
  never pass unseen. ``cargo publish`` writes only keys it knows, so no
  published manifest has one.

Only ``package.metadata`` and ``workspace.metadata`` are free-form (cargo
never reads them), and they are skipped *by position*, not by name.

Examples
--------
>>> doc = {"dependencies": {"metadata": {"package": "x", "git": "http://h/x"}}}
>>> [(d.where, d.name) for d in dependencies(doc)]
[('dependencies', 'metadata')]
>>> dependency_problems(dependencies(doc)[0].spec)
["a git dependency ('http://h/x') fetches code from outside the registry"]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DEPENDENCY_TABLES",
    "TARGET_TABLES",
    "Dependency",
    "dependencies",
    "dependency_problems",
    "package_table",
    "paths",
    "unknown_keys",
]

#: the tables of dependencies, as cargo spells them (the ``_`` forms are old spellings cargo still reads)
DEPENDENCY_TABLES = (
    "dependencies",
    "dev-dependencies",
    "dev_dependencies",
    "build-dependencies",
    "build_dependencies",
)
#: the tables of build targets, each with an optional ``path``
TARGET_TABLES = ("lib", "bin", "example", "test", "bench")
#: the top-level keys cargo defines
_TOP_LEVEL = frozenset(
    {
        "cargo-features",
        "package",
        "project",
        "profile",
        *TARGET_TABLES,
        *DEPENDENCY_TABLES,
        "features",
        "target",
        "replace",
        "patch",
        "workspace",
        "badges",
        "lints",
        "hints",
    }
)
_WORKSPACE = frozenset(
    {"members", "exclude", "default-members", "resolver", "metadata", "dependencies", "package", "lints"}
)
#: keys of a dependency's table that only choose among the registry's crates
_DEPENDENCY_SAFE = frozenset(
    {"version", "features", "optional", "default-features", "default_features", "package", "public", "workspace"}
)
#: keys of a dependency's table that bring code from another source, and why each is refused
_DEPENDENCY_SOURCES = {
    "git": "a git dependency ({value!r}) fetches code from outside the registry",
    "branch": "a git dependency's branch ({value!r}): git dependencies fetch code from outside the registry",
    "tag": "a git dependency's tag ({value!r}): git dependencies fetch code from outside the registry",
    "rev": "a git dependency's rev ({value!r}): git dependencies fetch code from outside the registry",
    "registry-index": "a registry-index dependency ({value!r}) fetches code from another registry",
    "registry": "a dependency from the named registry {value!r} fetches code from another registry",
    "base": "a path base ({value!r}) points a dependency somewhere cargo's configuration says",
    "artifact": "an artifact dependency ({value!r}) builds and hands over another crate's binaries",
}
#: package keys that name a file or directory cargo reads when it builds (``readme`` and ``license-file`` are read
#: only by ``cargo package``, and many published crates point them at ``../``: flakebot reads them inside the crate
#: only, through :func:`flakebot_magic.host.fsutil.read_inside`)
_PACKAGE_PATHS = ("build", "workspace")


@dataclass(frozen=True)
class Dependency:
    """One dependency as cargo reads it: the table it is in (``target.cfg(unix).dependencies``), its name, its spec."""

    where: str
    name: str
    spec: Any


def package_table(doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``[package]`` table (or its old name ``[project]``), empty when there is none."""
    for key in ("package", "project"):
        table = doc.get(key)
        if isinstance(table, Mapping):
            return table
    return {}


def _tables(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """Every table of dependencies in ``doc``, with where it is."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    places: list[tuple[str, Any]] = [("", doc)]
    targets = doc.get("target")
    if isinstance(targets, Mapping):
        places += [(f"target.{cfg}.", table) for cfg, table in targets.items()]
    for prefix, place in places:
        if isinstance(place, Mapping):
            found += [(prefix + t, place[t]) for t in DEPENDENCY_TABLES if isinstance(place.get(t), Mapping)]
    workspace = doc.get("workspace")
    if isinstance(workspace, Mapping) and isinstance(workspace.get("dependencies"), Mapping):
        found.append(("workspace.dependencies", workspace["dependencies"]))
    return found


def dependencies(doc: Mapping[str, Any]) -> list[Dependency]:
    """Every dependency cargo reads from ``doc``, whatever it is called (see the module docstring)."""
    return [Dependency(where, str(name), spec) for where, table in _tables(doc) for name, spec in table.items()]


def dependency_problems(spec: Any) -> list[str]:
    """Why a dependency's spec is refused: a source other than the registry, or a key this map does not know.

    A plain version string is fine; ``path`` is a path (:func:`paths` hands it
    to the policy, which checks where it points).
    """
    if not isinstance(spec, Mapping):
        return []
    problems = []
    for key, value in spec.items():
        if key in _DEPENDENCY_SAFE or key == "path":
            continue
        if key in _DEPENDENCY_SOURCES:
            problems.append(_DEPENDENCY_SOURCES[key].format(value=value))
        else:
            problems.append(f"the key {key!r} is not one flakebot knows cargo's meaning of, so it could name a source")
    return problems


def paths(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every path the manifest names (where, value): targets, package files, dependencies, workspace members.

    Member globs are given up to their first wildcard (the directory they
    expand under).
    """
    found: list[tuple[str, str]] = []
    package = package_table(doc)
    for key in _PACKAGE_PATHS:
        value = package.get(key)
        if isinstance(value, str):
            found.append((f"package.{key}", value))
        elif key == "build" and isinstance(value, list):
            found += [(f"package.{key}", v) for v in value if isinstance(v, str)]
    for kind in TARGET_TABLES:
        tables = doc.get(kind)
        for table in tables if isinstance(tables, list) else [tables]:
            if isinstance(table, Mapping) and isinstance(table.get("path"), str):
                found.append((f"{kind}.path", table["path"]))
    for dependency in dependencies(doc):
        if isinstance(dependency.spec, Mapping) and isinstance(dependency.spec.get("path"), str):
            found.append((f"{dependency.where}.{dependency.name}.path", dependency.spec["path"]))
    workspace = doc.get("workspace")
    if isinstance(workspace, Mapping):
        for key in ("members", "default-members"):
            members = workspace.get(key)
            for member in members if isinstance(members, list) else []:
                if isinstance(member, str):
                    literal = member.split("*")[0].split("?")[0].split("[")[0] or "."
                    found.append((f"workspace.{key}", literal))
    return found


def unknown_keys(doc: Mapping[str, Any]) -> list[str]:
    """The keys (dotted) in places cargo reads that cargo does not define: refused, never guessed at."""
    found = [str(key) for key in doc if key not in _TOP_LEVEL]
    targets = doc.get("target")
    if targets is not None and not isinstance(targets, Mapping):
        found.append("target")
    for cfg, table in targets.items() if isinstance(targets, Mapping) else []:
        if not isinstance(table, Mapping):
            found.append(f"target.{cfg}")
            continue
        found += [f"target.{cfg}.{key}" for key in table if key not in DEPENDENCY_TABLES]
    workspace = doc.get("workspace")
    if isinstance(workspace, Mapping):
        found += [f"workspace.{key}" for key in workspace if key not in _WORKSPACE]
    return found
