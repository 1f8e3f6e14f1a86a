"""The one interface of the build backends, and what a run carries through them.

What a run carries through them (its :class:`~flakebot_magic.stages.state.RunState`,
the pipeline's :class:`~flakebot_magic.stages.state.RunDeps`) lives in
:mod:`flakebot_magic.stages.state`. A :class:`Backend` turns a forked (and maybe
model-edited) workspace into a store entry:

* :meth:`Backend.lookup`: a recipe hit, when its store entry (and for nix its
  /nix/store path) is still there;
* :meth:`Backend.build`: the flake, the build and the tests (or a hit in the
  store by the workspace's hash), as a :class:`Built`;
* :meth:`Backend.deploy`: the store entry, with a manifest in the one schema
  (:func:`manifest`, :data:`MANIFEST_KEYS`) both backends write;
* :meth:`Backend.describe`: one line on how it builds.
"""

from __future__ import annotations

import os
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..config import Settings
from ..errors import FlakeError, StorageError
from ..events import EventBus, StageFinished, StageStarted
from ..host.fsutil import is_real_dir
from ..host.git import Git
from ..host.storage import read_cache_json
from ..host.trees import Walk
from ..records.proofs import ProofRecord, ProofStore
from ..registry.directory import read_manifest
from ..sandbox import release_target
from ..sandbox.cargo import Cargo
from ..sandbox.diagnostics import BINARY_NAME, TestReport
from ..stages.build import BuildResult, CheckResult, check
from ..stages.deploy import StorePath, served
from ..stages.deps import dependency_cache
from ..stages.flake import DEFAULT_NIXPKGS_URL, FlakeMeta
from ..stages.fork import Workspace
from ..stages.proven import ProvenSource
from ..stages.state import BackendChoice, RunDeps, RunState
from .nix_command import normalize_flake_ref

__all__ = [
    "MANIFEST_KEYS",
    "Backend",
    "Built",
    "cached_rows",
    "flake_meta",
    "manifest",
    "nixpkgs_url",
]

#: every key of a store entry's manifest.json, whichever backend wrote it (``hash``, ``format`` and
#: ``tools`` are added by :func:`~flakebot_magic.stages.deploy.write_entry`)
MANIFEST_KEYS = (
    "backend",
    "binaries",
    "build_bytes",
    "candidates",
    "checksum",
    "checksum_kind",
    "commit",
    "contract",
    "crate",
    "derivation",
    "description",
    "dropped",
    "flags",
    "gcroot",
    "iterations",
    "lock_hash",
    "model",
    "nar_hash",
    "nix_store_path",
    "nixpkgs",
    "nixpkgs_url",
    "plan",
    "proof_nar_hash",
    "proof_store_path",
    "proof",
    "registry",
    "rustc",
    "skipped_targets",
    "source_commit",
    "source_tree",
    "tests",
    "usage",
    "version",
    "winner",
)


@dataclass
class Built:
    """What :meth:`Backend.build` made: binaries and test counts, or a store entry that already had them."""

    key: str
    flags: list[str]
    cached: StorePath | None = None
    binaries: dict[str, Path] = field(default_factory=dict)
    #: the SHA-256 of each binary as its build ended (the deploy refuses other bytes)
    digests: dict[str, str] = field(default_factory=dict)
    tests: TestReport | None = None
    #: the proof of the tests (made by this build, or found: ``reused``)
    proof: ProofRecord | None = None
    #: the commit the release build compiled (its tree exported from git's objects), None for a cached entry
    source: ProvenSource | None = None
    #: nix: the built /nix/store path, its pending out-link, and what the lock pinned
    out_path: Path | None = None
    pending: Path | None = None
    lock: dict[str, Any] = field(default_factory=dict)


