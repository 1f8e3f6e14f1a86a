"""Confinement for code flakebot does not trust: crate code under cargo, and built tools.

Build scripts, proc macros and tests are code a model wrote or a crate
shipped, and cargo runs them; rustup and cargo obey files a crate ships. So
every process of the Rust toolchain (cargo, rustc, rustdoc, clippy, rustup's
proxies) runs in a :class:`Sandbox`, and :meth:`Sandbox.command` is the only
place such a command line is made (the process runner refuses any other,
:class:`~flakebot_magic.host.sandboxed.SandboxedCommand`):

* with bubblewrap (``bwrap``) a command sees only the system directories the
  toolchain needs (``/usr``, the ``/bin``/``/lib`` links, a handful of files
  from ``/etc``: no ``/etc/shadow``, no ssh host keys), the paths bound
  read-only for it (the Rust toolchain, the registry, a tool's store entry),
  its ``CARGO_HOME`` and its workspace, as its :class:`Profile` says
  (:data:`BUILD`: no network, the workspace writable but ``.git``, ``CARGO_HOME``
  read-only; :data:`FETCH`: the network, the workspace read-only but
  ``Cargo.lock``, ``CARGO_HOME`` writable; :data:`RELEASE`: the proven
  commit's exported tree read-only and the release target dir, the workspace
  not shown). ``$HOME`` and ``/tmp`` are empty
  private tmpfs; there is no ``/run``; a new pid namespace that dies with its
  pid 1, a new session, no capabilities, and a seccomp filter
  (:mod:`~flakebot_magic.sandbox.seccomp`: no keyring, ``ptrace``, ``bpf``,
  mounts or namespaces);
* the environment is an allowlist (:func:`allowed_env`): nothing passes
  because it "does not look like a secret";
* ``prlimit`` caps CPU seconds, address space, file size and (in the
  sandbox's user namespace) processes; where a pids cgroup is writable
  (root, or a delegated cgroup) the command also runs in its own cgroup with
  ``pids.max``, since the kernel never applies ``RLIMIT_NPROC`` to root, and
  where a memory cgroup is writable, in one capping the memory of all its
  processes together (``sandbox_memory_bytes``; ``RLIMIT_AS`` is per process);
* :class:`~flakebot_magic.sandbox.cargo.Cargo` stops a command whose output passes
  ``output_bytes``, or whose writable directories pass ``disk_bytes`` or
  ``files``; the runner's time limit caps wall time.

The toolchain itself is found by asking ``rustc`` in the sandbox
(:func:`toolchain_of`), and ``RUSTUP_TOOLCHAIN`` is pinned on every command.

Without bubblewrap nothing of the filesystem and network part holds:
:attr:`Sandbox.notice` says so, and the pipeline refuses model-edited builds
unless the user opts in (``allow_unsandboxed``).
"""

from __future__ import annotations

from ..host.process import allowed_env
from .command import BUILD, FETCH, FETCH_OFFLINE, RELEASE, SANDBOX_DIR, Profile, Sandbox, release_source, release_target
from .host import bubblewrap_works
from .limits import DiskUsage, Limits
from .seccomp import SeccompFilter, seccomp_filter
from .toolchain import Toolchain, toolchain_of

__all__ = [
    "BUILD",
    "FETCH",
    "FETCH_OFFLINE",
    "RELEASE",
    "SANDBOX_DIR",
    "DiskUsage",
    "Limits",
    "Profile",
    "Sandbox",
    "SeccompFilter",
    "Toolchain",
    "allowed_env",
    "bubblewrap_works",
    "release_source",
    "release_target",
    "seccomp_filter",
    "toolchain_of",
]
