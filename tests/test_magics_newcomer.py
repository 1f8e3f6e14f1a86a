"""Issue 37: `%flakebot help`, `%flakebot dashboard` and `%flakebot catalog` in an InteractiveShell (no build)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from tinycrates import write_registry
from traitlets.config import Config

from flakebot_magic.views.dashboard_link import dashboard_link

pytestmark = [pytest.mark.kernel]


@pytest.fixture
def ip(tmp_path: Path) -> Iterator[InteractiveShell]:
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(tmp_path / "cache")
    config.FlakebotMagics.registry = str(write_registry(tmp_path / "registry", ["tinyecho", "tinylib"]))
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    yield shell
    shell.cleanup()


def test_help_is_the_magics_own_help(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%flakebot help")
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    assert "%%flakebot [--name NAME]" in out or "--name" in out
    for command in ("catalog [WORDS]", "dashboard", "list"):
        assert f"%flakebot {command}" in out


def test_catalog_lists_what_builds_with_no_model(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%flakebot catalog")
    assert result.success, result.error_in_exec
    out = capsys.readouterr().out
    assert "%%flakebot --name tinyecho --crate tinyecho" in out and "tinylib" not in out


def test_dashboard_links_to_the_servers_page(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%flakebot dashboard")
    assert result.success, result.error_in_exec
    assert "/flakebot/" in capsys.readouterr().out


def test_the_link_is_under_the_base_url_of_the_server_that_started_the_kernel(tmp_path: Path) -> None:
    info = {"pid": os.getpid(), "base_url": "/user/ada/", "url": "http://127.0.0.1:8888/user/ada/"}
    (tmp_path / f"jpserver-{os.getpid()}.json").write_text(json.dumps(info))
    link = dashboard_link(tmp_path, os.getpid())
    assert link.path == "/user/ada/flakebot/" and link.url == "http://127.0.0.1:8888/user/ada/flakebot/"
    assert "href='/user/ada/flakebot/'" in link._repr_html_()
    nowhere = dashboard_link(tmp_path, 1)  # not started by a server here: the default path, and it says so
    assert nowhere.path == "/flakebot/" and not nowhere.found and "was not found" in nowhere._repr_html_()


def test_a_bad_name_is_said_before_anything_is_shown(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: an empty output entry (the widget, hidden) stood above the error for `--name 2bad`."""
    ip.run_line_magic("config", 'FlakebotMagics.progress = "widget"')
    result = ip.run_cell("%%flakebot --name 2bad\nrender markdown")
    assert not result.success and "not a valid tool name" in str(result.error_in_exec)
    assert capsys.readouterr().out == ""  # no display came before the error


def test_no_crate_fits_is_an_answer_not_an_error_box(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: "no crate fits" was amber in the record but sat in a pink error box; the cell now answers."""
    result = ip.run_cell("%%flakebot --name up\nuppercase helper library for text")
    assert result.success, result.error_in_exec  # no error: the search answered
    out = capsys.readouterr().out
    assert "No crate does" in out and "catalog" in out and "tinylib" in out
    assert "up" not in ip.user_ns
