"""``flakebot mcp`` itself, driven by clients nobody here wrote: the MCP Inspector CLI and the conformance suite.

The Inspector CLI lists flakebot's functions over stdio, calls ``build_tool``
(a real build of a tiny crate with cargo), finds the new tool in the next
``tools/list`` and calls it; over Streamable HTTP (``flakebot mcp --http``) it
sends the bearer token as a header, and without it gets nothing. The
conformance suite runs against ``flakebot mcp --http`` through a proxy that
adds the token (the suite sends no headers; the server's authentication is not
touched): the server requirements of 2026-07-28 and of 2025-11-25, each whole,
with an expected-failures file per revision (tests/interop/conformance/) that
gives each check that cannot pass its reason (they call the suite's own test
tools, prompts and resources); the suite fails the run on any other failing
check and on a listed check that passes. The scenarios that apply to a stdio
server run through the loopback gateway.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from auth_proxy import bearer_proxy
from interop_tools import node_env
from mcp_gateway import gateway
from test_conformance import conformance
from tinycrates import write_registry

import flakebot_magic
from flakebot_magic.records.inventory import Inventory

pytestmark = pytest.mark.cargo

#: the ``flakebot`` command of this interpreter
FLAKEBOT = str(Path(sys.executable).parent / "flakebot")
BUILTINS = {"build_tool", "search_crates", "list_tools", "tool_info"}
TOKEN = "interop-token"
#: the scenarios of the suite that apply to flakebot mcp over Streamable HTTP
HTTP_SCENARIOS = ("server-initialize", "ping", "tools-list", "server-sse-multiple-streams", "dns-rebinding-protection")


def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "FLAKEBOT_CACHE_DIR": str(cache), "FLAKEBOT_BACKEND": "cargo"}


def inspector(bin_dir: Path, target: list[str], *method: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "inspector"), "--cli", *target, *method],
        env=node_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )


def answer(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_registry(tmp_path_factory.mktemp("registry"), ["tinyecho"])


@pytest.fixture(scope="module")
def served(registry: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``flakebot mcp --http 0`` over a cache that has one tool (``shout``, built by a person); its URL."""
    cache = tmp_path_factory.mktemp("cache")
    flakebot_magic.build("", crate="tinyecho", name="shout", registry=str(registry), backend="cargo", cache_dir=cache)
    server = subprocess.Popen(
        [FLAKEBOT, "mcp", "--registry", str(registry), "--http", "0", "--token", TOKEN],
        stderr=subprocess.PIPE,
        env=_env(cache),
    )
    try:
        assert server.stderr is not None
        found = re.search(rb"serving (\S+)", server.stderr.readline())
        assert found is not None, "flakebot mcp --http did not say where it serves"
        yield found.group(1).decode(), cache
    finally:
        server.terminate()
        server.wait(30)
        if server.stderr is not None:
            server.stderr.close()


