"""A rebuild that fails, is cancelled or is killed leaves the ready tool exactly as it was (issue 12 item 2).

The tool's workspace (its HEAD the recorded commit), its inventory record, its
run log, ``show`` and its binary are compared before and after, with real
git, real cargo in the sandbox and a real ``kill -9``. The crate ``flip``
has a build script that waits for a ``release-gate`` file in the crate's own
directory: the published crate ships one, so the first build runs through;
a rebuild of a registry copy without it stays inside cargo until cancelled
or killed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tinycrates import crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.errors import BuildError, Cancelled
from flakebot_magic.events import StageFinished
from flakebot_magic.host.locks import held_locks
from flakebot_magic.manage import tools
from flakebot_magic.manage.cleanup import clean
from flakebot_magic.pipeline.background import start_build
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.records.runlog import attempt_log_path
from flakebot_magic.request import BuildRequest, RunFlags

pytestmark = pytest.mark.cargo

ROOT = Path(__file__).resolve().parents[2]

_GATED_BUILD_RS = r"""fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap();
    std::fs::write(format!("{}/build-script-started", dir), "").ok(); // the release build's source is read-only: its marker comes from the tests' build
    for _ in 0..600 {
        if std::path::Path::new(&format!("{}/release-gate", dir)).exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
"""
_MAIN = 'fn main() {\n    println!("flip {}", std::env::args().skip(1).collect::<Vec<_>>().join(" "));\n}\n'
_BROKEN_MAIN = "fn main() {\n    this does not compile\n}\n"

#: a build that forks and builds again, the cache not used (--rebuild)
REBUILD = RunFlags(rebuild=True)


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def built(tmp_path: Path) -> Iterator[tuple[Settings, Path]]:
    """``flip`` built once through the front doors' path (start_build: run log and record); its registry dir."""
    flip = crate(
        "flip",
        description="prints its arguments after the word flip",
        manifest='[package]\nname = "flip"\nversion = "0.1.0"\nedition = "2021"\nbuild = "build.rs"\n',
        files={"src/main.rs": _MAIN, "build.rs": _GATED_BUILD_RS, "release-gate": ""},
    )
    registry = write_registry(tmp_path / "registry", [flip])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    tool = start_build(settings, BuildRequest("", name="flip", crate="flip")).wait()
    assert tool("a", "b") == "flip a b\n"
    yield settings, registry / "flip-0.1.0"


def _state(settings: Settings) -> dict[str, Any]:
    """Everything a user sees of the tool ``flip``."""
    record = Inventory(settings.cache.tools).get("flip")
    assert record is not None
    workspace = Path(record.workspace)
    return {
        "record": record.to_json(),
        "show": tools.show_text(settings, "flip"),
        "logs": tools.logs(settings, "flip", last=None),
        "binary": Path(record.binary).read_bytes(),
        "head": _git(workspace, "rev-parse", "HEAD"),
        "status": _git(workspace, "status", "--porcelain"),
        "files": sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*") if ".git" not in p.parts),
    }


def _assert_unchanged(settings: Settings, before: dict[str, Any], *, attempt: str | None) -> None:
    """The tool as ``before``; ``attempt``: how a later run that made no tool ended (failed, cancelled), or None."""
    after = _state(settings)
    assert after["head"] == before["record"]["commit"]  # the workspace's HEAD is the recorded commit
    for key in ("record", "show", "binary", "head", "status", "files"):
        assert after[key] == before[key], key
    if attempt is not None:
        mention, rest = after["logs"].split("\n", 1)
        assert re.match(r"== a later build of flip (failed|was cancelled) \(", mention), mention
        assert str(attempt_log_path(settings, "flip", attempt)) in mention  # type: ignore[arg-type]
        assert rest == before["logs"]  # the ready tool's log, as it was
    else:
        assert after["logs"] == before["logs"]
        assert not any(attempt_log_path(settings, "flip", o).exists() for o in ("failed", "cancelled"))
    tool = tools.tool_of(Inventory(settings.cache.tools).get("flip"), settings)  # type: ignore[arg-type]
    assert tool("x") == "flip x\n"


def _next_dirs(settings: Settings) -> list[Path]:
    where = settings.cache.workspaces / ".next"
    return sorted(where.iterdir()) if where.is_dir() else []


def test_a_rebuild_that_stops_compiling_leaves_the_tool_as_it_was(built: tuple[Settings, Path]) -> None:
    settings, source = built
    before = _state(settings)
    (source / "src" / "main.rs").write_text(_BROKEN_MAIN)
    with pytest.raises(BuildError) as caught:
        start_build(settings, BuildRequest("", name="flip", crate="flip", flags=REBUILD)).wait()
    [attempt] = _next_dirs(settings)
    assert caught.value.workspace == attempt / "flip"  # the error says where the failed attempt is
    assert "this does not compile" in (attempt / "flip" / "src" / "main.rs").read_text()
    assert "cargo build failed for flip:" in str(caught.value)
    _assert_unchanged(settings, before, attempt="failed")
    failed = attempt_log_path(settings, "flip", "failed").read_text()
    assert "== run failed: BuildError" in failed and "'flip' is unchanged" in failed

    # clean takes the failed attempt (no build runs); the tool's workspace stays
    assert attempt in clean(settings).removed
    _assert_unchanged(settings, before, attempt="failed")

    # fixed, the rebuild goes through: the new workspace is swapped in, the old one moved aside
    (source / "src" / "main.rs").write_text(_MAIN.replace("flip {}", "flop {}"))
    seen: list[object] = []
    tool = start_build(
        settings, BuildRequest("", name="flip", crate="flip", flags=REBUILD), extra_observers=[seen.append]
    ).wait()
    assert tool("x") == "flop x\n"
    # the fork row names the workspace the tool has, not the .next/ one it was built in (gone once swapped in)
    [fork] = [e.detail for e in seen if isinstance(e, StageFinished) and e.stage == "fork"]
    assert fork == str(settings.cache.workspaces / "flip")
    record = Inventory(settings.cache.tools).get("flip")
    assert record is not None and record.commit != before["record"]["commit"]
    assert _git(Path(record.workspace), "rev-parse", "HEAD") == record.commit
    assert Path(record.workspace) == settings.cache.workspaces / "flip"
    [aside] = (settings.cache.workspaces / ".old").iterdir()
    assert _git(aside, "rev-parse", "HEAD") == before["record"]["commit"]
    assert _next_dirs(settings) == []
    assert not attempt_log_path(settings, "flip", "failed").exists()
    assert not tools.logs(settings, "flip").startswith("== a later build")


def _started(settings: Settings, proc: subprocess.Popen[str] | None = None, seconds: float = 120.0) -> Path:
    """The rebuild's attempt under .next/ (its workspace is ``flip`` in it), once its build script runs in cargo."""
    deadline = time.monotonic() + seconds
    while True:
        for attempt in _next_dirs(settings):
            if (attempt / "flip" / "build-script-started").exists():
                return attempt
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the build ended early: {proc.communicate()}")
        assert time.monotonic() < deadline, "the rebuild never reached its build script"
        time.sleep(0.05)


def test_a_rebuild_cancelled_mid_cargo_leaves_the_tool_as_it_was(built: tuple[Settings, Path]) -> None:
    settings, source = built
    before = _state(settings)
    (source / "release-gate").unlink()  # the rebuild's build script now waits
    run = start_build(settings, BuildRequest("", name="flip", crate="flip", flags=REBUILD))
    attempt = _started(settings)
    run.cancel("cancelled from the widget")
    with pytest.raises(Cancelled):
        run.wait()
    _assert_unchanged(settings, before, attempt="cancelled")
    # a cancel is logged as one: the stage cargo was in, and the run; no line calls it a failure
    logged = attempt_log_path(settings, "flip", "cancelled").read_text()
    assert "== run cancelled: Cancelled: " in logged and re.search(r"== build cancelled \(", logged), logged
    assert not re.search(r"== \S+ failed", logged), logged
    assert tools.logs(settings, "flip").startswith("== a later build of flip was cancelled (")
    assert attempt.is_dir()  # kept for a look, and clean's to remove
    assert held_locks(settings.cache) == {}
    assert attempt in clean(settings).removed


_KILLED_BUILD = """
    import sys
    from pathlib import Path
    from flakebot_magic.pipeline.background import start_build
    from flakebot_magic.config import Settings
    from flakebot_magic.request import BuildRequest, RunFlags
    REBUILD = RunFlags(rebuild=True)
    settings = Settings(cache_dir=Path(sys.argv[1]), registry=sys.argv[2], backend="cargo")
    start_build(settings, BuildRequest("", name="flip", crate="flip", flags=REBUILD)).wait()
"""


def test_a_rebuild_killed_with_sigkill_leaves_the_tool_as_it_was(built: tuple[Settings, Path]) -> None:
    settings, source = built
    before = _state(settings)
    (source / "release-gate").unlink()
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_KILLED_BUILD), str(settings.cache_dir), str(settings.registry)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        attempt = _started(settings, proc)
        # while it runs, clean spares its workspace under .next/
        report = clean(settings)
        assert attempt.is_dir() and attempt not in report.removed
        assert any(str(attempt) in kept and f"pid {proc.pid}" in kept for kept in report.kept), report.kept
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    (attempt / "flip" / "release-gate").write_text("")  # a build script outliving its cargo would now end
    _assert_unchanged(settings, before, attempt=None)
    # the crashed build's leftovers go with the next clean; the tool stays
    assert held_locks(settings.cache) == {}
    assert attempt in clean(settings).removed
    assert _next_dirs(settings) == []
    _assert_unchanged(settings, before, attempt=None)


def test_a_failed_first_build_keeps_its_log_and_is_listed(tmp_path: Path) -> None:
    """Without a tool, a failed run's log is ``NAME.failed.log`` (``NAME.log`` is only ever a tool's build log),
    and ``logs``, ``show`` and ``list`` show the attempt."""
    broken = crate(
        "flop",
        manifest='[package]\nname = "flop"\nversion = "0.1.0"\nedition = "2021"\n',
        files={"src/main.rs": _BROKEN_MAIN},
    )
    registry = write_registry(tmp_path / "registry", [broken])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    with pytest.raises(BuildError):
        start_build(settings, BuildRequest("", name="flop", crate="flop")).wait()
    assert attempt_log_path(settings, "flop", "failed").exists() and not (settings.cache.logs / "flop.log").exists()
    assert "== run failed: BuildError" in tools.logs(settings, "flop")
    assert [row[5] for row in tools.table(settings).rows()] == ["failed"]
    assert "cargo build failed for flop" in tools.show(settings, "flop").text
    assert (settings.cache.workspaces / "flop").is_dir() and _next_dirs(settings) == []
    shutil.rmtree(settings.cache.workspaces / "flop")
