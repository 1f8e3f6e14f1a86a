"""The cargo backend: ``cargo build --release`` beside ``cargo test`` (in the sandbox), binaries copied to the store.

::

    build (cargo build --release) ┐ ──► flake (write, commit) ──► deploy (copy bin/ to store/HASH-…)
    test  (cargo test)            ┘

The release build compiles the proven commit's files, exported from git's
objects (:mod:`~flakebot_magic.stages.proven`), never the work tree.

The flake is written for the tool's users (``nix build`` elsewhere); it is
not a build input here, so it does not change the store hash.
"""

from __future__ import annotations

from typing import Any

from ..sandbox.cargo import Cargo
from ..stages.build import BUILD_FLAGS
from ..stages.deploy import StorePath, deploy, lookup, store_key
from ..stages.flake import write_flake
from ..stages.state import RunState, Stage
from .base import Backend, Built, cached_rows, flake_meta, manifest, nixpkgs_url

__all__ = ["CargoBackend"]


class CargoBackend(Backend):
    """Builds with cargo; the tool is ``<cache>/store/HASH-crate-version/bin/``."""

    name = "cargo"

    def describe(self) -> str:
        return "cargo: the release build and the tests in the sandbox, the binaries copied to the store"

    def build(self, run: RunState, cargo: Cargo) -> Built:
        settings, bus = self.settings, self.bus
        workspace = run.forked()
        crate = workspace.crate
        git = self.git(run)
        key = store_key(git, run.rustc, BUILD_FLAGS)
        built = Built(key=key, flags=list(BUILD_FLAGS))
        built.cached = None if run.flags.rebuild else lookup(settings.cache.store, key, crate.name, crate.version)
        if built.cached is not None:
            cached_rows(bus, ("build", "test"), built.cached)
        else:
            result = self.check(run, cargo, git)
            built.binaries, built.tests, built.proof = dict(result.build.binaries), result.tests, result.proof
            built.digests, built.source = dict(result.build.digests), result.source
        with Stage(bus, "flake") as stage:
            written = write_flake(workspace.path, flake_meta(workspace, run.main_program), nixpkgs_url(settings))
            committed = git.commit(
                "Add flake.nix\n\nBuild it with `nix build`; packages.default is this crate's binaries, "
                "packages.deps its dependencies alone (flakebot-deps/).",
                written,
            )
            stage.detail = "flake.nix committed" if committed else "flake.nix unchanged"
        return built

    def deploy(self, run: RunState, built: Built, contract: dict[str, Any]) -> StorePath:
        settings = self.settings
        crate = run.crate()
        with Stage(self.bus, "deploy") as stage:
            if built.cached is not None:
                store = built.cached
                stage.status = "cached"
            else:
                data = manifest(run, self.name, built, commit=self.git(run).head(), contract=contract)
                store = deploy(
                    settings.cache.store,
                    built.key,
                    crate.name,
                    crate.version,
                    built.binaries,
                    data,
                    digests=built.digests,
                )
            stage.detail = str(store.path)
        return store
