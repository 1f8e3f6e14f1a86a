"""The sandbox's CPU limit follows each command's time limit (``Limits.cpu_for``), so it never fires first.

* every option that gives a sandboxed command its time limit (``build_timeout``, ``test_timeout``), at its
  default and at a large value: the command's RLIMIT_CPU is at least that many seconds on every usable CPU;
* through the real door: cargo (a stand-in that burns two CPU seconds) under ``Limits(cpu_seconds=1)`` runs to
  the end when its time limit allows it, and is killed by the CPU limit when it has no time limit to follow.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from tinycrates import write_registry

from flakebot_magic.config import Settings
from flakebot_magic.host.process import ProcessRunner
from flakebot_magic.options import OPTION_BY_NAME
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.sandbox import Limits, Sandbox
from flakebot_magic.sandbox.cargo import Cargo
from flakebot_magic.sandbox.limits import usable_cpus

#: the options that set a sandboxed command's wall time limit
TIME_LIMITS = ("build_timeout", "test_timeout")
#: the test interpreter, shown read-only in the sandbox that runs it
PYTHON = (sys.prefix, sys.base_prefix)


def _cpu(command: list[str]) -> int:
    return int(next(arg for arg in command if arg.startswith("--cpu=")).split("=", 1)[1])


@pytest.mark.parametrize("option", TIME_LIMITS)
@pytest.mark.parametrize("scale", [1, 4])
def test_the_cpu_limit_never_comes_before_the_time_limit(option: str, scale: int, tmp_path: Path) -> None:
    timeout = float(OPTION_BY_NAME[option].default) * scale
    settings = Settings(cache_dir=tmp_path / "cache", **{option: timeout})  # type: ignore[arg-type]
    sandbox = Sandbox(tmp_path, isolate=False)
    if sandbox.prlimit is None:
        pytest.skip("prlimit (util-linux) is not installed")
    seconds = getattr(settings, option)
    assert _cpu(sandbox.command(["cargo", "build"], timeout=seconds)) >= seconds * usable_cpus()
    assert _cpu(sandbox.command(["cargo", "build"])) == Limits().cpu_seconds  # no time limit: the fixed one


def test_the_default_options_no_longer_disagree() -> None:
    for option in TIME_LIMITS:
        assert Limits().cpu_for(float(OPTION_BY_NAME[option].default)) > OPTION_BY_NAME[option].default


def test_cargo_under_its_time_limit_is_not_killed_by_the_cpu_limit(tmp_path: Path) -> None:
    burn = "import time\nstart = time.process_time()\nwhile time.process_time() - start < 2.0: pass\nprint('done')"
    cargo_path = tmp_path / "burning-cargo"
    cargo_path.write_text(f'#!/bin/sh\nexec {sys.executable} -c "{burn}"\n')
    cargo_path.chmod(0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    registry = DirectoryRegistry(write_registry(tmp_path / "registry", []), tmp_path / "index")
    sandbox = Sandbox(workspace, read_only=PYTHON, limits=Limits(cpu_seconds=1))
    if sandbox.prlimit is None:
        pytest.skip("prlimit (util-linux) is not installed")
    cargo = Cargo(registry, ProcessRunner(), sandbox, executable=str(cargo_path))
    done = cargo.run("build", cwd=workspace, timeout=60)
    assert done.returncode == 0 and "done" in done.stdout, done.stderr
    # the control: the same command with no time limit to follow gets the fixed one second, and dies of it
    control = ProcessRunner().run(sandbox.command([str(cargo_path)]), cwd=workspace, env=sandbox.env(), timeout=60)
    killed = {-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL}  # bwrap passes it on
    assert control.returncode in killed and "done" not in control.stdout, control
