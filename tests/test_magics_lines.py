"""The managing line magics (list, show, logs, stop, rebuild) and the awaited cell, in an InteractiveShell."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from tinycrates import write_registry
from traitlets.config import Config

from flakebot_magic.magic_cells import install_transformer, uninstall_transformer

pytestmark = [pytest.mark.kernel, pytest.mark.cargo]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_registry(tmp_path_factory.mktemp("registry"), ["tinyecho"])


@pytest.fixture
def ip(
    tmp_path_factory: pytest.TempPathFactory, registry: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[InteractiveShell]:
    monkeypatch.setenv("FLAKEBOT_BACKEND", "cargo")  # these tests are about the magics, not nix
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(tmp_path_factory.getbasetemp() / "lines-cache")
    config.FlakebotMagics.registry = str(registry)
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    yield shell
    shell.cleanup()


def _out(capsys: pytest.CaptureFixture[str]) -> str:
    captured = capsys.readouterr()
    return captured.out + captured.err


def test_build_then_manage_it(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%%flakebot --crate tinyecho --name te\nshout it")
    assert result.success, result.error_in_exec
    assert "flakebot: build" in _out(capsys)  # no kernel: plain-text progress
    assert ip.user_ns["te"]("--help")

    ip.run_cell("%flakebot list")  # displayed, not returned
    listed = _out(capsys)
    assert "tinyecho@0.2.0" in listed and "ready" in listed

    ip.run_cell("%flakebot show te")
    shown = _out(capsys)
    assert "crate" in shown and "tinyecho" in shown and "commit" in shown and "shout it" in shown

    ip.run_cell("%flakebot logs te --tail 3")
    logs = _out(capsys)
    assert "build log" in logs and "== run ok" in logs

    ip.run_cell("%flakebot stop te")
    assert "nothing to stop" in _out(capsys)
    ip.run_cell("%flakebot stop --all")
    assert "No tool is running" in _out(capsys)

    rebuilt = ip.run_cell("%flakebot rebuild te")
    assert rebuilt.success, rebuilt.error_in_exec
    out = _out(capsys)
    assert "flakebot: build" in out and "cached" not in out.split("flakebot: build", 1)[1].splitlines()[0]
    assert ip.user_ns["te"] is rebuilt.result


@pytest.mark.parametrize(
    "line", ["show", "logs", "show a b", "rebuild", "frobnicate", "cargo", "cargo ghost test", "cargo 'unclosed"]
)
def test_line_mistakes_are_usage_errors(ip: InteractiveShell, line: str) -> None:
    with pytest.raises(UsageError):
        ip.run_line_magic("flakebot", line)


def test_unknown_tool_is_a_usage_error(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="No tool named 'ghost'"):
        ip.run_line_magic("flakebot", "show ghost")


def test_the_cell_can_be_awaited(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    """What a kernel runs: the transformer turns the cell into an await on the same build."""
    install_transformer(ip)
    try:
        code = ip.transform_cell("%%flakebot --crate tinyecho --name te2\nshout it\n")
        assert code.startswith("await get_ipython().magics_manager.registry['FlakebotMagics'].run_cell_async(")
        assert ip.transform_cell("%flakebot rebuild te2\n").startswith("await ")
        assert ip.transform_cell("%flakebot list\n") == "get_ipython().run_line_magic('flakebot', 'list')\n"
        result = ip.run_cell("%%flakebot --crate tinyecho --name te2\nshout it\n")
        assert result.success, result.error_in_exec
        assert ip.user_ns["te2"].name == "te2"
    finally:
        uninstall_transformer(ip)
    assert ip.transform_cell("%%flakebot\nx\n").startswith("get_ipython().run_cell_magic(")
