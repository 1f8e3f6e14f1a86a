"""The sandbox's seccomp filter: what it refuses, that ordinary programs still run, and that it cannot be undone."""

from __future__ import annotations

import ast
import platform
import sys
from pathlib import Path

import pytest

from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.sandbox import FETCH, Sandbox, SeccompFilter, bubblewrap_works, seccomp_filter
from flakebot_magic.sandbox.seccomp import DENIED

pytestmark = [
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the syscall numbers below are x86_64's"),
]

PYTHON = (sys.prefix, sys.base_prefix)

#: probes every refused family from Python (ctypes' raw syscall), then shows the process is otherwise whole
PROBE = r"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def call(number, *args):
    result = libc.syscall(number, *args)
    return "ok" if result >= 0 else os.strerror(ctypes.get_errno())
results = {
    "keyctl": call(250, 0, -3),                         # KEYCTL_GET_KEYRING_ID of the session keyring
    "add_key": call(248, b"user", b"planted", b"x", 1, -4),
    "request_key": call(249, b"user", b"x", None, -3),
    "ptrace": call(101, 0, 0, 0, 0),                    # PTRACE_TRACEME
    "bpf": call(321, 0, None, 0),
    "perf_event_open": call(298, None, 0, -1, -1, 0),
    "userfaultfd": call(323, 0),
    "mount": call(165, b"none", b"/tmp", b"tmpfs", 0, None),
    "unshare-user": call(272, 0x10000000),              # CLONE_NEWUSER
    "clone3": call(435, None, 0),
    "kexec_load": call(246, 0, 0, None, 0),
    "init_module": call(175, None, 0, b""),
}
try:
    socket.socket(40, socket.SOCK_STREAM)               # AF_VSOCK
    results["vsock"] = "ok"
except OSError as exc:
    results["vsock"] = exc.strerror
results["getpid"] = "ok" if os.getpid() > 0 else "broken"
results["fork"] = "ok" if (os.waitpid(pid, 0) if (pid := os.fork()) else os._exit(0)) else "broken"
status = open("/proc/self/status").read()
results["seccomp"] = [line.split()[1] for line in status.splitlines() if line.startswith("Seccomp:")][0]
results["no_new_privs"] = [line.split()[1] for line in status.splitlines() if line.startswith("NoNewPrivs:")][0]
print(results)
"""


def _run(sandbox: Sandbox, code: str, **profile: object) -> tuple[int, str, str]:
    command = sandbox.command([sys.executable, "-c", code], **profile)  # type: ignore[arg-type]
    done = ProcessRunner().run(command, cwd=sandbox.workspace, env=sandbox.env(), timeout=60)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    return Sandbox(workspace, read_only=PYTHON)


def test_the_filter_is_built_with_libseccomp_and_names_the_docker_profile_denials() -> None:
    built = seccomp_filter()
    assert isinstance(built, SeccompFilter), built
    assert {"keyctl", "add_key", "request_key", "ptrace", "bpf", "perf_event_open", "userfaultfd"} <= set(built.denied)
    assert {"mount", "umount2", "kexec_load", "kexec_file_load", "init_module", "unshare", "setns"} <= set(built.denied)
    assert set(built.denied) <= set(DENIED)
    assert built.path.stat().st_mode & 0o077 == 0 and built.path.parent.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("profile", ["build", "fetch"])
def test_every_refused_family_is_refused_and_the_process_still_works(sandbox: Sandbox, profile: str) -> None:
    code, out, err = _run(sandbox, PROBE, **({"profile": FETCH} if profile == "fetch" else {}))
    assert code == 0, err
    results = ast.literal_eval(out)
    refused = {k: v for k, v in results.items() if k not in ("getpid", "fork", "seccomp", "no_new_privs", "clone3")}
    assert all(v == "Operation not permitted" for v in refused.values()), refused
    assert results["clone3"] == "Function not implemented"  # ENOSYS: the C library falls back to clone
    assert (results["getpid"], results["fork"]) == ("ok", "ok")
    assert (results["seccomp"], results["no_new_privs"]) == ("2", "1")


def test_without_the_filter_the_same_sandbox_reaches_the_keyring(sandbox: Sandbox) -> None:
    """The control: namespaces and dropped capabilities alone leave these open; the filter is what closes them."""
    sandbox.seccomp = None
    probe = PROBE.split("results = {")[0] + (
        'print({"keyctl": call(250, 0, -3), "request_key": call(249, b"user", b"x", None, -3)})'
    )
    code, out, err = _run(sandbox, probe)
    assert code == 0, err
    results = ast.literal_eval(out)
    assert results["keyctl"] == "ok"  # the session keyring is there to read
    assert results["request_key"] != "Operation not permitted"  # the kernel looks (and finds no such key)
    code, out, err = _run(Sandbox(sandbox.workspace, read_only=PYTHON), probe)  # with the filter
    assert set(ast.literal_eval(out).values()) == {"Operation not permitted"}


def test_a_call_through_another_abi_kills_the_process(sandbox: Sandbox) -> None:
    # x32's getpid (the 0x40000000 bit): no number of another ABI slips past the table
    code, out, _ = _run(sandbox, "import ctypes; ctypes.CDLL(None).syscall(0x40000000 | 39); print('survived')")
    assert code != 0 and "survived" not in out


def test_code_in_the_sandbox_cannot_remove_or_loosen_the_filter(sandbox: Sandbox) -> None:
    # a filter of its own that allows everything is stacked under ours, never instead of it
    code = r"""
import ctypes, os, struct
libc = ctypes.CDLL(None, use_errno=True)
allow = struct.pack("HBBI", 0x06, 0, 0, 0x7fff0000)                 # BPF_RET | BPF_K, SECCOMP_RET_ALLOW
program = ctypes.create_string_buffer(allow)
fprog = struct.pack("HxxxxxxP", 1, ctypes.addressof(program))
installed = libc.prctl(22, 2, ctypes.create_string_buffer(fprog), 0, 0)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
cleared = libc.prctl(38, 0, 0, 0, 0)                                  # PR_SET_NO_NEW_PRIVS back to 0
keyctl = libc.syscall(250, 0, -3)
print(installed, cleared, keyctl, os.strerror(ctypes.get_errno()))
"""
    status, out, err = _run(sandbox, code)
    assert status == 0, err
    installed, cleared, keyctl, why = out.split(" ", 3)
    assert installed == "0"  # its own filter went in
    assert cleared == "-1"  # no_new_privs cannot be cleared
    assert keyctl == "-1" and why.strip() == "Operation not permitted"  # and ours still refuses
