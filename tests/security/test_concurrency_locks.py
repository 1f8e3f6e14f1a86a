"""Concurrency and crashes: one build per tool name, clean spares a running build, a store swap survives kill -9.

The policy under test (see :mod:`flakebot_magic.host.locks`): a second build of a
name waits for the first up to ``WAIT_SECONDS`` and then fails with an error
naming the holder; ``clean`` keeps what a running build holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tinycrates import crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.host.cache import CacheLayout
from flakebot_magic.host.locks import ToolBusy, held_locks, tool_lock
from flakebot_magic.manage.cleanup import clean
from flakebot_magic.stages.deploy import lookup

ROOT = Path(__file__).resolve().parents[2]


def _python(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the process ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


_HOLD = """
    import sys, time
    from pathlib import Path
    from flakebot_magic.host.cache import CacheLayout
    from flakebot_magic.host.locks import tool_lock
    with tool_lock(CacheLayout(Path(sys.argv[1])), sys.argv[2]):
        Path(sys.argv[3]).write_text("held")
        time.sleep(60)
"""


# -- the lock itself ---------------------------------------------------------------------------


def test_a_second_holder_waits_then_names_the_first(tmp_path: Path) -> None:
    holder = _python(_HOLD, str(tmp_path), "shout", str(tmp_path / "held"))
    try:
        _wait_for(tmp_path / "held", holder)
        assert held_locks(CacheLayout(tmp_path))["shout"].pid == holder.pid
        started = time.monotonic()
        with pytest.raises(ToolBusy) as caught, tool_lock(CacheLayout(tmp_path), "shout", wait=0.5):
            pass
        assert time.monotonic() - started >= 0.5  # it waited first
        message = str(caught.value)
        assert f"Another build of the tool 'shout' is running: pid {holder.pid}" in message
        assert "--name" in message and caught.value.holder.pid == holder.pid
        assert "it will then come from the cache" in message
        # a --rebuild is not served from the cache, and the message must not promise it
        with pytest.raises(ToolBusy) as rebuilding, tool_lock(CacheLayout(tmp_path), "shout", wait=0.1, rebuild=True):
            pass
        assert "--rebuild builds it once more then; it does not come from the cache" in str(rebuilding.value)
        assert "it will then come from the cache" not in str(rebuilding.value)
        with tool_lock(CacheLayout(tmp_path), "other", wait=0):  # other names are free
            pass
    finally:
        holder.kill()
        holder.communicate()
    # the kernel drops a killed holder's lock: no stale lock to break by hand
    with tool_lock(CacheLayout(tmp_path), "shout", wait=2):
        assert held_locks(CacheLayout(tmp_path))["shout"].pid == os.getpid()
    assert held_locks(CacheLayout(tmp_path)) == {}


# -- two builds of one name, and clean, while a build runs ------------------------------------------

_GATED_BUILD_RS = r"""fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    std::fs::write(format!("{}/build-script-started", dir), "").ok(); // the release build's source is read-only: its marker comes from the tests' build
    for _ in 0..1200 {
        if std::path::Path::new(&format!("{}/release-gate", dir)).exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
"""

_BUILD = """
    import sys
    from pathlib import Path
    import flakebot_magic.host.locks
    from flakebot_magic.config import Settings
    from flakebot_magic.errors import FlakebotError
    from flakebot_magic.pipeline import Pipeline
    flakebot_magic.host.locks.WAIT_SECONDS = float(sys.argv[3])
    settings = Settings(cache_dir=Path(sys.argv[1]), registry=sys.argv[2], backend="cargo")
    try:
        tool = Pipeline(settings).run("", crate="gated", name="gated")
    except FlakebotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    print(tool.store_path)
"""


@pytest.mark.cargo
def test_a_build_of_a_busy_name_waits_or_names_the_holder_and_clean_spares_it(tmp_path: Path) -> None:
    gated = crate(
        "gated",
        manifest='[package]\nname = "gated"\nversion = "0.1.0"\nedition = "2021"\n',
        files={"src/main.rs": 'fn main() {\n    println!("gated");\n}\n', "build.rs": _GATED_BUILD_RS},
    )
    registry = str(write_registry(tmp_path / "registry", [gated]))
    cache = tmp_path / "cache"
    settings = Settings(cache_dir=cache, registry=registry, backend="cargo")
    workspace = cache / "workspaces" / "gated"

    first = _python(_BUILD, str(cache), registry, "10")
    try:
        _wait_for(workspace / "build-script-started", first)  # inside cargo, holding the lock

        # another process asking for the same name gives up with a clear error
        impatient = _python(_BUILD, str(cache), registry, "0.3")
        _, err = impatient.communicate(timeout=120)
        assert impatient.returncode == 2, err
        assert f"Another build of the tool 'gated' is running: pid {first.pid}" in err
        assert "Traceback" not in err

        # clean while the build runs: its workspace and its build outputs stay
        (cache / "workspaces" / ".old").mkdir(exist_ok=True)
        leftover = cache / "workspaces" / ".old" / "gated-20240101-000000-000000001"
        leftover.mkdir()
        report = clean(settings)
        assert workspace.is_dir() and (workspace / "target").is_dir()
        assert leftover.is_dir()
        assert any("gated" in kept and f"pid {first.pid}" in kept for kept in report.kept), report.kept
        assert any(line.startswith("kept ") for line in report.summary())

        # clean --all too: the running build keeps its workspace, its build outputs and its private cargo home
        cargo_home = cache / "workspaces" / ".sandbox" / "gated" / "cargo-home"
        assert cargo_home.is_dir()
        everything = clean(settings, everything=True)
        assert cargo_home.is_dir() and (workspace / "target").is_dir() and leftover.is_dir()
        assert any(str(cache / "workspaces" / ".sandbox" / "gated") in kept for kept in everything.kept)

        (workspace / "release-gate").write_text("")
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0, err
    store_path = Path(out.strip())
    assert (store_path / "bin" / "gated").is_file()

    # a patient second build waits for the lock and is then served from the cache
    patient = _python(_BUILD, str(cache), registry, "10")
    out2, err2 = patient.communicate(timeout=300)
    assert patient.returncode == 0, err2
    assert Path(out2.strip()) == store_path
    assert [p.name for p in (cache / "store").iterdir()] == [store_path.name]
    log = subprocess.run(["git", "log", "--format=%s"], cwd=workspace, capture_output=True, text=True, check=True)
    assert log.stdout.splitlines()[-1] == "Published source of gated 0.1.0"
    assert held_locks(CacheLayout(cache)) == {}
    # with no build running, clean takes what is left aside again
    assert leftover in clean(settings).removed


# -- a crash in the middle of a store swap ----------------------------------------------------------

_SWAP = """
    import json, os, shutil, signal, sys
    from pathlib import Path
    from flakebot_magic.stages import deploy
    store, when = Path(sys.argv[1]), sys.argv[2]

    def fill(staging):
        (staging / "bin").mkdir()
        (staging / "bin" / "tool").write_text("new")
        if when == "filling":
            os.kill(os.getpid(), signal.SIGKILL)

    if when == "removing-old":  # die after the swap, before the old entry is removed
        deploy.remove_tree = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    deploy.write_entry(store, "a" * 32, "tool", "1.0.0", fill, {"n": 2})
"""


@pytest.mark.parametrize("when", ["filling", "removing-old"])
def test_kill_9_during_a_store_swap_leaves_a_usable_entry(tmp_path: Path, when: str) -> None:
    from flakebot_magic.stages.deploy import write_entry

    store = tmp_path / "store"

    def fill(staging: Path) -> None:
        (staging / "bin").mkdir()
        (staging / "bin" / "tool").write_text("old")

    old = write_entry(store, "a" * 32, "tool", "1.0.0", fill, {"n": 1})
    crash = _python(_SWAP, str(store), when)
    crash.communicate(timeout=60)
    assert crash.returncode == -signal.SIGKILL

    entry = lookup(store, "a" * 32, "tool", "1.0.0")
    assert entry is not None and entry.path == old.path
    expected = {"filling": ("old", 1), "removing-old": ("new", 2)}[when]
    assert ((entry.path / "bin" / "tool").read_text(), entry.manifest["n"]) == expected
    assert json.loads((entry.path / "manifest.json").read_text())["hash"] == "a" * 32

    # what the dead run left is a staging directory that clean removes (its pid is gone)
    leftovers = [p for p in store.iterdir() if p.name.startswith(".staging-")]
    assert len(leftovers) == 1
    report = clean(Settings(cache_dir=tmp_path, registry=str(tmp_path)))
    assert leftovers[0] in report.removed
