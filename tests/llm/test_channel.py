"""One channel to the model: only ``llm/`` sends chat requests, and every role's tokens reach the one budget.

* read from the source: no module outside ``flakebot_magic/llm/`` imports ``openai``, touches
  ``.chat.completions``, builds a model connection (``ModelHTTP``) or names the completions path;
* a scripted build (the fake OpenAI server, a test double; real cargo) whose crate choice spends tokens:
  they are in ``provenance["usage"]`` beside the engineer's, and ``--max-cost`` stops the build once the
  choice has spent it, before any engineer's request;
* a crate choice in flight is cut by the run's cancel token, long before the model's timeout.
"""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from editscripts import TINYHEX, call, reply, tinyhex_done
from polling import wait_for
from scripted_builds import scripted_settings, tiny_registry
from tinycrates import crate

from flakebot_magic.config import Settings
from flakebot_magic.errors import BudgetExhausted, Cancelled
from flakebot_magic.events import EventBus, ModelUsage
from flakebot_magic.host.process import CancelToken
from flakebot_magic.llm.budget import Budget
from flakebot_magic.llm.model import ModelConfig
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.registry.base import CrateCandidate
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.request import BuildRequest
from flakebot_magic.stages.choose import choose_by_model, chooser_channel
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

PACKAGE = Path(__file__).resolve().parents[2] / "flakebot_magic"
LLM = PACKAGE / "llm"
#: the test doubles serve the wire (the fake server); they never send a request
DOUBLES = PACKAGE / "testing"


def _requests_to_a_model(path: Path) -> list[str]:
    """What in ``path`` talks to a model directly: openai imports, ``.chat.completions``, ModelHTTP, the URL path."""
    found = []
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        where = f"{path.relative_to(PACKAGE)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "openai" for a in node.names):
            found.append(f"{where} imports openai")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "openai":
            found.append(f"{where} imports from openai")
        elif isinstance(node, ast.Attribute) and node.attr in ("completions", "with_streaming_response"):
            found.append(f"{where} uses .{node.attr}")
        elif isinstance(node, (ast.Name, ast.Attribute)) and "ModelHTTP" in (
            node.id if isinstance(node, ast.Name) else node.attr
        ):
            found.append(f"{where} names ModelHTTP")
        elif isinstance(node, ast.alias) and node.name == "ModelHTTP":
            found.append(f"{where} imports ModelHTTP")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "chat/completions" in node.value
            and id(node) not in docstrings
        ):
            found.append(f"{where} names the completions path")
    return found


def _code_files() -> list[Path]:
    suites = PACKAGE / "eval" / "suites"
    return [p for p in sorted(PACKAGE.rglob("*.py")) if suites not in p.parents]


def test_only_the_llm_package_sends_model_requests() -> None:
    outside = [
        hit
        for path in _code_files()
        if LLM not in path.parents and DOUBLES not in path.parents
        for hit in _requests_to_a_model(path)
    ]
    assert outside == [], "model requests go through flakebot_magic.llm.channel.ModelChannel:\n" + "\n".join(outside)


def test_the_check_sees_what_the_channel_does() -> None:
    """The rule is not vacuous: the channel itself is what it finds."""
    inside = [hit for path in sorted(LLM.glob("*.py")) for hit in _requests_to_a_model(path)]
    assert any("channel.py" in h and ".completions" in h for h in inside), inside
    assert any("channel.py" in h and "imports openai" in h for h in inside), inside
    assert any("model.py" in h and "imports openai" in h for h in inside), inside


# -- the crate choice spends the run's budget ------------------------------------------------------------------

HEXISH = crate("hexish", description="Hex encoding of bytes, upper case", files={"src/lib.rs": "pub fn x() {}\n"})
REQUEST = "hex-encode bytes from standard input"


