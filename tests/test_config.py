"""An unusable cache dir (a file, under a file) is a ConfigError saying what to do, at every door; the magic's
line that shlex cannot split is IPython's UsageError with a hint."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError as IPythonUsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import flakebot_magic
from flakebot_magic.config import Settings, apply
from flakebot_magic.errors import ConfigError

WHAT_TO_DO = r"cannot be used \(.*\): it must be a directory .*Choose another with --cache-dir"


@pytest.fixture(params=["file", "under-a-file"])
def unusable(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    (tmp_path / "f").write_text("x")
    return tmp_path / "f" if request.param == "file" else tmp_path / "f" / "cache"


def test_settings_and_the_python_api(unusable: Path) -> None:
    with pytest.raises(ConfigError, match=WHAT_TO_DO):
        Settings(cache_dir=unusable).cache  # noqa: B018
    with pytest.raises(ConfigError, match=WHAT_TO_DO):
        flakebot_magic.load("te", cache_dir=unusable)


def test_the_command(unusable: Path) -> None:
    for argv in (["list", "--cache-dir", str(unusable)], ["doctor", "--cache-dir", str(unusable)]):
        done = subprocess.run(
            [sys.executable, "-m", "flakebot_magic.cli", *argv], capture_output=True, text=True, timeout=120
        )
        assert done.returncode != 0 and "Traceback" not in done.stderr
        assert "cannot be used" in done.stderr and "Choose another with --cache-dir" in done.stderr


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[InteractiveShell]:
    (tmp_path / "f").write_text("x")
    config = Config()
    config.FlakebotMagics.cache_dir = str(tmp_path / "f")
    ip = InteractiveShell(config=config)
    ip.extension_manager.load_extension("flakebot_magic")
    yield ip
    InteractiveShell.clear_instance()


def test_the_magic(shell: InteractiveShell) -> None:
    with pytest.raises(IPythonUsageError, match=WHAT_TO_DO):
        shell.run_line_magic("flakebot", "list")


@pytest.mark.parametrize("line", ['--name "unclosed', "--crate 'x"])
def test_an_unsplittable_line_is_a_usage_error_with_a_hint(shell: InteractiveShell, line: str) -> None:
    with pytest.raises(IPythonUsageError, match=r"a quote that is never closed: close it .*%%flakebot\?"):
        shell.run_cell_magic("flakebot", line, "x")


@pytest.mark.parametrize("door", ["constructor", "apply", "assignment", "environment"])
def test_a_relative_cache_dir_is_made_absolute_at_every_door(
    door: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a relative cache dir would name another place once the working directory changed, and an intent's workspace
    # (kept absolute) would no longer be under it: a warm re-run called it damaged
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLAKEBOT_CACHE_DIR", "from-env")
    if door == "constructor":
        settings = Settings(cache_dir=Path("rel"))
    elif door == "apply":
        settings = apply(Settings(), {"cache_dir": "rel"})
    elif door == "assignment":
        settings = Settings()
        settings.cache_dir = "rel"  # type: ignore[assignment]
    else:
        settings = Settings()
    expected = tmp_path / ("from-env" if door == "environment" else "rel")
    assert settings.cache_dir == expected and settings.cache_dir.is_absolute()
    monkeypatch.chdir("/")
    assert settings.cache.root == expected  # the same place from anywhere
