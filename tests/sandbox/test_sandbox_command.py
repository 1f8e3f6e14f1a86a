"""The sandbox for model-written code: no secrets, no network, no writes outside, bounded resources."""

from __future__ import annotations

import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinycrates import crate, write_registry

from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.host.sandboxed import SandboxedCommand
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import FETCH, Limits, Sandbox, bubblewrap_works
from flakebot_magic.sandbox.cargo import Cargo

needs_bwrap = pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}")


#: the test interpreter, shown read-only in sandboxes that run it
PYTHON = (sys.prefix, sys.base_prefix)


def _run(sandbox: Sandbox, argv: list[str], env: dict[str, str] | None = None) -> tuple[int, str, str]:
    done = ProcessRunner().run(sandbox.command(argv), cwd=sandbox.workspace, env=sandbox.env(env), timeout=60)
    return done.returncode, done.stdout, done.stderr


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def test_only_allowlisted_variables_pass_and_temporary_files_stay_inside(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-to-cargo")
    monkeypatch.setenv("GH_TOKEN", "ghp-never")
    # an allowlist: a variable that looks harmless does not pass either (nobody listed it)
    monkeypatch.setenv("FLAKEBOT_HARMLESS", "dropped")
    monkeypatch.setenv("LC_TIME", "C")
    code, out, _ = _run(Sandbox(workspace), ["env"], {"CARGO_TERM_COLOR": "never"})
    assert code == 0
    assert "sk-never-to-cargo" not in out and "ghp-never" not in out
    assert "FLAKEBOT_HARMLESS" not in out
    assert "LC_TIME=C" in out and "CARGO_TERM_COLOR=never" in out and "PATH=" in out
    assert f"TMPDIR={workspace.resolve()}/target/flakebot-tmp" in out


@needs_bwrap
def test_only_the_workspace_is_writable(workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / f"outside-{uuid.uuid4().hex}"
    script = f"echo in > inside.txt && (echo out > {outside} 2>/dev/null || echo refused)"
    code, out, _ = _run(Sandbox(workspace), ["sh", "-c", script])
    # the sandbox's /tmp is a private tmpfs: the write lands there, or is refused, never on the host
    assert code == 0
    assert (workspace / "inside.txt").read_text() == "in\n"
    assert not outside.exists()
    code, out, _ = _run(Sandbox(workspace), ["sh", "-c", "echo out > /usr/escaped 2>/dev/null || echo refused"])
    assert out.strip() == "refused" and not Path("/usr/escaped").exists()


@pytest.fixture
def listener() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


@needs_bwrap
def test_no_network_not_even_the_hosts_loopback(workspace: Path, listener: int) -> None:
    probe = f"import socket; socket.create_connection(('127.0.0.1', {listener}), timeout=3); print('connected')"
    code, out, err = _run(Sandbox(workspace, isolate=False), [sys.executable, "-c", probe])
    assert code == 0 and "connected" in out  # the control: the listener is there
    code, out, err = _run(Sandbox(workspace, read_only=PYTHON), [sys.executable, "-c", probe])
    assert code != 0 and "connected" not in out
    assert "ConnectionRefused" in err or "unreachable" in err


def test_cpu_and_memory_limits(workspace: Path) -> None:
    sandbox = Sandbox(workspace, read_only=PYTHON, limits=Limits(cpu_seconds=1, memory_bytes=300 * 1024**2))
    if sandbox.prlimit is None:
        pytest.skip("prlimit (util-linux) is not installed")
    code, _, _ = _run(sandbox, [sys.executable, "-c", "while True: pass"])
    assert code != 0  # SIGXCPU, then SIGKILL, after one CPU second
    code, _, err = _run(sandbox, [sys.executable, "-c", "x = bytearray(2 * 1024**3)"])
    assert code != 0 and "MemoryError" in err


def test_without_bubblewrap_it_says_so(workspace: Path) -> None:
    assert "not installed" in bubblewrap_works("no-such-bwrap-here")
    sandbox = Sandbox(workspace, isolate=False)
    assert not sandbox.isolated
    assert "NOT SANDBOXED" in sandbox.notice and "WITHOUT network isolation" in sandbox.notice
    assert sandbox.command(["cargo", "build"])[-2:] == ["cargo", "build"]


def test_output_past_the_limit_stops_the_command(workspace: Path, tmp_path: Path) -> None:
    # a stand-in for cargo that prints without end (a test that never stops printing)
    noisy = tmp_path / "noisy-cargo"
    noisy.write_text("#!/bin/sh\nwhile true; do echo 'line line line line line line line line'; done\n")
    noisy.chmod(0o755)
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", []), tmp_path / "index")
    sandbox = Sandbox(workspace, limits=Limits(output_bytes=200_000))
    cargo = Cargo(registry, ProcessRunner(), sandbox, executable=str(noisy))
    lines: list[str] = []
    done = cargo.run("test", cwd=workspace, timeout=60, on_line=lambda stream, line: lines.append(line))
    assert done.returncode == -9
    assert "its output passed" in done.stderr
    assert sum(len(line) + 1 for line in lines) <= 200_000
    assert len(done.stdout) <= 200_000


def test_files_made_by_someone_else_never_stop_a_command(workspace: Path, tmp_path: Path) -> None:
    """The file system's counters only say when to count; the count is of what the command may write."""
    slow = tmp_path / "slow-cargo"
    slow.write_text(
        '#!/bin/sh\ncd "$(dirname "$3")" || exit 3\nfor i in 1 2 3 4 5 6 7 8 9 10; do : > mine$i; sleep 0.2; done\necho done\n'
    )
    slow.chmod(0o755)
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", []), tmp_path / "index")
    sandbox = Sandbox(workspace, limits=Limits(files=1_000))
    cargo = Cargo(registry, ProcessRunner(), sandbox, executable=str(slow))
    elsewhere = tmp_path / "elsewhere"  # the same file system, outside what the command may write
    elsewhere.mkdir()
    stop = threading.Event()

    def crowd() -> None:
        made = 0
        while not stop.is_set() and made < 20_000:
            (elsewhere / f"f{made}").touch()
            made += 1

    thread = threading.Thread(target=crowd)
    thread.start()
    try:
        done = cargo.run("build", cwd=workspace, timeout=60)
    finally:
        stop.set()
        thread.join()
    assert done.returncode == 0, done.stderr[-500:]
    assert "done" in done.stdout and len(list(workspace.glob("mine*"))) == 10
    assert len(list(elsewhere.iterdir())) > 1_000  # the crowd did pass the command's limit, elsewhere


def test_a_fast_writer_is_stopped_at_the_file_limit(workspace: Path, tmp_path: Path) -> None:
    writer = tmp_path / "writer-cargo"
    writer.write_text(
        '#!/bin/sh\ncd "$(dirname "$3")" || exit 3\nmkdir -p many && cd many && i=0; while [ $i -lt 20000 ]; do : > f$i; i=$((i+1)); done\n'
    )
    writer.chmod(0o755)
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", []), tmp_path / "index")
    sandbox = Sandbox(workspace, limits=Limits(files=2_000))
    done = Cargo(registry, ProcessRunner(), sandbox, executable=str(writer)).run("build", cwd=workspace, timeout=60)
    assert done.returncode == -9 and "2,000 files" in done.stderr
    assert sandbox.disk_usage().files < 5_000  # of the 20,000 it would make (50 ms glances; more under load)


BUILD_RS_ESCAPE = """fn main() {{
    let outside = "{outside}";
    match std::fs::write(outside, "escaped") {{
        Ok(()) => println!("cargo:warning=wrote {{}}", outside),
        Err(e) => panic!("cannot write {{}}: {{}}", outside, e),
    }}
}}
"""


@needs_bwrap
@pytest.mark.cargo
def test_cargo_builds_in_the_sandbox_and_a_build_script_cannot_write_outside(tmp_path: Path) -> None:
    # next to the crate, in the registry: shown to the sandbox, read-only
    outside = tmp_path / "registry" / f"escaped-{uuid.uuid4().hex}"
    files = {
        "src/main.rs": 'fn main() {\n    println!("sandboxed");\n}\n',
        "build.rs": BUILD_RS_ESCAPE.format(outside=outside),
    }
    root = write_registry(tmp_path / "registry", [crate("escaper", files=files)])
    registry = DirectoryRegistry(root, tmp_path / "index")
    workspace = root / "escaper-0.1.0"
    cargo = Cargo(registry, ProcessRunner(), Sandbox(workspace))
    done = cargo.run("build", cwd=workspace, timeout=300)
    assert done.returncode != 0
    assert "Read-only file system" in done.stderr
    assert not outside.exists()
    # without the build script the same crate builds, with rustup's toolchain mounted read-only
    (workspace / "build.rs").unlink()
    done = cargo.run("build", cwd=workspace, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (workspace / "target" / "debug" / "escaper").is_file()


def test_the_runner_refuses_a_toolchain_command_the_sandbox_did_not_make(workspace: Path) -> None:
    for argv in (["cargo", "build"], ["/root/.cargo/bin/rustc", "-vV"], ["nice", "-n", "5", "rustup", "show"]):
        with pytest.raises(ValueError, match="outside the sandbox"):
            ProcessRunner().run(argv, cwd=workspace)
    made = Sandbox(workspace, isolate=False).command(["cargo", "--version"])
    assert isinstance(made, SandboxedCommand)


@needs_bwrap
def test_the_fetch_profile_has_the_network_and_cargo_home_but_not_the_workspace(
    workspace: Path, tmp_path: Path, listener: int
) -> None:
    home = tmp_path / "cargo-home"
    home.mkdir()
    (workspace / "Cargo.lock").write_text("")
    sandbox = Sandbox(workspace, read_only=PYTHON, cargo_home=home)
    probe = (
        "import socket, pathlib\n"
        f"socket.create_connection(('127.0.0.1', {listener}), timeout=3); print('connected')\n"
        f"pathlib.Path('{home}/registry').mkdir(); print('cargo home written')\n"
        f"pathlib.Path('{workspace}/Cargo.lock').write_text('lock'); print('lock written')\n"
        f"pathlib.Path('{workspace}/src.rs').write_text('x')\n"
    )
    command = sandbox.command([sys.executable, "-c", probe], FETCH, writable_files=[workspace / "Cargo.lock"])
    done = ProcessRunner().run(command, cwd=workspace, env=sandbox.env(profile=FETCH), timeout=60)
    assert done.stdout.split("\n")[:3] == ["connected", "cargo home written", "lock written"]
    assert done.returncode != 0 and "Read-only file system" in done.stderr
    assert not (workspace / "src.rs").exists() and (workspace / "Cargo.lock").read_text() == "lock"
    # the build profile: the workspace writable, CARGO_HOME not, no network
    probe = (
        f"import pathlib; pathlib.Path('{workspace}/src.rs').write_text('x'); print('workspace written')\n"
        f"pathlib.Path('{home}/config.toml').write_text('[build]')\n"
    )
    code, out, err = _run(sandbox, [sys.executable, "-c", probe])
    assert out.strip() == "workspace written" and code != 0 and "Read-only file system" in err
    assert not (home / "config.toml").exists()


def test_only_the_fetch_profile_gets_the_users_proxy(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("no_proxy", "localhost")
    sandbox = Sandbox(workspace)
    fetch, build = sandbox.env(profile=FETCH), sandbox.env()
    assert fetch["HTTPS_PROXY"] == "http://proxy.example:3128" and fetch["no_proxy"] == "localhost"
    assert "HTTPS_PROXY" not in build and "no_proxy" not in build
    assert "TMPDIR" not in fetch  # the workspace is read-only there


def test_two_threads_releasing_the_same_cgroups_at_once_both_finish(tmp_path: Path) -> None:
    """The build and the test beside it release one sandbox's cgroups together: neither may fail for it."""
    from flakebot_magic.sandbox.limits import remove_cgroups

    for _ in range(50):
        cgroups = [tmp_path / f"gone-{i}" for i in range(50)]  # already removed: each is dropped from the list
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def release(
            cgroups: list[Path] = cgroups, start: threading.Barrier = start, errors: list[BaseException] = errors
        ) -> None:
            start.wait()
            try:
                remove_cgroups(cgroups)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=release) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == [] and cgroups == []


#: a grandchild that leaves the process group, lets go of the output pipes (so no pipe holder is looked for)
#: and, half a second after its command returned, would write a file in the workspace
_OUTLIVER = "setsid sh -c 'sleep 0.5; echo late > late' </dev/null >/dev/null 2>&1 & echo started"


@needs_bwrap
@pytest.mark.parametrize("told", [True, False], ids=["runner-knows-the-cgroup", "group-and-namespace-only"])
def test_nothing_a_sandboxed_command_started_outlives_it(workspace: Path, told: bool) -> None:
    """The invariant the runner keeps in constant time: when run() returns, no process of the command exists.

    With the command's pids cgroup known, its empty list proves it at once. Without (where no pids cgroup
    is writable), bubblewrap's pid namespace ends it: its init (in a session of its own, so not in the
    command's group) gets SIGKILL as bubblewrap exits and takes everything in the namespace with it, a
    moment later; the grandchild never writes its file.
    """
    from tinycrates import processes_in

    from flakebot_magic.sandbox.limits import pids_cgroups_writable

    sandbox = Sandbox(workspace)
    made = sandbox.command(["sh", "-c", _OUTLIVER], cwd=workspace)
    assert (made.cgroup is not None) == pids_cgroups_writable()
    argv = made if told else SandboxedCommand(made, cgroup=None)
    done = ProcessRunner().run(argv, cwd=workspace, env=sandbox.env(), timeout=30)
    assert done.returncode == 0 and done.stdout == "started\n"
    # with the cgroup, at once: not one left to be reaped later
    assert processes_in(workspace, settle=0 if told else 2.0) == []
    time.sleep(1.0)
    assert not (workspace / "late").exists()
