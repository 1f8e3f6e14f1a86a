"""A scripted edit-loop session turns a library into an MCP server; failing acceptance examples send it back.

The model is the fake OpenAI-compatible server replaying a script (a test
double, not a language model). Session 1 writes an MCP server with a bug the
crate's own tests miss; the cell's ``>>>`` example catches it after deploy, so
the pipeline opens a follow-up session with the failing example as its
instructions; session 2 fixes it and the example passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tinycrates import crate, write_crate

from flakebot_magic.clients import lifecycle
from flakebot_magic.clients.mcp import McpTool
from flakebot_magic.config import Settings
from flakebot_magic.events import Notice, StageFinished
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.request import PersonText
from flakebot_magic.testing.fake_openai import FakeOpenAIServer
from flakebot_magic.testing.overlay import fixture_crates_buildable, overlay_registry

pytestmark = [
    pytest.mark.cargo,
    pytest.mark.skipif(
        not fixture_crates_buildable(), reason="needs serde_json from Debian's registry: run `make install`"
    ),
]

CALCLIB = crate(
    "calclib",
    description="Adds numbers",
    files={
        "src/lib.rs": "pub fn add(a: f64, b: f64) -> f64 {\n    a + b\n}\n\n#[cfg(test)]\nmod tests {\n"
        "    #[test]\n    fn adds() {\n        assert_eq!(super::add(1.0, 2.0), 3.0);\n    }\n}\n",
    },
)

MANIFEST = """[package]
name = "calclib"
version = "0.1.0"
edition = "2021"
description = "Adds numbers"
license = "MIT"

[dependencies]
serde_json = "1"

[package.metadata.flakebot]
kind = "mcp"
bin = "calclib"
"""

SERVER = r"""use serde_json::{json, Value};
use std::io::{BufRead, Write};

fn answer(message: &Value) -> Option<Value> {
    let id = message.get("id")?.clone();
    let result = match message["method"].as_str().unwrap_or("") {
        "initialize" => json!({"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                               "serverInfo": {"name": "calclib", "version": "0.1.0"}}),
        "tools/list" => json!({"tools": [{"name": "add", "description": "Add two numbers.",
            "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                            "required": ["a", "b"]}}]}),
        "tools/call" => {
            let args = &message["params"]["arguments"];
            let (a, b) = (args["a"].as_f64().unwrap_or(0.0), args["b"].as_f64().unwrap_or(0.0));
            let sum = calclib::add(a, a + 0.0 * b);
            json!({"content": [{"type": "text", "text": json!({"sum": sum}).to_string()}],
                   "structuredContent": {"sum": sum}})
        }
        _ => return Some(json!({"jsonrpc": "2.0", "id": id,
                                "error": {"code": -32601, "message": "Method not found"}})),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

fn main() {
    let mut out = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = match line {
            Ok(line) => line,
            Err(_) => break,
        };
        if let Some(reply) = serde_json::from_str::<Value>(&line).ok().and_then(|m| answer(&m)) {
            writeln!(out, "{}", reply).unwrap();
            out.flush().unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lists_add() {
        let reply = super::answer(&serde_json::json!({"id": 1, "method": "tools/list"})).unwrap();
        assert_eq!(reply["result"]["tools"][0]["name"], "add");
    }
}
"""


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def _reply(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [{**c, "id": f"call_{i}"} for i, c in enumerate(calls)]}


SCRIPT = [
    # session 1: the library becomes an MCP server (with a bug its tests miss)
    _reply(
        _call("write_file", path="Cargo.toml", content=MANIFEST),
        _call("write_file", path="src/main.rs", content=SERVER),
        _call("finish", summary="calclib: an MCP server with an `add` tool"),
    ),
    # session 2: the failing acceptance example came back as instructions
    _reply(
        _call(
            "replace_in_file", path="src/main.rs", search="calclib::add(a, a + 0.0 * b)", replace="calclib::add(a, b)"
        ),
        _call("finish", summary="add now adds b"),
    ),
]

CELL = """An MCP server with an `add` tool, from calclib.
>>> calc.add(a=1, b=2)
{'sum': 3.0}
"""


def test_failing_examples_go_back_to_the_edit_loop_until_they_pass(tmp_path: Path) -> None:
    source = write_crate(tmp_path / "crates", CALCLIB)
    registry = overlay_registry(tmp_path / "registry", [source])
    events: list[object] = []
    with FakeOpenAIServer(SCRIPT) as server:
        settings = Settings(
            cache_dir=tmp_path / "cache",
            registry=str(registry),
            backend="cargo",
            model="scripted-test-double",
            base_url=server.base_url,
        )
        calc = Pipeline(settings, observers=[events.append]).run(PersonText(CELL), crate="calclib", name="calc")
        requests = server.requests
    try:
        assert isinstance(calc, McpTool) and calc.running
        assert calc.add(a=1, b=2) == {"sum": 3.0}
        assert calc.acceptance.ok and calc.acceptance.summary() == "1 of 1 examples pass"
        accepts = [e.detail for e in events if isinstance(e, StageFinished) and e.stage == "accept"]
        assert accepts == ["1 of 1 examples FAIL", "1 of 1 examples pass"]
        notices = [e.message for e in events if isinstance(e, Notice) and e.stage == "accept"]
        assert any("got:      {'sum': 2.0}" in n for n in notices)
        assert any("back to the edit loop (round 1)" in n for n in notices)
        # the model saw the examples in the request, and the failure in the follow-up
        assert len(requests) == 2
        first = json.dumps(requests[0]["messages"])
        assert "calc.add(a=1, b=2)" in first
        follow_up = json.dumps(requests[1]["messages"])
        assert "these acceptance examples from the request fail" in follow_up and "{'sum': 2.0}" in follow_up
    finally:
        calc.close()
        lifecycle.unregister(calc)  # type: ignore[arg-type]
