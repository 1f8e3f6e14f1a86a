"""Running cargo on model-written code: no secrets, no network, bounded CPU, memory, time and output.

Build scripts, proc macros and tests are code the model wrote or chose, and
cargo runs them. :class:`Sandbox` wraps each command:

* the environment is stripped of secrets (``*_API_KEY``, ``*_TOKEN``, ...);
* with bubblewrap (``bwrap``), the whole filesystem is mounted read-only
  except the workspace, and the network namespace is empty: no network.
  rustup's toolchains (``~/.cargo``, ``~/.rustup``) and the crate registry
  stay readable. Without bubblewrap the command runs unisolated, and
  :attr:`Sandbox.notice` says so;
* ``prlimit`` caps each process's CPU seconds, address space and file size;
  the runner's time limit caps wall time; output past ``output_bytes`` stops
  the command;
* temporary files go to ``target/flakebot-tmp`` inside the workspace.

:class:`SandboxedCargo` is a :class:`~flakebot_magic.cargo.Cargo` whose every
command goes through a sandbox, so the build stage needs no changes to use it.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from .cargo import Cargo
from .errors import Cancelled
from .process import CancelToken, Completed, LineCallback, ProcessRunner, scrubbed_env
from .registry.base import Registry

__all__ = ["Limits", "Sandbox", "SandboxedCargo", "bubblewrap_works"]

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class Limits:
    """Per-command resource limits (wall time is the runner's ``timeout``)."""

    #: CPU seconds per process (RLIMIT_CPU): a runaway test or rustc gets SIGXCPU
    cpu_seconds: int = 900
    #: address space per process (RLIMIT_AS)
    memory_bytes: int = 8 * GiB
    #: largest file a process may write (RLIMIT_FSIZE)
    file_bytes: int = 4 * GiB
    #: stdout plus stderr of one command; past it the command is stopped
    output_bytes: int = 32 * MiB


@lru_cache(maxsize=4)
def bubblewrap_works(bwrap: str = "bwrap") -> str:
    """``""`` when bubblewrap can make an isolated, network-less sandbox here, else why not."""
    path = shutil.which(bwrap)
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    try:
        done = subprocess.run(
            [path, *_bwrap_base(), "--", "true"],
            capture_output=True, timeout=20, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap could not start ({exc})"
    if done.returncode != 0:
        return f"bubblewrap cannot create a sandbox here ({done.stderr.decode(errors='replace').strip()[:200]})"
    return ""


def _bwrap_base() -> list[str]:
    return [
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--unshare-user-try", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
        "--unshare-cgroup-try", "--unshare-net",
        "--die-with-parent",
        "--cap-drop", "ALL",
    ]


class Sandbox:
    """How commands on model-written code run in one workspace.

    Parameters
    ----------
    workspace
        The only directory the commands may write.
    limits
        CPU, memory, file-size and output limits.
    isolate
        Use bubblewrap: None (default) when it works here, False never, True
        always (raising if it cannot).
    """

    def __init__(self, workspace: Path, *, limits: Limits | None = None, isolate: bool | None = None) -> None:
        self.workspace = Path(workspace).resolve()
        self.limits = limits or Limits()
        why = bubblewrap_works() if isolate is not False else "isolation was turned off"
        if isolate and why:
            from .errors import ConfigError

            raise ConfigError(f"Cannot sandbox cargo: {why}. Install bubblewrap (apt-get install bubblewrap).")
        self.isolated = not why
        self.why_not = why
        self.prlimit = shutil.which("prlimit")

    @property
    def notice(self) -> str:
        """What the user should know about this sandbox ("" when it is complete)."""
        missing = []
        if not self.isolated:
            missing.append(
                f"{self.why_not}: cargo runs model-written code WITHOUT network isolation and with "
                "write access beyond the workspace (install bubblewrap to close both)"
            )
        if self.prlimit is None:
            missing.append("prlimit (util-linux) is missing: no CPU, memory or file-size limits")
        return "; ".join(missing)

    @property
    def tmp_dir(self) -> Path:
        return self.workspace / "target" / "flakebot-tmp"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` wrapped in the limits and, when available, bubblewrap."""
        wrapped = list(argv)
        if self.prlimit is not None:
            limits = self.limits
            wrapped = [
                self.prlimit,
                f"--cpu={limits.cpu_seconds}",
                f"--as={limits.memory_bytes}",
                f"--fsize={limits.file_bytes}",
                "--core=0",
                "--",
                *wrapped,
            ]
        if self.isolated:
            path = shutil.which("bwrap") or "bwrap"
            ws = str(self.workspace)
            # bwrap keeps the caller's working directory (inside the workspace)
            wrapped = [path, *_bwrap_base(), "--bind", ws, ws, "--", *wrapped]
        return wrapped

    def env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """``env`` (default: the current one) without secrets, with temporary files in the workspace."""
        base = scrubbed_env() if env is None else scrubbed_env_of(env)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        base["TMPDIR"] = str(self.tmp_dir)
        # cargo must not try the network even when a registry is online: the sandbox has none
        base["CARGO_NET_OFFLINE"] = "true"
        return base

    def describe(self) -> str:
        parts = ["bubblewrap: read-only filesystem but the workspace, no network" if self.isolated else "no isolation"]
        if self.prlimit:
            limits = self.limits
            parts.append(
                f"limits: {limits.cpu_seconds} CPU-s, {limits.memory_bytes // GiB} GiB memory, "
                f"{limits.output_bytes // MiB} MiB output per command"
            )
        return "; ".join(parts)


def scrubbed_env_of(env: dict[str, str]) -> dict[str, str]:
    """``env`` without anything that looks like a secret (same rule as :func:`scrubbed_env`)."""
    from .process import _SECRET

    return {k: v for k, v in env.items() if not _SECRET.search(k)}


class _OutputLimit(CancelToken):
    """A cancel token that also fires when a command's output passes its limit."""

    def __init__(self, parent: CancelToken) -> None:
        super().__init__()
        self.parent = parent

    @property
    def cancelled(self) -> bool:
        return self._event.is_set() or self.parent.cancelled


class SandboxedCargo(Cargo):
    """A :class:`Cargo` whose commands run inside a :class:`Sandbox`.

    Everything else (registry arguments, offline mode, ``nice``) is the
    plain :class:`Cargo`'s.
    """

    def __init__(
        self, registry: Registry, runner: ProcessRunner, sandbox: Sandbox, *, executable: str | None = None
    ) -> None:
        super().__init__(registry, runner, executable=executable)
        self.sandbox = sandbox

    def argv(self, subcommand: str, *args: str) -> list[str]:
        argv = super().argv(subcommand, *args)
        if not self.registry.offline and subcommand != "fetch":
            # dependencies were fetched before (cargo fetch, outside); the sandbox has no network
            argv.insert(2, "--offline")
        return argv

    def fetch(self, cwd: Path, timeout: float, on_line: LineCallback | None = None) -> Completed:
        """``cargo fetch`` outside the sandbox (downloads only, runs no crate code)."""
        return super().run("fetch", cwd=cwd, timeout=timeout, on_line=on_line)

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
        """Run one cargo command in the sandbox; output past the limit stops it (exit status -9).

        With an online registry, ``cargo fetch`` runs first, outside: the
        sandbox has no network, and fetching runs no crate code.
        """
        if not self.registry.offline and subcommand in ("build", "test", "clippy", "check", "run"):
            self.fetch(cwd, timeout, on_line)
        argv = self.argv(subcommand, *args)
        if nice and shutil.which("nice"):
            argv = ["nice", "-n", str(nice), *argv]
        sandbox = self.sandbox
        limit = _OutputLimit(self.runner.cancel)
        out: list[str] = []
        err: list[str] = []
        size = 0

        def collect(stream: str, line: str) -> None:
            nonlocal size
            if limit.cancelled:
                return
            size += len(line) + 1
            if size > sandbox.limits.output_bytes:
                limit.cancel()
                return
            (out if stream == "stdout" else err).append(line + "\n")
            if on_line is not None:
                on_line(stream, line)

        runner = copy.copy(self.runner)  # an injected runner keeps observing
        runner.cancel = limit
        try:
            return runner.run(
                sandbox.command(argv),
                cwd=cwd,
                env=sandbox.env(self.env(env)),
                timeout=timeout,
                on_line=collect,
                workspace=cwd,
            )
        except Cancelled:
            if self.runner.cancel.cancelled:
                raise
            message = (
                f"flakebot: stopped `cargo {subcommand}`: its output passed "
                f"{sandbox.limits.output_bytes // MiB} MiB (a test or build script printing without end?)\n"
            )
            return Completed(argv, -9, "".join(out), "".join(err) + message, 0.0)
