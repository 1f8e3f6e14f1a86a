"""``auto`` is decided once, up front, from cached probes: offline it is cargo within a second, with a notice."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from tinycrates import Recorder

from flakebot_magic.backends import decide, nixpkgs_lockable
from flakebot_magic.backends.nix import PROBE_TTL
from flakebot_magic.backends.nix_command import nix_sandbox
from flakebot_magic.config import Settings
from flakebot_magic.events import Notice, StageFinished
from flakebot_magic.host.cache import CacheLayout
from flakebot_magic.host.process import Completed, ProcessRunner
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry

#: the default nixpkgs input; the tests' loopback guard makes github.com unreachable, as offline
GITHUB_NIXPKGS = "github:NixOS/nixpkgs/nixos-24.05"


class RecordingRunner(ProcessRunner):
    """A real runner that remembers every argv it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.argvs: list[list[str]] = []

    def run(self, args: Sequence[Any], **kwargs: Any) -> Completed:
        self.argvs.append([os.fspath(a) for a in args])
        return super().run(args, **kwargs)


class NoRunner(ProcessRunner):
    """A runner that fails the test if anything runs."""

    def run(self, args: Sequence[Any], **kwargs: Any) -> Completed:
        raise AssertionError(f"no process should run, but {list(args)} did")


# -- the probe ------------------------------------------------------------------


def test_a_local_nixpkgs_is_decided_without_a_process(tmp_path: Path) -> None:
    nixpkgs = tmp_path / "nixpkgs"
    nixpkgs.mkdir()
    (nixpkgs / "flake.nix").write_text("{ outputs = _: { }; }\n")
    found = nixpkgs_lockable(f"path:{nixpkgs}", cache=CacheLayout(tmp_path / "cache"), runner=NoRunner())
    assert found.ok and str(nixpkgs) in found.why
    missing = nixpkgs_lockable("path:/nonexistent/nixpkgs", cache=CacheLayout(tmp_path / "cache"), runner=NoRunner())
    assert not missing.ok and "/nonexistent/nixpkgs" in missing.why
    empty = tmp_path / "empty"
    empty.mkdir()
    assert not nixpkgs_lockable(f"path:{empty}", cache=CacheLayout(tmp_path / "cache"), runner=NoRunner()).ok


def test_an_unreachable_github_reference_is_decided_in_under_a_second(tmp_path: Path) -> None:
    started = time.monotonic()
    found = nixpkgs_lockable(GITHUB_NIXPKGS, cache=CacheLayout(tmp_path), runner=ProcessRunner())
    assert time.monotonic() - started < 1.0
    assert not found.ok
    assert "cannot be reached" in found.why


def test_the_answer_is_remembered_per_reference_until_it_expires(tmp_path: Path) -> None:
    nixpkgs = tmp_path / "nixpkgs"
    ref, cache = f"path:{nixpkgs}", tmp_path / "cache"
    clock = [1000.0]
    assert not nixpkgs_lockable(ref, cache=CacheLayout(cache), runner=NoRunner(), now=lambda: clock[0]).ok
    assert (cache / "probes" / "nixpkgs.json").is_file()
    nixpkgs.mkdir()
    (nixpkgs / "flake.nix").write_text("{ outputs = _: { }; }\n")
    clock[0] += PROBE_TTL / 2  # remembered: not asked again
    assert not nixpkgs_lockable(ref, cache=CacheLayout(cache), runner=NoRunner(), now=lambda: clock[0]).ok
    # another reference has its own answer
    assert not nixpkgs_lockable(
        "path:/nonexistent", cache=CacheLayout(cache), runner=NoRunner(), now=lambda: clock[0]
    ).ok
    clock[0] += PROBE_TTL  # expired: asked again
    assert nixpkgs_lockable(ref, cache=CacheLayout(cache), runner=NoRunner(), now=lambda: clock[0]).ok


# -- the decision -----------------------------------------------------------------


def test_an_explicit_backend_is_taken_as_asked(tmp_path: Path) -> None:
    choice = decide(Settings(cache_dir=tmp_path, backend="cargo"), NoRunner())
    assert (choice.name, choice.why, choice.auto, choice.fallback) == ("cargo", "asked for", False, "")


