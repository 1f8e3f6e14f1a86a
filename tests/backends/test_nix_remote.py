"""Remote builders for real (issue 24): OpenSSH's sshd on 127.0.0.1, a builder user with its own nix store.

``scripts/team-builder.sh up`` sets the builder up (as root, idempotently)
and ``down`` stops its sshd and revokes the test's key. With ``max-jobs = 0``
nix may build nothing here, so a tool that exists at all was built on the
builder: its output is asserted in the builder's store, and the build's log
names the builder. The crate carries a nonce, so its store path is new on
every run and nix cannot answer from a store that already has it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinycrates import Recorder, crate, write_registry

from flakebot_magic.backends.nix_command import Nix, NixOptions
from flakebot_magic.config import Settings
from flakebot_magic.errors import Cancelled, FlakeError
from flakebot_magic.events import LogLine
from flakebot_magic.host.process import CancelToken, ProcessRunner
from flakebot_magic.pipeline import Pipeline

pytestmark = [pytest.mark.nix, pytest.mark.cargo]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "team-builder.sh"
STAND_IN = REPO / "tests" / "nixpkgs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Builder:
    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, _free_port()
        done = subprocess.run(
            ["bash", str(SCRIPT), "up", str(folder), str(self.port)], capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
        lines = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
        self.builders = lines["FLAKEBOT_NIX_BUILDERS"].strip("'")
        self.sshopts = lines["NIX_SSHOPTS"].strip("'")
        self.store = Path(self.builders.split("root=", 1)[1].split()[0])

    def down(self) -> None:
        subprocess.run(["bash", str(SCRIPT), "down", str(self.folder)], check=True, timeout=60)


@pytest.fixture(scope="module")
def builder(nix_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Builder]:
    if os.geteuid() != 0 or shutil.which("ssh-keygen") is None:
        pytest.skip("the builder's set-up needs root and OpenSSH (scripts/install-system.sh installs it)")
    up = Builder(tmp_path_factory.mktemp("builder"))
    before = os.environ.get("NIX_SSHOPTS")
    os.environ["NIX_SSHOPTS"] = up.sshopts
    try:
        yield up
    finally:
        if before is None:
            os.environ.pop("NIX_SSHOPTS", None)
        else:
            os.environ["NIX_SSHOPTS"] = before
        up.down()
        pid_file = up.folder / "sshd.pid"
        assert not pid_file.exists()


def _nonce_registry(root: Path) -> tuple[str, str]:
    nonce = uuid.uuid4().hex[:12]
    main = (
        f'fn main() {{ println!("built remotely {nonce}"); }}\n'
        "#[cfg(test)]\nmod tests {\n    #[test]\n    fn runs() {}\n}\n"
    )
    write_registry(root, [crate("remotehi", description="Say where it was built", files={"src/main.rs": main})])
    return str(root), nonce


def test_max_jobs_zero_builds_on_the_builder_and_copies_back(builder: Builder, tmp_path: Path) -> None:
    registry, nonce = _nonce_registry(tmp_path / "registry")
    settings = Settings(
        cache_dir=tmp_path / "cache",
        registry=registry,
        backend="nix",
        nixpkgs=f"path:{STAND_IN}",
        nix_builders=builder.builders,
        nix_max_jobs=0,
    )
    recorder = Recorder()
    tool = Pipeline(settings, observers=[recorder]).run("", crate="remotehi")
    assert tool(input="") == f"built remotely {nonce}\n"
    # built there: the output is in the builder's own store; and copied back here
    remote = builder.store / str(tool.store_path).lstrip("/")
    assert (remote / "bin" / "remotehi").is_file()
    assert Path(tool.store_path).is_dir()
    logged = "\n".join(e.line for e in recorder.of(LogLine) if e.stage == "build")
    assert "from 'ssh-ng://fbbuilder@127.0.0.1'" in logged, logged[-2000:]


def test_a_builder_that_is_down_is_a_quick_clear_error(builder: Builder, tmp_path: Path) -> None:
    registry, _ = _nonce_registry(tmp_path / "registry")
    down = builder.builders.replace("127.0.0.1", "127.0.0.2", 1)  # nothing listens there
    settings = Settings(
        cache_dir=tmp_path / "cache",
        registry=registry,
        backend="nix",
        nixpkgs=f"path:{STAND_IN}",
        nix_builders=down,
        nix_max_jobs=0,
    )
    started = time.monotonic()
    with pytest.raises(FlakeError) as failed:
        Pipeline(settings).run("", crate="remotehi")
    assert time.monotonic() - started < 120
    assert "unable to start any build" in str(failed.value)


def _builder_processes(marker: str) -> list[int]:
    """Live processes whose command line or environment holds ``marker`` (the builder's sandbox included)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            seen = Path(f"/proc/{pid}/environ").read_bytes() + Path(f"/proc/{pid}/cmdline").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in seen and state != "Z" and int(pid) != os.getpid():
            found.append(int(pid))
    return found


def _owned_by(user: str, builder: Builder) -> list[int]:
    """Live processes of ``user`` that descend from this test's sshd: another run's builder is not this one's."""
    uid = int(subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True).stdout)
    sshd = int((builder.folder / "sshd.pid").read_text())
    parents: dict[int, int] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(pid)] = int(fields[1])

    def descends(pid: int) -> bool:
        for _ in range(64):
            pid = parents.get(pid, 0)
            if pid == sshd:
                return True
            if pid <= 1:
                return False
        return False

    return [pid for pid in parents if descends(pid) and _uid(str(pid)) == uid]


def _uid(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def test_cancel_during_a_remote_build_leaves_nothing_running_on_either_side(builder: Builder, tmp_path: Path) -> None:
    nonce = uuid.uuid4().hex
    repo = tmp_path / "slow"
    repo.mkdir()
    system = f"{os.uname().machine}-linux"
    (repo / "flake.nix").write_text(
        "{\n  outputs = { self }: {\n"
        f"    packages.{system}.default = derivation {{\n"
        f'      name = "remote-slow-{nonce[:8]}"; system = "{system}"; builder = "/bin/sh"; PATH = "/usr/bin:/bin";\n'
        f'      FLAKEBOT_TEST_NONCE = "{nonce}";\n'
        '      args = [ "-c" "sleep 120; echo done > $out" ];\n'
        "    };\n  };\n}\n"
    )
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run(["git", "add", "flake.nix"], cwd=repo, check=True)
    before = set(_owned_by("fbbuilder", builder))
    cancel = CancelToken()
    failure: list[BaseException] = []
    nix = Nix(ProcessRunner(cancel), options=NixOptions(builders=builder.builders, max_jobs=0))

    def build() -> None:
        try:
            nix.build(repo, tmp_path / "link", timeout=300)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 120
    remote: list[int] = []
    while not remote and time.monotonic() < deadline and thread.is_alive():
        remote = [p for p in _builder_processes(f"FLAKEBOT_TEST_NONCE={nonce}") if _uid(str(p)) != 0]
        time.sleep(0.2)
    assert remote, f"the build never started on the builder: {failure}"
    cancel.cancel()
    thread.join(timeout=60)
    assert not thread.is_alive() and isinstance(failure[0], Cancelled), failure
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        _builder_processes(f"FLAKEBOT_TEST_NONCE={nonce}") or set(_owned_by("fbbuilder", builder)) - before
    ):
        time.sleep(0.2)
    assert _builder_processes(f"FLAKEBOT_TEST_NONCE={nonce}") == []  # the build, here and on the builder
    assert (
        set(_owned_by("fbbuilder", builder)) - before == set()
    )  # no nix-daemon, shell or sshd child of the builder's left
