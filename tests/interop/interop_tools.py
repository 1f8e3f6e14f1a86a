"""What the interop tests share: where the npm tools are, their environment, the fixture-crate mark."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from flakebot_magic.testing.overlay import fixture_crates_buildable

__all__ = [
    "CONFORMANCE_VERSION",
    "MISSING_NODE_TOOLS",
    "NODE_BIN",
    "NODE_PREFIX",
    "conformance_version",
    "needs_fixture_crates",
    "node_env",
    "node_major",
]

NODE_PREFIX = Path(os.environ.get("FLAKEBOT_NODE_PREFIX", "/usr/local/lib/flakebot-node"))
NODE_BIN = NODE_PREFIX / "bin"
#: the conformance suite's version deps/node/package.json pins (its requirement sets are per version)
CONFORMANCE_VERSION = json.loads(
    (Path(__file__).resolve().parents[2] / "deps" / "node" / "package.json").read_text(encoding="utf-8")
)["dependencies"]["@modelcontextprotocol/conformance"]
#: said by every test that needs them when they are absent: loud, with the one command that installs them
MISSING_NODE_TOOLS = (
    f"NOT TESTED: the MCP Inspector CLI and the conformance suite {CONFORMANCE_VERSION} (npm, Node >= 22) are not "
    f"in {NODE_BIN}; run `sudo bash scripts/install-system.sh` (it installs what deps/node/ pins, from PyPI and the "
    "npm registry), or point FLAKEBOT_NODE_PREFIX at a prefix that has them"
)

needs_fixture_crates = pytest.mark.skipif(
    not fixture_crates_buildable(), reason="needs serde_json and tiny_http: run `make install`"
)


def node_env() -> dict[str, str]:
    """The environment for the npm tools: Node 22 first on PATH, no telemetry, no update checks."""
    return {
        **os.environ,
        "PATH": f"{NODE_BIN}:{os.environ.get('PATH', '')}",
        "NO_UPDATE_NOTIFIER": "1",
        "DO_NOT_TRACK": "1",
        "MCP_CATALOG_PATH": str(Path(os.environ.get("TMPDIR", "/tmp")) / "flakebot-interop-mcp.json"),
    }


def conformance_version() -> str:
    """The installed conformance suite's version ("" when there is none)."""
    try:
        done = subprocess.run(
            [str(NODE_BIN / "conformance"), "--version"], capture_output=True, text=True, timeout=60, env=node_env()
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def node_major() -> int:
    try:
        done = subprocess.run(
            [str(NODE_BIN / "node"), "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return 0
    return int(done.stdout.strip().lstrip("v").split(".")[0])
