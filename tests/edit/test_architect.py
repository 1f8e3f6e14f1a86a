"""The architect (``--plan``): one request before the engineers, its own model, its plan given to every engineer.

Real cargo in the sandbox and real git; the model is the scripted fake server (a test double, not a model).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, tinyhex_done
from scripted_builds import scripted_settings, tiny_registry

from flakebot_magic.events import ModelUsage, Notice
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest, RunFlags
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo

PLAN = (
    "1. Add src/main.rs reading standard input and printing tinyhex::to_hex of it.\n"
    "2. Declare the tool contract in Cargo.toml.\n"
    "Examples:\n"
    '>>> hexer(b"hi")\n'
    "'6869\\n'\n"
)


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


def test_the_architect_plans_once_with_its_own_model_and_every_engineer_reads_the_plan(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    script = {
        "roles": {
            "architect": [
                {"role": "assistant", "content": PLAN, "usage": {"prompt_tokens": 900, "completion_tokens": 80}}
            ]
        },
        "candidates": {"0": tinyhex_done("from the plan, #0"), "1": tinyhex_done("from the plan, #1")},
    }
    events: list[Any] = []
    with FakeOpenAIServer(script) as server:
        settings = scripted_settings(
            tmp_path / "cache",
            hex_registry,
            server,
            architect_model="scripted-architect",
        )
        tool = Pipeline(settings, observers=[events.append]).run(
            BuildRequest(
                "hex-encode standard input", crate="tinyhex", name="hexer", flags=RunFlags(plan=True, candidates=2)
            )
        )
        architect = server.requests_for("roles.architect")
        engineers = [r for r in server.records if r["queue"] != "roles.architect"]
    assert len(architect) == 1 and architect[0]["model"] == "scripted-architect"
    assert "hex-encode standard input" in architect[0]["messages"][1]["content"]
    assert engineers and all(r["body"]["model"] == "scripted-test-double" for r in engineers)
    firsts = [r["body"] for r in engineers if len(r["body"]["messages"]) == 2]
    assert len(firsts) == 2 and all(PLAN.strip() in b["messages"][1]["content"] for b in firsts)
    assert tool.provenance["plan"].startswith("1. Add src/main.rs")
    # a model's plan carries no acceptance examples: its ">>>" lines reached the engineers as words (above), and
    # the judge ran none of them against any candidate (only the person's own examples are checks: issue 33)
    scores = [c["score"] for c in tool.provenance["candidates"] if c["score"]]
    assert scores and all(s["examples_total"] == 0 for s in scores), scores
    assert any(isinstance(e, ModelUsage) and e.role == "architect" and e.prompt_tokens == 900 for e in events)


def test_an_architect_that_fails_is_a_notice_and_the_engineer_starts_without_a_plan(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    script = {
        "roles": {
            "architect": [
                {"fault": "status", "status": 400, "body": {"error": {"message": "no such model: scripted-architect"}}}
            ]
        },
        "responses": tinyhex_done(),
    }
    events: list[Any] = []
    with FakeOpenAIServer(script) as server:
        settings = scripted_settings(
            tmp_path / "cache",
            hex_registry,
            server,
            architect_model="scripted-architect",
        )
        tool = Pipeline(settings, observers=[events.append]).run(
            BuildRequest("hex-encode standard input", crate="tinyhex", name="hexer", flags=RunFlags(plan=True))
        )
    assert tool(b"hi").strip() == "6869"
    warnings = [e.message for e in events if isinstance(e, Notice) and e.level == "warning"]
    assert any("the architect" in w and "without one" in w for w in warnings), warnings
    assert not tool.provenance["plan"]
