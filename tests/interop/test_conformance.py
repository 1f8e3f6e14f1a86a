"""The MCP conformance suite's server scenarios that apply (initialize, ping, tools/list), over Streamable HTTP.

flakebot's servers speak stdio; the suite speaks HTTP, so a loopback gateway
(gateway.py) stands in front of them. Scenarios that need features a
flakebot tool does not offer (resources, prompts, sampling, its own test
tools) do not apply.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from interop_tools import needs_fixture_crates, node_env
from mcp_gateway import gateway

SCENARIOS = ("server-initialize", "ping", "tools-list")


def conformance(bin_dir: Path, url: str, scenario: str, out: Path) -> list[dict[str, Any]]:
    """Run one scenario; its checks (from the suite's checks.json)."""
    done = subprocess.run(
        [str(bin_dir / "conformance"), "server", "--url", url, "--scenario", scenario, "-o", str(out)],
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    (checks_file,) = out.glob(f"server-{scenario}-*/checks.json")
    checks: list[dict[str, Any]] = json.loads(checks_file.read_text())
    assert done.returncode == 0, done.stdout + done.stderr
    return checks


def assert_passes(node_tools: Path, argv: list[str], out: Path) -> None:
    with gateway(argv) as url:
        for scenario in SCENARIOS:
            checks = conformance(node_tools, url, scenario, out / scenario)
            assert checks, f"{scenario}: no checks ran"
            failed = [c for c in checks if c["status"] not in ("SUCCESS", "INFO")]
            assert not failed, json.dumps(failed, indent=2)


@pytest.mark.cargo
@needs_fixture_crates
def test_the_mcp_tool_flakebot_built_passes(node_tools: Path, calc: Any, tmp_path: Path) -> None:
    assert_passes(node_tools, [str(calc.binary)], tmp_path)


def test_the_bridge_serving_a_cli_tool_passes(node_tools: Path, shout: Any, tmp_path: Path) -> None:
    entry = shout.mcp_config()["mcpServers"]["shout"]
    assert_passes(node_tools, [entry["command"], *entry["args"]], tmp_path)


@pytest.mark.cargo
@needs_fixture_crates
def test_the_bridge_serving_an_http_service_passes(node_tools: Path, svc: Any, tmp_path: Path) -> None:
    entry = svc.mcp_config()["mcpServers"]["svc"]
    assert_passes(node_tools, [entry["command"], *entry["args"]], tmp_path)
