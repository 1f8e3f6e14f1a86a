"""Attacks from crate code during ``nix build``: nix's sandbox stops them, and flakebot builds only in it.

A hostile crate (in a directory registry, as flakebot forks it) has a build
script and a unit test that try, during ``nix build`` of the flake flakebot
generates (against the nixpkgs stand-in in tests/nixpkgs):

* to write canary files outside the build directory (the host's /tmp, /root);
* to read a secret planted in ``$HOME`` and in the host's /tmp, and to list
  ``/root/.ssh``;
* to connect to a listener on 127.0.0.1;
* to find the caller's ``CANARY_API_KEY`` in its environment.

The build script writes what it managed into the binary (``include_str!``
of a report in ``OUT_DIR``), so the test can read, from the built tool, that
the script ran and that every attack failed. Then: no canary file, no
connection, no secret in the report or the build log, the workspace and its
history untouched.

With the sandbox off (``NIX_CONF_DIR`` pointing at a nix.conf that says
``sandbox = false``), the nix backend refuses to build and ``auto`` picks
cargo, with a notice.
"""

from __future__ import annotations

import os
import platform
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tinycrates import Recorder, crate, write_registry

from flakebot_magic.backends.nix_command import NIX_FEATURES, Nix, nix_sandbox, resolve_backend
from flakebot_magic.config import Settings
from flakebot_magic.errors import ConfigError
from flakebot_magic.events import Notice
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.stages.flake import FlakeMeta, write_flake

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "nixpkgs"
SYSTEM = f"{platform.machine()}-linux"
NIX = shutil.which("nix")

pytestmark = [
    pytest.mark.nix,
    pytest.mark.skipif(NIX is None, reason="nix is not installed (run scripts/setup-nix.sh as root)"),
]

_ATTACK_RS = r"""// What a hostile build script or unit test tries during `nix build`.
#![allow(dead_code)]
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

const WRITES: &[&str] = &[WRITES_HERE];
const READS: &[&str] = &[READS_HERE];
const LISTS: &[&str] = &[LISTS_HERE];
const PORT: u16 = PORT_HERE;

fn outcome<T, E: std::fmt::Display>(result: Result<T, E>, shown: impl FnOnce(T) -> String) -> String {
    match result {
        Ok(value) => format!("DONE {}", shown(value)),
        Err(error) => format!("blocked ({})", error),
    }
}

pub fn run(who: &str) -> String {
    let mut lines = Vec::new();
    for path in WRITES {
        let target = format!("{}-{}", path, who);
        lines.push(format!("write {}: {}", target, outcome(std::fs::write(&target, who), |_| String::new())));
    }
    for path in READS {
        lines.push(format!("read {}: {}", path, outcome(std::fs::read_to_string(path), |text| text)));
    }
    for dir in LISTS {
        let listing = std::fs::read_dir(dir).map(|entries| {
            entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<_>>()
        });
        lines.push(format!("list {}: {}", dir, outcome(listing, |names| names.join(","))));
    }
    let address = SocketAddr::from(([127, 0, 0, 1], PORT));
    let sent = TcpStream::connect_timeout(&address, Duration::from_secs(3)).and_then(|mut s| s.write_all(who.as_bytes()));
    lines.push(format!("connect {}: {}", address, outcome(sent, |_| String::new())));
    let found: Vec<String> = std::env::vars().filter(|(k, _)| k.contains("CANARY")).map(|(k, v)| format!("{}={}", k, v)).collect();
    lines.push(format!("environment: [{}]", found.join(" ")));
    lines.join("\n")
}
"""

_BUILD_RS = r"""#[path = "src/attack.rs"]
mod attack;

fn main() {
    let report = attack::run("build-script");
    let out = std::env::var("OUT_DIR").unwrap();
    std::fs::write(format!("{}/report.txt", out), report).unwrap();
    println!("cargo:rerun-if-changed=build.rs");
}
"""

_MAIN_RS = r"""mod attack;

// what the build script managed, as it wrote it
const BUILD_REPORT: &str = include_str!(concat!(env!("OUT_DIR"), "/report.txt"));

fn main() {
    println!("{}", BUILD_REPORT);
}

#[cfg(test)]
mod tests {
    #[test]
    fn attacks_from_a_unit_test() {
        println!("{}", super::attack::run("unit-test"));
    }
}
"""


def _rust_strings(values: list[str]) -> str:
    return ", ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values)


@dataclass
class Listener:
    """A TCP listener on 127.0.0.1 that records every connection it accepts."""

    sock: socket.socket = field(default_factory=lambda: socket.create_server(("127.0.0.1", 0)))
    connections: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.connections.append(conn.recv(1024))
                except OSError:
                    self.connections.append(b"")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@dataclass
