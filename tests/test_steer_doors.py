"""Steering a running edit session through the front doors: the command (from another process) and the magic.

The session is stood in for by the test itself, holding ``steering.running``
as a session does, and reading what arrives with ``steering.Inbox``. The REST
route is tested with the other handlers, in a real Jupyter server
(tests/server/test_handlers.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from flakebot_magic.config import Settings
from flakebot_magic.errors import SteeringError
from flakebot_magic.host.cache import CacheLayout
from flakebot_magic.records import steering


def _flakebot(cache: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``flakebot ARGV --cache-dir CACHE`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "flakebot_magic.cli", *argv, "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FLAKEBOT_CACHE_DIR": str(cache)},
    )


def test_flakebot_steer_from_another_process_reaches_the_running_session(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with steering.running(CacheLayout(cache), "md") as inbox:
        done = _flakebot(cache, "steer", "md", "also accept --upper")
        assert done.returncode == 0, done.stderr
        assert "Queued for md's edit session" in done.stdout
        as_json = _flakebot(cache, "steer", "md", "and", "keep it short", "--json")
        assert as_json.returncode == 0, as_json.stderr
        data = json.loads(as_json.stdout)
        messages = inbox.take()
    assert [(m.text, m.source) for m in messages] == [("also accept --upper", "cli"), ("and keep it short", "cli")]
    assert data["name"] == "md" and data["text"] == "and keep it short" and data["source"] == "cli"
    assert steering.Inbox(CacheLayout(cache), "md").take() == []  # each message is read once


def test_flakebot_steer_without_a_running_session_says_how_to_start_one(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    done = _flakebot(cache, "steer", "md", "also accept --upper")
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("flakebot: error: No edit session of 'md' is running")
    assert "--resume" in done.stderr and "Traceback" not in done.stderr
    as_json = _flakebot(cache, "steer", "md", "x", "--json")
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["error"] == "SteeringError"


def test_flakebot_steer_refuses_an_empty_message_and_a_bad_name(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with steering.running(CacheLayout(cache), "md") as inbox:
        empty = _flakebot(cache, "steer", "md", "   ")
        bad = _flakebot(cache, "steer", "../md", "hello")
        assert inbox.take() == []
    assert empty.returncode == 1 and "empty" in empty.stderr and "Traceback" not in empty.stderr
    assert bad.returncode == 1 and "not a valid tool name" in bad.stderr


# -- the magic ----------------------------------------------------------------------------------------


@pytest.fixture
def ip(tmp_path: Path) -> Iterator[InteractiveShell]:
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(tmp_path / "cache")
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    yield shell
    shell.cleanup()


@pytest.mark.kernel
def test_the_line_magic_steers_with_the_rest_of_the_line_as_the_text(
    ip: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache = tmp_path / "cache"
    with steering.running(CacheLayout(cache), "md") as inbox:
        ip.run_line_magic("flakebot", "steer md also accept --upper -n 3")  # no option parsing of the text
        ip.run_line_magic("flakebot", "steer md \"a quoted 'message'\"")  # one quoted string: its content
        messages = inbox.take()
    assert [(m.text, m.source) for m in messages] == [
        ("also accept --upper -n 3", "magic"),
        ("a quoted 'message'", "magic"),
    ]
    assert "Queued for md's edit session" in capsys.readouterr().out


@pytest.mark.kernel
def test_the_line_magic_without_a_session_or_text_is_a_usage_error(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match=r"No edit session of 'md' is running.*--resume"):
        ip.run_line_magic("flakebot", "steer md also accept --upper")
    with pytest.raises(UsageError, match="Usage: %flakebot steer NAME TEXT"):
        ip.run_line_magic("flakebot", "steer md")


@pytest.mark.kernel
def test_the_widgets_send_button_steers_the_named_build(ip: InteractiveShell, tmp_path: Path) -> None:
    """``show_build`` gives the widget a Send that queues for the tool's session (the name known up front)."""
    magics = ip.magics_manager.registry["FlakebotMagics"]
    magics.progress = "widget"
    settings = Settings(cache_dir=tmp_path / "cache")
    named = magics.show_build("a request", settings, lambda: None, steer_name="md")
    unnamed = magics.show_build("a request", settings, lambda: None)
    assert unnamed.widget.on_steer is None  # no name yet: nothing to send to
    with steering.running(settings.cache, "md") as inbox:
        named.widget.on_steer("also accept --upper")
        assert [(m.text, m.source) for m in inbox.take()] == [("also accept --upper", "widget")]
    with pytest.raises(SteeringError, match="No edit session"):  # the widget shows what it raises
        named.widget.on_steer("too late")
