"""The fake OpenAI server's routed scripts: queues per role and candidate, simulated latency, scripted usage."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from polling import wait_for

from flakebot_magic.testing.fake_openai import FakeOpenAIServer, load_script

StartServer = Callable[..., FakeOpenAIServer]
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "make me a tool that counts words"}]
USAGE = {
    "prompt_tokens": 1200,
    "completion_tokens": 34,
    "total_tokens": 1234,
    "prompt_tokens_details": {"cached_tokens": 1024},
}


def text(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def headers(candidate: int | None = None, role: str | None = None) -> dict[str, str]:
    sent = {}
    if candidate is not None:
        sent["X-Flakebot-Candidate"] = str(candidate)
    if role is not None:
        sent["X-Flakebot-Role"] = role
    return sent


@pytest.fixture
def client_for() -> Iterator[Callable[..., openai.OpenAI]]:
    """Real openai clients pointed at a fake; all closed at teardown."""
    clients: list[openai.OpenAI] = []

    def make(server: FakeOpenAIServer, max_retries: int = 0, timeout: float = 10.0) -> openai.OpenAI:
        client = openai.OpenAI(base_url=server.base_url, api_key="test", max_retries=max_retries, timeout=timeout)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


def ask(client: openai.OpenAI, candidate: int | None = None, role: str | None = None) -> str | None:
    reply = client.chat.completions.create(
        model="m",
        messages=USER,
        extra_headers=headers(candidate, role),
    )
    return reply.choices[0].message.content


ROUTED = {
    "roles": {"architect": {"responses": [text("the plan")]}},
    "candidates": {"0": {"responses": [text("zero-a"), text("zero-b")]}, "1": [text("one")]},
    "responses": [text("default-a"), text("default-b")],
}


def test_requests_are_routed_by_candidate_then_role_then_default(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai(ROUTED)
    client = client_for(server)

    answers = [
        ask(client, role="architect"),
        ask(client, candidate=0, role="engineer"),
        ask(client, candidate=1, role="engineer"),
        ask(client, candidate=2, role="engineer"),  # no queue for candidate 2 nor for engineers
        ask(client, candidate=0, role="architect"),  # the candidate's queue comes first
        ask(client),
    ]

    assert answers == ["the plan", "zero-a", "one", "default-a", "zero-b", "default-b"]
    queues = ["roles.architect", "candidates.0", "candidates.1", "responses", "candidates.0", "responses"]
    assert [record["queue"] for record in server.records] == queues
    assert server.records[1]["headers"]["x-flakebot-candidate"] == "0"
    assert server.records[1]["headers"]["x-flakebot-role"] == "engineer"
    assert server.records[0]["headers"]["authorization"] == "Bearer <redacted>"
    assert len(server.requests_for("candidates.0")) == 2 and server.requests_for("roles.architect") == [
        server.requests[0]
    ]
    assert server.remaining == 0
    with pytest.raises(ValueError, match=r"no queue 'roles\.engineer'"):
        server.requests_for("roles.engineer")


def test_the_requests_endpoint_shows_headers_and_queue(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai(ROUTED)
    ask(client_for(server), candidate=1, role="engineer")

    records = httpx.get(server.base_url.removesuffix("/v1") + "/_requests").json()

    assert [(r["method"], r["queue"]) for r in records] == [("POST", "candidates.1")]
    assert records[0]["headers"]["x-flakebot-candidate"] == "1"
    assert records[0]["headers"]["authorization"] == "Bearer <redacted>"
    assert records[0]["body"]["messages"] == USER


def test_a_role_queue_answers_a_candidate_without_its_own(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai({"roles": {"engineer": [text("any engineer")]}, "candidates": {0: [text("zero")]}})

    assert ask(client_for(server), candidate=7, role="engineer") == "any engineer"
    assert server.records[0]["queue"] == "roles.engineer"


@pytest.mark.parametrize("script", [[text("one"), text("two")], {"responses": [text("one"), text("two")]}])
def test_a_plain_script_answers_every_request(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI], script: Any
) -> None:
    server = fake_openai(script)
    client = client_for(server)

    assert [ask(client, candidate=3, role="engineer"), ask(client, role="architect")] == ["one", "two"]
    assert {record["queue"] for record in server.records} == {"responses"}


def test_an_exhausted_queue_is_a_500_naming_it_and_others_still_answer(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai(ROUTED)
    client = client_for(server, max_retries=2)
    ask(client, candidate=1)

    with pytest.raises(openai.InternalServerError) as caught:
        ask(client, candidate=1)

    assert caught.value.status_code == 500
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert "'candidates.1' has only 1 items" in caught.value.message and "request 2" in caught.value.message
    assert len(server.requests_for("candidates.1")) == 2  # not retried
    assert ask(client, candidate=0) == "zero-a"


def test_a_request_no_queue_claims_is_a_500(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai({"roles": {"architect": [text("plan")]}})

    with pytest.raises(openai.InternalServerError) as caught:
        ask(client_for(server, max_retries=2), candidate=0, role="engineer")

    assert 'no default "responses" queue' in caught.value.message and "roles.architect" in caught.value.message
    assert server.records[0]["queue"] is None and len(server.requests) == 1


def test_each_queue_is_consumed_once_per_item_under_concurrency(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    count = 16
    server = fake_openai(
        {"candidates": {"0": [text(f"zero-{i}") for i in range(count)], "1": [text(f"one-{i}") for i in range(count)]}}
    )
    client = client_for(server)

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda i: ask(client, candidate=i % 2), range(2 * count)))

    assert sorted(a for a in answers if a and a.startswith("zero")) == sorted(f"zero-{i}" for i in range(count))
    assert sorted(a for a in answers if a and a.startswith("one")) == sorted(f"one-{i}" for i in range(count))
    assert server.remaining == 0


def test_delayed_replies_on_different_queues_overlap(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai({"delay": 1.0, "candidates": {str(i): [text(f"candidate {i}")] for i in range(3)}})
    clients = [client_for(server) for _ in range(3)]
    start = threading.Barrier(3)

    def timed(index: int) -> tuple[str | None, float]:
        start.wait()
        began = time.monotonic()
        answer = ask(clients[index], candidate=index, role="engineer")
        return answer, time.monotonic() - began

    began = time.monotonic()
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(timed, range(3)))
    wall = time.monotonic() - began

    assert [answer for answer, _ in results] == ["candidate 0", "candidate 1", "candidate 2"]
    assert all(seconds >= 1.0 for _, seconds in results)  # each waited its simulated latency
    assert wall < 2.5, f"three 1 s replies took {wall:.2f} s: they did not overlap"


def test_the_most_specific_delay_wins(fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]) -> None:
    server = fake_openai(
        {
            "delay": 60,
            "candidates": {"0": {"delay": 0, "responses": [text("quick"), text("slow", delay=0.3)]}},
            "responses": [text("quick too", delay=0)],
        }
    )
    client = client_for(server, timeout=10.0)  # a reply held back 60 s would time out
    times = []
    for candidate in (0, 0, None):
        began = time.monotonic()
        ask(client, candidate=candidate)
        times.append(time.monotonic() - began)

    assert times[0] < 5 and times[2] < 5
    assert times[1] >= 0.3


def test_stopping_does_not_wait_for_a_delayed_reply(client_for: Callable[..., openai.OpenAI]) -> None:
    server = FakeOpenAIServer({"delay": 60, "responses": [text("never sent")]})
    server.start(announce=False)
    client = client_for(server, timeout=30.0)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            ask(client)
        except openai.APIError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    wait_for(lambda: server.records, 10, "the delayed request to arrive")
    began = time.monotonic()
    server.stop()
    stopped = time.monotonic() - began
    caller.join(timeout=10)

    assert stopped < 2, f"stop() took {stopped:.2f} s"
    assert not caller.is_alive() and len(errors) == 1 and isinstance(errors[0], openai.APIConnectionError)


def test_scripted_usage_is_the_completions_usage(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai([text("counted", usage=USAGE), text("estimated")])
    client = client_for(server)

    scripted = client.chat.completions.create(model="m", messages=USER).usage
    estimated = client.chat.completions.create(model="m", messages=USER).usage

    assert scripted is not None and scripted.prompt_tokens_details is not None
    assert (scripted.prompt_tokens, scripted.completion_tokens, scripted.total_tokens) == (1200, 34, 1234)
    assert scripted.prompt_tokens_details.cached_tokens == 1024
    assert estimated is not None and estimated.completion_tokens == len("estimated") // 4  # today's estimate


def test_scripted_usage_streams_as_a_last_chunk(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai(
        [text("counted in a stream", usage={"prompt_tokens": 50, "completion_tokens": 7}), text("no usage asked")]
    )
    client = client_for(server)

    with client.chat.completions.create(
        model="m",
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
    ) as stream:
        chunks = list(stream)
    with client.chat.completions.create(model="m", messages=USER, stream=True) as stream:
        unasked = list(stream)

    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (50, 7, 57)
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == "counted in a stream"
    assert all(chunk.usage is None for chunk in unasked)


def test_streamed_usage_carries_cached_tokens(
    fake_openai: StartServer, client_for: Callable[..., openai.OpenAI]
) -> None:
    server = fake_openai({"candidates": {"2": [text("cached", usage=USAGE)]}})

    with client_for(server).chat.completions.create(
        model="m",
        messages=USER,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers(2, "engineer"),
    ) as stream:
        usages = [chunk.usage for chunk in stream if chunk.usage is not None]

    (usage,) = usages
    assert usage.total_tokens == 1234 and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == 1024


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({"roles": [text("x")]}, '"roles" must be an object'),
        ({"candidates": {"first": [text("x")]}}, "candidates: 'first' is not a candidate index"),
        ({"roles": {" architect": [text("x")]}}, "is not a role name"),
        ({"roles": {"architect": [text("x"), {"fault": "explode"}]}}, "roles.architect item 1: unknown fault"),
        ({"candidates": {"0": {"responses": [text("x")], "delay": "slow"}}}, 'candidates.0: "delay" must be'),
        ({"candidates": {"0": {"reply": [text("x")]}}}, "candidates.0 must be"),
        ({"candidates": {"0": [text("x")], 0: [text("y")]}}, "candidates.0 is given twice"),
        ({"responses": [text("x")], "role": {}}, "unknown key"),
        ({"delay": -1, "responses": [text("x")]}, '"delay" must be a number of seconds >= 0'),
        ({"delay": 1}, "must be"),
        ([text("x"), text("y", delay=True)], "item 1"),
        ([text("x", usage={"prompt_tokens": 3})], '"completion_tokens"'),
        ([text("x", usage={"prompt_tokens": 3, "completion_tokens": 1, "cost": 2})], 'unknown "usage" key'),
        ([text("x", usage={**USAGE, "prompt_tokens": 10})], "1024 cached_tokens, more than its 10 prompt_tokens"),
        ([{"fault": "status", "status": 500, "usage": USAGE}], 'only an assistant message has a "usage"'),
        ([{"fault": "stall", "seconds": 1, "delay": 1}, text("x")], 'put the "delay" on the item after it'),
    ],
)
def test_bad_routed_scripts_are_refused_naming_the_place(script: Any, message: str) -> None:
    with pytest.raises(ValueError, match="fake-openai script") as caught:
        load_script(script)

    assert message in str(caught.value)


def test_cli_serves_a_routed_script(tmp_path: Path) -> None:
    script = tmp_path / "routed.json"
    script.write_text(json.dumps(ROUTED))
    command = [sys.executable, "-m", "flakebot_magic.testing.fake_openai", "--script", str(script)]

    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        try:
            label = process.stdout.readline()  # type: ignore[union-attr]
            url = process.stdout.readline().strip()  # type: ignore[union-attr]
            body = {"model": "m", "messages": USER}
            reply = httpx.post(url + "/chat/completions", json=body, headers=headers(1, "engineer")).json()
            records = httpx.get(url.removesuffix("/v1") + "/_requests").json()
        finally:
            process.terminate()
        assert process.wait(timeout=10) == 0

    assert "replaying 6 responses in 4 queues" in label
    assert reply["choices"][0]["message"]["content"] == "one"
    assert records[0]["queue"] == "candidates.1"