class Attack:
    """The hostile crate's targets, and the workspace holding it."""

    workspace: Path
    canaries: list[Path]  # what the crate tries to create (each gets "-<who>" appended)
    secrets: dict[Path, str]  # planted files and their random content
    env_canary: str
    listener: Listener

    def created(self) -> list[Path]:
        return [
            Path(f"{c}-{who}")
            for c in self.canaries
            for who in ("build-script", "unit-test")
            if Path(f"{c}-{who}").exists()
        ]


def _git(workspace: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "core.hooksPath=/dev/null", "-c", "user.name=t", "-c", "user.email=t@t", *args],
        cwd=workspace,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


@pytest.fixture(scope="module")
def attack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attack]:
    """The hostile crate in a directory registry, forked into a git workspace with a flake; targets planted."""
    tmp = tmp_path_factory.mktemp("nixattack")
    token = secrets.token_hex(8)
    home_secret = Path.home() / f".flakebot-nix-canary-secret-{token}"
    tmp_secret = tmp / "secret.txt"
    planted = {home_secret: f"home-secret-{secrets.token_hex(16)}", tmp_secret: f"tmp-secret-{secrets.token_hex(16)}"}
    canaries = [Path(f"/tmp/flakebot-nix-canary-{token}"), Path.home() / f"flakebot-nix-canary-{token}", tmp / "canary"]
    listener = Listener()
    attack_rs = (
        _ATTACK_RS.replace("WRITES_HERE", _rust_strings([str(c) for c in canaries]))
        .replace("READS_HERE", _rust_strings([str(p) for p in planted] + [str(Path.home() / ".ssh" / "id_rsa")]))
        .replace("LISTS_HERE", _rust_strings(["/root/.ssh", str(Path.home()), str(tmp)]))
        .replace("PORT_HERE", str(listener.port))
    )
    hostile = crate(
        "nixattack",
        "0.1.0",
        description="A crate whose build script and test attack the host",
        files={"src/attack.rs": attack_rs, "build.rs": _BUILD_RS, "src/main.rs": _MAIN_RS},
    )
    registry = write_registry(tmp / "registry", [hostile])
    workspace = tmp / "workspaces" / "nixattack"
    shutil.copytree(registry / hostile.dirname, workspace)
    (workspace / ".cargo-checksum.json").unlink()
    (workspace / "Cargo.lock").write_text('version = 3\n\n[[package]]\nname = "nixattack"\nversion = "0.1.0"\n')
    write_flake(workspace, FlakeMeta("nixattack", "0.1.0", "hostile", "MIT", "nixattack"), f"path:{STAND_IN}")
    _git(workspace, "init", "-q")
    _git(workspace, "add", "-A")
    Nix(ProcessRunner()).lock(workspace, tmp / "kept.lock", timeout=300)  # as the pipeline: lock, commit both
    _git(workspace, "add", "-A")
    _git(workspace, "commit", "-q", "-m", "hostile crate, flake.nix and flake.lock")
    for path, text in planted.items():
        path.write_text(text)
        path.chmod(0o600)
    env_canary = f"canary-key-{secrets.token_hex(16)}"
    try:
        yield Attack(workspace, canaries, planted, env_canary, listener)
    finally:
        listener.close()
        for path in [*planted, *(Path(f"{c}-{who}") for c in canaries for who in ("build-script", "unit-test"))]:
            path.unlink(missing_ok=True)


def _sandbox_on() -> None:
    state = nix_sandbox()
    if not state.on:
        pytest.skip(f"nix's sandbox is off here ({state.why}): run scripts/setup-nix.sh as root")


@dataclass
class Built:
    store_path: Path
    log: str


def _build(attack: Attack, attribute: str, monkeypatch: pytest.MonkeyPatch, link: Path) -> Built:
    monkeypatch.setenv("CANARY_API_KEY", attack.env_canary)
    lines: list[str] = []
    nix = Nix(ProcessRunner())
    head = _git(attack.workspace, "rev-parse", "HEAD")
    path = nix.build(
        attack.workspace,
        link,
        timeout=900,
        attribute=attribute,
        on_line=lambda stream, line: lines.append(line),
    )
    # nothing lost: the workspace and its history are as they were
    assert _git(attack.workspace, "rev-parse", "HEAD") == head
    assert _git(attack.workspace, "status", "--porcelain") == ""
    return Built(path, "\n".join(lines))