def test_auto_without_nix_is_cargo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nix on it
    choice = decide(Settings(cache_dir=tmp_path, backend="auto"), NoRunner())
    assert (choice.name, choice.why, choice.auto, choice.fallback) == ("cargo", "auto: nix is not installed", True, "")


@pytest.fixture
def sandboxed_nix() -> None:
    state = nix_sandbox()  # asked once per process: the timing below is the nixpkgs probe's alone
    if not state.on:
        pytest.skip(f"auto considers nix only when it builds in its sandbox: {state.why}")


@pytest.mark.nix
def test_auto_with_an_offline_nixpkgs_decides_for_cargo_in_under_a_second(sandboxed_nix: None, tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path, backend="auto", nixpkgs=GITHUB_NIXPKGS)
    started = time.monotonic()
    choice = decide(settings, ProcessRunner())
    assert time.monotonic() - started < 1.0
    assert (choice.name, choice.auto) == ("cargo", True)
    assert choice.why.startswith(f"auto: nix cannot lock the flake's nixpkgs input {GITHUB_NIXPKGS} here")
    assert choice.fallback
    # the second run asks nothing: the answer is in the cache dir
    assert decide(settings, NoRunner()) == choice


@pytest.mark.nix
def test_auto_with_a_local_nixpkgs_decides_for_nix(sandboxed_nix: None, tmp_path: Path) -> None:
    nixpkgs = tmp_path / "nixpkgs"
    nixpkgs.mkdir()
    (nixpkgs / "flake.nix").write_text("{ outputs = _: { }; }\n")
    choice = decide(Settings(cache_dir=tmp_path, backend="auto", nixpkgs=str(nixpkgs)), NoRunner())
    assert (choice.name, choice.auto, choice.fallback) == ("nix", True, "")


@pytest.mark.nix
@pytest.mark.cargo
def test_an_offline_auto_build_is_cargo_with_a_notice_and_no_failed_stage(
    sandboxed_nix: None, session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    recorder, runner = Recorder(), RecordingRunner()
    settings = Settings(cache_dir=tmp_path, registry=str(session_registry.path), backend="auto", nixpkgs=GITHUB_NIXPKGS)
    tool: Any = Pipeline(settings, observers=[recorder], runner=runner).run("", crate="tinyecho")
    assert tool.backend == "cargo" and tool.provenance["backend"] == "cargo"
    assert tool(input="hi") == "HI"
    finished = recorder.of(StageFinished)
    assert [e for e in finished if e.status == "failed"] == []
    assert [e.status for e in finished if e.stage == "flake"] == ["done"]  # one flake row, cargo's
    notices = [n.message for n in recorder.of(Notice)]
    assert any(n.startswith("backend: cargo (auto: nix cannot lock") for n in notices), notices
    assert not any(n.startswith("backend: nix") for n in notices), notices
    assert any("falling back to the cargo backend" in n and "--nixpkgs" in n for n in notices), notices
    # no nix flake lock that cannot succeed: nix ran for nothing but the probes
    assert not [argv for argv in runner.argvs if "lock" in argv], runner.argvs


@pytest.mark.nix
@pytest.mark.cargo
def test_a_lock_that_fails_after_all_is_a_notice_and_a_skipped_row(
    sandboxed_nix: None, session_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    """The probe said yes (a local flake), nix flake lock said no (it does not parse): cargo builds, nothing failed."""
    nixpkgs = tmp_path / "broken-nixpkgs"
    nixpkgs.mkdir()
    (nixpkgs / "flake.nix").write_text("{ this is not nix\n")
    recorder = Recorder()
    settings = Settings(
        cache_dir=tmp_path / "cache", registry=str(session_registry.path), backend="auto", nixpkgs=str(nixpkgs)
    )
    tool: Any = Pipeline(settings, observers=[recorder]).run("", crate="tinyecho")
    assert tool.backend == "cargo" and tool(input="hi") == "HI"
    finished = recorder.of(StageFinished)
    assert [e for e in finished if e.status == "failed"] == []
    assert [e.status for e in finished if e.stage == "flake"] == ["skipped", "done"]
    notices = [n.message for n in recorder.of(Notice)]
    assert any("falling back to the cargo backend" in n for n in notices), notices
    # remembered: the next run decides for cargo up front
    assert decide(settings, NoRunner()).name == "cargo"
