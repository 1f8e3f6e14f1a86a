"""How flakebot invokes cargo: the registry, offline mode, a clean environment."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .errors import ConfigError
from .process import Completed, LineCallback, ProcessRunner, scrubbed_env
from .registry.base import Registry

__all__ = ["Cargo", "find_cargo"]

_BUILD_VARIABLES = frozenset(
    {
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_ENCODED_RUSTDOCFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_INCREMENTAL",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
    }
)


def find_cargo() -> str:
    """The cargo executable: on PATH, else rustup's default place."""
    found = shutil.which("cargo")
    if found:
        return found
    rustup = Path.home() / ".cargo" / "bin" / "cargo"
    if rustup.is_file():
        return str(rustup)
    raise ConfigError(
        "cargo is not installed (not on PATH, not in ~/.cargo/bin). "
        "Run `make install` in the flakebot-magic checkout (installs Debian's cargo), "
        "or install Rust from https://rustup.rs, then try again."
    )


class Cargo:
    """cargo, pointed at one registry, in one workspace.

    With an offline registry every command gets ``--offline`` and the
    registry as ``--config`` arguments, so nothing machine-specific is
    written into the workspace.
    """

    def __init__(self, registry: Registry, runner: ProcessRunner, *, executable: str | None = None) -> None:
        self.registry = registry
        self.runner = runner
        self.executable = executable or find_cargo()

    def argv(self, subcommand: str, *args: str) -> list[str]:
        argv = [self.executable, subcommand]
        if self.registry.offline:
            argv.append("--offline")
            config_args = getattr(self.registry, "cargo_config_args", None)
            if config_args is not None:
                argv += config_args()
        return argv + list(args)

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = scrubbed_env({"CARGO_TERM_COLOR": "never", "CARGO_TERM_PROGRESS_WHEN": "never"})
        # flags from the caller's shell would change the binary without changing the store hash
        for name in [
            n for n in env if n in _BUILD_VARIABLES or n.startswith(("CARGO_BUILD_", "CARGO_PROFILE_", "CARGO_TARGET_"))
        ]:
            del env[name]
        # the toolchain's own directory must stay reachable when cargo came from ~/.cargo/bin
        bin_dir = os.path.dirname(self.executable)
        if bin_dir not in env.get("PATH", "").split(os.pathsep):
            env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
        if extra:
            env.update(extra)
        return env

    def run(
        self,
        subcommand: str,
        *args: str,
        cwd: Path,
        timeout: float,
        on_line: LineCallback | None = None,
        env: dict[str, str] | None = None,
        nice: int = 0,
    ) -> Completed:
        """Run one cargo command; ``nice`` lowers its CPU priority (for work that may wait)."""
        argv = self.argv(subcommand, *args)
        if nice and shutil.which("nice"):
            argv = ["nice", "-n", str(nice), *argv]
        return self.runner.run(
            argv,
            cwd=cwd,
            env=self.env(env),
            timeout=timeout,
            on_line=on_line,
            workspace=cwd,
            label=["cargo", subcommand, *args],
        )

    def fetch(
        self, workspace: Path, timeout: float, on_line: LineCallback | None = None, *, env: dict[str, str] | None = None
    ) -> Completed:
        """``cargo fetch`` for ``workspace``, honouring none of the workspace's configuration.

        cargo reads ``.cargo/config.toml`` from its working directory and the
        directories above it, not from the manifest's: so it runs in ``/``
        with ``--manifest-path``, and a ``.cargo/config.toml`` planted in the
        workspace (a ``runner``, a ``rustc-wrapper``, a source replacement)
        is never read by this step, which runs outside any sandbox.
        """
        manifest = Path(workspace).resolve() / "Cargo.toml"
        argv = [*self.argv("fetch"), "--manifest-path", str(manifest)]
        return self.runner.run(
            argv, cwd=Path("/"), env=self.env(env), timeout=timeout, on_line=on_line, workspace=workspace
        )

    def rustc_version(self) -> str:
        """``rustc -vV`` of the toolchain cargo uses (part of every store hash)."""
        rustc = shutil.which("rustc", path=self.env()["PATH"]) or "rustc"
        done = self.runner.run([rustc, "-vV"], env=self.env(), timeout=60)
        return done.stdout.strip()