def _assert_nothing_escaped(attack: Attack, *texts: str) -> None:
    assert attack.created() == [], "a canary file was written outside the build directory"
    assert attack.listener.connections == [], "the builder reached a listener on 127.0.0.1"
    for text in texts:
        for secret in attack.secrets.values():
            assert secret not in text
        assert attack.env_canary not in text
    for path, secret in attack.secrets.items():
        assert path.read_text() == secret  # still there, unchanged


def test_a_build_script_reaches_nothing_during_nix_build(
    attack: Attack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _sandbox_on()
    built = _build(attack, "", monkeypatch, tmp_path / "result")
    report = subprocess.run(
        [str(built.store_path / "bin" / "nixattack")], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    # the build script ran every attack, and each failed (or stayed inside the sandbox)
    lines = dict(line.split(": ", 1) for line in report.strip().splitlines())
    assert len(lines) == 3 + 3 + 3 + 1 + 1, report
    in_sandbox_tmp = f"write {attack.canaries[0]}-build-script"  # the sandbox's own /tmp: allowed, and discarded
    for target, outcome in lines.items():
        if target not in (in_sandbox_tmp, "environment"):
            assert outcome.startswith("blocked"), f"{target}: {outcome}"
    assert lines["environment"] == "[]"
    _assert_nothing_escaped(attack, report, built.log)


def test_a_unit_test_reaches_nothing_during_nix_flake_check(
    attack: Attack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _sandbox_on()
    built = _build(attack, f"checks.{SYSTEM}.default", monkeypatch, tmp_path / "checked")
    # the stand-in ran cargo test, and the hostile test in it
    log = (
        subprocess.run(
            [NIX or "nix", *NIX_FEATURES, "log", str(built.store_path)], capture_output=True, text=True, timeout=60
        ).stdout
        + built.log
    )
    assert "attacks_from_a_unit_test ... ok" in log, log[-3000:]
    _assert_nothing_escaped(attack, log)


# -- the sandbox off: refuse, and auto picks cargo ----------------------------


@pytest.fixture
def sandbox_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """NIX_CONF_DIR with this machine's nix.conf, but `sandbox = false`."""
    conf_dir = tmp_path / "nix-conf"
    conf_dir.mkdir()
    current = Path(os.environ.get("NIX_CONF_DIR", "/etc/nix")) / "nix.conf"
    kept = [
        line
        for line in (current.read_text().splitlines() if current.is_file() else [])
        if line.split("=", 1)[0].strip() not in ("sandbox", "sandbox-fallback")
    ]
    (conf_dir / "nix.conf").write_text("\n".join([*kept, "sandbox = false", ""]))
    registry = current.parent / "flake-registry.json"
    if registry.is_file():
        shutil.copy(registry, conf_dir / "flake-registry.json")
    monkeypatch.setenv("NIX_CONF_DIR", str(conf_dir))
    return conf_dir


def test_with_the_sandbox_off_nix_refuses_the_hostile_crate(
    sandbox_off: Path, attack: Attack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = nix_sandbox()  # asks the real nix, which reads NIX_CONF_DIR
    assert not state.on and "sandbox = false" in state.why
    with pytest.raises(ConfigError) as error:
        resolve_backend("nix")
    assert "make nix" in str(error.value) and "sandbox = true" in str(error.value)
    assert resolve_backend("auto")[0] == "cargo"
    monkeypatch.setenv("CANARY_API_KEY", attack.env_canary)
    with pytest.raises(ConfigError, match="sandbox"):
        Nix(ProcessRunner()).build(attack.workspace, tmp_path / "result", timeout=1800)
    assert not (tmp_path / "result").exists()
    _assert_nothing_escaped(attack)


def test_with_the_sandbox_off_a_nix_pipeline_fails_before_any_work(sandbox_off: Path, tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(tmp_path / "nowhere"), backend="nix")
    with pytest.raises(ConfigError, match="build-users-group = nixbld"):
        Pipeline(settings).run("anything")
    assert not any(settings.cache.workspaces.iterdir())  # the cache's directories exist (private), empty


@pytest.mark.cargo
def test_with_the_sandbox_off_auto_builds_with_cargo_and_says_why(sandbox_off: Path, tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="auto")
    recorder = Recorder()
    tool = Pipeline(settings, observers=[recorder]).run("", crate="tinyecho")
    assert tool.backend == "cargo"
    assert tool("sandboxed", input="") == "sandboxed\n"
    notices = [n.message for n in recorder.of(Notice)]
    assert any(
        m.startswith("backend: cargo (auto: nix is on PATH but its sandbox is off") and "make nix" in m for m in notices
    ), notices
