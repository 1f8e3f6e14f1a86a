"""The paraphrase evaluation of search and fitness (tests/search_paraphrases.toml) on Debian's registry.

The data was committed before any tuning for issue 20 and split by request;
the held-out half is checked against the digest it had then. The accuracy
asserted here is what the held-out half measured with semantic search (the
fusion's design frozen on the tuning half first; ``make bench`` reports both
halves, with and without the model); the issue's targets that are not
reached yet are the strict ``xfail`` tests below, so that reaching one shows (the held-out half's top-3 target
was reached on 2026-11-26 and is asserted since).

The blind set (tests/search_paraphrases_fresh.toml: three more paraphrases
per request, written by someone who never saw the code, added after all
tuning and checked against its digest) is measured the same way; its floors
are what it measured once, a little lower, and nothing was tuned after.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flakebot_magic.config import DEBIAN_REGISTRY
from flakebot_magic.host.fsutil import load_toml
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.stages import search as search_stage
from flakebot_magic.testing.search_eval import (
    BLIND2,
    BLIND2_PARAPHRASES,
    BLIND3,
    BLIND3_PARAPHRASES,
    BLIND4,
    BLIND4_PARAPHRASES,
    FRESH,
    FRESH_PARAPHRASES,
    PARAPHRASES,
    VERDICTS,
    Case,
    Outcome,
    evaluate,
    load_blind2_cases,
    load_blind3_cases,
    load_blind4_cases,
    load_cases,
    load_fresh_cases,
    summarize,
)

#: sha256 of the held-out half as committed before tuning (9a1dfc9): it is never edited
HELD_OUT_DIGEST = "da69b5c88e8cff8901f63625379089353bee4d8434ab9042a53cfa3454983766"
#: what the held-out half measured with semantic search (all-MiniLM-L6-v2 fused with the words; 120
#: paraphrases of 30 requests): top-3 0.942 (113), top-10 0.992 (119), no wrong deploy since a deploy needs
#: evidence in words and in meaning, and both rankers' agreement. Before each crate's meaning averaged three
#: views of it (chosen on the tuning split of every file, benchmarks/tune_search.py): 111 and 118. Words alone,
#: when issue 20 landed: 0.85, 0.875, one wrong deploy.
#: Since (2026-11-26, issue 20's last targets: a request's examples named by their shape, a few synonyms of the same
#: thing, chosen on the tuning split of every file): top-3 0.950 (114), the target, top-10 the same 119.
HELD_OUT_TOP3 = 114 / 120
HELD_OUT_TOP10 = 119 / 120
#: the issue's targets
TARGET_TOP3, TARGET_TOP10, TARGET_WRONG = 0.95, 0.99, 0
#: sha256 of the blind set (tests/search_paraphrases_fresh.toml) as its writer handed it over: never edited
FRESH_DIGEST = "a5921eaefafed0a81ee21b96990176e16a8b4cb54c7cb5c03c8ae4f3889aba37"
#: what the blind set measured, once, with semantic search, after all tuning and with nothing changed since
#: (189 paraphrases of 63 requests): top-3 152, top-10 179, 3 wrong deploys (words alone: 133, 149, 2). The
#: floors sit a little below, so that a regression fails. The fitness rule tuned on the tuning half since
#: (words AND meaning, and both rankers agreeing: benchmarks/tune_fitness.py) deploys none wrongly here, the
#: three above included, at the same top-3 and top-10 (measured as totals once, after).
#: Since, the three views were chosen on the tuning split of every file, this set's rows of tuning-half requests
#: included (so only its held-out-half rows are still unseen): 163 and 178 in all (held-out half: 80 and 86 of 90).
FRESH_TOP3 = 158 / 189
FRESH_TOP10 = 176 / 189

#: sha256 of the second blind set (tests/search_paraphrases_blind2.toml, branch blind2, 60098f4), as its writer
#: handed it over, before any code read it: never edited
BLIND2_DIGEST = "7b1af62bb29483be9ff566dc7ea80b5d5e59eff2e79166ca8c12b05bac3336bf"
#: what it measured, once, with semantic search, after issue 20's last tuning (186 paraphrases of 62 requests):
#: top-1 138, top-3 172, top-10 179, no wrong deploy (words alone: 126, 152, 169 and 3 wrong). Floors a little
#: below, so that a regression fails. Since (the three views, chosen on the tuning split of every file, this
#: set's tuning-half rows included): 171 and 180 (held-out half: 83 and 89 of 90).
BLIND2_TOP3 = 168 / 186
BLIND2_TOP10 = 176 / 186

#: sha256 of the third blind set (tests/search_paraphrases_blind3.toml, branch blind3, e92f8c2: four paraphrases
#: of every request by a writer who read only tests/search_requests.toml), committed alone before the three views
#: were tuned and never read by the tuning: never edited
BLIND3_DIGEST = "60400299703a6c254b43cd0bda2c10d87ceb8f55ac3ce223fff3ac73508461c1"
#: what it measured, once, after the three views shipped (248 paraphrases): top-1 183, top-3 224, top-10 244 (held-out
#: half's requests: 110 and 119 of 120), one wrong deploy (hexyl, a hex viewer, for "bytes to hex string"; the
#: class of the first blind set's "binary data to hexadecimal text"). Words alone: top-3 190, top-10 212, no deploy (words alone
#: never deploy as published since). Before the three views (main's ranker, measured the same hour): 220 and 240,
#: the same wrong deploy. Floors a little below, so that a regression fails.
#: Since, its tuning-half rows tuned on (the class of that wrong deploy fixed: a viewer answers only a request to
#: see; examples named by their shape): 230 and 245 in all, no wrong deploy (held-out half: 110 and 119 of 120,
#: as before). The floors stay where they were: only held-out rows may raise a floor.
BLIND3_TOP3 = 220 / 248
BLIND3_TOP10 = 240 / 248

#: sha256 of the fourth blind set (tests/search_paraphrases_blind4.toml, branch blind4, f06a252: four paraphrases of
#: every request in four other styles: input and output, a field's jargon, an agent's terse spec, casual; by a
#: writer who read only tests/search_requests.toml and kept every word that contains an accepted crate's name out,
#: "hex", "zip", "random" and "time" among them), committed alone before this round's tuning: never edited
BLIND4_DIGEST = "82117cd6b9331233a2a1c775bdb25be8137e8fb92fa069dccaa7a9fefcab4522"
#: what it measured on main's ranker (2cf3c16) before this round's tuning was merged (248 paraphrases): top-1 128,
#: top-3 165, top-10 210, no wrong deploy (words alone: 93, 120, 165, no deploy); once more after it was merged
#: (viewers answer only requests to see, examples named by their shape, six synonyms; nothing tuned on this set):
#: 131, 174, 211, no wrong deploy (held-out half's requests: 91 and 109 of 120, before 90 and 110; words alone 94,
#: 127, 176). Floors a little below the second.
BLIND4_TOP3 = 170 / 248
BLIND4_TOP10 = 208 / 248

needs_debian = pytest.mark.skipif(
    not (DEBIAN_REGISTRY / "pulldown-cmark-0.9.2").is_dir(), reason="Debian's registry is not installed (make install)"
)


def _requests() -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = load_toml(PARAPHRASES)["request"]
    return requests


def test_the_held_out_half_is_as_committed_before_tuning() -> None:
    held_out = [r for r in _requests() if r["split"] == "held-out"]
    assert hashlib.sha256(json.dumps(held_out, sort_keys=True).encode()).hexdigest() == HELD_OUT_DIGEST


def test_every_request_has_four_kinds_of_paraphrase_in_its_own_half() -> None:
    requests = _requests()
    assert len({r["id"] for r in requests}) == len(requests) >= 60
    texts = [p["text"] for r in requests for p in r["paraphrases"]]
    assert len(set(texts)) == len(texts)
    for request in requests:
        kinds = [p["kind"] for p in request["paraphrases"]]
        assert {"words", "order", "question", "typo"} <= set(kinds), request["id"]
        assert set(kinds) <= {"words", "order", "question", "typo", "issue"}
        assert request["split"] in ("tune", "held-out")
        assert set(request["tools"]) <= set(request["accept"])
    # a case carries its request's half: the split is by request, never by paraphrase
    halves: dict[str, set[str]] = {}
    for case in load_cases():
        halves.setdefault(case.request, set()).add(case.split)
    assert all(len(h) == 1 for h in halves.values())
    assert len([r for r in requests if r["split"] == "held-out"]) >= 30


def test_the_blind_set_is_as_written_and_paraphrases_every_request_three_times() -> None:
    assert hashlib.sha256(FRESH_PARAPHRASES.read_bytes()).hexdigest() == FRESH_DIGEST
    cases = load_fresh_cases()
    requests = {r["id"]: r for r in _requests()}
    per_request: dict[str, int] = {}
    for case in cases:
        per_request[case.request] = per_request.get(case.request, 0) + 1
        assert case.split == case.kind == FRESH and case.half == requests[case.request]["split"]
        assert case.accept == tuple(requests[case.request]["accept"])
    assert per_request == dict.fromkeys(requests, 3)
    assert len({c.text for c in cases}) == len(cases)


@pytest.mark.parametrize(
    ("path", "digest", "load", "split"),
    [
        (BLIND3_PARAPHRASES, BLIND3_DIGEST, load_blind3_cases, BLIND3),
        (BLIND4_PARAPHRASES, BLIND4_DIGEST, load_blind4_cases, BLIND4),
    ],
    ids=[BLIND3, BLIND4],
)
def test_the_third_and_fourth_blind_sets_are_as_written_and_paraphrase_every_request_four_times(
    path: Path, digest: str, load: Callable[[], list[Case]], split: str
) -> None:
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    cases = load()
    requests = {r["id"]: r for r in _requests()}
    per_request: dict[str, int] = {}
    for case in cases:
        per_request[case.request] = per_request.get(case.request, 0) + 1
        assert case.split == case.kind == split and case.half == requests[case.request]["split"]
        assert case.accept == tuple(requests[case.request]["accept"])
    assert per_request == dict.fromkeys(set(requests) - {"filename"}, 4), set(requests) - set(per_request)
    assert len({c.text for c in cases}) == len(cases) == 248


def test_the_second_blind_set_is_as_written_and_paraphrases_requests_three_times() -> None:
    assert hashlib.sha256(BLIND2_PARAPHRASES.read_bytes()).hexdigest() == BLIND2_DIGEST
    cases = load_blind2_cases()
    requests = {r["id"]: r for r in _requests()}
    per_request: dict[str, int] = {}
    for case in cases:
        per_request[case.request] = per_request.get(case.request, 0) + 1
        assert case.split == case.kind == BLIND2 and case.half == requests[case.request]["split"]
    # every request of tests/search_requests.toml, which its writer read (the file name one came from issue 20)
    assert per_request == dict.fromkeys(set(requests) - {"filename"}, 3), set(requests) - set(per_request)
    assert len({c.text for c in cases}) == len(cases) == 186


def test_the_issues_requests_are_in_the_tuning_half() -> None:
    quoted = [(r["split"], p["text"]) for r in _requests() for p in r["paraphrases"] if p["kind"] == "issue"]
    assert {text for _, text in quoted} == {
        "Turn Markdown into HTML.",
        "convert a TOML file to JSON",
        "make a string safe to use as a file name",
        "make the text upper case",
        "encode text as a QR code",
    }
    assert {split for split, _ in quoted} == {"tune"}


@needs_debian
def test_every_accepted_crate_is_in_the_registry_and_every_tool_has_a_binary(debian: DirectoryRegistry) -> None:
    for request in _requests():
        for name in request["accept"]:
            found = debian.get(name)
            assert name not in request["tools"] or search_stage.tools_of(found), name


def test_the_judge() -> None:
    case = Case("md", "Turn Markdown into HTML.", "issue", "tune", ("pulldown-cmark", "markdown"), ("pulldown-cmark",))
    outcome = Outcome(case, ("markdown", "x", "pulldown-cmark"), "wrong", "markdown")
    assert outcome.top(1) and outcome.top(3)
    summary = summarize([outcome, Outcome(case, ("x",) * 10, "refuse", "")])["tune"]
    assert summary["n"] == 2 and summary["top1"] == summary["top10"] == 0.5
    assert [summary[v] for v in VERDICTS] == [0, 1, 0, 1]


@pytest.fixture(scope="module")
def debian(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DirectoryRegistry]:
    opened = DirectoryRegistry(DEBIAN_REGISTRY, tmp_path_factory.mktemp("cache"))
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def held_out(debian: DirectoryRegistry) -> dict[str, Any]:
    return _measured(debian, [c for c in load_cases() if c.split == "held-out"], "held-out")


def _measured(debian: DirectoryRegistry, cases: list[Case], split: str) -> dict[str, Any]:
    """The summary of ``cases`` (of ``split``) with semantic search: every floor here is its."""
    # measured without the model the floors would fail: say why here first
    assert debian.semantic_off == "", debian.semantic_off
    return summarize(evaluate(debian, cases))[split]


@needs_debian
def test_held_out_accuracy_and_fitness(held_out: dict[str, Any]) -> None:
    assert held_out["n"] >= 120
    assert held_out["top3"] >= HELD_OUT_TOP3
    assert held_out["top10"] >= HELD_OUT_TOP10


@needs_debian
def test_held_out_wrong_deploy_target(held_out: dict[str, Any]) -> None:
    assert held_out["wrong"] <= TARGET_WRONG
    assert held_out["deploy"] + held_out["refuse"] + held_out["miss"] == held_out["n"]


@needs_debian
def test_held_out_top10_target(held_out: dict[str, Any]) -> None:
    assert held_out["top10"] >= TARGET_TOP10


@needs_debian
def test_held_out_top3_target(held_out: dict[str, Any]) -> None:
    assert held_out["top3"] >= TARGET_TOP3


#: requests for a value that a hex viewer's words and meaning sit next to (written for this test, in no evaluation
#: file), and requests to see that the viewer answers: the wrong-deploy class of the first and third blind sets
VALUE_REQUESTS = (
    "hex-encode the bytes of a key",
    "turn the raw bytes of a digest into hexadecimal characters",
    "I need the hexadecimal form of a byte buffer as a string",
    "format bytes as a lowercase hex string",
    "bytes in, hex text out",
    "write a byte slice as hex digits",
)
VIEW_REQUESTS = ("view a binary file as a hex dump", "hex dump of a file", "show a file as a hexdump")


@needs_debian
def test_a_viewer_is_never_deployed_for_a_value_and_is_for_a_view(debian: DirectoryRegistry) -> None:
    for request in VALUE_REQUESTS:
        found = search_stage.search(debian, request, limit=10, prefer_bin=True)
        assert "hexyl" in [c.name for c in found[:5]], request  # the viewer is a close candidate ...
        fit = search_stage.fitness(found)
        # ... and never deployed: no viewer is, for a request that asks for no view
        assert fit.chosen is None or not search_stage.viewer(fit.chosen), (request, fit.reason)
        hexyl = next(c for c in found if c.name == "hexyl")
        assert search_stage.unfit(hexyl).endswith("is a viewer, and the request asks for a result, not a view")
    for request in VIEW_REQUESTS:
        fit = search_stage.fitness(search_stage.search(debian, request, limit=10, prefer_bin=True))
        assert fit.chosen is not None and fit.chosen.name == "hexyl", (request, fit.reason)


@pytest.fixture(scope="module")
def fresh(debian: DirectoryRegistry) -> dict[str, Any]:
    return _measured(debian, load_fresh_cases(), FRESH)


@needs_debian
def test_blind_set_accuracy_and_fitness(fresh: dict[str, Any]) -> None:
    assert fresh["n"] == 189
    assert fresh["top3"] >= FRESH_TOP3
    assert fresh["top10"] >= FRESH_TOP10


@needs_debian
def test_blind_set_wrong_deploy_target(fresh: dict[str, Any]) -> None:
    assert fresh["wrong"] <= TARGET_WRONG
    assert fresh["deploy"] + fresh["refuse"] + fresh["miss"] == fresh["n"]


@needs_debian
@pytest.mark.xfail(strict=True, reason="issue 20's ranking targets are not reached on the blind set: see README")
def test_blind_set_ranking_targets(fresh: dict[str, Any]) -> None:
    assert fresh["top3"] >= TARGET_TOP3
    assert fresh["top10"] >= TARGET_TOP10


@pytest.fixture(scope="module")
def blind2(debian: DirectoryRegistry) -> dict[str, Any]:
    return _measured(debian, load_blind2_cases(), BLIND2)


@needs_debian
def test_second_blind_set_accuracy_and_no_wrong_deploy(blind2: dict[str, Any]) -> None:
    assert blind2["n"] == 186
    assert blind2["top3"] >= BLIND2_TOP3
    assert blind2["top10"] >= BLIND2_TOP10
    assert blind2["wrong"] <= TARGET_WRONG
    assert blind2["deploy"] + blind2["refuse"] + blind2["miss"] == blind2["n"]


@needs_debian
@pytest.mark.xfail(strict=True, reason="issue 20's ranking targets are not reached on the second blind set: see README")
def test_second_blind_set_ranking_targets(blind2: dict[str, Any]) -> None:
    assert blind2["top3"] >= TARGET_TOP3
    assert blind2["top10"] >= TARGET_TOP10


@pytest.fixture(scope="module")
def blind3(debian: DirectoryRegistry) -> dict[str, Any]:
    return _measured(debian, load_blind3_cases(), BLIND3)


@needs_debian
def test_third_blind_set_accuracy_and_no_wrong_deploy(blind3: dict[str, Any]) -> None:
    assert blind3["n"] == 248
    assert blind3["top3"] >= BLIND3_TOP3
    assert blind3["top10"] >= BLIND3_TOP10
    assert blind3["wrong"] <= TARGET_WRONG
    assert blind3["deploy"] + blind3["refuse"] + blind3["miss"] == blind3["n"]


@needs_debian
@pytest.mark.xfail(strict=True, reason="issue 20's ranking targets are not reached on the third blind set: see README")
def test_third_blind_set_ranking_targets(blind3: dict[str, Any]) -> None:
    assert blind3["top3"] >= TARGET_TOP3
    assert blind3["top10"] >= TARGET_TOP10


@pytest.fixture(scope="module")
def blind4(debian: DirectoryRegistry) -> dict[str, Any]:
    return _measured(debian, load_blind4_cases(), BLIND4)


@needs_debian
def test_fourth_blind_set_accuracy_and_no_wrong_deploy(blind4: dict[str, Any]) -> None:
    assert blind4["n"] == 248
    assert blind4["top3"] >= BLIND4_TOP3
    assert blind4["top10"] >= BLIND4_TOP10
    assert blind4["wrong"] <= TARGET_WRONG
    assert blind4["deploy"] + blind4["refuse"] + blind4["miss"] == blind4["n"]


@needs_debian
@pytest.mark.xfail(strict=True, reason="issue 20's ranking targets are not reached on the fourth blind set: see README")
def test_fourth_blind_set_ranking_targets(blind4: dict[str, Any]) -> None:
    assert blind4["top3"] >= TARGET_TOP3
    assert blind4["top10"] >= TARGET_TOP10
