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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from tinycrates import Recorder, crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.errors import FlakeError
from flakebot_magic.events import LogLine
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
