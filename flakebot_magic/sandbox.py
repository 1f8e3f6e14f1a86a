"""Confinement for code flakebot does not trust: crate code under cargo, and built tools.

Build scripts, proc macros and tests are code a model wrote or a crate
shipped, and cargo runs them. :class:`Sandbox` wraps each such command:

* with bubblewrap (``bwrap``) it sees only the system directories the
  toolchain needs (``/usr``, the ``/bin``/``/lib`` links, a handful of files
  from ``/etc``: no ``/etc/shadow``, no ssh host keys), the paths bound
  read-only for it (the Rust toolchain, the registry, a tool's store entry),
  a private ``CARGO_HOME``, and the workspace read-write **with ``.git``
  read-only**. ``$HOME`` and ``/tmp`` are empty private tmpfs; there is no
  ``/run`` and no network (not even the host's loopback, so no unix or
  abstract socket outside is reachable); a new pid namespace that dies with
  its pid 1, a new session, no capabilities;
* the environment is an allowlist (:func:`allowed_env`): nothing passes
  because it "does not look like a secret";
* ``prlimit`` caps CPU seconds, address space, file size and (in the
  sandbox's user namespace) processes; where a pids cgroup is writable
  (root, or a delegated cgroup) the command also runs in its own cgroup with
  ``pids.max``, since the kernel never applies ``RLIMIT_NPROC`` to root;
* :class:`SandboxedCargo` stops a command whose output passes
  ``output_bytes`` or whose workspace plus ``CARGO_HOME`` pass
  ``disk_bytes``; the runner's time limit caps wall time.

Without bubblewrap nothing of the filesystem and network part holds:
:attr:`Sandbox.notice` says so, and the pipeline refuses model-edited builds
unless the user opts in (``allow_unsandboxed``).
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from .cargo import Cargo
from .errors import Cancelled, ConfigError
from .process import CancelToken, Completed, LineCallback, LinkedToken, ProcessRunner, allowed_env
from .registry.base import Registry
from .sandbox_host import (
    INSTALL_BWRAP,
    Toolchain,
    bubblewrap_works,
    is_under,
    namespaces,
    system_binds,
    toolchain_of,
    visible_system,
)
from .sandbox_limits import GiB, Limits, MiB, disk_usage_of, make_pids_cgroup, remove_cgroups

__all__ = [
    "SANDBOX_DIR",
    "Limits",
    "Sandbox",
    "SandboxedCargo",
    "Toolchain",
    "allowed_env",
    "bubblewrap_works",
    "toolchain_of",
]

#: beside a workspace: ``.sandbox/NAME/cargo-home``, the private CARGO_HOME of the builds in workspace NAME
SANDBOX_DIR = ".sandbox"


# --- the sandbox --------------------------------------------------------------------------------


class Sandbox:
    """How commands on untrusted code run in one directory.

    Parameters
    ----------
    workspace
        The only directory the commands may write (its ``.git`` stays read-only).
    read_only
        More paths the commands may read (a tool's store entry, the registry,
        the toolchain). Anything under ``/nix/store`` shows the whole store.
    limits
        CPU, memory, file-size, process, disk and output limits.
    isolate
        Use bubblewrap: None (default) when it works here, False never, True
        always (raising :class:`ConfigError` if it cannot).
    cargo_home
        A private ``CARGO_HOME``, writable (default: next to the workspace,
        under ``.sandbox/``, never the user's ``~/.cargo``).

    ``command(argv)`` is the command to run, ``env(extra)`` its environment;
    run them with ``cwd`` inside the workspace.
    """

    def __init__(
        self,
        workspace: Path,
        *,
        read_only: Iterable[Path | str] = (),
        limits: Limits | None = None,
        isolate: bool | None = None,
        cargo_home: Path | None = None,
    ) -> None:
        self.workspace = Path(workspace).resolve()
        self.read_only = [str(Path(p).resolve()) for p in read_only]
        self.read_write: list[str] = []
        self.limits = limits or Limits()
        why = bubblewrap_works() if isolate is not False else "isolation was turned off"
        if isolate and why:
            raise ConfigError(f"Cannot sandbox untrusted code: {why}. To fix it, {INSTALL_BWRAP}.")
        self.isolated = not why
        self.why_not = why
        self.prlimit = shutil.which("prlimit")
        self.cargo_home = (
            Path(cargo_home) if cargo_home else self.workspace.parent / SANDBOX_DIR / self.workspace.name / "cargo-home"
        )
        home = os.path.expanduser("~")
        #: $HOME inside: the user's home path, but an empty tmpfs (rustup under it stays bound at its path)
        self.home = home if self.isolated and os.path.isabs(home) and home != "/" else str(self.tmp_dir / "home")
        self._cgroups: list[Path] = []
        weakref.finalize(self, remove_cgroups, self._cgroups)

    @property
    def notice(self) -> str:
        """What the user should know about this sandbox ("" when it is complete)."""
        missing = []
        if not self.isolated:
            missing.append(
                f"NOT SANDBOXED: {self.why_not}: code runs WITHOUT network isolation, sees $HOME, "
                f"secrets and sockets, and can write beyond its workspace (to close that, {INSTALL_BWRAP})"
            )
        if self.prlimit is None:
            missing.append("prlimit (util-linux) is missing: no CPU, memory, file-size or process limits")
        return "; ".join(missing)

    @property
    def tmp_dir(self) -> Path:
        return self.workspace / "target" / "flakebot-tmp"

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` wrapped in the limits and, when available, bubblewrap."""
        wrapped = list(argv)
        limits = self.limits
        if self.prlimit is not None:
            # RLIMIT_NPROC counts per user: in bwrap's user namespace that is the sandbox's processes only
            nproc = [f"--nproc={limits.processes}"] if self.isolated else []
            wrapped = [
                self.prlimit,
                f"--cpu={limits.cpu_seconds}",
                f"--as={limits.memory_bytes}",
                f"--fsize={limits.file_bytes}",
                "--core=0",
                *nproc,
                "--",
                *wrapped,
            ]
        if self.isolated:
            wrapped = [shutil.which("bwrap") or "bwrap", *self._bwrap_args(), "--", *wrapped]
        cgroup = make_pids_cgroup(limits.processes)
        if cgroup is not None:
            self._cgroups.append(cgroup)
            # enter the cgroup, then become the command: everything it starts is counted, setsid or not
            wrapped = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"), *wrapped]
        return wrapped

    def _bwrap_args(self) -> list[str]:
        size = str(self.limits.tmp_bytes)
        args = [*system_binds(), "--size", size, "--tmpfs", "/tmp"]
        if self.home != "/tmp":
            args += ["--size", size, "--perms", "0700", "--tmpfs", self.home]
        read_only = list(dict.fromkeys(self.read_only))
        if any(is_under(p, ("/nix/store",)) for p in read_only):
            read_only = ["/nix/store", *(p for p in read_only if not is_under(p, ("/nix/store",)))]
        for path in read_only:
            if os.path.exists(path) and not visible_system(path):
                args += ["--ro-bind", path, path]
        ws = str(self.workspace)
        for path in dict.fromkeys([*self.read_write, ws]):
            if os.path.isdir(path):
                args += ["--bind", path, path]
        git = self.workspace / ".git"
        if git.exists() or git.is_symlink():
            # the repository is flakebot's, not the code's: no hooks, no config, no rewritten history
            args += ["--ro-bind", str(git), str(git)]
        return [*args, *namespaces()]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The allowlisted environment (:func:`allowed_env`) plus ``extra``; temporary files in the workspace."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        if not self.isolated:
            Path(self.home).mkdir(mode=0o700, exist_ok=True)
        env = allowed_env(home=self.home)
        env["TMPDIR"] = str(self.tmp_dir)
        if extra:
            env.update(extra)
        return env

    def disk_usage(self) -> int:
        """Bytes on disk under the workspace, the private ``CARGO_HOME`` and the other writable paths."""
        roots = [self.workspace, self.cargo_home, *map(Path, self.read_write)]
        return sum(disk_usage_of(root) for root in roots)

    @contextmanager
    def watch_disk(self, token: CancelToken) -> Iterator[list[int]]:
        """Cancel ``token`` when :meth:`disk_usage` passes the limit; yields ``[bytes seen]`` when it did."""
        stop = threading.Event()
        seen: list[int] = []

        def poll() -> None:
            interval = 0.25
            while not stop.wait(interval):
                started = time.monotonic()
                used = self.disk_usage()
                if used > self.limits.disk_bytes:
                    seen.append(used)
                    token.cancel()
                    return
                interval = max(0.25, 10 * (time.monotonic() - started))  # a large target dir: scan less often

        thread = threading.Thread(target=poll, name="flakebot-disk-watch", daemon=True)
        thread.start()
        try:
            yield seen
        finally:
            stop.set()
            thread.join()

    def release(self) -> None:
        """Remove the process-count cgroups of finished commands."""
        remove_cgroups(self._cgroups)

    def describe(self) -> str:
        parts = [
            "bubblewrap: only the toolchain, registry and workspace are visible (.git read-only), "
            "empty $HOME and /tmp, no network"
            if self.isolated
            else "NO isolation"
        ]
        if self.prlimit:
            limits = self.limits
            parts.append(
                f"limits: {limits.cpu_seconds} CPU-s, {limits.memory_bytes // GiB} GiB memory, "
                f"{limits.processes} processes, {limits.disk_bytes // GiB} GiB disk, "
                f"{limits.output_bytes // MiB} MiB output per command"
            )
        return "; ".join(parts)


# --- cargo in the sandbox -----------------------------------------------------------------------


#: what may live in a private CARGO_HOME; anything else (a planted config.toml, credentials) is removed
_CARGO_HOME_KEEP = frozenset({"registry", "git", ".package-cache", ".package-cache-mutate", ".global-cache"})


class SandboxedCargo(Cargo):
    """A :class:`Cargo` whose commands run inside a :class:`Sandbox`.

    The sandbox shows the toolchain (pinned by ``RUSTUP_TOOLCHAIN``), the
    registry (read-only) and a private ``CARGO_HOME``; the environment is the
    allowlist plus cargo's own settings.
    """

    def __init__(
        self, registry: Registry, runner: ProcessRunner, sandbox: Sandbox, *, executable: str | None = None
    ) -> None:
        super().__init__(registry, runner, executable=executable)
        self.sandbox = sandbox
        self.toolchain = toolchain_of(self.executable)
        shown = [*self.toolchain.read_only()]
        path = getattr(registry, "path", None)
        if path is not None:
            shown.append(str(Path(path).resolve()))
        if not visible_system(self.executable) and not is_under(os.path.realpath(self.executable), shown):
            shown.append(os.path.realpath(self.executable))  # a stand-in for cargo (tests), alone
        sandbox.read_only.extend(p for p in shown if p not in sandbox.read_only)

    def argv(self, subcommand: str, *args: str) -> list[str]:
        argv = super().argv(subcommand, *args)
        if not self.registry.offline and subcommand != "fetch":
            # dependencies were fetched before (cargo fetch, outside); the sandbox has no network
            argv.insert(2, "--offline")
        return argv

    def _cargo_home(self) -> Path:
        """The private CARGO_HOME, with nothing in it that cargo would read as configuration."""
        home = self.sandbox.cargo_home
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        for entry in home.iterdir():
            if entry.name not in _CARGO_HOME_KEEP or entry.is_symlink():
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        return home

    def fetch(
        self, workspace: Path, timeout: float, on_line: LineCallback | None = None, *, env: dict[str, str] | None = None
    ) -> Completed:
        """``cargo fetch`` outside the sandbox (it needs the network; it runs no crate code).

        No workspace configuration is honoured (see :meth:`Cargo.fetch`), and
        downloads go to the private ``CARGO_HOME``, cleared first of anything
        sandboxed code could have planted there as configuration.
        """
        extra = {"CARGO_HOME": str(self._cargo_home()), **self.toolchain.env(), **(env or {})}
        return super().fetch(workspace, timeout, on_line, env=extra)

    def sandbox_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """cargo's environment inside the sandbox: the allowlist, the toolchain, the private CARGO_HOME."""
        env = {
            "CARGO_TERM_COLOR": "never",
            "CARGO_TERM_PROGRESS_WHEN": "never",
            # cargo must not try the network even when a registry is online: the sandbox has none
            "CARGO_NET_OFFLINE": "true",
            "CARGO_HOME": str(self._cargo_home()),
            **self.toolchain.env(),
        }
        if extra:
            env.update(extra)
        return self.sandbox.env(env)

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
        """Run one cargo command in the sandbox; too much output or disk stops it (exit status -9).

        With an online registry, ``cargo fetch`` runs first, outside: the
        sandbox has no network, and fetching runs no crate code.
        """
        if not self.registry.offline and subcommand in ("build", "test", "clippy", "check", "run"):
            self.fetch(cwd, timeout, on_line)
        argv = self.argv(subcommand, *args)
        if nice and shutil.which("nice"):
            argv = ["nice", "-n", str(nice), *argv]
        sandbox = self.sandbox
        limit = sandbox.limits.output_bytes
        stop = LinkedToken(self.runner.cancel)  # also set by the output cap and the disk watch
        size = 0
        out: list[str] = []
        err: list[str] = []

        def collect(stream: str, line: str) -> None:
            nonlocal size
            if stop.cancelled:
                return
            size += len(line.encode("utf-8", "replace")) + 1  # lines come in pieces of at most 64 KiB
            if size > limit:
                stop.cancel()
                return
            (out if stream == "stdout" else err).append(line + "\n")
            if on_line is not None:
                on_line(stream, line)

        writable = [str(self._cargo_home().resolve())]
        target = (env or {}).get("CARGO_TARGET_DIR")
        if target and not is_under(str(Path(target).resolve()), (str(sandbox.workspace),)):
            Path(target).mkdir(parents=True, exist_ok=True)
            writable.append(str(Path(target).resolve()))
        sandbox.read_write.extend(p for p in writable if p not in sandbox.read_write)
        cmd_env = self.sandbox_env(env)
        runner = copy.copy(self.runner)  # an injected runner keeps observing
        runner.cancel = stop
        try:
            with sandbox.watch_disk(stop) as disk:
                try:
                    done = runner.run(
                        sandbox.command(argv),
                        cwd=cwd,
                        env=cmd_env,
                        timeout=timeout,
                        on_line=collect,
                        workspace=cwd,
                        capture_limit=limit + (1 << 20),  # the limit above fires first
                        label=["cargo", subcommand, *args],
                    )
                except Cancelled:
                    if self.runner.cancel.cancelled:
                        raise
                    if disk:
                        why = (
                            f"the workspace grew past {sandbox.limits.disk_bytes / GiB:g} GiB on disk "
                            "(a build script or test filling the disk?)"
                        )
                    else:
                        why = f"its output passed {limit / MiB:g} MiB (a test or build script printing without end?)"
                    message = f"flakebot: stopped `cargo {subcommand}`: {why}\n"
                    return Completed(argv, -9, "".join(out), "".join(err) + message, 0.0)
        finally:
            sandbox.release()
        return Completed(argv, done.returncode, done.stdout, done.stderr, done.elapsed)