def test_the_inspector_builds_a_tool_through_flakebot_mcp_then_calls_it(
    node_tools: Path, registry: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    # the Inspector starts the server with an environment of its own: the cache and backend go with -e
    target = [FLAKEBOT, "mcp", "--registry", str(registry), "-e", f"FLAKEBOT_CACHE_DIR={cache}"]
    target += ["-e", "FLAKEBOT_BACKEND=cargo"]
    listed = answer(inspector(node_tools, target, "--method", "tools/list"))
    assert {t["name"] for t in listed["tools"]} == BUILTINS

    args = ["request=echo words", "crate=tinyecho", "name=te"]
    built = answer(
        inspector(node_tools, target, "--method", "tools/call", "--tool-name", "build_tool", "--tool-arg", *args)
    )
    assert built["isError"] is False, built
    assert built["content"][0]["text"].startswith("Built `te`")
    who = built["structuredContent"]["requested_by"]
    assert who and who != "mcp client"  # the Inspector's own clientInfo.name
    record = Inventory(cache / "tools").get("te")
    assert record is not None and record.requested_by == who

    listed = answer(inspector(node_tools, target, "--method", "tools/list"))
    tools = {t["name"]: t for t in listed["tools"]}
    assert set(tools) == BUILTINS | {"te"}
    assert tools["te"]["inputSchema"]["additionalProperties"] is False
    called = answer(
        inspector(node_tools, target, "--method", "tools/call", "--tool-name", "te", "--tool-arg", "input=quiet")
    )
    assert called["isError"] is False and called["content"][0]["text"] == "QUIET"
    info = answer(
        inspector(node_tools, target, "--method", "tools/call", "--tool-name", "tool_info", "--tool-arg", "name=te")
    )
    assert f"requested_by: {who}" in info["content"][0]["text"]


def test_the_inspector_over_streamable_http_needs_the_token(node_tools: Path, served: tuple[str, Path]) -> None:
    url, _ = served
    refused = inspector(node_tools, [url, "--transport", "http"], "--method", "tools/list")
    # the 401 (WWW-Authenticate: Bearer) makes the Inspector ask for authorization, which it cannot do here
    assert refused.returncode != 0 and '"auth_required"' in refused.stderr, refused.stdout + refused.stderr
    target = [url, "--transport", "http", "--header", f"Authorization: Bearer {TOKEN}"]
    listed = answer(inspector(node_tools, target, "--method", "tools/list"))
    assert {t["name"] for t in listed["tools"]} == BUILTINS | {"shout"}
    called = answer(
        inspector(node_tools, target, "--method", "tools/call", "--tool-name", "shout", "--tool-arg", "input=hi")
    )
    assert called["isError"] is False and called["content"][0]["text"] == "HI"
    found = answer(
        inspector(
            node_tools, target, "--method", "tools/call", "--tool-name", "search_crates", "--tool-arg", "query=echo"
        )
    )
    assert found["isError"] is False and "tinyecho" in found["content"][0]["text"]


def _passed(checks: list[dict[str, Any]], scenario: str) -> None:
    assert checks, f"{scenario}: no checks ran"
    failed = [c for c in checks if c["status"] not in ("SUCCESS", "INFO")]
    assert not failed, json.dumps(failed, indent=2)


def test_the_conformance_scenarios_over_streamable_http(
    node_tools: Path, served: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = served
    with bearer_proxy(url, TOKEN) as proxied:
        for scenario in HTTP_SCENARIOS:
            checks = conformance(node_tools, proxied, scenario, tmp_path / scenario)
            _passed(checks, scenario)
            if scenario == "tools-list":  # the built tool is listed, with a valid entry
                assert set(checks[0]["details"]["tools"]) == BUILTINS | {"shout"}
            if scenario == "dns-rebinding-protection":
                (rebound,) = [c for c in checks if c["id"] == "localhost-host-rebinding-rejected"]
                assert rebound["details"]["statusCode"] == 403  # refused for its Host/Origin, not for a token


#: per revision, the checks that cannot pass, each with its reason
EXPECTED_FAILURES = Path(__file__).parent / "conformance"


@pytest.mark.parametrize("revision", ["2026-07-28", "2025-11-25"])
def test_the_conformance_requirements_of_each_revision(
    node_tools: Path, served: tuple[str, Path], tmp_path: Path, revision: str
) -> None:
    """``conformance server --requirements REVISION --expected-failures FILE``: exit 0, or the failures it names."""
    url, _ = served
    baseline = EXPECTED_FAILURES / f"expected-failures-{revision}.yaml"
    with bearer_proxy(url, TOKEN) as proxied:
        argv = [str(node_tools / "conformance"), "server", "--url", proxied, "--requirements", revision]
        done = subprocess.run(
            [*argv, "--expected-failures", str(baseline), "-o", str(tmp_path)],
            env=node_env(),
            capture_output=True,
            text=True,
            timeout=900,
        )
    report = done.stdout + done.stderr
    assert done.returncode == 0 and "Baseline check passed" in report, report[-6000:]
    checks = {path.parent.name: json.loads(path.read_text()) for path in tmp_path.glob("server-*/checks.json")}
    passed = sum(c["status"] == "SUCCESS" for found in checks.values() for c in found)
    assert passed >= (90 if revision == "2026-07-28" else 35), passed  # the suite ran, and most of it passed
    core = "server-stateless" if revision == "2026-07-28" else "server-initialize"
    (ran,) = [found for name, found in checks.items() if name.startswith(f"server-{core}-")]
    assert sum(c["status"] == "SUCCESS" for c in ran) >= (20 if core == "server-stateless" else 3)


def test_the_conformance_scenarios_over_stdio_through_the_gateway(
    node_tools: Path, registry: Path, served: tuple[str, Path], tmp_path: Path
) -> None:
    _, cache = served
    with gateway([FLAKEBOT, "mcp", "--registry", str(registry)], _env(cache)) as url:
        for scenario in ("server-initialize", "ping", "tools-list"):
            _passed(conformance(node_tools, url, scenario, tmp_path / scenario), scenario)
