"""Row "model replies" of the matrix (docs/SECURITY.md): what a model writes is words, never code, never examples.

A model's reply reaches the host as text at these doors: the architect's plan (``--plan``), which the engineers
read and which the judge of a race (``--candidates``) ran as acceptance examples against every candidate; the
engineers' summaries and calls (their protocol: ``tests/edit``); the crate choice. Before issue 33 the plan's
``>>>`` lines ran with ``exec`` in flakebot's process: a plan wrote a file as the user (the red team's first
door). Here the plan carries the payload of ``door_payloads`` at each door: nothing runs, no judge counts it,
and the engineers still read it as words.

Real cargo in the sandbox and real git; the model is the scripted fake server (a test double, not a model).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from door_payloads import assert_nothing_ran, runs_if_code
from editscripts import TINYHEX, tinyhex_done
from scripted_builds import scripted_settings, tiny_registry

from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest, PersonText, RunFlags
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


def _plan(marker: Path) -> str:
    return "1. Add src/main.rs printing tinyhex::to_hex of standard input.\nExamples:\n" + runs_if_code(marker, "hexer")


@pytest.mark.parametrize("candidates", [2, 1])
def test_an_architects_plan_runs_nothing_at_any_door(
    hex_registry: DirectoryRegistry, tmp_path: Path, candidates: int
) -> None:
    marker = tmp_path / "plan-ran"
    plan = _plan(marker)
    script: dict[str, object] = {"roles": {"architect": [{"role": "assistant", "content": plan}]}}
    if candidates > 1:
        script["candidates"] = {str(i): tinyhex_done(f"#{i}") for i in range(candidates)}
    else:
        script["responses"] = tinyhex_done()
    with FakeOpenAIServer(script) as server:
        settings = scripted_settings(tmp_path / "cache", hex_registry, server, architect_model="scripted-architect")
        tool = Pipeline(settings).run(
            BuildRequest(
                PersonText("hex-encode standard input"),  # the person's words: no examples of their own
                crate="tinyhex",
                name="hexer",
                flags=RunFlags(plan=True, candidates=candidates),
            )
        )
        engineers = [r for r in server.records if r["queue"] != "roles.architect"]
    assert_nothing_ran(marker, tool, source="the architect's plan")
    assert tool(b"hi").strip() == "6869"
    # the engineers read the plan, payload and all, as words
    said = [str(m.get("content")) for r in engineers for m in r["body"]["messages"]]
    assert any("Add src/main.rs printing" in m and "__import__('pathlib')" in m for m in said)
    # no judge counted an example of the plan's
    for candidate in tool.provenance.get("candidates") or []:
        assert not (candidate.get("score") or {}).get("examples_total"), candidate


def test_the_persons_own_examples_are_still_judged_beside_a_plan(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    """The control: the person's ``>>>`` line is an acceptance example in the same race, the plan's are not."""
    marker = tmp_path / "plan-ran"
    script = {
        "roles": {"architect": [{"role": "assistant", "content": _plan(marker)}]},
        "candidates": {"0": tinyhex_done("#0"), "1": tinyhex_done("#1")},
    }
    with FakeOpenAIServer(script) as server:
        settings = scripted_settings(tmp_path / "cache", hex_registry, server, architect_model="scripted-architect")
        tool = Pipeline(settings).run(
            BuildRequest(
                PersonText('hex-encode standard input\n>>> hexer(b"hi")\n6869\n'),
                crate="tinyhex",
                name="hexer",
                flags=RunFlags(plan=True, candidates=2),
            )
        )
    assert not marker.exists()
    assert tool.acceptance is not None and [r.passed for r in tool.acceptance.results] == [True]
    scores = [c["score"] for c in tool.provenance["candidates"] if c["score"]]
    assert scores and all(s["examples_total"] == 1 for s in scores), scores