def cached_rows(bus: EventBus, stages: Iterable[str], store: StorePath | None = None, *, where: str = "") -> None:
    """A ``cached`` row for each of ``stages``.

    With the store entry that had the tool, the test row says what its tests
    counted when it was built (the counts a front end shows are the tool's,
    not a check run's), and the deploy row says ``where`` it is.
    """
    tests = (store.manifest.get("tests") if store is not None else None) or {}
    for name in stages:
        detail = ""
        if name == "test" and isinstance(tests, dict) and "passed" in tests:
            detail = (
                f"{tests.get('passed', 0)} passed, {tests.get('failed', 0)} failed, {tests.get('ignored', 0)} ignored"
            )
        elif name == "deploy":
            detail = where
        bus.emit(StageStarted(name))
        bus.emit(StageFinished(name, "cached", detail))


def line_logger(bus: EventBus, stage: str) -> Callable[[str, str], None]:
    """An ``on_line`` callback that sends a child process's lines to ``stage``'s log."""

    def on_line(stream: str, line: str) -> None:
        bus.log(stage, line, "stderr" if stream == "stderr" else "stdout")

    return on_line


def nixpkgs_url(settings: Settings) -> str:
    """The generated flakes' nixpkgs input: ``settings.nixpkgs`` made absolute, else the default."""
    return normalize_flake_ref(settings.nixpkgs) if settings.nixpkgs else DEFAULT_NIXPKGS_URL


def flake_meta(workspace: Workspace, main_program: str) -> FlakeMeta:
    """What the flake says about the crate: Cargo.toml's description, license and homepage, and the binary.

    ``main_program`` (the tool contract's ``bin``, which a model may have
    written) must be a plain binary name, the rule deploy applies to every
    binary: it lands in flake.nix and in a path.
    """
    if not BINARY_NAME.fullmatch(main_program):
        raise FlakeError(
            f"Cannot write the flake: the binary {main_program[:80]!r} (the tool contract's bin) is not a "
            "plain binary name (letters, digits, '_' and '-'). Name a [[bin]] target of the crate.",
            workspace=workspace.path,
        )
    crate = workspace.crate
    package = read_manifest(workspace.path / "Cargo.toml").get("package", {})
    return FlakeMeta(
        pname=crate.name,
        version=crate.version,
        description=str(package.get("description", "")),
        license=str(package.get("license", "")),
        main_program=main_program,
        homepage=str(package.get("homepage") or package.get("repository") or ""),
    )


def manifest(
    run: RunState, backend: str, built: Built, *, commit: str, contract: dict[str, Any], **nix: Any
) -> dict[str, Any]:
    """A store entry's manifest, the same keys (:data:`MANIFEST_KEYS`) from either backend.

    ``nix`` holds the nix backend's own values (``lock_hash``, ``nixpkgs``,
    ``nixpkgs_url``, ``gcroot``); a cargo entry has them empty.
    """
    workspace = run.forked()
    crate = workspace.crate
    tests = built.tests
    data: dict[str, Any] = {
        "backend": backend,
        "binaries": sorted(built.binaries),
        # what the build's outputs took on disk: what a full disk's error says the next build needs
        "build_bytes": _bytes_under(workspace.path / "target") + _bytes_under(release_target(workspace.path)),
        "checksum": workspace.checksum,
        "checksum_kind": workspace.checksum_kind,
        "commit": commit,
        "contract": contract,
        "crate": crate.name,
        "derivation": "",
        "description": crate.description,
        "dropped": [str(d) for d in workspace.dropped],
        "flags": list(built.flags),
        "gcroot": "",
        "iterations": run.iterations,
        "lock_hash": "",
        "model": run.model.model if run.model is not None else "",
        "nar_hash": "",
        "nix_store_path": "",
        "nixpkgs": {},
        "proof_nar_hash": "",
        "proof_store_path": "",
        "nixpkgs_url": "",
        "registry": crate.registry,
        "rustc": run.rustc,
        "skipped_targets": workspace.skipped_targets,
        # what the release build compiled: this commit's tree, exported from git's objects (stages/proven.py)
        "source_commit": built.source.commit if built.source is not None else "",
        "source_tree": built.source.tree if built.source is not None else "",
        "tests": {"passed": tests.passed, "failed": tests.failed, "ignored": tests.ignored} if tests else {},
        "proof": built.proof.summary() if built.proof is not None else {},
        "version": crate.version,
        # the edit session's (pipeline.edit_stage.session_record): tokens and cost; with --candidates, each and the winner
        "usage": run.session.get("usage", {}),
        "winner": run.session.get("winner"),
        "candidates": run.session.get("candidates", []),
        "plan": run.session.get("plan", ""),
    }
    unknown = set(nix) - set(MANIFEST_KEYS)
    if unknown:
        raise TypeError(f"not manifest keys: {sorted(unknown)}")
    data.update(nix)
    return data


