"""How one command runs confined: its profile, what bubblewrap shows it, its environment, its disk.

Two profiles, one per kind of work:

* :data:`BUILD`: cargo building, testing and linting, and the tools' ``--help``
  probe and examples. No network; the workspace writable but for ``.git``;
  ``CARGO_HOME`` read-only (what was downloaded stays as downloaded).
* :data:`RELEASE`: the release build, of the proven commit's tree exported from git's objects
  (:func:`release_source`). That tree read-only, the workspace not shown at all, the one writable
  place flakebot's own release target dir (:func:`release_target`); no network, ``CARGO_HOME``
  read-only. Nothing that is in no commit (a file a test left under ``target/``) can reach the binary.
* :data:`FETCH`: cargo resolving and downloading dependencies (``fetch``,
  ``generate-lockfile``). The host's network (:data:`FETCH_OFFLINE`: none, for a
  registry on disk); the workspace read-only but for ``Cargo.lock``;
  ``CARGO_HOME`` writable. cargo runs no crate code here, and flakebot runs this
  profile only on a tree the policy has just passed
  (:meth:`flakebot_magic.sandbox.cargo.Cargo.resolve`).

Every path bubblewrap binds is either flakebot's own (the toolchain, the
registry, ``CARGO_HOME``, :attr:`Sandbox.release_target`, beside the
workspace and never inside it) or the workspace itself: a directory flakebot
keeps inside the workspace (``target/flakebot-tmp``) is made real first
(:func:`~flakebot_magic.host.fsutil.real_dir`), and nothing inside the
workspace is ever bound at a path of its own, so no symlink that sandboxed
code planted decides what a later command may write.

Both have an empty private ``$HOME``, ``/tmp`` and ``/dev/shm`` (capped), bubblewrap's own root, ``/dev`` and
``/proc`` read-only (:data:`~flakebot_magic.sandbox.host.SEALED`), no ``/run``, new pid, IPC,
UTS, user and cgroup namespaces, no capabilities, the seccomp filter of
:mod:`~flakebot_magic.sandbox.seccomp`, and the allowlisted environment.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..host.fsutil import real_dir
from ..host.process import CancelToken, allowed_env
from ..host.sandboxed import SandboxedCommand
from .host import INSTALL_BWRAP, SEALED, bubblewrap_works, is_under, namespaces, system_binds, visible_system
from .limits import (
    DiskUsage,
    GiB,
    Limits,
    MiB,
    disk_usage_of,
    filesystem_usage,
    make_cgroups,
    remove_cgroups,
    stopped,
)
from .seccomp import SeccompFilter, seccomp_filter

__all__ = [
    "BUILD",
    "FETCH",
    "FETCH_OFFLINE",
    "PROXY_VARIABLES",
    "RELEASE",
    "SANDBOX_DIR",
    "Profile",
    "Sandbox",
    "release_source",
    "release_target",
]

#: beside a workspace: ``.sandbox/NAME/cargo-home``, the private CARGO_HOME of the builds in workspace NAME
SANDBOX_DIR = ".sandbox"

#: the file descriptor bubblewrap reads the seccomp filter from
_SECCOMP_FD = 3
#: what a command with the network (the fetch profile) also gets of the kernel's environment: the way out
PROXY_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
)


def release_target(workspace: Path) -> Path:
    """The release build's target dir for ``workspace``: ``.sandbox/NAME/release-target`` beside it (see
    :attr:`Sandbox.release_target`)."""
    workspace = Path(workspace).resolve()
    return workspace.parent / SANDBOX_DIR / workspace.name / "release-target"


def release_source(workspace: Path) -> Path:
    """Where the proven commit of ``workspace`` is exported for the release build: ``.sandbox/NAME/release-source``
    beside it (flakebot's own, never bound writable into any sandbox)."""
    workspace = Path(workspace).resolve()
    return workspace.parent / SANDBOX_DIR / workspace.name / "release-source"


@dataclass(frozen=True)
class Profile:
    """What a sandboxed command may do beyond reading the system, the toolchain and the registry."""

    name: str
    #: the host's network namespace (else an empty one: not even loopback)
    network: bool
    #: the workspace (and the sandbox's other writable directories) read-write, ``.git`` aside;
    #: else read-only, but for the files the command names (``Cargo.lock``)
    workspace: bool
    #: ``CARGO_HOME`` read-write (else read-only)
    cargo_home: bool
    #: the release target dir (:attr:`Sandbox.release_target`) may be bound writable for this command
    release: bool = False


BUILD = Profile("build", network=False, workspace=True, cargo_home=False)
FETCH = Profile("fetch", network=True, workspace=False, cargo_home=True)
#: the fetch profile for a registry on disk: nothing to download, so no network
FETCH_OFFLINE = Profile("fetch-offline", network=False, workspace=False, cargo_home=True)
#: the release build: the exported commit read-only, only the release target dir writable, no network
RELEASE = Profile("release", network=False, workspace=False, cargo_home=False, release=True)


class Sandbox:
    """How commands on untrusted code run in one directory.

    Parameters
    ----------
    workspace
        The directory the commands work on (writable in :data:`BUILD`; its
        ``.git`` always read-only).
    read_only
        More paths the commands may read (a tool's store entry, the registry,
        the toolchain). Anything under ``/nix/store`` shows the whole store.
    limits
        CPU, memory, file-size, process, disk, file-count and output limits.
    isolate
        Use bubblewrap: None (default) when it works here, False never, True
        always (raising :class:`ConfigError` if it cannot).
    cargo_home
        The ``CARGO_HOME`` its cargo uses (default: next to the workspace,
        under ``.sandbox/``, never the user's ``~/.cargo``).
    release_dir
        The release target dir (default: :func:`release_target` of ``workspace``); the release build's sandbox,
        whose "workspace" is the exported commit, names its workspace's.
    scratch
        The workspace is a scratch dir (a deployed tool's, :class:`~flakebot_magic.clients.base.Confinement`):
        inside, a fresh tmpfs capped at ``tmp_bytes``, with the regular files flakebot put there before the
        command started bound read-only into it. What the command writes stays in its memory (its cgroup's),
        never on the host's disk, which no watcher counts for a tool.

    ``command(argv, profile)`` is the command to run, ``env(extra, profile)``
    its environment.
    """

    def __init__(
        self,
        workspace: Path,
        *,
        read_only: Iterable[Path | str] = (),
        limits: Limits | None = None,
        isolate: bool | None = None,
        cargo_home: Path | None = None,
        scratch: bool = False,
        release_dir: Path | None = None,
    ) -> None:
        self.workspace = Path(workspace).resolve()
        self._release_dir = Path(os.path.abspath(release_dir)) if release_dir is not None else None
        self.scratch = scratch
        self.read_only = [str(Path(p).resolve()) for p in read_only]
        self.limits = limits or Limits()
        why = bubblewrap_works() if isolate is not False else "isolation was turned off"
        if isolate and why:
            raise ConfigError(f"Cannot sandbox untrusted code: {why}. To fix it, {INSTALL_BWRAP}.")
        self.isolated = not why
        self.why_not = why
        self.prlimit = shutil.which("prlimit")
        found = seccomp_filter() if self.isolated else "no bubblewrap"
        self.seccomp: SeccompFilter | None = found if isinstance(found, SeccompFilter) else None
        self.why_no_seccomp = found if isinstance(found, str) else ""
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
        elif self.seccomp is None:
            missing.append(f"no seccomp filter: {self.why_no_seccomp}")
        if self.prlimit is None:
            missing.append("prlimit (util-linux) is missing: no CPU, memory, file-size or process limits")
        return "; ".join(missing)

    @property
    def tmp_dir(self) -> Path:
        return self.workspace / "target" / "flakebot-tmp"

    @property
    def release_target(self) -> Path:
        """The release build's target dir: beside the workspace (``.sandbox/NAME/release-target``), not in it.

        Only the command that builds for release sees it (writable): no test,
        no other command can touch a binary between the build and the deploy.
        """
        return self._release_dir or release_target(self.workspace)

    def command(
        self,
        argv: list[str],
        profile: Profile = BUILD,
        *,
        writable_files: Iterable[Path] = (),
        writable_dirs: Iterable[Path] = (),
        cwd: Path | str | None = None,
        timeout: float | None = None,
    ) -> SandboxedCommand:
        """``argv`` wrapped in the limits and, when available, bubblewrap with ``profile``.

        ``writable_files``: files of the workspace the command may write when
        the profile keeps it read-only (they must exist). ``writable_dirs``:
        flakebot's own directories outside the workspace this one command may
        write too (:attr:`release_target`; never a path the workspace names).
        ``cwd``: the command's working directory inside (run it from the same
        path outside). ``timeout``: the wall seconds the runner will allow it;
        its CPU limit follows (:meth:`Limits.cpu_for`).
        """
        wrapped = list(argv)
        limits = self.limits
        if self.prlimit is not None:
            # RLIMIT_NPROC counts per user: in bwrap's user namespace that is the sandbox's processes only
            nproc = [f"--nproc={limits.processes}"] if self.isolated else []
            wrapped = [
                self.prlimit,
                f"--cpu={limits.cpu_for(timeout)}",
                f"--as={limits.memory_bytes}",
                f"--fsize={limits.file_bytes}",
                "--core=0",
                *nproc,
                "--",
                *wrapped,
            ]
        seccomp = self.seccomp if self.isolated else None
        if self.isolated:
            filter_args = ["--seccomp", str(_SECCOMP_FD)] if seccomp is not None else []
            chdir = ["--chdir", str(cwd)] if cwd is not None else []
            bwrap = shutil.which("bwrap") or "bwrap"
            wrapped = [
                bwrap,
                *self._bwrap_args(profile, writable_files, writable_dirs),
                *filter_args,
                *chdir,
                "--",
                *wrapped,
            ]
        cgroups = make_cgroups(limits)
        self._cgroups.extend(cgroups.all)
        if not cgroups.all and seccomp is None:
            return SandboxedCommand(wrapped)
        # enter the cgroups (everything the command starts is counted, setsid or not), open the filter for
        # bubblewrap at its descriptor, then become the command
        enter = "".join(f'echo $$ > "${{{i + 1}}}" || exit 125; ' for i in range(len(cgroups.all)))
        script = (
            enter
            + (f"shift {len(cgroups.all)}; " if cgroups.all else "")
            + 'exec "$@"'
            + (f' {_SECCOMP_FD}<"$0"' if seccomp is not None else "")
        )
        filter_path = str(seccomp.path) if seccomp is not None else ""
        procs = [str(cgroup / "cgroup.procs") for cgroup in cgroups.all]
        return SandboxedCommand(["/bin/sh", "-c", script, filter_path, *procs, *wrapped], cgroups.pids, cgroups.all)

    def _bwrap_args(self, profile: Profile, writable_files: Iterable[Path], writable_dirs: Iterable[Path]) -> list[str]:
        size = str(self.limits.tmp_bytes)
        args = [
            *system_binds(network=profile.network, shm_bytes=self.limits.tmp_bytes),
            "--size",
            size,
            "--tmpfs",
            "/tmp",
        ]
        if self.home != "/tmp":
            args += ["--size", size, "--perms", "0700", "--tmpfs", self.home]
        read_only = list(dict.fromkeys(self.read_only))
        if any(is_under(p, ("/nix/store",)) for p in read_only):
            read_only = ["/nix/store", *(p for p in read_only if not is_under(p, ("/nix/store",)))]
        for path in read_only:
            if os.path.exists(path) and not visible_system(path):
                args += ["--ro-bind", path, path]
        ws = str(self.workspace)
        if self.scratch:
            args += ["--size", size, "--perms", "0700", "--tmpfs", ws]
            for entry in sorted(os.scandir(ws), key=lambda e: e.name):  # flakebot's inputs (input.txt)
                if entry.is_file(follow_symlinks=False):
                    args += ["--ro-bind", entry.path, entry.path]
        elif profile.workspace:
            for path in dict.fromkeys([*map(str, writable_dirs), ws]):
                if os.path.isdir(path) and not os.path.islink(path):
                    args += ["--bind", path, path]
        else:
            args += ["--ro-bind", ws, ws]
            for file in writable_files:
                if os.path.isfile(file) and not os.path.islink(file):
                    args += ["--bind", str(file), str(file)]
            for path in dict.fromkeys(map(str, writable_dirs)):  # flakebot's own (the release target), never the ws's
                if os.path.isdir(path) and not os.path.islink(path) and not is_under(path, (ws,)):
                    args += ["--bind", path, path]
        home = str(self.cargo_home)
        if os.path.isdir(home) and not is_under(home, (ws,)):
            args += ["--bind" if profile.cargo_home else "--ro-bind", home, home]
        git = self.workspace / ".git"
        if git.exists() or git.is_symlink():
            # the repository is flakebot's, not the code's: no hooks, no config, no rewritten history
            args += ["--ro-bind", str(git), str(git)]
        return [*args, *SEALED, *namespaces(network=profile.network)]

    def env(self, extra: Mapping[str, str] | None = None, profile: Profile = BUILD) -> dict[str, str]:
        """The allowlisted environment (:func:`allowed_env`) plus ``extra``; in :data:`BUILD`, temporary files
        in the workspace's target dir; with the network, the user's proxy settings (:data:`PROXY_VARIABLES`)."""
        if not self.isolated:
            Path(self.home).mkdir(mode=0o700, parents=True, exist_ok=True)
        env = allowed_env(home=self.home)
        if profile.network:  # the user's proxy, for cargo's downloads (no crate code runs with the network)
            env.update({k: v for k, v in os.environ.items() if k in PROXY_VARIABLES})
        if profile.workspace and not self.scratch:  # a scratch dir's commands use the private /tmp
            real_dir(self.workspace, self.tmp_dir)
            env["TMPDIR"] = str(self.tmp_dir)
        if extra:
            env.update(extra)
        return env

    def writable(self, profile: Profile = BUILD, also: Iterable[Path] = ()) -> list[Path]:
        """The directories a command with ``profile`` (and ``writable_dirs=also``) may write (what its disk and
        file limits count)."""
        paths = [self.workspace] if profile.workspace else []
        paths += map(Path, also)
        return [*paths, self.cargo_home] if profile.cargo_home else paths

    def disk_usage(self, profile: Profile = BUILD, also: Iterable[Path] = ()) -> DiskUsage:
        """Bytes and entries on disk under what a command with ``profile`` may write."""
        return disk_usage_of(self.writable(profile, also))

    @contextmanager
    def watch_disk(
        self, token: CancelToken, profile: Profile = BUILD, also: Iterable[Path] = ()
    ) -> Iterator[list[str]]:
        """Cancel ``token`` when :meth:`disk_usage` passes a limit; yields ``[why]`` once it did.

        Two watches: the file systems' own counters (:func:`filesystem_usage`,
        constant time) every 50 ms, and the exact count of what the command may
        write (:meth:`disk_usage`, a walk). When the counters have grown by as
        much as is left under a limit, the command's processes are stopped while
        the walk counts, so a fast writer cannot outrun the count; it is killed if
        the walk finds a limit passed and continued otherwise (the growth was
        someone else's). The walk is also polled on its own (alone without a cgroup or counters, so a fast
        writer can pass a limit by a little before it is stopped), since a sparse file's length grows no
        counter; and once more when the block ends: a command that left too much behind ends with ``why``
        said too, so its caller reports it stopped, whatever its exit status.

        What is guaranteed, however busy the machine: with a cgroup, the count
        that passes a limit is taken with the command's processes stopped, and
        they are killed without running again, so what is on disk after the
        kill is what the message names (each stopped process may finish the one
        system call it was in). How far past the limit that is depends on how
        soon this thread runs after the counters moved: a writer outruns the
        glance, never the count.
        """
        stop = threading.Event()
        why: list[str] = []
        limits = self.limits
        also = tuple(also)
        roots = self.writable(profile, also)

        def verdict(used: DiskUsage) -> bool:
            if used.bytes > limits.disk_bytes:
                why.append(
                    f"the workspace grew past {limits.disk_bytes / GiB:g} GiB on disk "
                    "(a build script or test filling the disk?)"
                )
            elif used.files > limits.files:
                why.append(
                    f"the workspace passed {limits.files:,} files ({used.files:,} when it was stopped: a build script "
                    "or test creating files without end?)"
                )
            if why:
                token.cancel()
            return bool(why)

        def count() -> tuple[DiskUsage, DiskUsage | None]:
            """The exact use and the counters it was taken at, the processes stopped meanwhile (and left
            stopped for the kill when a limit is passed)."""
            with stopped(self._cgroups) as keep_stopped:
                used = self.disk_usage(profile, also)
                if verdict(used):
                    keep_stopped.append(True)
                return used, filesystem_usage(roots)

        def poll() -> None:
            used, base = count()
            if why:
                return
            interval = 0.25
            walked = time.monotonic()
            while not stop.wait(0.05 if base is not None else interval):
                if base is None or time.monotonic() - walked >= interval:
                    # the walk, polled: alone without counters, and beside them for what they never see (a
                    # sparse file's length takes no block)
                    started = walked = time.monotonic()
                    if verdict(self.disk_usage(profile, also)):
                        return
                    # a large target dir: walk less often, but never so seldom that files pile up unseen; beside
                    # the counters, a backstop at most every 5 s (the last walk, at the end, misses nothing)
                    took = time.monotonic() - started
                    interval = max(0.25, min(2.0, 5 * took)) if base is None else max(1.0, min(5.0, 20 * took))
                    continue
                now = filesystem_usage(roots)
                if now is None:
                    base = None
                elif (
                    now.files - base.files >= limits.files - used.files
                    or now.bytes - base.bytes >= limits.disk_bytes - used.bytes
                ):
                    used, base = count()
                    if why:
                        return

        thread = threading.Thread(target=poll, name="flakebot-disk-watch", daemon=True)
        thread.start()
        try:
            yield why
        finally:
            stop.set()
            thread.join()
        if not why:  # the last word, once the command is over: what it left counts even if it left it fast
            verdict(self.disk_usage(profile, also))

    def release(self) -> None:
        """Remove the process-count cgroups of finished commands (not one made in the last seconds, which a
        command starting beside may not have entered yet)."""
        remove_cgroups(self._cgroups, grace=10.0)

    def describe(self) -> str:
        parts = [
            "bubblewrap: only the toolchain, registry and workspace are visible (.git read-only), "
            "empty $HOME and /tmp, no network"
            + (", a seccomp filter (no keyring, ptrace, bpf, mounts)" if self.seccomp is not None else "")
            if self.isolated
            else "NO isolation"
        ]
        if self.prlimit:
            limits = self.limits
            parts.append(
                f"limits: CPU time as the time limit allows, {limits.memory_bytes // GiB} GiB memory, "
                f"{limits.processes} processes, {limits.disk_bytes // GiB} GiB disk, {limits.files:,} files, "
                f"{limits.output_bytes // MiB} MiB output per command"
            )
        return "; ".join(parts)
