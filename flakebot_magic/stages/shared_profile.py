"""The proof in the release build's target dir: which package is compiled with which profile settings.

A cold proof (:func:`flakebot_magic.stages.build.check` on a workspace the
edit loop never worked in, built by cargo) runs ``cargo test --release`` in
the release build's own target dir, after that build, so every unit of the
release build's dependencies is reused unchanged rather than compiled again
in the debug profile. Cargo's profile overrides by package (``--config``,
never an edit of the crate's ``Cargo.toml``) give back what a plain
``cargo test`` has where it matters:

* the crate under test (the root package) at the test profile's settings:
  opt-level 0, debug assertions and overflow checks on, no debugger symbols
  (:data:`ROOT_SETTINGS`);
* the packages only the tests need (dev-dependencies and what only they pull
  in; :func:`dev_only_packages`, from ``cargo metadata``) at opt-level 0
  (:data:`TEST_ONLY_SETTINGS`): they are not in the release graph, so
  optimising them buys nothing.

The normal dependencies are tested as they ship: release-compiled, without
their own debug assertions or overflow checks. Cargo hashes a unit's profile
into its fingerprint and metadata, so an override on one package changes no
other unit: the release build's dependency units stay fresh (counted by
``benchmarks/bench_proof.py``'s ``shared`` variant).

The profile is named in a proof's key by :data:`PROOF_FLAGS` (the settings,
with the package names as roles): the names themselves follow from the source
tree and ``Cargo.lock``, which the key holds already.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..host.fsutil import load_json
from ..sandbox.cargo import Cargo
from ..untrusted import safe_text

__all__ = [
    "PROOF_FLAGS",
    "ROOT_SETTINGS",
    "TEST_ONLY_SETTINGS",
    "SharedProfile",
    "dev_only_packages",
    "shared_profile",
]

#: the crate under test, as ``cargo test`` compiles it (the dev profile's settings that decide what is tested)
ROOT_SETTINGS = (("opt-level", "0"), ("debug-assertions", "true"), ("overflow-checks", "true"), ("debug", "false"))
#: what only the tests link: compiled once, run once, never shipped
TEST_ONLY_SETTINGS = (("opt-level", "0"),)
#: the profile in a proof's key: the settings by role (the names are the source's and Cargo.lock's)
PROOF_FLAGS = (
    "--release",
    "profile.release.package.<root>: " + " ".join(f"{k}={v}" for k, v in ROOT_SETTINGS),
    "profile.release.package.<test-only>: " + " ".join(f"{k}={v}" for k, v in TEST_ONLY_SETTINGS),
)
#: a package name as cargo allows it: nothing that could close the TOML key it is put in
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: cargo metadata of a forked crate: far below this; more is refused
_MAX_METADATA = 64 << 20


class SharedProfile:
    """The root package and the test-only packages of one workspace, and the cargo arguments they make."""

    def __init__(self, root: str, test_only: tuple[str, ...]) -> None:
        for name in (root, *test_only):
            if not _NAME.fullmatch(name):
                raise BuildError(f"cargo metadata named a package {name!r}, which cargo does not allow.")
        self.root, self.test_only = root, test_only

    def args(self) -> tuple[str, ...]:
        """``--release`` and the ``--config`` overrides for ``cargo test``."""
        overrides = [(self.root, ROOT_SETTINGS)] + [(name, TEST_ONLY_SETTINGS) for name in self.test_only]
        return (
            "--release",
            *(
                arg
                for name, settings in overrides
                for key, value in settings
                for arg in ("--config", f'profile.release.package."{name}".{key}={value}')
            ),
        )


def dev_only_packages(metadata: Any) -> tuple[str, tuple[str, ...]] | None:
    """The root package's name and the names of the packages only its tests need, from ``cargo metadata``'s
    JSON (None without a root package: a virtual workspace).

    A package is test-only when it is reached from the root only through a
    dev-dependency edge. A name that also names a package of the release
    graph (another version) is left out: an override by name would reach that
    one too.

    Examples
    --------
    >>> dep = lambda p, *kinds: {"pkg": p, "dep_kinds": [{"kind": k} for k in kinds]}
    >>> meta = {"packages": [{"id": i, "name": i} for i in "rnd"], "resolve": {"root": "r", "nodes": [
    ...     {"id": "r", "deps": [dep("n", None), dep("d", "dev")]}, {"id": "n", "deps": []},
    ...     {"id": "d", "deps": [dep("n", None)]}]}}
    >>> dev_only_packages(meta)
    ('r', ('d',))
    """
    resolve = metadata.get("resolve") or {}
    root = resolve.get("root")
    if root is None:
        return None
    names = {p["id"]: p["name"] for p in metadata["packages"]}
    edges = {node["id"]: node.get("deps", []) for node in resolve.get("nodes", [])}

    def reach(*, dev: bool) -> set[str]:
        seen, todo = {root}, [root]
        while todo:
            for dep in edges.get(todo.pop(), []):
                kinds = {k.get("kind") for k in dep.get("dep_kinds", [])}
                if dep["pkg"] not in seen and (dev or kinds - {"dev"}):
                    seen.add(dep["pkg"])
                    todo.append(dep["pkg"])
        return seen

    release = {names[p] for p in reach(dev=False)}
    only = {names[p] for p in reach(dev=True)} - release
    return names[root], tuple(sorted(only))


def shared_profile(cargo: Cargo, workspace: Path, timeout: float) -> SharedProfile | None:
    """The workspace's :class:`SharedProfile` (``cargo metadata`` in the sandbox, offline, for the host only), or
    None when it has no root package."""
    host = next(
        (line.split(":", 1)[1].strip() for line in cargo.rustc_version().splitlines() if line.startswith("host:")), ""
    )
    platform = ("--filter-platform", host) if host else ()
    done = cargo.run("metadata", "--format-version", "1", "--locked", *platform, cwd=workspace, timeout=timeout)
    if done.returncode != 0 or len(done.stdout) > _MAX_METADATA:
        raise BuildError(
            f"cargo metadata failed for {workspace.name}, so its tests cannot be planned:\n{safe_text(done.stderr[-2000:])}",
            command=done.args,
            workspace=workspace,
        )
    try:
        found = dev_only_packages(load_json(done.stdout))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BuildError(f"cargo metadata of {workspace.name} was not what cargo writes: {exc}") from exc
    return None if found is None else SharedProfile(*found)
