"""The choice of crate: fitness without a model (over Debian's real registry), the model's choice (scripted)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tomllib

from flakebot_magic.config import DEBIAN_REGISTRY, Settings
from flakebot_magic.errors import NeedsModelError
from flakebot_magic.events import EventBus, Notice
from flakebot_magic.host.process import CancelToken
from flakebot_magic.llm.budget import Budget
from flakebot_magic.llm.model import ModelConfig
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.provenance import provenance_of
from flakebot_magic.registry.base import CrateCandidate, Registry
from flakebot_magic.registry.directory import DirectoryRegistry, fixture_binary
from flakebot_magic.stages import search as search_stage
from flakebot_magic.stages.choose import Choice, choose_by_model, choose_without_model, chooser_channel, summary_of
from flakebot_magic.testing.fake_openai import FakeOpenAIServer

REQUESTS = Path(__file__).parent.parent / "search_requests.toml"
debian = pytest.mark.skipif(not (DEBIAN_REGISTRY / "textwrap-0.16.0").is_dir(), reason="run `make install` first")


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> DirectoryRegistry:
    if not DEBIAN_REGISTRY.is_dir():
        pytest.skip("Debian's registry is not installed: run `make install` first")
    return DirectoryRegistry(DEBIAN_REGISTRY, tmp_path_factory.mktemp("cache"))


# -- telling fixtures from tools ----------------------------------------------------


@pytest.mark.parametrize(
    ("name", "path", "features"),
    [
        ("stdio-fixture", "src/bin/stdio-fixture.rs", ()),
        ("bin_fixture", "src/bin/bin_fixture.rs", ()),
        ("gen_hash_test", "src/bin/gen_hash_test.rs", ("criterion",)),
        ("protobuf-bin-gen-rust-do-not-use", "src/bin/x.rs", ()),
        ("runner", "tests/support/runner.rs", ()),
        ("demo", "examples/demo/main.rs", ()),
        ("bench", "src/bin/bench.rs", ()),
    ],
)
def test_fixture_binaries_are_told_apart(name: str, path: str, features: tuple[str, ...]) -> None:
    assert fixture_binary(name, path, features)


@pytest.mark.parametrize(
    ("name", "path", "features"),
    [
        ("hexyl", "src/main.rs", ()),
        ("pulldown-cmark", "src/main.rs", ("getopts",)),
        ("cargo-ctest", "src/bin/ctest.rs", ()),
        ("rav1e", "src/bin/rav1e.rs", ("binaries",)),
        ("sq-wot", "src/sq-wot.rs", ()),
    ],
)
def test_tools_are_not_fixtures(name: str, path: str, features: tuple[str, ...]) -> None:
    assert fixture_binary(name, path, features) == ""


@debian
def test_the_index_leaves_test_fixtures_out(registry: DirectoryRegistry) -> None:
    clap = registry.get("clap", "4.0.32")
    assert "stdio-fixture" not in clap.bin_names and not clap.has_bin
    assert registry.get("duct").bin_names == ()  # tiny helpers its own tests run by name
    assert registry.get("hexyl").bin_names == ("hexyl",)
    pulldown = registry.get("pulldown-cmark")
    assert pulldown.bin_names == ("pulldown-cmark",) and pulldown.reads_stdin


# -- fitness without a model -----------------------------------------------------------


@debian
@pytest.mark.parametrize(
    ("request_text", "crate"),
    [
        ("wrap long lines of text to a width", "textwrap"),
        # toml_edit (a format-preserving TOML parser) is as right as toml (tests/search_requests.toml accepts both)
        ("parse TOML", "toml toml_edit"),
        ("parse a URL", "url"),
    ],
)
def test_library_only_requests_stop_naming_the_right_crate(
    registry: DirectoryRegistry, request_text: str, crate: str
) -> None:
    candidates = search_stage.search(registry, request_text, limit=10, prefer_bin=True)
    with pytest.raises(NeedsModelError) as caught:
        choose_without_model(candidates, request_text)
    error = caught.value
    assert error.candidates[0].name in crate.split(), [c.name for c in error.candidates]
    crate = error.candidates[0].name
    message = str(error)
    lines = message.splitlines()
    assert len(lines) <= 8 and lines[0].startswith(f"No crate does {request_text!r} as published: ")
    assert f"  {crate} " in message and "--model NAME" in lines[-1] and "--crate NAME" in lines[-1]
    assert "stdio-fixture" not in message


@debian
def test_the_pipeline_stops_before_any_fork(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(DEBIAN_REGISTRY), backend="cargo")
    with pytest.raises(NeedsModelError, match="textwrap"):
        Pipeline(settings).run("wrap long lines of text to a width", name="wrap")
    assert not (tmp_path / "cache" / "workspaces" / "wrap").exists()
    assert not list((tmp_path / "cache").glob("store/*"))


@debian
def test_no_fixture_binary_is_ever_chosen_and_binaries_that_fit_are(registry: DirectoryRegistry) -> None:
    requests = tomllib.loads(REQUESTS.read_text(encoding="utf-8"))["request"]
    assert len(requests) >= 30
    deployed: dict[str, str] = {}
    refused: list[bool] = []
    for request in requests:
        candidates = search_stage.search(registry, request["text"], limit=10, prefer_bin=True)
        try:
            choice = choose_without_model(candidates, request["text"])
        except NeedsModelError as exc:
            # how often the right crate is among the five candidates the error lists (the paraphrase
            # evaluation, tests/registry/test_paraphrases.py, holds the targets)
            refused.append(bool({c.name for c in exc.candidates[:5]} & set(request["accept"])))
            continue
        tools = search_stage.tools_of(choice.candidate)
        assert tools and not any(fixture_binary(t) for t in tools), (request["text"], tools)
        deployed[request["text"]] = choice.candidate.name
    assert sum(refused) >= 0.9 * len(refused)
    # the binary crates of the set still deploy as published
    assert deployed["Render Markdown text to HTML"] == "pulldown-cmark"
    assert deployed["show a hex dump of a binary file"] == "hexyl"
    assert deployed["cat a file with syntax highlighting"] == "bat"
    print(f"deployed as published: {len(deployed)} of {len(requests)}: {deployed}", file=sys.stderr)


def test_a_binary_whose_own_words_miss_the_request_does_not_fit_however_it_ranks() -> None:
    library = CrateCandidate("url", "2.3.1", score=19.7, parts={"relevance": 9.4})
    binary = CrateCandidate(
        "open", "3.0.2", score=30.0, has_bin=True, bin_names=("open",), reads="args", parts={"evidence": 0.3}
    )
    fit = search_stage.fitness([binary, library])
    assert fit.chosen is None and fit.reason == (
        "the best binary, open: its own description and binary text cover 30% of the request"
    )
    # one far below the library in score, whose own words and meaning cover the request, is deployed, and the
    # choice says why
    close = CrateCandidate(
        "urlcli",
        "1.0.0",
        score=2.0,
        has_bin=True,
        bin_names=("urlcli",),
        reads="stdin",
        parts={"evidence": 0.9, "words": 1.0, "meaning": 1.0, "own_similarity": 0.55},
    )
    choice = choose_without_model([library, close], "parse a URL")
    assert choice.candidate == close and choice.by == "fitness"
    assert choice.reason == (
        "urlcli ships the binary urlcli, and its own description and binary text cover 90% of the request "
        "and mean what it asks (similarity 0.55) (url matches more words, but it has no binary)"
    )
    # the same binary found by its words alone is not deployed: a model or --crate decides
    words_only = CrateCandidate(
        "urlcli", "1.0.0", score=2.0, has_bin=True, bin_names=("urlcli",), reads="stdin", parts={"evidence": 0.9}
    )
    with pytest.raises(NeedsModelError, match="only its words were weighed"):
        choose_without_model([library, words_only], "parse a URL")
    fixture = CrateCandidate("clap", "4", score=30.0, has_bin=True, bin_names=("stdio-fixture",), parts={"bin": 1.75})
    fit = search_stage.fitness([fixture, library])
    assert fit.chosen is None and "test fixtures" in fit.reason


# -- the model's choice ----------------------------------------------------------------


def _choice_call(crate: str, reason: str) -> dict[str, Any]:
    arguments = json.dumps({"crate": crate, "reason": reason})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "choose_crate", "arguments": arguments}}],
    }


def _choose(
    server: FakeOpenAIServer, registry: Registry, request: str, candidates: list[CrateCandidate]
) -> tuple[Choice, list[Notice]]:
    notices: list[Notice] = []
    bus = EventBus([lambda e: notices.append(e) if isinstance(e, Notice) else None])
    model = ModelConfig("scripted", base_url=server.base_url, max_retries=0, stream=False)
    settings = Settings()
    budget = Budget(settings.token_budget)
    with chooser_channel(
        model, bus=bus, budget=budget, limits=settings.reply_limits(), cancel=CancelToken()
    ) as channel:
        return choose_by_model(channel, registry, request, candidates, bus), notices


@debian
def test_the_model_chooses_among_the_best_and_says_why(
    registry: DirectoryRegistry, fake_openai: Callable[..., FakeOpenAIServer]
) -> None:
    request = "wrap long lines of text to a width"
    candidates = search_stage.search(registry, request, limit=10)
    server = fake_openai([_choice_call("textwrap", "textwrap::fill wraps text to a width")])
    choice, notices = _choose(server, registry, request, candidates)
    assert (choice.candidate.name, choice.by, choice.reason) == (
        "textwrap",
        "model",
        "textwrap::fill wraps text to a width",
    )
    assert not notices and len(server.requests) == 1
    sent = server.requests[0]
    shown = json.loads(sent["messages"][1]["content"].split("\n\n", 1)[1].split("\n", 1)[1])
    textwrap = next(s for s in shown if s["crate"] == "textwrap")
    assert "fn fill" in textwrap["public_items"] and textwrap["readme"]
    assert len(shown) == 5 and sent["tools"][0]["function"]["name"] == "choose_crate"
    assert choice.to_json()["by"] == "model" and "textwrap" not in choice.to_json()["alternatives"]


@debian
@pytest.mark.parametrize(
    "reply",
    [
        _choice_call("no-such-crate", "made up"),
        {"role": "assistant", "content": "I think textwrap is best."},
        {"fault": "malformed"},
        {"fault": "status", "status": 400},
    ],
)
def test_an_unusable_choice_falls_back_to_the_ranking_with_a_notice(
    registry: DirectoryRegistry, fake_openai: Callable[..., FakeOpenAIServer], reply: dict[str, Any]
) -> None:
    request = "parse TOML"
    candidates = search_stage.search(registry, request, limit=10)
    server = fake_openai([reply])
    choice, notices = _choose(server, registry, request, candidates)
    assert choice.candidate == candidates[0] and choice.by == "ranking"
    assert "unusable" in choice.reason
    # a broken reply is asked again first (one notice each, as for every role); the fallback says so once
    fallback = [n for n in notices if "choice of crate" in n.message]
    assert len(fallback) == 1 and fallback[0].level == "warning" and candidates[0].name in fallback[0].message
    assert all(n.level == "warning" and "asking again" in n.message for n in notices if n not in fallback)


def test_a_json_answer_in_plain_content_is_read_too(fake_openai: Callable[..., FakeOpenAIServer]) -> None:
    a, b = CrateCandidate("alpha", "1.0.0", "first"), CrateCandidate("beta", "1.0.0", "second")
    server = fake_openai([{"role": "assistant", "content": 'Here: {"crate": "beta", "reason": "it fits"}'}])
    choice, _ = _choose(server, _NoSources(), "x", [a, b])
    assert (choice.candidate, choice.reason, choice.alternatives) == (b, "it fits", [a])


def test_one_candidate_needs_no_request(fake_openai: Callable[..., FakeOpenAIServer]) -> None:
    server = fake_openai([])
    only = CrateCandidate("alpha", "1.0.0")
    choice, _ = _choose(server, _NoSources(), "x", [only])
    assert choice.candidate == only and server.requests == []


def test_summaries_without_sources_are_the_description() -> None:
    summary = summary_of(_NoSources(), CrateCandidate("a", "1", "does a", bin_names=("a", "a-fixture")))
    assert summary == {"crate": "a", "version": "1", "description": "does a", "binaries": ["a"]}


def test_the_choice_is_in_the_provenance() -> None:
    choice = Choice(CrateCandidate("textwrap", "0.16.0"), "model", "it wraps text")

    class Tool:
        name, crate, version = "wrap", "textwrap", "0.16.0"
        provenance = {"choice": choice.to_json()}

    assert provenance_of(Tool())["choice"] == "textwrap (chosen by model): it wraps text"


class _NoSources:
    """A registry that cannot place sources (crates.io-like): the model sees descriptions only."""

    id = "test"
    offline = True


def test_a_refusal_says_why_its_candidates_need_a_model() -> None:
    """A library needs a model to become a tool; a binary that does something else needs one to be adapted."""
    from flakebot_magic.stages.choose import refusal

    library = CrateCandidate("textwrap", "0.16.0", "Wrap text")
    binary = CrateCandidate("pleaser", "0.5.3", "a polite sudo", has_bin=True, bin_names=("please",))
    libraries = refusal("wrap text", search_stage.Fitness(None, "none ships a binary", [library]))
    assert libraries.splitlines()[1] == "The best candidate (a library needs a model to become a tool):"
    sandwich = refusal("make me a sandwich", search_stage.Fitness(None, "0% of the request", [binary, library]))
    assert sandwich.splitlines()[1] == "The 2 best candidates (a model could adapt one):"
    assert "  pleaser 0.5.3 [binary please]: a polite sudo" in sandwich.splitlines()
    assert "library needs" not in sandwich
    # a binary listed first that takes no text says why it was passed over
    for reads, said in (("file", "[binary md, reads files only]"), ("none", "[binary md, reads no input]")):
        passed = CrateCandidate("markdown", "0.3.0", "md", has_bin=True, bin_names=("md",), reads=reads)
        lines = refusal("render markdown", search_stage.Fitness(None, "0%", [passed, binary])).splitlines()
        assert f"  markdown 0.3.0 {said}: md" in lines


def test_a_refusal_names_the_binary_to_build_only_when_its_own_text_fits() -> None:
    """``--crate NAME`` names the best binary when only the words and the meaning disagreed on it (it fits by its own
    text); a binary that reads files, or none at all, leaves NAME for the user to choose."""
    from flakebot_magic.stages.choose import refusal

    library = CrateCandidate("textwrap", "0.16.0", "Wrap text", score=9.0)
    fits, files = (
        CrateCandidate(
            name, "1.0.0", "Wrap text", score=5.0, has_bin=True, bin_names=(name,), reads=reads, parts={"evidence": 0.9}
        )
        for name, reads in (("wrapcli", "stdin"), ("wrapfile", "file"))
    )
    for found, named in (([library, fits], "wrapcli"), ([library, files], ""), ([library], "")):
        fit = search_stage.fitness(found)
        assert fit.chosen is None and fit.binary == named, (found, fit)
        ways = refusal("wrap text", fit).splitlines()[-1]
        if named:
            assert ways.startswith(f"Build {named} as published with --crate {named}, or configure a model"), ways
        else:
            assert "with --crate NAME" in ways, ways
