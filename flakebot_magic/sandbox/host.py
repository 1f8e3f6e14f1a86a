"""What a sandbox shows of this host: the system paths, what a download needs of /etc, bubblewrap's namespaces."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

from ..errors import FlakebotError
from ..host.probes import ProbeCache, file_identity
from ..host.process import ProcessRunner

__all__ = [
    "INSTALL_BWRAP",
    "NETWORK_ETC",
    "SEALED",
    "bubblewrap_works",
    "is_under",
    "namespaces",
    "system_binds",
    "visible_system",
]

#: how to get bubblewrap, said wherever it is missing
INSTALL_BWRAP = "install bubblewrap (`apt-get install bubblewrap`, or `make install`)"

#: system directories bound read-only (a symlink, as /bin on merged-/usr systems, is recreated)
_SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: from /etc only what running the toolchain and ordinary programs needs: no shadow, no ssh keys
_ETC = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/hosts",
    "/etc/os-release",
)
#: what a command with the network (the fetch profile) also needs: name resolution and CA certificates
NETWORK_ETC = (
    "/etc/resolv.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/ssl/certs",  # not /etc/ssl/private
    "/etc/ssl/openssl.cnf",
    "/etc/pki/tls/certs",
    "/etc/pki/ca-trust/extracted",
)


#: the last bubblewrap arguments of every sandbox, once every mount point exists: its own root (a tmpfs with no
#: size limit) read-only, so nothing but the binds a profile makes writable (and the capped tmpfs) takes a byte
SEALED = ("--remount-ro", "/")

#: bubblewrap's answer per binary, asked again when the binary changes (or, after a failure, soon)
_BWRAP_PROBES: ProbeCache[tuple[str, str], str] = ProbeCache("bubblewrap", 4, failed=bool)


def bubblewrap_works(bwrap: str = "bwrap") -> str:
    """``""`` when bubblewrap can make an isolated, network-less sandbox here, else why not.

    The answer is kept while the binary found is the same file (path, inode,
    mtime: :func:`~flakebot_magic.host.probes.file_identity`); a failure is
    kept a short while only, so installing bubblewrap or allowing user
    namespaces takes effect without a kernel restart.
    """
    path = shutil.which(bwrap)
    if path is None:
        return "bubblewrap (bwrap) is not installed"
    return _BWRAP_PROBES.get((bwrap, path), file_identity([path]), lambda: _probe_bubblewrap(path))


def _probe_bubblewrap(path: str) -> str:
    try:
        done = ProcessRunner().run(
            [path, *system_binds(), *SEALED, *namespaces(network=False), "--", "true"], timeout=20
        )
    except (OSError, FlakebotError) as exc:  # cannot start, or past its time limit
        return f"bubblewrap could not start ({exc})"
    if done.returncode != 0:
        return f"bubblewrap cannot create a sandbox here ({done.stderr.strip()[:200]})"
    return ""


def system_binds(*, network: bool = False, shm_bytes: int = 64 * 1024 * 1024) -> list[str]:
    """bubblewrap arguments showing the system directories and the few /etc files, read-only, plus /dev and /proc.

    With ``network``, also what name resolution and TLS need (:data:`NETWORK_ETC`).

    ``/dev`` and ``/proc`` are read-only mounts: bubblewrap's ``/dev`` is a tmpfs without a size limit (a
    writer could fill the host's memory), and its ``/proc`` covers ``/proc/sys`` only when the caller cannot
    write there anyway; run as root, the sandbox's uid 0 is the host's, and a build script could set
    ``kernel.core_pattern`` to a program the kernel then runs as root outside every namespace. The devices
    stay usable (a device node is written through a read-only mount); ``/dev/shm`` is a tmpfs of its own,
    capped at ``shm_bytes``.
    """
    args: list[str] = []
    for path in (*_SYSTEM, *_ETC, *(NETWORK_ETC if network else ())):
        if os.path.islink(path) and (path in _SYSTEM or visible_system(os.path.realpath(path))):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):  # a link elsewhere (resolv.conf into /run): its target, at its name
            args += ["--ro-bind", os.path.realpath(path), path]
    shm = ["--perms", "1777", "--size", str(shm_bytes), "--tmpfs", "/dev/shm"]
    return [*args, "--dev", "/dev", *shm, "--remount-ro", "/dev", "--proc", "/proc", "--remount-ro", "/proc"]


def namespaces(*, network: bool) -> list[str]:
    """bubblewrap arguments for fresh namespaces, a new session and no capabilities.

    Without ``network`` the command gets an empty network namespace (not even
    the host's loopback); with it, the host's network (the fetch profile).
    """
    return [
        "--unshare-user-try",
        "--unshare-ipc",
        "--unshare-pid",
        "--unshare-uts",
        "--unshare-cgroup-try",
        *([] if network else ["--unshare-net"]),
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
    ]


def is_under(path: str, roots: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``roots`` or inside one (as strings: no path is resolved)."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def visible_system(path: str) -> bool:
    """Whether the sandbox already shows ``path`` as part of the system directories."""
    real = os.path.realpath(path)
    return is_under(real, ("/usr",)) or is_under(path, _SYSTEM)
