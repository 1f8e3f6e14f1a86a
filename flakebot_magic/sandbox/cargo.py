"""How flakebot runs cargo: always in the sandbox, with its own configuration, never the workspace's.

:class:`Cargo` is the only way flakebot runs cargo (and through it rustc,
rustdoc and clippy; ``rustc -vV`` too is asked in the sandbox, by
:func:`~flakebot_magic.sandbox.toolchain_of`). Every command:

* runs in the workspace's :class:`~flakebot_magic.sandbox.Sandbox`: building,
  testing and linting in the :data:`~flakebot_magic.sandbox.BUILD` profile (no
  network, ``CARGO_HOME`` read-only), resolving and downloading in the
  :data:`~flakebot_magic.sandbox.FETCH` profile (:meth:`Cargo.resolve`, only
  right after the tree policy passes the workspace);
* runs from ``/`` with ``--manifest-path``: cargo reads configuration from
  its working directory and the directories above it, never from the
  manifest's, so no ``.cargo/config.toml`` in the workspace is read;
* reads flakebot's own configuration (the registry, no colours) from
  ``$CARGO_HOME/config.toml``, which flakebot writes before each command and
  no sandboxed command can write;
* has ``RUSTUP_TOOLCHAIN`` pinned, so rustup's proxies ignore any
  ``rust-toolchain.toml``.
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from ..errors import Cancelled, ConfigError
from ..host.fsutil import atomic_write, is_real_dir, private_dir, read_regular, real_dir
from ..host.output import LineCallback
from ..host.process import Completed, LinkedToken, ProcessRunner
from ..host.trees import remove_tree
from .command import BUILD, FETCH, FETCH_OFFLINE, Profile, Sandbox
from .host import is_under, visible_system
from .layout import OUTPUT_DIRS
from .limits import GiB, MiB, memory_cgroup_killed
from .policy import TreePolicy
from .toolchain import Toolchain, toolchain_of

__all__ = ["MANIFEST_SUBCOMMANDS", "Cargo", "CargoRegistry", "find_cargo"]


class CargoRegistry(Protocol):
    """What cargo needs of a crate registry: whether cargo runs ``--offline`` against it, and the lines of
    ``.cargo/config.toml`` that point cargo at it. Every :class:`~flakebot_magic.registry.base.Registry` has both;
    declared here so that the sandbox sits below ``registry/`` (docs/ARCHITECTURE.md, the layers)."""

    offline: bool

    def cargo_config(self) -> str:
        """TOML for ``.cargo/config.toml`` (empty when cargo's default, crates.io, is right)."""
        ...


_HOME_LOCK = threading.Lock()
#: what may live in a CARGO_HOME besides flakebot's config.toml; anything else (credentials) is removed
_CARGO_HOME_KEEP = frozenset({"registry", "git", ".package-cache", ".package-cache-mutate", ".global-cache"})
#: cargo's subcommands that take ``--manifest-path`` (so they run from ``/``, reading no workspace configuration)
MANIFEST_SUBCOMMANDS = frozenset(
    {
        "bench",
        "build",
        "check",
        "clean",
        "clippy",
        "doc",
        "fetch",
        "fix",
        "fmt",
        "generate-lockfile",
        "locate-project",
        "metadata",
        "package",
        "pkgid",
        "run",
        "rustc",
        "rustdoc",
        "test",
        "tree",
        "update",
        "verify-project",
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
    """cargo, pointed at one registry, every command of it in a sandbox.

    Parameters
    ----------
    registry
        Where dependencies come from (its configuration goes into ``CARGO_HOME``).
    runner
        Runs the commands (its cancel token stops them).
    sandbox
        The sandbox of the one workspace this cargo works in; default: a
        sandbox per workspace a command names.
    executable
        cargo itself (default: :func:`find_cargo`).
    isolate
        For sandboxes made here: see :class:`~flakebot_magic.sandbox.Sandbox`.
    memo
        Where the toolchain found is kept across processes (:func:`~flakebot_magic.sandbox.toolchain_of`).
    """

    def __init__(
        self,
        registry: CargoRegistry,
        runner: ProcessRunner,
        sandbox: Sandbox | None = None,
        *,
        executable: str | None = None,
        isolate: bool | None = None,
        memo: Path | None = None,
    ) -> None:
        self.registry = registry
        self.runner = runner
        self.executable = executable or find_cargo()
        self.toolchain: Toolchain = toolchain_of(self.executable, memo)
        self.isolate = isolate
        self.sandbox = sandbox
        #: the workspace a stopped command says is kept (the one it ran in, unless it ran in an export of it)
        self.kept: Path | None = None
        if sandbox is not None:
            self._show(sandbox)

    def confined_to(self, sandbox: Sandbox, runner: ProcessRunner | None = None) -> Cargo:
        """This cargo, working in ``sandbox``'s workspace only (with ``runner``, default this one's)."""
        return Cargo(self.registry, runner or self.runner, sandbox, executable=self.executable, isolate=self.isolate)

    def for_release(self, workspace: Path, source: Path) -> Cargo:
        """This cargo, building ``source`` (the proven commit of ``workspace``, exported from git's objects) in
        the :data:`~flakebot_magic.sandbox.RELEASE` profile: ``source`` read-only, the workspace not shown at all,
        ``workspace``'s release target dir the one writable place, its ``CARGO_HOME`` read-only.

        So a file in no commit (one a test left under ``target/``, an absolute ``include!`` of the workspace)
        cannot reach the release binary: the build sees only what the commit holds.
        """
        own = self.sandbox_for(workspace)
        sandbox = Sandbox(
            source,
            read_only=own.read_only,
            limits=own.limits,
            isolate=own.isolated,
            cargo_home=own.cargo_home,
            release_dir=own.release_target,
        )
        cargo = self.confined_to(sandbox)
        cargo.kept = Path(workspace)  # a stopped release build keeps the workspace, not the export it built
        return cargo

    def sandbox_for(self, workspace: Path) -> Sandbox:
        """The sandbox commands on ``workspace`` run in."""
        if self.sandbox is not None:
            return self.sandbox
        sandbox = Sandbox(workspace, isolate=self.isolate)
        self._show(sandbox)
        return sandbox

    def _show(self, sandbox: Sandbox) -> None:
        """Let ``sandbox`` show the toolchain and the registry (read-only)."""
        shown = [*self.toolchain.read_only()]
        path = getattr(self.registry, "path", None)
        if path is not None:
            shown.append(str(Path(path).resolve()))
        if not visible_system(self.executable) and not is_under(os.path.realpath(self.executable), shown):
            shown.append(os.path.realpath(self.executable))  # a stand-in for cargo (tests), alone
        sandbox.read_only.extend(p for p in shown if p not in sandbox.read_only)

    def rustc_version(self) -> str:
        """``rustc -vV`` of the toolchain cargo uses (part of every store hash), as asked in the sandbox."""
        return self.toolchain.version

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """What flakebot sets for cargo (above the sandbox's allowlist): the toolchain, no colours, ``extra``."""
        env = {"CARGO_TERM_COLOR": "never", "CARGO_TERM_PROGRESS_WHEN": "never", **self.toolchain.env()}
        if extra:
            env.update(extra)
        return env

    def _cargo_home(self, sandbox: Sandbox) -> Path:
        """The sandbox's CARGO_HOME, holding flakebot's config.toml and nothing else cargo reads as configuration."""
        home = sandbox.cargo_home
        config = (
            "# Written by flakebot before every cargo command; nothing in a sandbox can write it.\n"
            '[term]\ncolor = "never"\nprogress.when = "never"\n\n' + self.registry.cargo_config()
        ).encode()
        with _HOME_LOCK:  # the build and the tests of one check start at once, candidates share a home
            home.mkdir(parents=True, exist_ok=True, mode=0o700)
            for entry in home.iterdir():
                if entry.name != "config.toml" and (entry.name not in _CARGO_HOME_KEEP or entry.is_symlink()):
                    if entry.is_dir() and not entry.is_symlink():
                        remove_tree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
            try:
                current, _ = read_regular(home / "config.toml", len(config) + 1)
            except OSError:
                current = b""
            if current != config:
                atomic_write(home / "config.toml", config, mode=0o600, root=home)
        return home

    def _argv(self, subcommand: str, workspace: Path, args: Iterable[str], profile: Profile) -> list[str]:
        argv = [self.executable, subcommand]
        if subcommand in MANIFEST_SUBCOMMANDS:
            argv += ["--manifest-path", str(Path(workspace).resolve() / "Cargo.toml")]
        if not profile.network and subcommand in MANIFEST_SUBCOMMANDS:
            argv.append("--offline")
        return argv + list(args)

    def run(
        self,
        subcommand: str,
        *args: str,
        cwd: Path,
        timeout: float,
        on_line: LineCallback | None = None,
        env: dict[str, str] | None = None,
        nice: int = 0,
        profile: Profile = BUILD,
    ) -> Completed:
        """``cargo SUBCOMMAND ARGS`` on the workspace ``cwd``, in the build profile (no network), or
        :data:`~flakebot_magic.sandbox.RELEASE` for the release build (:meth:`for_release`).

        ``nice`` lowers its CPU priority (for work that may wait). Too much
        output, disk or files stops it (exit status -9, and the report says why).
        """
        if profile.network:
            raise ValueError("cargo with the network runs only through resolve(), after the tree policy")
        argv = self._argv(subcommand, cwd, args, profile)
        if nice and shutil.which("nice"):
            argv = ["nice", "-n", str(nice), *argv]
        return self._execute(argv, cwd, profile, env=env, timeout=timeout, on_line=on_line, label=[subcommand, *args])

    def resolve(
        self,
        subcommand: str,
        *args: str,
        cwd: Path,
        policy: TreePolicy,
        timeout: float,
        on_line: LineCallback | None = None,
    ) -> Completed:
        """A cargo command that resolves or downloads dependencies, in the fetch profile.

        ``fetch``, ``generate-lockfile``, ``metadata``: the only cargo commands
        with the network (for an online registry), a writable ``CARGO_HOME``
        and the workspace read-only but for ``Cargo.lock``. The tree policy
        checks the workspace first, so this runs only on a tree it has just
        passed (:class:`~flakebot_magic.errors.PolicyError` otherwise).
        """
        policy.enforce(cwd)
        profile = FETCH_OFFLINE if self.registry.offline else FETCH
        lock = Path(cwd) / "Cargo.lock"
        made = False
        if not os.path.lexists(lock):
            # the read-only workspace keeps one file writable: the lock, which must exist to be bound
            os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
            made = True
        try:
            argv = self._argv(subcommand, cwd, args, profile)
            return self._execute(
                argv, cwd, profile, timeout=timeout, on_line=on_line, label=[subcommand, *args], writable_files=[lock]
            )
        finally:
            if made and os.path.isfile(lock) and os.path.getsize(lock) == 0:
                lock.unlink()

    def fetch(
        self, workspace: Path, *, policy: TreePolicy, timeout: float, on_line: LineCallback | None = None
    ) -> Completed | None:
        """Check ``workspace`` with ``policy``, then download what it needs (:meth:`resolve`); None for a registry
        on disk.

        Every door that runs cargo on a workspace (the build stage, the edit
        loop's check runs, ``flakebot cargo``, the eval's hidden tests) calls
        this first, so the policy runs before each of them whatever the
        registry (:class:`~flakebot_magic.errors.PolicyError` and nothing runs).
        """
        for name in OUTPUT_DIRS:  # flakebot's own directories: what code planted at their names goes first
            if os.path.lexists(Path(workspace) / name) and not is_real_dir(Path(workspace) / name):
                remove_tree(Path(workspace) / name)
        if self.registry.offline:
            policy.enforce(workspace)  # the policy is the gate, not the download: a registry on disk needs it too
            return None  # the registry is a directory the sandbox shows: nothing to download
        return self.resolve("fetch", cwd=workspace, policy=policy, timeout=timeout, on_line=on_line)

    def _execute(
        self,
        argv: list[str],
        workspace: Path,
        profile: Profile,
        *,
        timeout: float,
        on_line: LineCallback | None,
        label: list[str],
        env: dict[str, str] | None = None,
        writable_files: Iterable[Path] = (),
    ) -> Completed:
        """Run ``argv`` in the sandbox of ``workspace`` with ``profile``: the one place cargo starts."""
        sandbox = self.sandbox_for(Path(workspace))
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

        home = self._cargo_home(sandbox)
        env = dict(env or {})
        dirs: list[Path] = []
        if "CARGO_TARGET_DIR" in env:
            target = _target_dir(sandbox, Path(workspace), Path(env["CARGO_TARGET_DIR"]), profile)
            env["CARGO_TARGET_DIR"] = str(target)
            dirs = [target] if target == sandbox.release_target else []
        extra = {"CARGO_HOME": str(home.resolve())}
        if not profile.network:
            extra["CARGO_NET_OFFLINE"] = "true"  # the sandbox has no network: cargo must not try it
        cmd_env = sandbox.env(self.env({**extra, **env}), profile)
        command = sandbox.command(
            argv, profile, writable_files=writable_files, writable_dirs=dirs, cwd="/", timeout=timeout
        )
        runner = copy.copy(self.runner)  # an injected runner keeps observing; only this command is stopped
        runner.cancel = stop
        shown = ["cargo", *label]
        try:
            with sandbox.watch_disk(stop, profile, dirs) as disk:
                try:
                    done = runner.run(
                        command,
                        cwd=Path("/"),
                        env=cmd_env,
                        timeout=timeout,
                        on_line=collect,
                        workspace=self.kept or Path(workspace),
                        capture_limit=limit + (1 << 20),  # the limit above fires first
                        label=shown,
                    )
                except Cancelled:
                    if self.runner.cancel.cancelled:
                        raise
                    done = None
            if done is None or disk:  # stopped, or it left more on disk than it may once it was over
                why = (
                    disk[0]
                    if disk
                    else (f"its output passed {limit / MiB:g} MiB (a test or build script printing without end?)")
                )
                message = f"flakebot: stopped `{' '.join(shown[:2])}`: {why}\n"
                return Completed(argv, -9, "".join(out), "".join(err) + message, 0.0)
            stderr = done.stderr
            if done.returncode != 0 and memory_cgroup_killed(command.cgroups):
                stderr += (
                    f"flakebot: `{' '.join(shown[:2])}`: the kernel stopped a process: the sandbox's processes passed "
                    f"{sandbox.limits.sandbox_memory_bytes / GiB:g} GiB of memory together "
                    "(a build script or test taking memory without end?)\n"
                )
        finally:
            sandbox.release()
        return Completed(argv, done.returncode, done.stdout, stderr, done.elapsed)


def _target_dir(sandbox: Sandbox, workspace: Path, target: Path, profile: Profile) -> Path:
    """Where ``CARGO_TARGET_DIR`` may point, made safe: a real directory under the workspace, or the release target.

    A target dir inside the workspace is named by its path under
    ``sandbox.workspace`` and made a chain of real directories
    (:func:`~flakebot_magic.host.fsutil.real_dir`: a ``target`` symlink that a
    test planted is removed, never followed), so it is inside the workspace's
    bind, never bound on its own. :attr:`~flakebot_magic.sandbox.Sandbox.release_target`
    is flakebot's, outside the workspace, and bound for this one command (the
    :data:`~flakebot_magic.sandbox.RELEASE` profile's only). Any other place is a
    programming error (``ValueError``).
    """
    if Path(os.path.abspath(target)) == sandbox.release_target and profile.release:
        private_dir(sandbox.release_target)
        return sandbox.release_target
    try:
        relative = Path(os.path.abspath(target)).relative_to(os.path.abspath(workspace))
    except ValueError:
        raise ValueError(f"CARGO_TARGET_DIR={target} is not inside the workspace {workspace}") from None
    path = sandbox.workspace / relative
    if profile.workspace:
        real_dir(sandbox.workspace, path)
    return path