def _bytes_under(path: Path) -> int:
    """The bytes of the regular files under ``path`` (0 when there is none, or it is a planted symlink)."""
    total = 0
    if not is_real_dir(path):
        return 0
    for directory, _, files in Walk(path):
        for name in files:
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


class Backend(ABC):
    """Builds a run's workspace and deploys it to the store: :class:`CargoBackend` or :class:`NixBackend`."""

    #: ``cargo`` or ``nix``: what the recipe, the manifest and the tool record say
    name: ClassVar[str]
    #: the backend ``auto`` falls back to when this one cannot build here after all (nix's: cargo), or None
    #: (:func:`flakebot_magic.backends.fallback_for`)
    falls_back_to: ClassVar[str | None] = None

    def __init__(self, deps: RunDeps, choice: BackendChoice) -> None:
        self.deps = deps
        self.choice = choice

    @property
    def settings(self) -> Settings:
        return self.deps.settings

    @property
    def bus(self) -> EventBus:
        return self.deps.bus

    def recipe_parts(self) -> list[str]:
        """What this backend adds to a recipe's key (the inputs it alone depends on)."""
        return []

    def alive(self, store: StorePath, name: str) -> bool:
        """Is what ``store`` records still there (nix: the /nix/store path, rooted under ``name``)?"""
        return True

    def lookup(self, recipe: Path, name: str) -> StorePath | None:
        """The store entry a recipe names, when it is complete and alive; else None."""
        try:
            data = read_cache_json(recipe)
            # the entry by its name in this cache's store: a recipe written before the cache dir moved still finds it
            path, key = self.settings.cache.store / Path(str(data["store"])).name, str(data["hash"])
        except (OSError, StorageError, KeyError, TypeError):
            return None
        store = served(path, key)  # a damaged entry is set aside: no cache hit, the build makes it again
        return store if store is not None and self.alive(store, name) else None

    def git(self, run: RunState) -> Git:
        return Git(run.forked().path, self.deps.runner)

    def check(
        self, run: RunState, cargo: Cargo, git: Git, *, release: Callable[[Path], BuildResult] | None = None
    ) -> CheckResult:
        """The release build and the tests of ``run``'s workspace in the sandbox, with this cache's proofs and
        compiled dependencies (``release``: how the release build runs, when not by cargo; nix's)."""
        settings = self.settings
        return check(
            run.forked().path,
            cargo,
            self.bus,
            policy=run.checked(),
            build_timeout=settings.build_timeout,
            test_timeout=settings.test_timeout,
            proofs=ProofStore(settings.cache.proofs),
            git=git,
            deps=dependency_cache(settings.cache.units, cargo, self.bus),
            release=release,
        )

    @abstractmethod
    def build(self, run: RunState, cargo: Cargo) -> Built | None:
        """The flake, the build and the tests of ``run``'s workspace (``cargo`` is the sandboxed one).

        None: ``auto`` chose this backend and it cannot build here after all
        (nix could not lock nixpkgs); the caller builds with cargo instead.
        """

    @abstractmethod
    def deploy(self, run: RunState, built: Built, contract: dict[str, Any]) -> StorePath:
        """The store entry for ``built`` (a ``cached`` deploy row when the store had it)."""

    @abstractmethod
    def describe(self) -> str:
        """One line: how this backend builds and where the tool ends up."""
