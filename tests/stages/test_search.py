"""The search stage: ranking with a preference for binaries, and opening registries."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from tinycrates import crate

from flakebot_magic.errors import ConfigError, SearchError
from flakebot_magic.registry import ranking
from flakebot_magic.registry.base import CrateCandidate, FetchedSource
from flakebot_magic.registry.cratesio import CratesIoRegistry
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.registry.embedding import find_model, missing_libraries
from flakebot_magic.stages import search as search_stage
from flakebot_magic.stages.search import (
    AGREEMENT,
    BIN_BOOST,
    EVIDENCE,
    SEMANTIC_EVIDENCE,
    TERM_BOOST,
    asks_to_see,
    boost_exact_terms,
    disagreement,
    fitness,
    fitting,
    open_registry,
    rank,
    search,
    unfit,
    viewer,
    wants_tool,
    why,
)

MakeRegistry = Callable[..., DirectoryRegistry]


class ListRegistry:
    """A registry (test double) that answers every search with a fixed list, best first."""

    id = "list"
    offline = True

    def __init__(self, candidates: list[CrateCandidate]) -> None:
        self.candidates = candidates
        self.limits: list[int] = []

    def search(self, query: str, limit: int = 10) -> list[CrateCandidate]:
        self.limits.append(limit)
        return self.candidates[:limit]

    def get(self, name: str, version: str | None = None) -> CrateCandidate:
        raise SearchError(name)

    def fetch(self, candidate: CrateCandidate, dest: Path) -> FetchedSource:
        raise NotImplementedError

    def cargo_config(self) -> str:
        return ""


def _lib(name: str, score: float) -> CrateCandidate:
    return CrateCandidate(name, "1.0.0", score=score)


def _bin(name: str, score: float, evidence: float = 1.0, reads: str = "stdin") -> CrateCandidate:
    return CrateCandidate(
        name, "1.0.0", score=score, has_bin=True, bin_names=(name,), reads=reads, parts={"evidence": evidence}
    )


_READS_STDIN = (
    "use std::io::Read;\nfn main() { let mut s = String::new(); std::io::stdin().read_to_string(&mut s).unwrap(); }\n"
)


# -- against a real directory registry ---------------------------------------------


def test_a_binary_whose_own_words_cover_the_request_beats_a_library_that_scores_higher(
    make_registry: MakeRegistry,
) -> None:
    library = crate("shoutlib", description="Shout words: a library that shouts words, shouts them loud")
    tool = crate("shoutcli", description="Shout words", files={"src/main.rs": _READS_STDIN})
    registry = make_registry(library, tool, embedding_model="off")  # the words alone rank the library first
    query = "shout words"
    raw = {c.name: c for c in registry.search(query)}
    assert raw["shoutlib"].score > raw["shoutcli"].score > 0  # the library matches the words better
    assert raw["shoutcli"].parts["evidence"] >= EVIDENCE and raw["shoutcli"].reads == "stdin"

    found = search(registry, query, prefer_bin=True)
    assert [c.name for c in found] == ["shoutcli", "shoutlib"]
    assert found[0].score == pytest.approx(raw["shoutcli"].score * BIN_BOOST)
    assert found[1].score == raw["shoutlib"].score
    assert [c.name for c in search(registry, query, prefer_bin=False)] == ["shoutlib", "shoutcli"]
    # words alone lift the binary in the ranking, but never deploy it as published (nothing weighed its meaning)
    fit = fitness(found)
    assert fit.chosen is None and fit.reason == (
        "the best binary, shoutcli: only its words were weighed, not its meaning (search by meaning is off)"
    )
    # the same two as semantic search scores them: the binary's words and meaning agree, so it is deployed
    meant = [replace(c, parts={**c.parts, "words": 1.0, "meaning": 1.0, "own_similarity": 0.7}) for c in found]
    fit = fitness(meant)
    assert fit.chosen is not None and fit.chosen.name == "shoutcli"
    assert "(shoutlib matches more words, but it has no binary)" in fit.reason


def test_a_binary_whose_own_words_miss_the_request_is_not_preferred(make_registry: MakeRegistry) -> None:
    registry = make_registry("tinyecho", "tinylib")
    query = "uppercase helper library for words"
    [echo] = [c for c in registry.search(query) if c.name == "tinyecho"]
    assert echo.parts["evidence"] < EVIDENCE and unfit(echo)
    assert [c.name for c in search(registry, query, prefer_bin=True)] == ["tinylib", "tinyecho"]


def test_the_query_decides_when_prefer_bin_is_not_given(make_registry: MakeRegistry) -> None:
    registry = make_registry("tinyecho", "tinylib", "brokenbin")
    assert [c.name for c in search(registry, "uppercase helper")][0] == "tinylib"
    assert [c.name for c in search(registry, "print shout standard input")][0] == "tinyecho"


def test_binaries_are_preferred_even_when_scores_tie_at_zero() -> None:
    tied = [_lib("lib", 0.0), _bin("tool", 0.0)]
    assert [c.name for c in rank(tied, prefer_bin=True)] == ["tool", "lib"]


def test_no_match_is_an_empty_list(make_registry: MakeRegistry) -> None:
    assert search(make_registry("tinyecho"), "quantum chromodynamics") == []


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_empty_query_is_a_search_error(make_registry: MakeRegistry, query: str) -> None:
    with pytest.raises(SearchError, match="The search query is empty") as caught:
        search(make_registry("tinyecho"), query)
    assert "render markdown to html" in str(caught.value)  # an example of what to write


# -- ranking -------------------------------------------------------------------------


def test_rank_boosts_only_binaries_that_fit() -> None:
    candidates = [_lib("a", 10.0), _bin("b", 6.0), _lib("c", 5.0), _bin("d", 1.0), _bin("e", 4.0, evidence=0.2)]
    candidates += [_bin("f", 3.0, reads="file"), _bin("g", 2.0, reads="none")]
    ranked = rank(candidates, prefer_bin=True)
    assert [(c.name, c.score) for c in ranked] == [
        ("b", 10.5),
        ("a", 10.0),
        ("c", 5.0),
        ("e", 4.0),
        ("f", 3.0),
        ("g", 2.0),
        ("d", 1.75),
    ]


@pytest.mark.parametrize(
    ("candidate", "why_not"),
    [
        (_lib("lib", 1.0), "it has no binary"),
        (_bin("filer", 1.0, reads="file"), "its binary filer reads files, not text"),
        (_bin("demo", 1.0, reads="none"), "its binary demo reads no input"),
        (_bin("far", 1.0, evidence=0.5), "its own description and binary text cover 50% of the request"),
        (
            CrateCandidate("clap", "4", has_bin=True, bin_names=("stdio-fixture",)),
            "its only binaries are test fixtures (stdio-fixture)",
        ),
    ],
)
def test_why_a_binary_is_unfit(candidate: CrateCandidate, why_not: str) -> None:
    assert unfit(candidate).startswith(why_not)
    fit = fitness([candidate])
    assert fit.chosen is None and (why_not if candidate.has_bin else "no candidate ships a binary") in fit.reason


# -- a viewer's output is a view, not a value --------------------------------------------


def _fits(name: str, description: str, keywords: tuple[str, ...] = ()) -> CrateCandidate:
    """A binary whose words and meaning both fit the request (first by each)."""
    parts = {"evidence": 1.0, "words": 1.0, "meaning": 1.0, "own_similarity": 0.9}
    return replace(_bin(name, 1.0), description=description, keywords=keywords, parts=parts)


#: binaries that lay their output out for a person, and one whose output is the answer
_VIEWERS = [
    _fits("hexview", "A command-line hex viewer"),
    _fits("pagey", "A terminal pager for logs"),
    _fits("logtui", "Explore JSON", ("tui",)),
]
_TRANSFORMER = _fits("hexenc", "Encode bytes as hexadecimal text")


@pytest.mark.parametrize(
    "request_text",
    [
        "a key's bytes as a hex string",
        "convert a buffer to hexadecimal characters",
        "print a digest as hex",  # "print": a program's result is printed either way
        "give me the base-16 digits of a buffer",
        "hex-encode some bytes",
    ],
)
def test_a_viewer_is_no_answer_to_a_request_for_a_value(request_text: str) -> None:
    assert not asks_to_see(request_text)
    for candidate in _VIEWERS:
        assert viewer(candidate)
        [found] = search(ListRegistry([candidate]), request_text, prefer_bin=True)
        assert unfit(found) == f"its binary {candidate.name} is a viewer, and the request asks for a result, not a view"
        assert fitness([found]).chosen is None and "bin" not in found.parts  # not boosted either
    # a transformer whose words fit is still deployed for the same request
    [found] = search(ListRegistry([_TRANSFORMER]), request_text, prefer_bin=True)
    assert not viewer(_TRANSFORMER) and fitness([found]).chosen == found


@pytest.mark.parametrize(
    "request_text",
    [
        "view a core file in hex",
        "hexdump an image",
        "how can I look inside a packet capture?",
        "show me what is in this binary blob",
        "inspect a firmware image byte by byte",
        "let me see the bytes of a save game",
        "browse a big log",
        "dump a file as hex",
    ],
)
def test_a_viewer_answers_a_request_to_see(request_text: str) -> None:
    assert asks_to_see(request_text)
    for candidate in _VIEWERS:
        [found] = search(ListRegistry([candidate]), request_text, prefer_bin=True)
        assert unfit(found) == "" and fitness([found]).chosen == found


@pytest.mark.parametrize("reads", ["stdin", "args", ""])
def test_a_binary_that_takes_text_and_covers_the_request_fits(reads: str) -> None:
    assert unfit(_bin("tool", 1.0, evidence=EVIDENCE, reads=reads)) == ""


def _meant(name: str, *, words: float, meaning: float, own: float, evidence: float = 1.0) -> CrateCandidate:
    """A candidate as semantic search scores it: shares of the best by words and by meaning, its binary's
    similarity to the request (a library when ``own`` is negative)."""
    parts = {"evidence": evidence, "words": words, "meaning": meaning}
    if own < 0:
        return CrateCandidate(name, "1.0.0", score=words + meaning, parts=parts)
    parts["own_similarity"] = own
    return CrateCandidate(
        name, "1.0.0", score=words + meaning, has_bin=True, bin_names=(name,), reads="stdin", parts=parts
    )


@pytest.mark.parametrize(
    ("evidence", "own", "deployed"),
    [
        (1.0, SEMANTIC_EVIDENCE, True),
        (EVIDENCE, 0.9, True),
        (1.0, SEMANTIC_EVIDENCE - 0.01, False),  # its words cover the request, its meaning does not
        (EVIDENCE - 0.01, 0.9, False),  # it means the request, its words do not say so
    ],
)
def test_a_binary_needs_both_words_and_meaning(evidence: float, own: float, deployed: bool) -> None:
    tool = _meant("tool", words=1.0, meaning=1.0, own=own, evidence=evidence)
    fit = fitness([tool, _meant("lib", words=0.5, meaning=0.5, own=-1)])
    assert (fit.chosen is tool) is deployed
    if not deployed:
        assert fit.reason.startswith("the best binary, tool: ")
        assert ("meaning" in fit.reason) is (evidence >= EVIDENCE)


def test_the_words_and_the_meaning_must_agree_on_a_binary() -> None:
    # every place from first to last, by words and by meaning: deployed only within AGREEMENT by both
    size = AGREEMENT + 3
    for by_words in range(size):
        for by_meaning in range(size):
            others = [
                _meant(f"lib{i}", words=1.0 - i / size - 0.5 / size, meaning=1.0 - i / size - 0.5 / size, own=-1)
                for i in range(size - 1)
            ]
            tool = _meant("tool", words=1.0 - by_words / size, meaning=1.0 - by_meaning / size, own=0.9)
            candidates = [tool, *others]
            agree = by_words < AGREEMENT and by_meaning < AGREEMENT
            assert (disagreement(tool, candidates) == "") is agree, (by_words, by_meaning)
            assert (fitness(candidates).chosen is tool) is agree
            assert (tool in fitting(candidates)) is agree
            if not agree:  # the words are said first
                place, label = (by_words, "words") if by_words >= AGREEMENT else (by_meaning, "meaning")
                assert fitness(candidates).reason.endswith(f"it is {place + 1}th of {size} candidates by {label}")


def test_words_alone_have_nothing_to_agree_on_so_nothing_deploys_as_published() -> None:
    tools = [_bin(f"tool{i}", 10.0 - i) for i in range(AGREEMENT + 2)]  # their words cover the request
    assert all(
        disagreement(t, tools) == "only its words were weighed, not its meaning (search by meaning is off)"
        for t in tools
    )
    assert fitness(tools).chosen is None
    # a registry that reports no evidence at all (a test's stand-in) is not held to it
    bare = [CrateCandidate("tool", "1.0.0", has_bin=True, bin_names=("tool",), reads="stdin")]
    assert disagreement(bare[0], bare) == "" and fitness(bare).chosen is bare[0]


def test_a_deploy_says_both_kinds_of_evidence() -> None:
    tool = _meant("tool", words=1.0, meaning=1.0, own=0.61, evidence=0.8)
    assert fitness([tool]).reason == (
        "tool ships the binary tool, and its own description and binary text cover 80% of the request"
        " and mean what it asks (similarity 0.61)"
    )


def test_boosts_are_recorded_in_the_parts() -> None:
    lib = CrateCandidate("a", "1", score=10.0, parts={"relevance": 10.0})
    binary = CrateCandidate("b", "1", score=6.0, has_bin=True, bin_names=("b",), parts={"relevance": 6.0})
    ranked = rank([lib, binary], prefer_bin=True)
    assert [(c.name, c.parts) for c in ranked] == [
        ("b", {"relevance": 6.0, "bin": BIN_BOOST}),
        ("a", {"relevance": 10.0}),
    ]
    sha = CrateCandidate("sha2", "1", "SHA-256", score=5.0, parts={"relevance": 5.0})
    [boosted] = boost_exact_terms([sha], "the SHA-256 of a file")
    assert boosted.parts == {"relevance": 5.0, "term": TERM_BOOST}
    assert why(boosted) == "relevance 5.00 x exact term 2.00"


def test_why_without_parts_gives_the_registry_score() -> None:
    assert why(_lib("a", 3.5)) == "registry score 3.50"


def test_search_results_carry_their_parts(make_registry: MakeRegistry) -> None:
    [echo, *_] = search(make_registry("tinyecho", "tinylib", embedding_model="off"), "print echo", prefer_bin=True)
    assert echo.name == "tinyecho"
    assert set(echo.parts) >= {"relevance", "prior", "popularity", "name", "coverage", "evidence", "bin"}
    factors = ("relevance", "popularity", "name", "bin")
    product = math.prod(echo.parts[f] for f in factors) * echo.parts["coverage"] ** ranking.COVERAGE_POWER
    assert echo.score == pytest.approx(product)
    assert echo.to_json()["parts"] == echo.parts


@pytest.mark.skipif(find_model() is None or bool(missing_libraries()), reason="the embedding model is not installed")
def test_semantic_results_carry_words_and_meaning(make_registry: MakeRegistry) -> None:
    [echo, *_] = search(make_registry("tinyecho", "tinylib"), "print echo", prefer_bin=True)
    assert echo.name == "tinyecho"
    parts = echo.parts
    assert set(parts) >= {"lexical", "words", "similarity", "meaning", "own_similarity", "evidence", "bin"}
    fused = (1 - ranking.SEMANTIC_WEIGHT) * parts["words"] + ranking.SEMANTIC_WEIGHT * parts["meaning"]
    assert echo.score == pytest.approx(fused * parts["bin"])
    assert why(echo).startswith(f"{1 - ranking.SEMANTIC_WEIGHT:g} x words ") and "meaning" in why(echo)


def test_rank_without_preference_keeps_scores() -> None:
    ranked = rank([_bin("b", 6.0), _lib("a", 10.0)], prefer_bin=False)
    assert [(c.name, c.score) for c in ranked] == [("a", 10.0), ("b", 6.0)]


def test_a_binary_below_the_limit_is_lifted_into_it() -> None:
    candidates = [_lib(f"lib{i}", 20.0 - i) for i in range(12)] + [_bin("deep", 12.0)]
    registry = ListRegistry(candidates)
    found = search(registry, "convert things", limit=3)
    assert [c.name for c in found] == ["deep", "lib0", "lib1"]
    assert registry.limits == [20]  # asked for more than the limit


def test_limit_truncates() -> None:
    registry = ListRegistry([_lib(f"lib{i}", 100.0 - i) for i in range(40)])
    assert len(search(registry, "anything", limit=15)) == 15
    assert registry.limits == [45]


@pytest.mark.parametrize(
    "query",
    [
        "render markdown to html",
        "a command-line tool that counts words",
        "convert yaml to json",
        "hexdump viewer",
        "pretty-print JSON",
        "compute the sha256 of a file",
        "a CLI for dates",
    ],
)
def test_wants_tool(query: str) -> None:
    assert wants_tool(query)


@pytest.mark.parametrize("query", ["markdown parser", "a json library", "async runtime", "regular expressions"])
def test_does_not_want_tool(query: str) -> None:
    assert not wants_tool(query)


@pytest.mark.parametrize("query", ["a library to apply patches", "a fast hashmap", "approximate string matching"])
def test_tool_words_need_whole_words(query: str) -> None:
    assert not wants_tool(query)


# -- opening a registry -------------------------------------------------------------


def test_open_registry_directory(tmp_path: Path, make_registry: MakeRegistry) -> None:
    path = make_registry("tinyecho").path
    opened = open_registry(str(path), tmp_path / "cache")
    assert isinstance(opened, DirectoryRegistry)
    try:
        assert opened.path == path
        assert opened.index_path.is_relative_to(tmp_path / "cache")
    finally:
        opened.close()


def test_open_registry_from_the_environment(
    tmp_path: Path, make_registry: MakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = make_registry("tinyecho").path
    monkeypatch.setenv("FLAKEBOT_REGISTRY", str(path))
    opened = open_registry(None, tmp_path / "cache")
    assert isinstance(opened, DirectoryRegistry)
    try:
        assert opened.path == path
    finally:
        opened.close()


@pytest.mark.parametrize("spec", ["crates.io", "https://crates.io"])
def test_open_registry_crates_io(tmp_path: Path, spec: str) -> None:
    opened = open_registry(spec, tmp_path / "cache")  # makes no request
    assert isinstance(opened, CratesIoRegistry)
    try:
        assert opened.id == "crates.io"
    finally:
        opened.close()


def test_open_registry_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        open_registry(str(tmp_path / "missing"), tmp_path / "cache")


def test_the_semantic_notice_is_said_once_and_only_for_a_registry_that_could_search_by_meaning(
    make_registry: MakeRegistry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(search_stage, "_NOTICED", set())  # as in a fresh process
    assert search_stage.semantic_notice(ListRegistry([])) == ""  # no say in it (as crates.io)
    off = make_registry("tinylib", embedding_model="off")
    assert "words only" in search_stage.semantic_notice(off)
    assert search_stage.semantic_notice(off) == ""
    assert search_stage.semantic_notice(make_registry("tinylib", embedding_model="off")) == ""  # per process
    if find_model() is not None and not missing_libraries():  # a registry that ranks by meaning has nothing to say
        assert search_stage.semantic_notice(make_registry("tinylib")) == ""


# -- issue 37: a request that names the crate ------------------------------------------------------------------


def _binary(name: str, evidence: float, *, named: bool) -> CrateCandidate:
    parts = {"evidence": evidence, "own_similarity": 0.6, "words": 1.0, "meaning": 1.0}
    if named:
        parts["name"] = ranking.NAME_BOOST
    return CrateCandidate(name, "1.0.0", has_bin=True, bin_names=(name,), reads="args", parts=parts)


@pytest.mark.parametrize("evidence", [search_stage.NAMED_EVIDENCE, 0.46, 0.5, EVIDENCE - 0.01])
def test_a_request_that_names_the_crate_needs_less_cover_of_its_other_words(evidence: float) -> None:
    """ "draw a QR code for some text in the terminal" names qrcode: "draw" and "terminal" say how, not what."""
    assert search_stage.unfit(_binary("qrcode", evidence, named=True)) == ""
    assert "cover" in search_stage.unfit(_binary("qrcode", evidence, named=False))


@pytest.mark.parametrize("evidence", [0.0, 0.2, search_stage.NAMED_EVIDENCE - 0.01])
def test_naming_the_crate_is_not_enough_alone(evidence: float) -> None:
    assert "cover" in search_stage.unfit(_binary("qrcode", evidence, named=True))
    far = _binary("qrcode", 0.9, named=True)
    far = replace(far, parts={**far.parts, "own_similarity": SEMANTIC_EVIDENCE - 0.01})
    assert "far from the request" in search_stage.unfit(far)  # the meaning must still fit
