"""Attacks on the cache by another local user: every cache directory is 0700, run logs 0600, even under umask 022.

A run log may hold whatever a crate's tests printed; workspaces hold model
output; the tool inventory holds HTTP tools' tokens. Another user of the machine
must not read any of it. A planted symlink where a log goes is replaced, never
followed (the file it pointed at is left as it was).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from flakebot_magic.config import Settings
from flakebot_magic.events import EventBus, RunFinished, StageStarted
from flakebot_magic.host.cache import CACHE_DIRECTORIES, CacheLayout
from flakebot_magic.records.runlog import RunLog, attempt_log_path, log_path


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_the_cache_dir_is_private_from_its_first_use(tmp_path: Path, umask_022: None) -> None:
    settings = Settings(cache_dir=tmp_path / "new" / "cache")
    settings.cache.tools.mkdir(parents=True, exist_ok=True)  # what the inventory does first
    assert _mode(settings.cache_dir) == 0o700 and _mode(settings.cache.tools) == 0o700  # umask 022 or not
    for where in (settings.cache.workspaces, settings.cache.store, settings.cache.logs):
        assert where.parent == settings.cache_dir


def test_a_world_readable_cache_dir_is_made_private(tmp_path: Path, umask_022: None) -> None:
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    assert Settings(cache_dir=cache).cache.store.parent == cache
    assert _mode(cache) == 0o700


def test_a_run_log_is_the_users_alone(tmp_path: Path, umask_022: None) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    log = RunLog(settings)
    bus = EventBus([log])
    bus.log("test", "test output that may hold a secret", "stdout")
    bus.emit(RunFinished(ok=True))
    path = log.save("te")
    assert path == log_path(settings, "te") and path.exists()
    assert "may hold a secret" in path.read_text()
    assert _mode(path) == 0o600
    assert _mode(path.parent) == 0o700 and _mode(settings.cache_dir) == 0o700
    # a run that failed: its log and its record (the request, the error) are the user's alone too
    failed = RunLog(settings)
    EventBus([failed]).emit(StageStarted("build"))
    EventBus([failed]).log("test", "more output that may hold a secret", "stdout")
    path = failed.save("te2", request="secret words", error=RuntimeError("boom"))
    assert path == attempt_log_path(settings, "te2", "failed") and _mode(path) == 0o600
    [attempt] = settings.cache.attempts.iterdir()
    assert _mode(attempt) == 0o600 and _mode(attempt.parent) == 0o700


def test_a_planted_symlink_at_the_log_path_is_replaced_not_followed(tmp_path: Path, umask_022: None) -> None:
    settings = Settings(cache_dir=tmp_path / "cache")
    victim = tmp_path / "bashrc"
    victim.write_text("the user's file\n")
    path = log_path(settings, "te")
    path.parent.mkdir(parents=True, exist_ok=True)  # the layout made it already
    path.symlink_to(victim)
    log = RunLog(settings)
    log(RunFinished(ok=True))
    log.save("te")
    assert victim.read_text() == "the user's file\n"
    assert not path.is_symlink() and _mode(path) == 0o600


@pytest.mark.cargo
def test_after_a_build_the_cache_and_its_log_are_private(tmp_path: Path, umask_022: None) -> None:
    from tinycrates import write_registry

    from flakebot_magic.pipeline.background import start_build

    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    tool = start_build(settings, "", crate="tinyecho", name="te").wait()
    assert tool("hi") == "HI"  # it shouts standard input
    assert _mode(settings.cache_dir) == 0o700
    assert _mode(log_path(settings, "te")) == 0o600
    assert "Compiling tinyecho" in log_path(settings, "te").read_text()
    # every directory of the layout, read without making or fixing anything: this user's, 0700
    root = Path(settings.cache_dir)
    layout = CacheLayout(root)
    for path in [root, *layout.directories()]:
        info = os.stat(path)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and _mode(path) == 0o700, path
    # nothing else sits directly under the root, and the build did write under the layout (not vacuous)
    assert {p.name for p in root.iterdir()} <= set(CACHE_DIRECTORIES)
    assert all(any(getattr(layout, name).iterdir()) for name in ("store", "workspaces", "tools", "logs", "locks"))
