"""Speculative candidates through the whole pipeline: real cargo in the sandbox, real git, the scripted fake server.

Three candidates race on tinyhex. The fake server (a scripted test double,
not a model) answers each by its ``X-Flakebot-Candidate`` header:

* #0 is quick and green, but its main has a clippy warning: not perfect;
* #1 is green with no warning: perfect, so the manager stops the rest;
* #2 is slow (its replies take seconds), and is cancelled when #1 wins.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, TINYHEX_CONTRACT, TINYHEX_LIB, TINYHEX_MAIN, call, reply, tinyhex_done
from scripted_builds import scripted_settings, tiny_registry
from tinycrates import crate, write_registry

from flakebot_magic.config import Settings
from flakebot_magic.errors import Cancelled
from flakebot_magic.events import CandidateUpdate, ModelUsage
from flakebot_magic.host.process import CancelToken
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest, RunFlags
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo

#: tinyhex's main with a clippy warning (`len() == 0`): green, but not perfect
LINTED_MAIN = TINYHEX_MAIN.replace(
    '    println!("{}", tinyhex::to_hex(&input));',
    "    let empty = input.len() == 0;\n    if empty {\n        println!();\n        return;\n    }\n"
    '    println!("{}", tinyhex::to_hex(&input));',
)


def linted_done() -> list[dict[str, Any]]:
    return [
        reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=LINTED_MAIN)),
        reply(call("finish", summary="tinyhex, with a lint")),
    ]


def race_script(slow: float = 30.0) -> dict[str, Any]:
    return {
        "candidates": {
            "0": {"responses": linted_done(), "delay": 0.2},
            "1": {"responses": tinyhex_done("tinyhex, clean"), "delay": 1.0},
            "2": {"responses": tinyhex_done("tinyhex, slow"), "delay": slow},
        }
    }


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


def _settings(tmp_path: Path, registry: DirectoryRegistry, server: FakeOpenAIServer, **more: Any) -> Settings:
    return scripted_settings(tmp_path / "cache", registry, server, **more)


def test_three_candidates_race_and_the_judge_keeps_the_perfect_one(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    events: list[Any] = []
    with FakeOpenAIServer(race_script()) as server:
        settings = _settings(tmp_path, hex_registry, server)
        tool = Pipeline(settings, observers=[events.append]).run(
            BuildRequest("hex-encode standard input", crate="tinyhex", name="hexer", flags=RunFlags(candidates=3))
        )
        records = server.records
    # every engineer's request said who it was
    by_candidate = {r["headers"].get("x-flakebot-candidate") for r in records}
    assert by_candidate == {"0", "1", "2"}
    assert {r["headers"].get("x-flakebot-role") for r in records} == {"engineer"}
    # candidates differ in sampling
    temperatures = {json.dumps(r["body"].get("temperature")) for r in records}
    assert len(temperatures) == 3

    assert tool.provenance["winner"] == 1
    listed = {c["index"]: c for c in tool.provenance["candidates"]}
    assert listed[1]["status"] == "winner" and listed[1]["score"]["contract_met"] is True
    assert listed[0]["status"] == "lost" and listed[0]["score"]["clippy_warnings"] >= 1
    assert listed[1]["first_check_dependency_units"] == 0
    assert listed[2]["status"] == "cancelled", json.dumps(listed)
    assert tool(b"hi").strip() == "6869"

    # the widget saw a row per candidate, and the winner
    updates = [e for e in events if isinstance(e, CandidateUpdate)]
    assert {u.index for u in updates} == {0, 1, 2}
    assert any(u.index == 1 and u.state == "winner" for u in updates)
    # usage, per candidate and in the provenance
    finals = [e for e in events if isinstance(e, ModelUsage) and e.final]
    assert {e.candidate for e in finals} >= {0, 1}
    assert tool.provenance["usage"]["calls"] >= 4

    # the losers are kept for inspection under the tool's workspace; the winner's commits are the workspace's
    workspace = settings.cache.workspaces / "hexer"
    assert (workspace / ".flakebot-candidates" / "0" / "src" / "main.rs").read_text() == LINTED_MAIN
    assert (workspace / "src" / "main.rs").read_text() == TINYHEX_MAIN


def test_clones_start_warm_no_dependency_unit_is_compiled_again(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    """Each candidate's first check run compiles only the crate (tinyhex has no dependencies: a floor test; the
    bench measures a crate with dependencies)."""
    events: list[Any] = []
    with FakeOpenAIServer(race_script(slow=0.5)) as server:
        settings = _settings(tmp_path, hex_registry, server)
        Pipeline(settings, observers=[events.append]).run(
            BuildRequest("hex-encode standard input", crate="tinyhex", name="hexer", flags=RunFlags(candidates=3))
        )
    cloned = [u for u in events if isinstance(u, CandidateUpdate) and "cloned in" in u.detail]
    assert len(cloned) == 3


def test_a_cancel_stops_every_actor_and_process_within_two_seconds(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    token = CancelToken()
    events: list[Any] = []
    # every candidate waits on a 60 s reply
    script = {"candidates": {str(i): {"responses": tinyhex_done(), "delay": 60.0} for i in range(3)}}
    with FakeOpenAIServer(script) as server:
        settings = _settings(tmp_path, hex_registry, server)
        failure: list[BaseException] = []

        def build() -> None:
            try:
                Pipeline(settings, observers=[events.append], cancel=token).run(
                    BuildRequest(
                        "hex-encode standard input", crate="tinyhex", name="hexer", flags=RunFlags(candidates=3)
                    )
                )
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=build)
        thread.start()
        deadline = time.monotonic() + 120
        while len(server.records) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(server.records) == 3, "the three candidates never asked the model"
        cancelled_at = time.monotonic()
        token.cancel()
        thread.join(10)
        stopped_after = time.monotonic() - cancelled_at
    assert not thread.is_alive()
    assert failure and isinstance(failure[0], Cancelled)
    assert stopped_after < 2.0, f"stopping took {stopped_after:.2f} s"
    leftovers = [t.name for t in threading.enumerate() if t.name.startswith(("flakebot-engineer", "flakebot-judge"))]
    assert leftovers == []


HEXLITE = crate(
    "hexlite",
    description="Hex encoding of bytes, small",
    files={"src/lib.rs": TINYHEX_LIB.replace("tinyhex", "hexlite"), "README.md": "# hexlite\n\nHex-encode bytes.\n"},
)
HEXLITE_MAIN = TINYHEX_MAIN.replace("tinyhex::to_hex", "hexlite::to_hex").replace("Usage: tinyhex", "Usage: hexlite")
HEXLITE_CONTRACT = call(
    "replace_in_file",
    path="Cargo.toml",
    search='license = "MIT"\n',
    replace='license = "MIT"\n\n[package.metadata.flakebot]\nkind = "cli"\nbin = "hexlite"\n',
)


def test_when_the_search_is_close_a_candidate_starts_from_the_second_crate_and_can_win(
    tmp_path: Path,
) -> None:
    root = write_registry(tmp_path / "registry", [TINYHEX, HEXLITE])
    registry = DirectoryRegistry(root, tmp_path / "index")
    choose = reply(call("choose_crate", crate="tinyhex", reason="hex encoding"))
    script = {
        "responses": [choose],  # the crate choice (no role header)
        "candidates": {
            "0": {"responses": linted_done()},  # tinyhex, green with a clippy warning
            "1": {
                "responses": [
                    reply(HEXLITE_CONTRACT, call("write_file", path="src/main.rs", content=HEXLITE_MAIN)),
                    reply(call("finish", summary="hexlite, clean")),
                ]
            },
        },
    }
    events: list[Any] = []
    try:
        with FakeOpenAIServer(script) as server:
            settings = _settings(tmp_path, registry, server)
            tool = Pipeline(settings, observers=[events.append]).run(
                BuildRequest("hex encoding of bytes", name="hexer", flags=RunFlags(candidates=2))
            )
    finally:
        registry.close()
    assert tool.provenance["winner"] == 1
    assert tool.crate == "hexlite" and tool.provenance["crate"] == "hexlite"
    listed = {c["index"]: c for c in tool.provenance["candidates"]}
    assert listed[1].get("crate", "").startswith("hexlite") and "crate" not in listed[0]
    assert tool(b"hi").strip() == "6869"
    workspace = settings.cache.workspaces / "hexer"
    assert "hexlite" in (workspace / "Cargo.toml").read_text()
    # the first crate's fork and the losing candidate are kept for inspection
    kept = workspace / ".flakebot-candidates"
    assert (kept / "base" / "src" / "lib.rs").is_file() and (kept / "0" / "src" / "main.rs").is_file()
