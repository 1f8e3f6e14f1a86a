"""The MCP bridge (a CLI tool served over MCP): JSON-RPC for bad input, serverInfo, schemas, the null rule."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.clients.bridge import serve
from flakebot_magic.clients.cli_tool import CliTool
from flakebot_magic.host.entry import binary_digest

SHOUT = (
    "#!/bin/sh\n"
    'if [ "$1" = --help ]; then printf "Usage: shout [OPTIONS]\\nReads standard input.\\n\\nOptions:\\n'
    '  -e, --exclaim  add a bang\\n  -r, --repeat <N>  say it N times\\n"; exit 0; fi\n'
    'n=1; bang=""\n'
    'while [ $# -gt 0 ]; do case "$1" in --exclaim) bang="!";; --repeat) n="$2"; shift;; esac; shift; done\n'
    'text=$(tr a-z A-Z); i=0; while [ $i -lt "$n" ]; do printf "%s" "$text"; i=$((i+1)); done; printf "%s" "$bang"\n'
)


@pytest.fixture
def shout(tmp_path: Path) -> CliTool:
    """A store entry: ``<entry>/bin/shout`` and the manifest the pipeline writes beside it."""
    entry = tmp_path / "0123-shout-1.4.2"
    (entry / "bin").mkdir(parents=True)
    script = entry / "bin" / "shout"
    script.write_text(SHOUT)
    script.chmod(0o755)
    manifest = {"crate": "shout", "version": "1.4.2", "description": "Upper-cases its input", "hash": "0123"}
    manifest.update(binaries=["shout"], digests={"shout": binary_digest(script)})
    (entry / "manifest.json").write_text(json.dumps(manifest))
    return CliTool(
        name="sh",
        binary=script,
        crate="shout",
        version="1.4.2",
        source_hash="0123",
        store_path=entry,
        provenance=manifest,
    )


def exchange(tool: CliTool, *lines: str) -> list[Any]:
    """Each line as the bridge reads it; the answers it wrote, decoded."""
    out = io.BytesIO()
    serve(tool, io.BytesIO("".join(line + "\n" for line in lines).encode()), out)
    return [json.loads(line) for line in out.getvalue().splitlines()]


def call(tool: CliTool, arguments: Any, name: str = "sh") -> Any:
    request = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    (answer,) = exchange(tool, json.dumps(request))
    return answer


@pytest.mark.parametrize(
    ("line", "code", "ident"),
    [
        ("{not json", -32700, None),
        ("null", -32600, None),
        ("42", -32600, None),
        ("[]", -32600, None),
        ('[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]', -32600, None),
        ('{"jsonrpc": "2.0", "id": 3}', -32600, 3),
        ('{"id": 4, "method": "ping"}', -32600, 4),
        ('{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}', -32600, None),
        ('{"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": [1]}', -32602, 5),
        ('{"jsonrpc": "2.0", "id": 6, "method": "resources/list"}', -32601, 6),
    ],
)
def test_bad_requests_get_json_rpc_errors(shout: CliTool, line: str, code: int, ident: Any) -> None:
    (answer,) = exchange(shout, line)
    assert answer["jsonrpc"] == "2.0" and answer["id"] == ident and answer["error"]["code"] == code
    assert "result" not in answer


def test_notifications_and_responses_get_no_answer(shout: CliTool) -> None:
    assert exchange(
        shout,
        '{"jsonrpc": "2.0", "method": "notifications/initialized"}',
        '{"jsonrpc": "2.0", "id": 9, "result": {}}',
        '{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
    ) == [{"jsonrpc": "2.0", "id": 1, "result": {}}]


@pytest.mark.parametrize("arguments", [[1, 2], "input=hi", 3, True])
def test_arguments_that_are_not_an_object_are_invalid_params(shout: CliTool, arguments: Any) -> None:
    answer = call(shout, arguments)
    assert answer["error"]["code"] == -32602 and "arguments must be an object" in answer["error"]["message"]


def test_an_unknown_tool_is_invalid_params(shout: CliTool) -> None:
    assert call(shout, {}, name="nope")["error"] == {"code": -32602, "message": "Unknown tool: nope"}


def test_initialize_names_the_crate_and_version_and_says_what_it_is_in_plain_words(shout: CliTool) -> None:
    request = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
    (answer,) = exchange(shout, json.dumps(request))
    result = answer["result"]
    assert result["protocolVersion"] == "2025-06-18"
    assert result["serverInfo"]["name"] == "shout" and result["serverInfo"]["version"] == "1.4.2"
    text = result["instructions"]
    assert text.startswith("shout 1.4.2: Upper-cases its input.\n")
    assert "a command-line tool" in text and "- sh: " in text
    assert "```" not in text and "sh(" not in text and "(command-line tool)" not in text  # no Python


def test_the_input_schema_says_extra_keys_are_refused_and_they_are(shout: CliTool) -> None:
    (answer,) = exchange(shout, '{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}')
    (tool,) = answer["result"]["tools"]
    assert tool["name"] == "sh" and tool["inputSchema"]["additionalProperties"] is False
    assert tool["description"].endswith(".")
    refused = call(shout, {"input": "hi", "volume": 11})["result"]
    assert refused["isError"] is True and "got an unexpected argument 'volume'" in refused["content"][0]["text"]


def test_null_for_an_optional_argument_is_not_given_at_every_door(shout: CliTool) -> None:
    assert shout("hi", exclaim=None, repeat=None) == "HI"
    from_model = shout.call({"id": "c", "function": {"name": "sh", "arguments": '{"input": "hi", "exclaim": null}'}})
    assert from_model["content"] == "HI"
    bridged = call(shout, {"input": "hi", "exclaim": None, "repeat": None})["result"]
    assert bridged["isError"] is False and bridged["content"][0]["text"] == "HI"
    assert call(shout, None)["result"]["isError"] is False  # arguments: null is no arguments


def test_the_bridge_as_a_process_reads_the_manifest(shout: CliTool) -> None:
    entry = shout.mcp_config()["mcpServers"]["sh"]
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "sh", "arguments": {"input": "x"}}},
    ]
    done = subprocess.run(
        [entry["command"], *entry["args"]],
        input="".join(json.dumps(m) + "\n" for m in lines),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["result"]["serverInfo"] == {
        "name": "shout",
        "version": "1.4.2",
        "title": "sh (shout 1.4.2, served by flakebot)",
    }
    assert second["result"]["content"][0]["text"] == "X"