def _choice(name: str, prompt_tokens: int = 7_000) -> dict[str, Any]:
    """The chooser's scripted answer, with the tokens it says it took."""
    message = reply(call("choose_crate", crate=name, reason="it encodes bytes as hex"))
    return {**message, "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 40}}


@pytest.fixture(scope="module")
def two_hex_crates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    yield from tiny_registry(tmp_path_factory, [TINYHEX, HEXISH])


@pytest.mark.cargo
def test_the_crate_choice_is_charged_and_shows_in_the_provenance(
    two_hex_crates: DirectoryRegistry, tmp_path: Path
) -> None:
    script = {"roles": {"chooser": [_choice("tinyhex")]}, "responses": tinyhex_done()}
    events: list[Any] = []
    with FakeOpenAIServer(script) as server:
        settings = scripted_settings(tmp_path / "cache", two_hex_crates, server)
        tool = Pipeline(settings, observers=[events.append]).run(BuildRequest(REQUEST, name="hexer"))
        chooser = server.records[0]
    assert chooser["queue"] == "roles.chooser" and chooser["headers"]["x-flakebot-role"] == "chooser"
    assert tool.provenance["choice"]["by"] == "model"
    final = [e for e in events if isinstance(e, ModelUsage) and e.final]
    roles = {e.role for e in final}
    assert roles == {"chooser", "engineer"}, final
    chose = next(e for e in final if e.role == "chooser")
    assert chose.prompt_tokens == 7_000 and chose.completion_tokens == 40 and chose.stage == "search"
    usage = tool.provenance["usage"]
    # the provenance counts every role's tokens: the choice's and the engineer's, one budget
    assert usage["prompt_tokens"] == sum(e.prompt_tokens for e in final) > 7_000
    assert usage["calls"] == len(server.requests) == 3


@pytest.mark.cargo
def test_max_cost_stops_the_build_once_the_crate_choice_spent_it(
    two_hex_crates: DirectoryRegistry, tmp_path: Path
) -> None:
    script = {"roles": {"chooser": [_choice("tinyhex", prompt_tokens=200_000)]}, "responses": tinyhex_done()}
    with FakeOpenAIServer(script) as server:
        # the choice's prompt (a few thousand tokens) fits $0.10 at $1 per million; the 200,000 it took do not
        settings = scripted_settings(
            tmp_path / "cache", two_hex_crates, server, prices={"scripted-test-double": (1.0, 1.0)}, max_cost=0.1
        )
        with pytest.raises(BudgetExhausted) as caught:
            Pipeline(settings).run(BuildRequest(REQUEST, name="hexer"))
        sent = [r["queue"] for r in server.records]
    assert caught.value.reason == "cost" and "$0.10" in str(caught.value)
    assert sent == ["roles.chooser"]  # no engineer's request went out


def test_a_crate_choice_in_flight_is_cut_by_the_cancel(fake_openai: Callable[..., FakeOpenAIServer]) -> None:
    stall = 30
    server = fake_openai([{"fault": "stall", "seconds": stall}, _choice("b")])
    model = ModelConfig("scripted", base_url=server.base_url, timeout=60.0, max_retries=0)
    cancel = CancelToken()
    a, b = CrateCandidate("a", "1.0.0", "first"), CrateCandidate("b", "1.0.0", "second")
    settings = Settings()
    cancelled_at: list[float] = []

    def cancel_in_flight() -> None:  # once the server holds the request (it records it before the stall)
        wait_for(lambda: server.requests, 120, "the choice's request to reach the model")
        cancelled_at.append(time.monotonic())
        cancel.cancel()

    threading.Thread(target=cancel_in_flight, daemon=True).start()
    with (
        pytest.raises(Cancelled),
        chooser_channel(
            model, bus=EventBus([]), budget=Budget(10**9), limits=settings.reply_limits(), cancel=cancel
        ) as channel,
    ):
        choose_by_model(channel, _NoSources(), "x", [a, b], EventBus([]))
    # cut, not answered: the answer comes only once the stall is over. Timed from the cancel of a request in
    # flight: a timer started before the channel measured the imports under load (8 to 10 s against 5).
    assert cancelled_at and time.monotonic() - cancelled_at[0] < stall


class _NoSources:
    id = "no sources"
