"""Edit sessions that survive and can be steered, through the whole pipeline.

Real cargo in the sandbox, real git, a real second process; the model is the
scripted fake server (a test double, not a model).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, TINYHEX_CONTRACT, TINYHEX_MAIN, call, reply, tinyhex_done
from polling import wait_for
from scripted_builds import kill_when, resumable_script, scripted_settings, tiny_registry

from flakebot_magic.config import Settings
from flakebot_magic.edit.session import MAX_RESULT_BYTES
from flakebot_magic.errors import BudgetExhausted, UsageError
from flakebot_magic.manage.tools import describe
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.journal import Journal
from flakebot_magic.records.sessions import render_with_sessions
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest, RunFlags
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

pytestmark = pytest.mark.cargo

ROOT = Path(__file__).resolve().parents[2]
REQUEST = "hex-encode standard input"

#: how a run continues a killed session
RESUME = RunFlags(resume=True)


@pytest.fixture(scope="module")
def hex_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX])


def _settings(tmp_path: Path, registry: DirectoryRegistry, server: FakeOpenAIServer, **more: Any) -> Settings:
    return scripted_settings(tmp_path / "cache", registry, server, **more)


def _user_texts(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m.get("content"), str)]


def test_a_steering_message_from_another_process_reaches_the_next_request(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    first, second = tinyhex_done()
    script = [{**first, "delay": 3.0}, second]
    with FakeOpenAIServer(script) as server:
        settings = _settings(tmp_path, hex_registry, server)
        done: list[Any] = []
        thread = threading.Thread(
            target=lambda: done.append(Pipeline(settings).run(BuildRequest(REQUEST, crate="tinyhex", name="hexer")))
        )
        thread.start()
        wait_for(lambda: len(server.requests) >= 1, timeout=120, what="the session's first request")
        sent = subprocess.run(
            [sys.executable, "-m", "flakebot_magic.cli", "steer", "hexer", "also accept --upper"],
            capture_output=True,
            text=True,
            env={**os.environ, "FLAKEBOT_CACHE_DIR": str(settings.cache_dir)},
            timeout=60,
        )
        assert sent.returncode == 0, sent.stderr
        thread.join(180)
        assert done, "the build did not finish"
        bodies = server.requests
    assert not any("also accept --upper" in t for t in _user_texts(bodies[0]))
    assert any("also accept --upper" in t for t in _user_texts(bodies[1]))
    # recorded in the journal too
    journals = list((settings.cache_dir / "journals" / "hexer").glob("*.jsonl"))
    steers = [r for j in journals for r in Journal.read(j) if r["t"] == "steer"]
    assert [s["text"] for s in steers] == ["also accept --upper"]


def test_usage_and_cost_are_the_scripted_usage_times_the_price_table(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    first, second = tinyhex_done()
    usage = [
        {"prompt_tokens": 12_000, "completion_tokens": 800, "prompt_tokens_details": {"cached_tokens": 0}},
        {"prompt_tokens": 15_000, "completion_tokens": 50, "prompt_tokens_details": {"cached_tokens": 0}},
    ]
    script = [{**first, "usage": usage[0]}, {**second, "usage": usage[1]}]
    with FakeOpenAIServer(script) as server:
        settings = _settings(tmp_path, hex_registry, server, prices={"scripted-test-double": (2.0, 8.0)})
        tool = Pipeline(settings).run(BuildRequest(REQUEST, crate="tinyhex", name="hexer"))
    recorded = tool.provenance["usage"]
    assert recorded["prompt_tokens"] == 27_000 and recorded["completion_tokens"] == 850
    assert recorded["cost_usd"] == pytest.approx((27_000 * 2.0 + 850 * 8.0) / 1_000_000)
    # per tool: every journalled session of it (one so far), in `flakebot show`
    shown = describe(settings, "hexer")
    every = shown["usage_all_sessions"]
    assert (every["sessions"], every["prompt_tokens"], every["completion_tokens"]) == (1, 27_000, 850)
    assert every["cost_usd"] == pytest.approx(recorded["cost_usd"])
    assert "over 1 edit session" in render_with_sessions(shown)


def test_max_cost_stops_the_session_before_it_overspends(hex_registry: DirectoryRegistry, tmp_path: Path) -> None:
    first, second = tinyhex_done()
    # $0.98 + $0.008 spent by the first reply; the second request's prompt would take it past $0.99
    script = [{**first, "usage": {"prompt_tokens": 490_000, "completion_tokens": 1000}}, second]
    with FakeOpenAIServer(script) as server:
        settings = _settings(
            tmp_path,
            hex_registry,
            server,
            prices={"scripted-test-double": (2.0, 8.0)},
            max_cost=0.99,
            token_budget=10_000_000,
        )
        with pytest.raises(BudgetExhausted) as caught:
            Pipeline(settings).run(BuildRequest(REQUEST, crate="tinyhex", name="hexer"))
        assert len(server.requests) == 1  # the second request would have passed $1.00: it was never sent
    assert caught.value.reason == "cost"
    assert "--resume" in str(caught.value)


LOUD_MAIN = TINYHEX_MAIN.replace(
    "mod tests {",
    'mod tests {\n    #[test]\n    fn loud() {\n        print!("{}", "x".repeat(5_000_000));\n        panic!("too loud");\n    }\n',
)


def test_five_megabytes_of_test_output_reach_the_model_within_the_cap(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    script = [
        reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=LOUD_MAIN), call("run_checks")),
        reply(call("replace_in_file", path="src/main.rs", search='panic!("too loud");', replace="")),
        reply(call("finish", summary="quiet again")),
    ]
    with FakeOpenAIServer(script) as server:
        settings = _settings(tmp_path, hex_registry, server)
        Pipeline(settings).run(BuildRequest(REQUEST, crate="tinyhex", name="hexer"))
        after_checks = server.requests[1]
    results = [m["content"] for m in after_checks["messages"] if m["role"] == "tool"]
    assert results and all(len(r.encode()) <= MAX_RESULT_BYTES for r in results)
    assert len(json.dumps(after_checks)) < 200_000


def test_a_session_killed_with_sigkill_resumes_and_deploys(hex_registry: DirectoryRegistry, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with FakeOpenAIServer(resumable_script(TINYHEX_MAIN, TINYHEX_CONTRACT)) as server:
        kill_when(server, cache, hex_registry, requests=2)
        settings = scripted_settings(cache, hex_registry, server)
        events: list[Any] = []
        tool = Pipeline(settings, observers=[events.append]).run(BuildRequest("", name="hexer", flags=RESUME))
        resumed = server.requests[2]
    assert tool(b"hi").strip() == "6869"
    # the resumed request carries the earlier conversation: the first reply's calls and their results
    roles = [m["role"] for m in resumed["messages"]]
    assert roles[:2] == ["system", "user"] and "tool" in roles
    assert any(REQUEST in t for t in _user_texts(resumed))
    # the check runs the killed session finished are not repeated: not check run 0, not the green check run 1
    notices = [str(getattr(e, "message", "")) for e in events]
    assert any("no check run is repeated" in n for n in notices)
    assert any("its result is reused, no check run repeated" in n for n in notices), notices


def test_a_race_killed_with_sigkill_resumes_every_candidate_and_deploys_the_winner(
    hex_registry: DirectoryRegistry, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = reply(TINYHEX_CONTRACT, call("write_file", path="src/main.rs", content=TINYHEX_MAIN), call("run_checks"))
    waiting = {**reply(call("finish", summary="never seen")), "delay": 120.0}  # the process dies waiting
    script = {
        "candidates": {
            "0": [first, waiting, reply(call("finish", summary="#0 after the resume"))],
            "1": [first, waiting, reply(call("finish", summary="#1 after the resume"))],
        }
    }
    with FakeOpenAIServer(script) as server:
        kill_when(server, cache, hex_registry, requests=4, candidates=2)
        settings = scripted_settings(cache, hex_registry, server)
        events: list[Any] = []
        tool = Pipeline(settings, observers=[events.append]).run(BuildRequest("", name="hexer", flags=RESUME))
        resumed = server.records[4:]
    assert tool(b"hi").strip() == "6869"
    assert tool.provenance["winner"] in (0, 1) and len(tool.provenance["candidates"]) == 2
    # each candidate's resumed request carried its own earlier conversation
    assert {r["headers"]["x-flakebot-candidate"] for r in resumed} <= {"0", "1"}
    assert all("tool" in [m["role"] for m in r["body"]["messages"]] for r in resumed)
    notices = [str(getattr(e, "message", "")) for e in events]
    assert any("resuming the race of 2 candidates" in n for n in notices), notices
    # the race is decided: nothing is left to resume
    with pytest.raises(UsageError, match="no unfinished edit session"):
        Pipeline(settings).run(BuildRequest("", name="hexer", flags=RESUME))
