"""The sandbox's seccomp filter: the system calls crate code never needs, refused by the kernel.

Modelled on Docker's default profile (``moby/profiles``, ``seccomp/default.json``)
for a container without capabilities: what that profile does not allow such a
container is refused here, and so is ``ptrace`` (with ``process_vm_readv`` and
``process_vm_writev``), which Docker allows on kernels from 4.8. By group:

* the kernel keyring (``keyctl``, ``add_key``, ``request_key``): keys of the
  user's session are not the sandbox's to read or add;
* other processes and the kernel's insides: ``ptrace``, ``process_vm_*``,
  ``kcmp``, ``pidfd_getfd``, ``process_madvise``, ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``lookup_dcookie``, ``io_uring_*`` (Docker dropped it too);
* mounts and namespaces: ``mount``, ``umount2``, the new mount API, ``pivot_root``,
  ``chroot``, ``setns``, ``unshare`` and ``clone`` with any ``CLONE_NEW*`` flag
  (bubblewrap made the namespaces already; crate code makes none);
* the machine: modules, ``kexec_*``, ``reboot``, ``swapon``/``swapoff``, the clock,
  host and domain names, ``syslog``, ``acct``, quotas, I/O ports, NUMA policy,
  ``fanotify_init``, ``open_by_handle_at``, and obsolete calls
  (``uselib``, ``ustat``, ``sysfs``, ``_sysctl`` ...);
* ``clone3`` answers ``ENOSYS`` (as in Docker's profile): its flags live in
  memory a filter cannot read, so the C library falls back to ``clone``, whose
  flags it can;
* ``socket(AF_VSOCK)``: the host's virtual-machine sockets.

Everything else is allowed (Docker's profile allows by name; a call this table
does not name, such as one a newer kernel adds, is allowed here: the sandbox's
namespaces, not this filter, are the main wall). A call of another
architecture's ABI (32-bit ``int 0x80``, x32) kills the process: libseccomp's
filter checks the architecture first, so no call slips past the table by its
other number.

bubblewrap loads the filter (``--seccomp FD``) after it has set up the
namespaces and right before it runs the command, with ``no_new_privs`` set:
the filter holds for the command and everything it starts, and no process can
remove it. The filter is built with libseccomp, through ``pyseccomp`` (a
ctypes binding with the API of libseccomp's own Python bindings, which Debian
ships only for its system Python); without libseccomp :func:`seccomp_filter`
says why, and the sandbox's notice says so.
"""

from __future__ import annotations

import errno
import hashlib
import os
import platform
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..host.fsutil import atomic_write
from ..host.probes import ProbeCache

__all__ = ["DENIED", "SeccompFilter", "seccomp_filter"]

#: refused with EPERM, whatever the arguments
DENIED = (
    # the kernel keyring
    "keyctl",
    "add_key",
    "request_key",
    # other processes, the kernel's insides
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "lookup_dcookie",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # mounts and namespaces
    "mount",
    "umount2",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "pivot_root",
    "chroot",
    "setns",
    "unshare",
    # the machine
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "settimeofday",
    "clock_settime",
    "sethostname",
    "setdomainname",
    "syslog",
    "acct",
    "quotactl",
    "quotactl_fd",
    "iopl",
    "ioperm",
    "vhangup",
    "get_mempolicy",
    "set_mempolicy",
    "set_mempolicy_home_node",
    "mbind",
    "migrate_pages",
    "move_pages",
    "fanotify_init",
    "open_by_handle_at",
    "nfsservctl",
    # obsolete or never implemented
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "afs_syscall",
    "getpmsg",
    "putpmsg",
    "security",
    "tuxcall",
    "vserver",
)
#: clone flags that make a namespace (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET)
CLONE_NEW = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
AF_VSOCK = 40


@dataclass(frozen=True)
class SeccompFilter:
    """A compiled filter: the BPF program bubblewrap loads, in a file only flakebot writes."""

    #: the BPF program (``struct sock_filter`` array, the host's byte order)
    path: Path
    #: the calls refused (what libseccomp knew of :data:`DENIED` on this architecture)
    denied: tuple[str, ...]


#: the filter, built from what a process cannot change (the table above, the loaded libseccomp, the architecture);
#: built again when its file is gone (a temporary-files cleaner), and a failure is retried soon
_FILTERS: ProbeCache[str, SeccompFilter | str] = ProbeCache("seccomp", 1, failed=lambda found: isinstance(found, str))


def seccomp_filter() -> SeccompFilter | str:
    """The sandbox's filter for this machine, or why there is none (no libseccomp, another architecture).

    Built once per process (in well under a millisecond) and written, named by
    its hash, to a private directory; the file is never written by anything
    that runs in a sandbox. When that file is gone it is built and written
    again.
    """
    return _FILTERS.get("filter", (), _build_filter, valid=lambda found: isinstance(found, str) or found.path.is_file())


def _build_filter() -> SeccompFilter | str:
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # pyseccomp loads libseccomp.so.2 when imported
        return f"libseccomp cannot be loaded ({exc}): install libseccomp2 and pyseccomp (`make install`)"
    if platform.machine() not in ("x86_64", "aarch64"):
        return f"no filter is defined for {platform.machine()}"
    try:
        program = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        refused = seccomp.ERRNO(errno.EPERM)
        denied: list[str] = []
        for name in DENIED:
            try:
                program.add_rule(refused, name)
            except (OSError, ValueError, RuntimeError):
                continue  # a call this architecture (or this libseccomp) does not have
            denied.append(name)
        for flag in CLONE_NEW:
            program.add_rule(refused, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
        program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
        program.add_rule(refused, "socket", seccomp.Arg(0, seccomp.EQ, AF_VSOCK))
        with tempfile.TemporaryFile() as out:
            program.export_bpf(out)
            out.seek(0)
            code = out.read()
    except (OSError, ValueError, RuntimeError) as exc:
        return f"libseccomp could not build the filter ({exc})"
    directory = Path(tempfile.gettempdir()) / f"flakebot-seccomp-{os.getuid()}"
    path = directory / f"{hashlib.sha256(code).hexdigest()[:16]}.bpf"
    try:
        directory.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(directory)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            return f"{directory} is not a private directory of this user: the filter is not written there"
        atomic_write(path, code, mode=0o600, root=directory)
    except OSError as exc:
        return f"the filter could not be written to {path} ({exc})"
    return SeccompFilter(path=path, denied=tuple(denied))
