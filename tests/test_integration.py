"""Real crates from the offline registry, built with real cargo and called through the client."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flakebot_magic.config import DEBIAN_REGISTRY, Settings
from flakebot_magic.errors import ToolError
from flakebot_magic.events import StageFinished
from flakebot_magic.pipeline import Pipeline

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(
        not (DEBIAN_REGISTRY / "pulldown-cmark-0.9.2").is_dir(),
        reason="Debian's offline registry is not installed: run `make install`",
    ),
]


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    # `make test` points FLAKEBOT_CACHE_DIR at a fresh per-run cache shared with the notebooks
    cache = os.environ.get("FLAKEBOT_CACHE_DIR")
    return Settings(cache_dir=Path(cache) if cache else tmp_path_factory.mktemp("cache"), registry=str(DEBIAN_REGISTRY))


def _run(settings: Settings, request: str, **kwargs: str) -> tuple[object, list[StageFinished]]:
    events: list[object] = []
    tool = Pipeline(settings, observers=[events.append]).run(request, **kwargs)
    return tool, [e for e in events if isinstance(e, StageFinished)]


def test_markdown_request_builds_pulldown_cmark_and_renders(settings: Settings) -> None:
    md, finished = _run(settings, "Render Markdown text to HTML.", name="md")
    assert md.crate == "pulldown-cmark"
    assert md("# Hi") == "<h1>Hi</h1>\n"
    assert md("| a |\n|---|\n| 1 |", "--enable-tables").startswith("<table>")
    statuses = {e.stage: e.status for e in finished}
    # either built now or earlier in this test run (the cache is shared with the notebooks): a tool built for this
    # name and request answers from its record, without a search
    assert statuses["search"] in ("done", "cached")
    assert statuses["deploy"] in ("done", "cached")
    workspace = settings.cache.workspaces / "md"
    log = subprocess.run(["git", "log", "--format=%s", "--all"], cwd=workspace, capture_output=True, text=True).stdout
    assert "Published source of pulldown-cmark 0.9.2" in log
    assert "Add flake.nix" in log
    flake = (workspace / "flake.nix").read_text()
    assert "buildRustPackage" in flake and "cargoLock" in flake


def test_markdown_rerun_is_a_cache_hit_with_the_same_store_path(settings: Settings) -> None:
    first, _ = _run(settings, "Render Markdown text to HTML.", name="md")
    again, finished = _run(settings, "Render Markdown text to HTML.", name="md")
    assert again.store_path == first.store_path
    assert {e.stage: e.status for e in finished}["build"] == "cached"
    manifest = json.loads((Path(again.store_path) / "manifest.json").read_text())
    assert manifest["crate"] == "pulldown-cmark" and manifest["hash"] == again.source_hash


def test_hexyl_builds_tests_and_dumps_bytes(settings: Settings) -> None:
    hexyl, finished = _run(settings, "a hex viewer for binary data", name="hexyl")
    assert hexyl.crate == "hexyl"
    out = hexyl("-n", "4", "--color", "never", "--border", "none", input=b"\x00\x01\x02\x03\x04")
    assert out.split()[:5] == ["00000000", "00", "01", "02", "03"]
    assert " 04" not in out
    assert hexyl.reads_stdin  # its help says: "If no FILE argument is given, read from STDIN"
    with pytest.raises(ToolError) as failure:
        hexyl("--no-such-flag", input=b"")
    assert failure.value.returncode != 0 and "no-such-flag" in failure.value.stderr
    statuses = {e.stage: e.status for e in finished}
    assert statuses["test"] in ("done", "cached")
