"""The nix backend: backend choice, nix's command line, and real ``nix build`` deploys (marked ``nix``).

The real-nix tests build tiny crates (and pulldown-cmark once, the issue's
"done when") against the nixpkgs stand-in in tests/nixpkgs; they need a root
Nix set up by scripts/setup-nix.sh. Builds are shared through module-scoped
fixtures to keep the suite's nix time small.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from IPython.lib.pretty import pretty
from tinycrates import Recorder, processes_in

from flakebot_magic.backends.nix_command import (
    NIX_FEATURES,
    Nix,
    NixOptions,
    NixSandbox,
    lock_hash,
    nix_sandbox,
    normalize_flake_ref,
    resolve_backend,
)
from flakebot_magic.cli import main as cli_main
from flakebot_magic.clients.cli_tool import CliTool as Tool
from flakebot_magic.config import DEBIAN_REGISTRY, Settings
from flakebot_magic.errors import Cancelled, ConfigError, FlakeError, UsageError
from flakebot_magic.events import Notice, StageFinished
from flakebot_magic.host.process import CancelToken, Completed, ProcessRunner
from flakebot_magic.manage.cleanup import clean
from flakebot_magic.manage.export import export_replit
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.registry.directory import DirectoryRegistry

REPO = Path(__file__).resolve().parents[2]
STAND_IN = REPO / "tests" / "nixpkgs"
SYSTEM = f"{platform.machine()}-linux"
NIX = shutil.which("nix")
SANDBOX_ON = NixSandbox(True, "sandbox = true")
SANDBOX_OFF = NixSandbox(False, "nix.conf says `sandbox = false`")


# -- backend choice (no nix needed) -----------------------------------------


def test_auto_is_nix_when_nix_is_on_path() -> None:
    assert resolve_backend("auto", nix="/usr/bin/nix", sandbox=SANDBOX_ON) == ("nix", "auto: nix is on PATH")
    assert resolve_backend(None, nix="/usr/bin/nix", sandbox=SANDBOX_ON)[0] == "nix"


def test_auto_is_cargo_when_nix_builds_unsandboxed() -> None:
    backend, why = resolve_backend("auto", nix="/usr/bin/nix", sandbox=SANDBOX_OFF)
    assert backend == "cargo"
    assert why.startswith("auto: ")  # the pipeline's notice, not a failure
    assert "sandbox = false" in why and "make nix" in why and "build-users-group = nixbld" in why


def test_nix_refuses_to_build_unsandboxed_and_says_how_to_turn_the_sandbox_on(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as error:
        resolve_backend("nix", nix="/usr/bin/nix", sandbox=SANDBOX_OFF)
    message = str(error.value)
    for words in (
        "sandbox = false",
        "make nix",
        "sandbox = true",
        "build-users-group = nixbld",
        "/etc/nix/nix.conf",
        "--backend cargo",
    ):
        assert words in message
    # Nix.build checks too, before running anything
    runner = RecordingRunner({})
    with pytest.raises(ConfigError, match="sandbox"):
        Nix(runner, executable="/usr/bin/nix", sandbox=SANDBOX_OFF).build(tmp_path, tmp_path / "link", timeout=1800)
    assert runner.argvs == []


class ConfigRunner(ProcessRunner):
    """Answers ``nix show-config --json`` with ``config`` (or fails with ``stderr``); counts the calls."""

    def __init__(self, config: dict[str, Any] | None, stderr: str = "") -> None:
        super().__init__()
        self.config, self.stderr, self.calls = config, stderr, 0

    def run(self, args: Sequence[Any], **kwargs: Any) -> Completed:  # type: ignore[override]
        self.calls += 1
        if self.config is None:
            return Completed(list(args), 1, "", self.stderr, 0.0)
        return Completed(list(args), 0, json.dumps({k: {"value": v} for k, v in self.config.items()}), "", 0.0)


@pytest.mark.parametrize(
    ("config", "on", "why"),
    [
        ({"sandbox": True, "build-users-group": "nixbld"}, True, "sandbox = true"),
        ({"sandbox": False, "build-users-group": "nixbld"}, False, "`sandbox = false`"),
        ({"sandbox": "relaxed", "build-users-group": "nixbld"}, False, "`sandbox = relaxed`"),
        ({"build-users-group": "nixbld"}, False, "no sandbox setting"),
        (None, False, "cannot tell: error: bad"),
    ],
)
def test_the_sandbox_probe_reads_nix_show_config(
    config: dict[str, Any] | None, on: bool, why: str, tmp_path: Path
) -> None:
    runner = ConfigRunner(config, "error: bad")
    # a configuration of its own: the per-process answer is not shared with other tests
    env = {"NIX_CONF_DIR": str(tmp_path)}
    state = nix_sandbox("/usr/bin/nix", runner, env=env)
    assert state.on is on and why in state.why
    assert nix_sandbox("/usr/bin/nix", runner, env=env) == state
    assert runner.calls == (1 if config is not None else 2)  # asked once; newer nix's `config show` tried too


@pytest.mark.skipif(os.geteuid() != 0, reason="nix as root only")
def test_root_without_build_users_is_not_sandboxed_enough(tmp_path: Path) -> None:
    runner = ConfigRunner({"sandbox": True, "build-users-group": "", "store": "auto"})
    state = nix_sandbox("/usr/bin/nix", runner, env={"NIX_CONF_DIR": str(tmp_path)})
    assert not state.on and "build-users-group" in state.why


def test_auto_is_cargo_without_nix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert resolve_backend("auto") == ("cargo", "auto: nix is not installed")


def test_cargo_is_cargo_even_with_nix() -> None:
    assert resolve_backend("cargo", nix="/usr/bin/nix") == ("cargo", "asked for")


def test_nix_without_nix_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError) as error:
        resolve_backend("nix")
    message = str(error.value)
    assert "make install" in message
    assert "apt-get install nix-bin" in message
    assert "scripts/setup-nix.sh" in message
    assert "--backend cargo" in message


def test_unknown_backend_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="auto, nix or cargo"):
        resolve_backend("docker")


def test_pipeline_with_nix_backend_and_no_nix_fails_before_any_work(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    settings = Settings(cache_dir=tmp_path, registry=str(tmp_path / "nowhere"), backend="nix")
    with pytest.raises(ConfigError, match="apt-get install nix-bin"):
        Pipeline(settings).run("anything")
    assert not any((tmp_path / "workspaces").iterdir())  # the cache's directories exist (made private), empty


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKEBOT_BACKEND", "nix")
    monkeypatch.setenv("FLAKEBOT_NIXPKGS", "path:/x")
    monkeypatch.setenv("FLAKEBOT_NIX_SUBSTITUTERS", "https://cache.example")
    settings = Settings()
    assert (settings.backend, settings.nixpkgs, settings.nix_substituters) == (
        "nix",
        "path:/x",
        "https://cache.example",
    )


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("github:NixOS/nixpkgs/nixos-24.05", "github:NixOS/nixpkgs/nixos-24.05"),
        ("path:/abs/nixpkgs", "path:/abs/nixpkgs"),
        ("path:rel/nixpkgs", "path:/base/rel/nixpkgs"),
        ("path:./rel?narHash=x", "path:/base/rel?narHash=x"),
        ("./rel", "path:/base/rel"),
        ("/abs", "path:/abs"),
    ],
)
def test_normalize_flake_ref(ref: str, expected: str) -> None:
    assert normalize_flake_ref(ref, Path("/base")) == expected


def test_lock_hash_is_the_sha256_of_flake_lock(tmp_path: Path) -> None:
    assert lock_hash(tmp_path) == ""
    (tmp_path / "flake.lock").write_text('{"version": 7}\n')
    assert lock_hash(tmp_path) == "sha256-" + hashlib.sha256(b'{"version": 7}\n').hexdigest()


def test_magic_options_and_config_reach_the_settings() -> None:
    from traitlets.config import Config

    from flakebot_magic.magics import FlakebotMagics

    config = Config()
    config.FlakebotMagics.backend = "nix"
    config.FlakebotMagics.nix_substituters = "https://cache.example.org"
    config.FlakebotMagics.nix_trusted_public_keys = "cache.example.org-1:KEY="
    magics = FlakebotMagics(shell=None, config=config)
    args = magics._parse("--nixpkgs path:/x --builders ssh://b")
    settings = magics._settings(args)
    assert (settings.backend, settings.nixpkgs, settings.nix_builders) == ("nix", "path:/x", "ssh://b")
    assert settings.nix_substituters == "https://cache.example.org"
    assert settings.nix_trusted_public_keys == "cache.example.org-1:KEY="
    assert magics._settings(magics._parse("--backend cargo")).backend == "cargo"


# -- nix's command line (a recording runner, no nix needed) -----------------


class RecordingRunner(ProcessRunner):
    """Records every argv; answers nix commands from ``answers`` (first match on a word) instead of running them."""

    def __init__(self, answers: dict[str, Completed]) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []
        self.answers = answers

    def run(self, args: Sequence[Any], **kwargs: Any) -> Completed:  # type: ignore[override]
        argv = [os.fspath(a) for a in args]
        self.argvs.append(argv)
        for word, answer in self.answers.items():
            if word in argv:
                return answer
        return Completed(argv, 0, "", "", 0.0)


def test_options_reach_every_nix_command_line(tmp_path: Path) -> None:
    out = "/nix/store/" + "a" * 32 + "-x-1.0"
    runner = RecordingRunner({"build": Completed([], 0, json.dumps([{"outputs": {"out": out}}]), "", 0.0)})
    options = NixOptions(
        builders="ssh://builder x86_64-linux - 8 ; ssh://arm aarch64-linux",
        substituters="https://cache.example.org https://cache.nixos.org",
        trusted_public_keys="cache.example.org-1:AAAA= cache.nixos.org-1:BBBB=",
    )
    nix = Nix(runner, executable="/usr/bin/nix", options=options, sandbox=SANDBOX_ON)
    assert nix.build(tmp_path, tmp_path / "link", timeout=60) == Path(out)
    nix.add_root(Path(out), tmp_path / "root")
    build_argv, root_argv = runner.argvs
    for argv in (build_argv, root_argv):
        joined = " ".join(argv)
        assert "--option builders ssh://builder x86_64-linux - 8 ; ssh://arm aarch64-linux" in joined
        assert "--option substituters https://cache.example.org https://cache.nixos.org" in joined
        assert "--option trusted-public-keys cache.example.org-1:AAAA= cache.nixos.org-1:BBBB=" in joined
    assert build_argv[:3] == ["/usr/bin/nix", *NIX_FEATURES]
    assert build_argv[build_argv.index("--out-link") + 1] == str(tmp_path / "link")


def test_unset_options_leave_nix_conf_in_charge() -> None:
    assert NixOptions().argv() == []
    assert NixOptions(substituters="").argv() == ["--option", "substituters", ""]


@pytest.fixture
def fake_nix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``nix`` on PATH that writes its argv (one per line) to a file and fails."""
    bindir = tmp_path / "fakebin"
    bindir.mkdir()
    record = tmp_path / "nix-argv"
    script = bindir / "nix"
    config = json.dumps({"sandbox": {"value": True}, "build-users-group": {"value": "nixbld"}})
    script.write_text(
        "#!/bin/sh\n"
        f"case \"$*\" in *show-config*) echo '{config}'; exit 0 ;; esac\n"
        f'printf "%s\\n" "$@" >> {record}\necho "error: fake nix" >&2\nexit 1\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return record


@pytest.mark.cargo
def test_command_options_reach_the_nix_argv(
    fake_nix: Path, session_registry: DirectoryRegistry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(
        [
            "build",
            "--crate",
            "tinyecho",
            "--registry",
            str(session_registry.path),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--backend",
            "nix",
            "--quiet",
            "--nixpkgs",
            "path:/some/nixpkgs",
            "--builders",
            "ssh://b1 x86_64-linux",
            "--substituters",
            "https://cache.example.org",
            "--trusted-public-keys",
            "cache.example.org-1:KEY=",
        ]
    )
    assert code == 1
    assert "fake nix" in capsys.readouterr().err
    argv = fake_nix.read_text().splitlines()
    assert argv[argv.index("builders") + 1] == "ssh://b1 x86_64-linux"
    assert argv[argv.index("substituters") + 1] == "https://cache.example.org"
    assert argv[argv.index("trusted-public-keys") + 1] == "cache.example.org-1:KEY="
    assert argv[-2:] == ["flake", "lock"]
    flake = (tmp_path / "cache" / "workspaces" / "tinyecho" / "flake.nix").read_text()
    assert 'inputs.nixpkgs.url = "path:/some/nixpkgs";' in flake


# -- real nix ---------------------------------------------------------------


def _nix(
    *args: str, cwd: Path, timeout: float = 600, stdin: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    assert NIX is not None
    done = subprocess.run(
        [NIX, *NIX_FEATURES, *args], cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert done.returncode == 0, f"nix {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    return done


def _valid(path: Path) -> bool:
    nix_store = Path(NIX or "nix").with_name("nix-store")
    return subprocess.run([str(nix_store), "--check-validity", str(path)], capture_output=True).returncode == 0


def _nix_settings(cache: Path, registry: str) -> Settings:
    return Settings(cache_dir=cache, registry=registry, backend="nix", nixpkgs=f"path:{STAND_IN}")


class CountingRunner(ProcessRunner):
    """A real runner that remembers every argv it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []

    def run(self, args: Sequence[Any], **kwargs: Any) -> Completed:  # type: ignore[override]
        self.argvs.append([os.fspath(a) for a in args])
        return super().run(args, **kwargs)

    def nix_commands(self) -> list[list[str]]:
        return [a for a in self.argvs if Path(a[0]).name in ("nix", "nix-store")]


@pytest.fixture(scope="module")
def echo_settings(
    nix_ready: None, session_registry: DirectoryRegistry, tmp_path_factory: pytest.TempPathFactory
) -> Settings:
    return _nix_settings(tmp_path_factory.mktemp("nixcache"), str(session_registry.path))


@pytest.fixture(scope="module")
def echo_run(echo_settings: Settings) -> tuple[Tool, Recorder]:
    """tinyecho through the whole pipeline with the nix backend, once per module."""
    recorder = Recorder()
    tool = Pipeline(echo_settings, observers=[recorder]).run("", crate="tinyecho")
    return tool, recorder


@pytest.mark.nix
def test_nix_deploy_gives_a_working_tool_in_the_nix_store(
    echo_run: tuple[Tool, Recorder], echo_settings: Settings
) -> None:
    tool, recorder = echo_run
    assert tool.backend == "nix"
    assert str(tool.store_path).startswith("/nix/store/") and tool.store_path.name.endswith("-tinyecho-0.2.0")
    assert tool.binary == tool.store_path / "bin" / "tinyecho"
    assert _valid(tool.store_path)
    assert tool("hello", "nix", input="") == "hello nix\n"
    assert tool(input="quiet") == "QUIET"
    statuses = {e.stage: e.status for e in recorder.of(StageFinished)}
    assert all(statuses[s] == "done" for s in ("fork", "flake", "build", "test", "deploy", "client")), statuses
    assert any(n.message == "backend: nix (asked for)" for n in recorder.of(Notice))
    deploy = next(e for e in recorder.of(StageFinished) if e.stage == "deploy")
    assert deploy.detail == str(tool.store_path)


@pytest.mark.nix
def test_the_flake_and_its_lock_are_committed(echo_run: tuple[Tool, Recorder], echo_settings: Settings) -> None:
    tool, _ = echo_run
    workspace = echo_settings.cache.workspaces / "tinyecho"
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=workspace, capture_output=True, text=True, check=True
    ).stdout.split()
    assert {"flake.nix", "flake.lock", "Cargo.lock"} <= set(tracked)
    assert subprocess.run(["git", "status", "--porcelain"], cwd=workspace, capture_output=True, text=True).stdout == ""
    lock = json.loads((workspace / "flake.lock").read_text())
    locked = lock["nodes"]["nixpkgs"]["locked"]
    assert locked["type"] == "path" and locked["path"] == str(STAND_IN) and locked["narHash"].startswith("sha256-")
    assert tool.lock_hash == lock_hash(workspace)
    assert tool.provenance["nixpkgs"] == locked
    assert f"flake.lock {tool.lock_hash}" in pretty(tool)  # what IPython shows for `tool`
    assert str(tool.store_path) in pretty(tool)
    assert tool.lock_hash in tool._repr_html_()


@pytest.mark.nix
def test_a_gc_root_keeps_the_tool(echo_run: tuple[Tool, Recorder], echo_settings: Settings) -> None:
    tool, _ = echo_run
    root = echo_settings.cache.gcroots / "tinyecho"
    assert root.is_symlink() and Path(os.readlink(root)) == tool.store_path
    assert not list((echo_settings.cache.gcroots / ".pending").iterdir())
    roots = subprocess.run(
        [str(Path(NIX or "nix").with_name("nix-store")), "--gc", "--print-roots"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"{root} -> {tool.store_path}" in roots


@pytest.mark.nix
def test_a_second_request_is_a_cache_hit_without_nix(echo_run: tuple[Tool, Recorder], echo_settings: Settings) -> None:
    first, _ = echo_run
    runner = CountingRunner()
    recorder = Recorder()
    again = Pipeline(echo_settings, runner=runner, observers=[recorder]).run("", crate="tinyecho")
    assert again.store_path == first.store_path and again.binary == first.binary
    assert again.lock_hash == first.lock_hash
    assert runner.nix_commands() == []  # no evaluation, no build: the recipe and the GC root answer
    statuses = {e.stage: e.status for e in recorder.of(StageFinished)}
    assert statuses["build"] == statuses["deploy"] == "cached"


@pytest.mark.nix
def test_a_collected_root_is_restored_on_a_hit(echo_run: tuple[Tool, Recorder], echo_settings: Settings) -> None:
    first, _ = echo_run
    root = echo_settings.cache.gcroots / "tinyecho"
    root.unlink()
    runner = CountingRunner()
    again = Pipeline(echo_settings, runner=runner).run("", crate="tinyecho")
    assert again.store_path == first.store_path
    assert [Path(a[0]).name for a in runner.nix_commands()] == ["nix-store"]  # --realise --add-root, no build
    assert Path(os.readlink(root)) == first.store_path


@pytest.mark.nix
def test_the_store_path_is_stable_across_caches(
    echo_run: tuple[Tool, Recorder], session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    first, _ = echo_run
    settings = _nix_settings(tmp_path / "other-cache", str(session_registry.path))
    again = Pipeline(settings).run("", crate="tinyecho", name="echo2")
    assert again.store_path == first.store_path
    assert Path(os.readlink(settings.cache.gcroots / "echo2")) == first.store_path

    # clean: a tool that is gone (its record, its workspace and its store entry, which would re-register it:
    # the store is evidence) loses its root; the store path itself is nix's
    record = Inventory(settings.cache.tools).get("echo2")
    assert record is not None
    Inventory(settings.cache.tools).remove("echo2")
    shutil.rmtree(settings.cache.workspaces / "echo2")
    shutil.rmtree(record.store_path)
    report = clean(settings)  # an empty inventory and an empty store agree: nothing to check first
    assert settings.cache.gcroots / "echo2" in report.removed
    assert not (settings.cache.gcroots / "echo2").is_symlink()
    assert _valid(first.store_path)  # still rooted by the module's cache


@pytest.mark.nix
def test_clean_all_removes_every_root(
    session_registry: DirectoryRegistry, echo_run: tuple[Tool, Recorder], tmp_path: Path
) -> None:
    first, _ = echo_run
    settings = _nix_settings(tmp_path / "cache", str(session_registry.path))
    Pipeline(settings).run("", crate="tinyecho", name="echo3")
    assert (settings.cache.gcroots / "echo3").is_symlink()
    clean(settings, everything=True)
    layout = settings.cache  # made again, empty: only the layout's own .pending/ is under gcroots/
    assert [p.name for p in layout.gcroots.iterdir()] == [".pending"] and not any(layout.pending_gcroots.iterdir())
    assert _valid(first.store_path)


@pytest.mark.nix
def test_nix_flake_check_passes_on_the_generated_flake(
    echo_run: tuple[Tool, Recorder], echo_settings: Settings
) -> None:
    workspace = echo_settings.cache.workspaces / "tinyecho"
    _nix("flake", "check", cwd=workspace)
    drv = _nix("eval", "--raw", f".#checks.{SYSTEM}.default.drvPath", cwd=workspace).stdout
    log = _nix("log", drv, cwd=workspace).stdout
    plain = re.sub(r"\x1b\[[0-9;]*m|\x1b\(B", "", log)
    assert "test result: ok. 1 passed; 0 failed" in plain  # the crate's own test ran


@pytest.mark.nix
def test_nix_run_runs_the_app(echo_run: tuple[Tool, Recorder], echo_settings: Settings) -> None:
    workspace = echo_settings.cache.workspaces / "tinyecho"
    assert _nix("run", ".", "--", "from", "nix", "run", cwd=workspace).stdout == "from nix run\n"
    assert _nix("run", ".", cwd=workspace, stdin="shout").stdout == "SHOUT"


@pytest.mark.nix
def test_the_rebuild_is_bit_identical(echo_run: tuple[Tool, Recorder], echo_settings: Settings) -> None:
    tool, _ = echo_run
    workspace = echo_settings.cache.workspaces / "tinyecho"
    before = hashlib.sha256(tool.binary.read_bytes()).hexdigest()
    # --rebuild builds again and fails when the result differs from the store path bit for bit
    done = _nix("build", "--rebuild", "--no-link", cwd=workspace)
    assert "may not be deterministic" not in done.stderr
    assert hashlib.sha256(tool.binary.read_bytes()).hexdigest() == before
    binary = tool.binary.read_bytes()
    for host_path in (b"/tmp/nix-build-", str(workspace).encode()):
        assert host_path not in binary, f"{host_path!r} leaked into the binary"


@pytest.mark.nix
def test_replit_export_builds_and_runs_the_tool_from_its_flake(
    echo_run: tuple[Tool, Recorder], echo_settings: Settings, tmp_path: Path
) -> None:
    tool, _ = echo_run
    exported = export_replit(echo_settings, "tinyecho", tmp_path / "repl")
    assert (tmp_path / "repl" / "tinyecho" / "flake.nix").is_file()
    assert (tmp_path / "repl" / "tinyecho" / "flake.lock").is_file()
    assert not (tmp_path / "repl" / "tinyecho" / ".git").exists()
    dot_replit = exported.dot_replit.read_text()
    assert 'run = ["tinyecho", "--help"]' in dot_replit and "[nix]" in dot_replit
    pkgs = f'(builtins.getFlake "path:{STAND_IN}").legacyPackages.{SYSTEM}'
    deps = f"(import {exported.replit_nix} {{ pkgs = {pkgs}; }}).deps"
    # flakes on: builtins.getFlake builds the exported flake as locked: the very same store path
    with_flakes = _nix("eval", "--impure", "--raw", "--expr", f"toString (builtins.head {deps})", cwd=tmp_path).stdout
    assert with_flakes == str(tool.store_path)
    # flakes off (nix-build, no getFlake): the flake's own outputs, given Replit's pkgs
    nix_build = Path(NIX or "nix").with_name("nix-build")
    legacy_pkgs = f'(import {STAND_IN}/pkgs.nix {{ lib = import {STAND_IN}/lib.nix; system = "{SYSTEM}"; }})'
    done = subprocess.run(
        [
            str(nix_build),
            "--option",
            "experimental-features",
            "",
            "--no-out-link",
            "-E",
            f"builtins.head (import {exported.replit_nix} {{ pkgs = {legacy_pkgs}; }}).deps",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = Path(done.stdout.strip())
    assert (
        subprocess.run([str(built / "bin" / "tinyecho"), "replit"], capture_output=True, text=True).stdout == "replit\n"
    )


@pytest.mark.nix
def test_export_command(
    echo_run: tuple[Tool, Recorder], echo_settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main(
        ["export", "--cache-dir", str(echo_settings.cache_dir), "--replit", str(tmp_path / "r"), "tinyecho"]
    )
    assert code == 0
    assert (tmp_path / "r" / ".replit").is_file() and (tmp_path / "r" / "replit.nix").is_file()
    assert "replit.nix" in capsys.readouterr().out
    assert (
        cli_main(["export", "--cache-dir", str(echo_settings.cache_dir), "--replit", str(tmp_path / "r"), "nosuch"])
        == 1
    )


# -- errors -----------------------------------------------------------------


def _flake_repo(path: Path, text: str) -> Path:
    path.mkdir(parents=True)
    (path / "flake.nix").write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=path, check=True)
    subprocess.run(["git", "add", "flake.nix"], cwd=path, check=True)
    return path


@pytest.mark.nix
def test_an_evaluation_error_names_the_flake_file_and_line(nix_ready: None, tmp_path: Path) -> None:
    repo = _flake_repo(
        tmp_path / "bad",
        (
            "{\n"
            "  outputs = { self }: {\n"
            f"    packages.{SYSTEM}.default = let x = 1; in x + undefinedThing;\n"
            "  };\n"
            "}\n"
        ),
    )
    with pytest.raises(FlakeError) as error:
        Nix(ProcessRunner()).build(repo, tmp_path / "link", timeout=1800)
    assert error.value.file == repo / "flake.nix" and error.value.line == 3
    message = str(error.value)
    assert "undefined variable 'undefinedThing'" in message
    assert "flake.nix:3:" in message  # named, never opened through a path nix printed (issue 19, A09)
    assert "3 | packages" in message
    assert not (tmp_path / "link").exists()


@pytest.mark.nix
def test_a_failed_build_carries_the_tail_of_its_log(nix_ready: None, tmp_path: Path) -> None:
    nonce = uuid.uuid4().hex
    repo = _flake_repo(
        tmp_path / "boom",
        (
            "{\n  outputs = { self }: {\n"
            f"    packages.{SYSTEM}.default = derivation {{\n"
            f'      name = "boom"; system = "{SYSTEM}"; builder = "/bin/sh"; PATH = "/usr/bin:/bin";\n'
            f'      args = [ "-c" "echo {nonce}; for i in $(seq 1 100); do echo line $i; done; echo last words >&2; exit 3" ];\n'
            "    };\n  };\n}\n"
        ),
    )
    with pytest.raises(FlakeError) as error:
        Nix(ProcessRunner()).build(repo, tmp_path / "link", timeout=1800)
    tail = error.value.log_tail.splitlines()
    assert tail[-1] == "last words" and tail[-2] == "line 100"
    assert nonce not in error.value.log_tail  # a tail, not the whole log
    assert error.value.drv.endswith("-boom.drv")
    assert "last words" in str(error.value) and "nix log" in str(error.value)
    assert not (tmp_path / "link").exists()


def _processes_with_env(entry: str, *, settle: float = 2.0) -> list[int]:
    """Pids of live processes whose environment holds ``entry`` (``NAME=value``), after up to ``settle`` seconds.

    A builder in nix's sandbox has its own pids and its cwd reads ``/build``;
    its environment (the derivation's attributes) still tells it apart.
    """
    wanted = entry.encode()
    deadline = time.monotonic() + settle
    while True:
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if wanted in environ and state != "Z":
                found.append(int(pid))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.nix
def test_cancelling_nix_build_leaves_no_process_store_path_or_root(nix_ready: None, tmp_path: Path) -> None:
    nonce = uuid.uuid4().hex
    repo = _flake_repo(
        tmp_path / "slow",
        (
            "{\n  outputs = { self }: {\n"
            f"    packages.{SYSTEM}.default = derivation {{\n"
            f'      name = "slow-{nonce[:8]}"; system = "{SYSTEM}"; builder = "/bin/sh"; PATH = "/usr/bin:/bin";\n'
            f'      FLAKEBOT_TEST_NONCE = "{nonce}";\n'
            f'      args = [ "-c" "mkdir -p $out; sleep 120; echo done > $out/done" ];\n'
            "    };\n  };\n}\n"
        ),
    )
    out = Path(_nix("eval", "--raw", f".#packages.{SYSTEM}.default.outPath", cwd=repo).stdout)
    cancel = CancelToken()
    failure: list[BaseException] = []

    def build() -> None:
        try:
            Nix(ProcessRunner(cancel)).build(repo, tmp_path / "link", timeout=1800)
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=build)
    thread.start()
    deadline = time.monotonic() + 120
    builders: list[int] = []
    while not builders and time.monotonic() < deadline:
        builders = _processes_with_env(f"FLAKEBOT_TEST_NONCE={nonce}", settle=0)
        time.sleep(0.1)
    assert builders, f"the builder never started: {failure}"
    time.sleep(0.3)
    cancelled_at = time.monotonic()
    cancel.cancel()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert isinstance(failure[0], Cancelled)
    assert time.monotonic() - cancelled_at < 25
    assert _processes_with_env(f"FLAKEBOT_TEST_NONCE={nonce}") == [], "the builder outlived the cancelled nix build"
    # never registered: to nix it is garbage (the next build of it starts
    # afresh, nix-collect-garbage deletes it), and no root or recipe names it
    assert not _valid(out)
    assert not (tmp_path / "link").exists() and not (tmp_path / "link").is_symlink()


@pytest.mark.nix
@pytest.mark.cargo
def test_a_cancelled_pipeline_leaves_no_root_and_no_recipe(
    nix_ready: None, session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    settings = _nix_settings(tmp_path / "cache", str(session_registry.path))
    cancel = CancelToken()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            Pipeline(settings, cancel=cancel).run("", crate="slowbuild")
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    workspace = settings.cache.workspaces / "slowbuild"
    deadline = time.monotonic() + 180
    pending = settings.cache.gcroots / ".pending"
    # both are running: cargo test's build script in the workspace, nix build's somewhere in /tmp
    in_nix = "nix-build-slowbuild-0.1.0.drv-*/source/build-script-started"
    while time.monotonic() < deadline and not (
        (workspace / "build-script-started").exists() and list(Path("/tmp").glob(in_nix))
    ):
        time.sleep(0.2)
    assert (workspace / "build-script-started").exists() and list(Path("/tmp").glob(in_nix)), failure
    cancel.cancel()
    thread.join(timeout=60)
    assert not thread.is_alive()
    assert failure and isinstance(failure[0], Cancelled), failure
    assert processes_in(workspace) == []
    assert not pending.exists() or list(pending.iterdir()) == []
    assert not (settings.cache.gcroots / "slowbuild").exists()
    assert not settings.cache.recipes.exists() or list(settings.cache.recipes.iterdir()) == []
    out = Path(_nix("eval", "--raw", f".#packages.{SYSTEM}.default.outPath", cwd=workspace).stdout)
    assert _processes_with_env(f"out={out}") == []  # nix's builder (in its sandbox) is gone too
    assert not _valid(out)


# -- the issue's "done when": the markdown request, deployed through nix ----


@pytest.mark.nix
@pytest.mark.cargo
@pytest.mark.skipif(
    not (DEBIAN_REGISTRY / "pulldown-cmark-0.9.2").is_dir(), reason="Debian's registry is not installed"
)
def test_markdown_request_through_nix(nix_ready: None, tmp_path_factory: pytest.TempPathFactory) -> None:
    settings = _nix_settings(tmp_path_factory.mktemp("mdcache"), str(DEBIAN_REGISTRY))
    md = Pipeline(settings).run("render markdown to html", name="md")
    assert md.backend == "nix" and md.crate == "pulldown-cmark"
    assert md.binary == md.store_path / "bin" / "pulldown-cmark" and str(md.store_path).startswith("/nix/store/")
    assert md("# Hi") == "<h1>Hi</h1>\n"
    runner = CountingRunner()
    again = Pipeline(settings, runner=runner).run("render markdown to html", name="md")
    assert again.store_path == md.store_path
    assert runner.nix_commands() == []
