"""The magic inside a real IPython InteractiveShell."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from flakebot_magic.config import DEBIAN_REGISTRY
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.kernel


@pytest.fixture
def ip(tmp_path: Path) -> Iterator[InteractiveShell]:
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = os.environ.get("FLAKEBOT_CACHE_DIR") or str(tmp_path / "cache")
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    yield shell
    shell.cleanup()


def test_magic_documents_itself(ip: InteractiveShell) -> None:
    doc = ip.find_cell_magic("flakebot").__doc__
    assert "--name" in doc and "--crate" in doc and "--registry" in doc and "--rebuild" in doc
    assert "--keep-workspace" in doc


def test_the_help_reads_as_ipythons_own(ip: InteractiveShell) -> None:
    """The cell form first, the options in groups, the line commands after; no `<{...}>` placeholders."""
    doc = ip.find_cell_magic("flakebot").__doc__
    assert doc.startswith("::\n\n  %%flakebot [--name NAME] [--crate CRATE] [build options]\n")
    usage = doc[: doc.index("Turn a request into")]
    assert "%flakebot list | show NAME | logs NAME | load NAME|--all" in usage
    assert "--tail" not in usage and "--backend" not in usage  # the usage is not every flag
    assert "<{" not in doc and "{auto,nix,cargo}" not in doc
    assert "--backend BACKEND, -b BACKEND" in doc
    tool, build, line = (doc.index(h) for h in ("\nthe tool:", "\nbuild options", "\nline mode (%flakebot COMMAND):"))
    assert doc.index("Turn a request into") < tool < build < line
    # each option in its group: --name with the tool, --model with the build, --tail with the line commands
    assert tool < doc.index("  --name NAME") < build < doc.index("  --model MODEL") < line < doc.index("  --tail N")
    assert "positional arguments" not in doc and "\noptions:" not in doc  # nothing left ungrouped


def test_empty_cell_is_a_usage_error(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="The cell is empty"):
        ip.run_cell_magic("flakebot", "--name md", "   \n")


def test_bad_option_is_a_usage_error(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError):
        ip.run_cell_magic("flakebot", "--no-such-option", "render markdown")


def test_words_after_the_cell_magic_are_a_usage_error(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match="Unexpected words"):
        ip.run_cell_magic("flakebot", "render markdown", "render markdown")


def test_config_traits_are_configurable(ip: InteractiveShell) -> None:
    magics = ip.magics_manager.registry["FlakebotMagics"]
    assert magics.cache_dir == ip.config.FlakebotMagics.cache_dir
    assert "registry" in magics.class_trait_names(config=True)


def test_missing_registry_path_is_a_clear_error(ip: InteractiveShell, tmp_path: Path) -> None:
    result = ip.run_cell(f"%%flakebot --registry {tmp_path / 'nope'}\nrender markdown")
    assert not result.success
    assert "does not exist" in str(result.error_in_exec)


@pytest.mark.cargo
@pytest.mark.skipif(not (DEBIAN_REGISTRY / "pulldown-cmark-0.9.2").is_dir(), reason="run `make install` first")
def test_cell_injects_md_into_the_kernel(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%%flakebot --name md\nRender Markdown text to HTML.")
    assert result.success, result.error_in_exec
    assert ip.user_ns["md"]("# Hi") == "<h1>Hi</h1>\n"
    out = capsys.readouterr().out
    assert "flakebot: search" in out and "`md` is ready" in out
    html = result.result._repr_html_()
    assert "pulldown-cmark" in html and "md(" in html
    listing = ip.run_cell("%flakebot list")
    assert listing.success
    assert "pulldown-cmark@0.9.2" in capsys.readouterr().out


def test_failed_run_shows_message_not_traceback(
    ip: InteractiveShell, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "empty-registry"
    registry.mkdir()
    ip.run_cell(f"%%flakebot --registry {registry}\nrender markdown")
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert "SearchError" in text and "No crate" in text
    assert "Traceback" not in text


# -- the edit loop through the magic (the model is the scripted fake OpenAI server) --------------


def test_model_options_and_traits_are_documented(ip: InteractiveShell) -> None:
    doc = ip.find_cell_magic("flakebot").__doc__
    for option in ("--model", "--base-url", "--provider", "--max-iterations", "--continue", "--allow-build-scripts"):
        assert option in doc, option
    traits = ip.magics_manager.registry["FlakebotMagics"].class_trait_names(config=True)
    assert {"model", "base_url", "provider", "max_iterations", "token_budget", "allow_build_scripts"} <= set(traits)


def test_continue_without_a_model_is_a_usage_error(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLAKEBOT_MODEL", raising=False)
    result = ip.run_cell("%%flakebot --name sha --continue\nalso accept --upper")
    assert not result.success
    assert "needs a model" in str(result.error_in_exec) and "--model" in str(result.error_in_exec)


@pytest.mark.cargo
def test_a_configured_model_turns_a_library_into_a_tool_in_the_kernel(
    tmp_path: Path, fake_openai: Callable[..., FakeOpenAIServer]
) -> None:
    from editscripts import TINYHEX, tinyhex_done
    from tinycrates import write_registry

    registry = write_registry(tmp_path / "registry", [TINYHEX])
    server = fake_openai(tinyhex_done())
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(tmp_path / "cache")
    config.FlakebotMagics.registry = str(registry)
    config.FlakebotMagics.model = "scripted"  # c.FlakebotMagics.model = ... in ipython_config.py
    config.FlakebotMagics.base_url = server.base_url
    shell = InteractiveShell(config=config)
    try:
        shell.extension_manager.load_extension("flakebot_magic")
        result = shell.run_cell("%%flakebot --name hexer\nprint standard input as hex")
        assert result.success, result.error_in_exec
        assert shell.user_ns["hexer"]("hi") == "6869\n"
    finally:
        shell.cleanup()
    assert len(server.requests) == 2 and "print standard input as hex" in str(server.requests[0]["messages"])


def test_the_cells_acceptance_examples_reach_the_magic(ip: InteractiveShell) -> None:
    """IPython strips `>>>` prompts from a pasted doctest; in a %%flakebot cell they are examples and stay."""
    code = ip.input_transformer_manager.transform_cell(
        '%%flakebot --name md\nRender Markdown.\n>>> md("# Hi")\n<h1>Hi</h1>\n'
    )
    assert '>>> md(\\"# Hi\\")' in code or ">>> md(" in code, code
    # wrapped in another cell magic too
    wrapped = ip.input_transformer_manager.transform_cell("%%time\n%%flakebot --name md\nx\n>>> md('a')\nb\n")
    assert ">>> md(" in wrapped, wrapped
    # everywhere else IPython still strips pasted prompts
    assert ip.input_transformer_manager.transform_cell(">>> x = 1\n>>> x\n") == "x = 1\nx\n"


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("--bogus", "Unknown option --bogus. `%%flakebot?` lists the options."),
        ("--crates x", "Unknown option --crates: did you mean --crate? `%%flakebot?` lists the options."),
        ("--modle gpt", "Unknown option --modle: did you mean --model? `%%flakebot?` lists the options."),
        ("--backend foo", "(choose from 'auto', 'nix', 'cargo'). `%%flakebot?` lists the options."),
    ],
)
def test_an_unknown_option_says_what_to_do(ip: InteractiveShell, line: str, said: str) -> None:
    with pytest.raises(UsageError) as caught:
        ip.run_cell_magic("flakebot", line, "render markdown")
    assert str(caught.value).endswith(said), str(caught.value)
    with pytest.raises(UsageError, match="lists the options"):
        ip.run_line_magic("flakebot", f"list {line}")


def test_list_shows_its_table_wherever_it_is_in_the_cell(
    ip: InteractiveShell, capsys: pytest.CaptureFixture[str]
) -> None:
    result = ip.run_cell("%flakebot list\nanswer = 42")  # not the cell's last line
    assert result.success and result.result is None
    shown = capsys.readouterr().out
    assert "No tools yet" in shown or (shown.startswith("name ") and "crate@version" in shown.splitlines()[0])


def test_doctor_and_clean_with_a_damaged_registry(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``%flakebot clean`` stops short of what only a damaged registry could prove unused; ``doctor`` repairs."""
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(tmp_path / "cache")
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("flakebot_magic")
    try:
        entry = tmp_path / "cache" / "store" / f"{'a' * 32}-demo-1.0.0"
        (entry / "bin").mkdir(parents=True)
        (entry / "manifest.json").write_text('{"hash": "' + "a" * 32 + '", "binaries": []}')
        registry = tmp_path / "cache" / "tools" / "tools.sqlite3"
        registry.parent.mkdir(parents=True)
        registry.write_bytes(os.urandom(8192))
        capsys.readouterr()
        shell.run_line_magic("flakebot", "clean")
        out = capsys.readouterr().out
        assert "flakebot clean stopped: the tool inventory cannot be trusted: SQLite cannot read" in out
        assert entry.is_dir()  # nothing a tool might use is gone
        [kept] = (tmp_path / "cache" / "tools").glob("tools.sqlite3.damaged-*")
        assert f"the damaged file is kept at {kept}" in out
        shell.run_line_magic("flakebot", "doctor")
        out = capsys.readouterr().out
        assert "The tool inventory is sound" in out
    finally:
        shell.cleanup()
