"""Row "cache files" of the matrix (docs/SECURITY.md): a request the cache recorded is replayed as words, never
as the person's, never as code.

The cache keeps requests that are replayed later: a tool's record (``flakebot rebuild NAME``,
``%flakebot rebuild NAME``), an interrupted session's journal (``--resume``). What they hold may be an agent's
words (an agent's build is recorded like any), or a follow-up a tool's output wrote (``test_doors_tool_output``).
Before issue 33 a replayed request's ``>>>`` lines were acceptance examples run with ``exec`` in flakebot's
process. Here each door replays the payload of ``door_payloads``: nothing runs; a resumed session's words are the
person's only when the person typed the very same words again.

Real cargo in the sandbox; the model is the scripted fake server (a test double, not a model).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from door_payloads import assert_nothing_ran, runs_if_code
from editscripts import TINYHEX, TINYHEX_CONTRACT, TINYHEX_MAIN
from IPython.core.interactiveshell import InteractiveShell
from scripted_builds import kill_when, resumable_script, scripted_settings, tiny_registry
from tinycrates import write_registry
from traitlets.config import Config

from flakebot_magic.agent.builds import AgentSession
from flakebot_magic.cli import main as cli_main
from flakebot_magic.config import Settings
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest, PersonText, RunFlags
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo


def test_a_recorded_request_is_replayed_by_rebuild_as_words(tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "registry", ["tinyecho"])
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(registry), backend="cargo")
    marker = tmp_path / "record-ran"
    request = "echo the words it is given\n" + runs_if_code(marker, "echo")
    AgentSession(settings, requested_by="an-agent").build(request, crate="tinyecho", name="echo")
    assert_nothing_ran(marker, source="an agent's request")
    record = Inventory(settings.cache.tools).get("echo")
    assert record is not None and record.request == request.strip()  # the cache holds the payload
    # `flakebot rebuild NAME`
    assert cli_main(["rebuild", "echo", "--cache-dir", str(settings.cache_dir), "--registry", str(registry)]) == 0
    assert_nothing_ran(marker, source="a recorded request replayed by `flakebot rebuild`")
    # `%flakebot rebuild NAME`
    config = Config()
    config.HistoryManager.enabled = False
    config.FlakebotMagics.cache_dir = str(settings.cache_dir)
    config.FlakebotMagics.registry = str(registry)
    config.FlakebotMagics.progress = "text"
    shell = InteractiveShell(config=config)
    try:
        shell.extension_manager.load_extension("flakebot_magic")
        tool = shell.run_line_magic("flakebot", "rebuild echo")
        assert tool("hi").strip().lower() == "hi"
        assert_nothing_ran(marker, tool, source="a recorded request replayed by `%flakebot rebuild`")
    finally:
        shell.extension_manager.unload_extension("flakebot_magic")
        shell.cleanup()
        InteractiveShell.clear_instance()


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


def test_a_journals_request_is_resumed_as_words_unless_the_person_typed_it(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    marker = tmp_path / "journal-ran"
    request = "hex-encode standard input\n" + runs_if_code(marker, "hexer")
    cache = tmp_path / "cache"
    with FakeOpenAIServer(resumable_script(TINYHEX_MAIN, TINYHEX_CONTRACT)) as server:
        # a session on the payload's words (an agent's, say), killed while it waits for the model
        kill_when(server, cache, hex_registry, requests=2, request=request)
        settings = scripted_settings(cache, hex_registry, server)
        # the person resumes it from a cell of their own: the journal's words are not the person's
        tool = Pipeline(settings).run(
            BuildRequest(PersonText("hex-encode standard input"), name="hexer", flags=RunFlags(resume=True))
        )
    assert tool(b"hi").strip() == "6869"
    assert_nothing_ran(marker, tool, source="an interrupted session's journal, resumed")
