"""The interop suite: clients nobody here wrote drive the tools flakebot builds and its bridge.

The official ``mcp`` Python SDK (in-process and inside a real kernel), the MCP
Inspector CLI and the MCP conformance suite (npm packages that need Node >= 22;
``scripts/install-system.sh`` installs Node 24 and them, pinned by deps/node/,
into ``$FLAKEBOT_NODE_PREFIX``, default ``/usr/local/lib/flakebot-node``), and
the ``openai`` SDK's strict-schema helper. All traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from interop_tools import CONFORMANCE_VERSION, MISSING_NODE_TOOLS, NODE_BIN, conformance_version, node_major

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.base import ToolClient
from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.config import Settings
from flakebot_magic.host.entry import binary_digest
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.testing.overlay import FIXTURES, overlay_registry


@pytest.fixture(scope="session")
def node_tools() -> Path:
    """The bin dir with ``node`` (>= 22), ``inspector`` and ``conformance`` (the version deps/node pins); a loud skip
    without them (a failure under CI, whose ``make test`` installed them)."""
    tools = all((NODE_BIN / tool).exists() for tool in ("inspector", "conformance"))
    if node_major() < 22 or not tools or conformance_version() != CONFORMANCE_VERSION:
        if os.environ.get("CI"):
            pytest.fail(MISSING_NODE_TOOLS)  # CI ran `make test`, whose install step puts them there
        pytest.skip(MISSING_NODE_TOOLS)
    return NODE_BIN


@pytest.fixture(scope="session")
def fixture_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    registry = overlay_registry(
        tmp_path_factory.mktemp("fixture-registry"), [FIXTURES / "demo-mcp", FIXTURES / "demo-http"]
    )
    cache = os.environ.get("FLAKEBOT_CACHE_DIR")
    return Settings(
        cache_dir=Path(cache) if cache else tmp_path_factory.mktemp("cache"), registry=str(registry), backend="cargo"
    )


@pytest.fixture(scope="module")
def built(fixture_settings: Settings) -> Iterator[Callable[[str, str], ToolClient]]:
    """``built("demo-mcp", "calc")``: the fixture crate built by the real pipeline (once per cache)."""
    made: dict[str, ToolClient] = {}

    def build(crate: str, name: str) -> ToolClient:
        if name not in made:
            made[name] = Pipeline(fixture_settings).run("", crate=crate, name=name)
        return made[name]

    yield build
    for tool in made.values():
        tool.close()
        lifecycle.unregister(tool)  # type: ignore[arg-type]


@pytest.fixture
def calc(built: Callable[[str, str], ToolClient]) -> ToolClient:
    return built("demo-mcp", "calc")


@pytest.fixture
def svc(built: Callable[[str, str], ToolClient]) -> ToolClient:
    return built("demo-http", "svc")


SHOUT = (
    "#!/bin/sh\n"
    'if [ "$1" = --help ]; then printf "Usage: shout [OPTIONS]\\nReads standard input.\\n\\nOptions:\\n'
    '  -e, --exclaim  add a bang\\n"; exit 0; fi\n'
    'tr a-z A-Z; if [ "$1" = --exclaim ]; then printf "!"; fi\n'
)


@pytest.fixture
def shout(tmp_path: Path) -> CliTool:
    """A command-line tool in a store-entry layout (``<entry>/bin/shout`` + ``manifest.json``)."""
    entry = tmp_path / "0-shout-2.0.1"
    (entry / "bin").mkdir(parents=True)
    script = entry / "bin" / "shout"
    script.write_text(SHOUT)
    script.chmod(0o755)
    manifest = {"crate": "shout", "version": "2.0.1", "description": "Upper-cases its input", "hash": "0"}
    manifest.update(binaries=["shout"], digests={"shout": binary_digest(script)})  # as deploy writes it
    (entry / "manifest.json").write_text(json.dumps(manifest))
    return CliTool(
        name="shout",
        binary=script,
        crate="shout",
        version="2.0.1",
        source_hash="0",
        store_path=entry,
        provenance=manifest,
    )
