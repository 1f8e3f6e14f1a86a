"""The ``search`` stage: find the crate that is the best starting point for a request."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import SearchError
from ..events import INDEXING
from ..registry import ranking
from ..registry.base import BuildsAnIndex, CrateCandidate, Registry, SearchesByMeaning
from ..registry.crate_files import fixture_binary

__all__ = [
    "AGREEMENT",
    "BIN_BOOST",
    "EVIDENCE",
    "INDEXING",
    "NAMED_EVIDENCE",
    "SEMANTIC_EVIDENCE",
    "TERM_BOOST",
    "Fitness",
    "asks_to_see",
    "boost_exact_terms",
    "disagreement",
    "fitness",
    "fitting",
    "indexing",
    "open_registry",
    "rank",
    "relevance",
    "search",
    "semantic_notice",
    "tools_of",
    "unfit",
    "viewer",
    "wants_tool",
    "why",
    "words_only",
]

#: how much a binary that fits the request (:func:`unfit`) multiplies its score when a tool is wanted
BIN_BOOST = 1.75
#: a binary is deployed as published only on absolute evidence, in words AND in meaning: its own words (name,
#: description, keywords, what its binaries say) cover at least this share of the request ...
EVIDENCE = 0.65
#: ... what its binary says of itself means what the request asks, the cosine similarity of their embeddings
#: at least this (with semantic search) ...
SEMANTIC_EVIDENCE = 0.4
#: ... and both rankers agree on it: among the candidates it is one of the first this many by words and by
#: meaning (with semantic search). The three were chosen together on the tuning half of
#: tests/search_paraphrases.toml (``benchmarks/tune_fitness.py``): the most right deploys (16 of 137) with no
#: wrong one, nor any with one of them loosened a step (evidence 0.5, similarity 0.35, agreement 10); the rule
#: before (words OR meaning, a similarity below 0.3 vetoing: 18 right) deployed wrongly with its evidence
#: loosened to 0.5.
AGREEMENT = 3
#: ... unless the request names the crate (its name is one of the request's terms: "draw a QR code in the terminal"
#: names qrcode): its other words then say how or where ("draw", "in the terminal", "a maker", "a picture"), and
#: the crate's own words need cover only this share. Chosen on the tuning halves (``benchmarks/fitness_sets.py``):
#: no wrong deploy from 0.2 up (0.1 deploys one), so 0.4 keeps a margin of two steps; the held-out halves were
#: measured after, once (issue 37)
NAMED_EVIDENCE = 0.4
#: how much naming an exact term of the request (``SHA-256``, ``base64``) multiplies a score
TERM_BOOST = 2.0

#: what a crate that calls its binary a viewer says of itself: a hex viewer, a pager, a terminal UI. Its output
#: is a view laid out for a person's eyes (offsets, columns, borders, colours), not a value to use
_VIEWER = re.compile(r"\b(viewer|pager|tui|terminal user interface|interactive)s?\b", re.I)
#: the words of a request that asks to see something: a view is then the answer ("hexdump": a dump)
_SEEING = re.compile(
    r"\b(view|see|seeing|look|show|display|inspect|dump|browse|peek|preview|examine|visuali[sz]e)"
    r"(?:s|es|er|ers|ing|ed|d)?\b|dump(?:s|ing)?\b",
    re.I,
)

_TOOL_WORDS = re.compile(
    r"\b(tool|command|cli|binary|program|app|utility|executable|convert|render|print|"
    r"view|viewer|show|dump|format|compute|hash|encode|decode)(?:s|es|er|ers|ing|ed|d)?\b",
    re.I,
)


def open_registry(spec: str | None, cache_dir: Path, embedding_model: str | None = None) -> Registry:
    """A registry from a user's ``--registry``: a directory path, ``crates.io``, or None.

    None means Debian's registry when it is installed, crates.io otherwise.
    ``embedding_model`` is the ``embedding_model`` setting, for a directory
    registry's semantic search (crates.io ranks with its own search).
    """
    from ..config import default_registry

    spec = spec if spec is not None else default_registry()
    if spec is None or spec in ("crates.io", "https://crates.io"):
        from ..registry.cratesio import CratesIoRegistry

        return CratesIoRegistry()
    if spec.startswith(("http://", "https://")):
        from ..registry.cratesio import CratesIoRegistry

        return CratesIoRegistry(api_url=spec.rstrip("/"))
    from ..registry.directory import DirectoryRegistry

    return DirectoryRegistry(spec, cache_dir, embedding_model=embedding_model)


_NOTICED: set[str] = set()
_NOTICED_LOCK = threading.Lock()


def semantic_notice(registry: Registry) -> str:
    """Why ``registry`` searches by words only, the first time this process asks; ``""`` after that.

    A pipeline says it once (a notice), not on every build: semantic search
    being off (no model installed, or ``$FLAKEBOT_EMBEDDING_MODEL=off``) is
    the machine's state, not the request's. ``""`` too for a registry that
    ranks by meaning, or has no say in it (crates.io).
    """
    why = words_only(registry)
    if not why:
        return ""
    with _NOTICED_LOCK:
        if why in _NOTICED:
            return ""
        _NOTICED.add(why)
    return why


def words_only(registry: Registry) -> str:
    """Why ``registry`` searches by words only, and how to change that; ``""`` when meaning counts too, or
    the registry has no say in it (crates.io ranks with its own search)."""
    return registry.semantic_off if isinstance(registry, SearchesByMeaning) else ""


def indexing(registry: Registry, say: Callable[[str], None], *, announce: Callable[[str], None] | None = None) -> None:
    """Build ``registry``'s search index now if none is built, saying so: never a silent first wait.

    ``announce`` (default ``say``) is told once why this search waits (the
    first on this machine, once for every cache dir, and how to do it ahead);
    ``say`` gets a line per tenth of the way (:data:`INDEXING`, a percentage).
    Nothing is said when the index is built already, or the registry builds none.
    """
    if not isinstance(registry, BuildsAnIndex) or registry.index_ready():
        return
    (announce if announce is not None else say)(
        f"indexing {registry.id.removeprefix('dir:')} for search: the first search on this machine waits for it "
        "(once: every cache dir shares it; `make install` or `flakebot index --system` as root builds it ahead)"
    )
    shown = [-1]

    def progress(done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if tenth > shown[0]:
            shown[0] = tenth
            say(f"{INDEXING}: {10 * tenth}%")

    registry.prepare_index(progress)


def wants_tool(query: str) -> bool:
    """Does the request ask for something to run (rather than a library to read about)?"""
    return bool(_TOOL_WORDS.search(query))


def viewer(candidate: CrateCandidate) -> bool:
    """Whether a crate's own words (its description and keywords) call its binary a viewer, a pager or a
    terminal UI: a tool whose output is a view for a person (hexyl: "A command-line hex viewer")."""
    return bool(_VIEWER.search(" ".join([candidate.description, *candidate.keywords])))


def asks_to_see(query: str) -> bool:
    """Whether a request asks to see something (view, show, look at, inspect, dump, browse ...).

    A request for a value ("a key's bytes as a hex string", "print a digest
    as hex") is answered by a transformer, whose output is the answer; one that
    asks to see ("view a core file in hex", "hexdump an image") may be
    answered by a viewer too. "print" alone is no such word: a program's
    result is printed either way.

    Examples
    --------
    >>> [asks_to_see(q) for q in ["hexdump an image", "look inside a blob", "a key's bytes as a hex string"]]
    [True, True, False]
    """
    return bool(_SEEING.search(query))


def rank(candidates: list[CrateCandidate], *, prefer_bin: bool) -> list[CrateCandidate]:
    """Re-rank a registry's candidates: binaries that fit the request (:func:`unfit`) first among equals."""
    if not prefer_bin:
        return sorted(candidates, key=lambda c: -c.score)
    boosted = [
        replace(c, score=c.score * BIN_BOOST, parts={**c.parts, "bin": BIN_BOOST}) if not unfit(c) else c
        for c in candidates
    ]
    # a binary wins ties too: in a small registry bm25 can score every match near zero
    return sorted(boosted, key=lambda c: (-c.score, bool(unfit(c))))


def relevance(candidate: CrateCandidate) -> float:
    """A candidate's score without the binary boost: how well it matches the request as a crate."""
    return candidate.score / candidate.parts.get("bin", 1.0)


def tools_of(candidate: CrateCandidate) -> tuple[str, ...]:
    """The binaries of a candidate that are tools: test, example and benchmark fixtures left out.

    A directory registry leaves fixtures out of its index already; a
    registry that only knows names (crates.io) is checked by name here.
    """
    return tuple(name for name in candidate.bin_names if not fixture_binary(name))


def unfit(candidate: CrateCandidate) -> str:
    """Why a candidate's binary is no tool for the request as published ("" when it is one).

    The evidence is absolute, not relative to other candidates: the crate
    must ship a binary that is a tool (no test fixture), that binary must
    take input a string can be (standard input or its arguments: not only a
    file path, not nothing), and the crate's own words (its name,
    description, keywords and what its binaries say they do) must cover at
    least :data:`EVIDENCE` of the request (``parts["evidence"]``, weighted by
    how rare each word of the request is; :data:`NAMED_EVIDENCE` when the
    request names the crate, ``parts["name"]``), and, with semantic search, what
    its binary says of itself must mean what the request asks: their
    embeddings' cosine similarity at least :data:`SEMANTIC_EVIDENCE`
    (``parts["own_similarity"]``). Words alone are not enough evidence: a
    binary whose text shares the request's words may do something else. Nor
    is meaning: a binary its crate calls a viewer (:func:`viewer`) lays its
    output out for a person, so it answers only a request that asks to see
    (:func:`asks_to_see`; ``parts["view_only"]``, set by :func:`search`):
    hexyl, a hex viewer, shows bytes in hex but is no answer to "a key's bytes
    as a hex string". A registry that reports no evidence is not held to the
    rules on evidence and meaning. (The
    relative check, that words and meaning agree, is :func:`disagreement`.)

    Examples
    --------
    >>> unfit(CrateCandidate("markdown", "0.3.0", has_bin=True, bin_names=("markdown",), reads="file"))
    'its binary markdown reads files, not text'
    >>> unfit(CrateCandidate("hexyl", "0.8.0", has_bin=True, bin_names=("hexyl",), reads="stdin",
    ...     parts={"evidence": 0.8}))
    ''
    """
    tools = tools_of(candidate)
    if not candidate.has_bin:
        return "it has no binary"
    if not tools:
        return f"its only binaries are test fixtures ({', '.join(candidate.bin_names[:3])})"
    if candidate.reads == "file":
        return f"its binary {tools[0]} reads files, not text"
    if candidate.reads == "none":
        return f"its binary {tools[0]} reads no input (a demo, or it needs a feature that is off by default)"
    if candidate.parts.get("view_only"):
        return f"its binary {tools[0]} is a viewer, and the request asks for a result, not a view"
    evidence = candidate.parts.get("evidence")
    needed = NAMED_EVIDENCE if candidate.parts.get("name", 1.0) > 1.0 else EVIDENCE
    if evidence is not None and evidence < needed:
        return f"its own description and binary text cover {evidence:.0%} of the request"
    similarity = candidate.parts.get("own_similarity")
    if similarity is not None and similarity < SEMANTIC_EVIDENCE:
        return f"what its binary says of itself is far from the request in meaning (similarity {similarity:.2f})"
    return ""


def disagreement(candidate: CrateCandidate, candidates: list[CrateCandidate]) -> str:
    """Why the words and the meaning do not agree on ``candidate`` among ``candidates`` ("" when they do).

    With semantic search each candidate carries its share of the best by
    words (``parts["words"]``) and by meaning (``parts["meaning"]``): a
    binary is deployed only when it is one of the first :data:`AGREEMENT`
    candidates by each. A binary whose words match while its purpose differs
    (its text shares the request's words) is rarely also among the closest
    in meaning, and the reverse. So a candidate whose words were weighed and
    whose meaning was not (words-only search, or crates.io's) has nothing to
    agree with, and is never deployed as published: a model or ``--crate``
    decides. (A candidate with no evidence at all, from a registry that
    reports none, is not held to this.)

    Examples
    --------
    >>> a, b, c, d = (CrateCandidate(n, "1", parts={"words": w, "meaning": m})
    ...     for n, w, m in [("a", 1.0, 0.2), ("b", 0.9, 0.3), ("c", 0.8, 0.1), ("d", 0.1, 1.0)])
    >>> disagreement(a, [a, b, c, d]), disagreement(c, [a, b, c, d])
    ('', 'it is 4th of 4 candidates by meaning')
    >>> words_only = CrateCandidate("e", "1", parts={"evidence": 0.9})
    >>> disagreement(words_only, [words_only])
    'only its words were weighed, not its meaning (search by meaning is off)'
    """
    if "evidence" in candidate.parts and "meaning" not in candidate.parts:
        return "only its words were weighed, not its meaning (search by meaning is off)"
    for part, label in (("words", "words"), ("meaning", "meaning")):
        if part not in candidate.parts:
            continue
        place = 1 + sum(c.parts.get(part, 0.0) > candidate.parts[part] for c in candidates if c is not candidate)
        if place > AGREEMENT:
            return f"it is {_ordinal(place)} of {len(candidates)} candidates by {label}"
    return ""


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def fitting(candidates: list[CrateCandidate]) -> list[CrateCandidate]:
    """The candidates whose binary may be deployed as published, in their order: not :func:`unfit`, and the
    words and the meaning agree on them (:func:`disagreement`)."""
    return [c for c in candidates if not unfit(c) and not disagreement(c, candidates)]


@dataclass(frozen=True)
class Fitness:
    """What may be deployed as published for a request: ``chosen``, or None and ``reason`` why not.

    ``candidates`` are the best candidates by relevance (binary or not), for
    the listing a :class:`~flakebot_magic.errors.NeedsModelError` shows.
    ``binary`` names the best binary when its own text fits the request and
    only the words and the meaning did not agree on it (:func:`disagreement`):
    ``--crate`` builds it as published, at the user's word ("" otherwise).
    """

    chosen: CrateCandidate | None
    reason: str
    candidates: list[CrateCandidate] = field(default_factory=list)
    binary: str = ""


def fitness(candidates: list[CrateCandidate]) -> Fitness:
    """Whether a candidate's binary is a real tool for the request, and which: the best ranked of :func:`fitting`.

    A binary that fits is deployed even when a library ranks higher: its own
    words and meaning say it does what was asked, while the library would
    need a model to become a tool. The reason says so.

    Examples
    --------
    >>> found = [CrateCandidate("textwrap", "0.16.0", score=9.1),
    ...     CrateCandidate("open", "3.0.2", score=5.3, has_bin=True, bin_names=("open",), reads="args",
    ...         parts={"evidence": 0.1})]
    >>> fit = fitness(found)
    >>> fit.chosen is None, fit.reason
    (True, 'the best binary, open: its own description and binary text cover 10% of the request')
    """
    by_relevance = sorted(candidates, key=lambda c: -relevance(c))
    if not by_relevance:
        return Fitness(None, "no crate matches the request")
    fits = fitting(candidates)
    if not fits:
        binaries = [c for c in candidates if c.has_bin]
        if not binaries:
            none = "no candidate" if len(candidates) == 1 else f"none of the {len(candidates)} candidates"
            return Fitness(None, f"{none} ships a binary", by_relevance)
        best_binary = binaries[0]
        unfit_why = unfit(best_binary)
        why_not = unfit_why or disagreement(best_binary, candidates)
        buildable = "" if unfit_why else best_binary.name
        return Fitness(None, f"the best binary, {best_binary.name}: {why_not}", by_relevance, buildable)
    chosen = fits[0]
    reason = f"{chosen.name} ships the binary {tools_of(chosen)[0]}"
    evidence, similarity = chosen.parts.get("evidence"), chosen.parts.get("own_similarity")
    if evidence is not None:
        reason += f", and its own description and binary text cover {evidence:.0%} of the request"
    if similarity is not None:
        reason += f" and mean what it asks (similarity {similarity:.2f})"
    best = by_relevance[0]
    if best is not chosen and relevance(best) > relevance(chosen):
        reason += f" ({best.name} matches more words, but {unfit(best) or disagreement(best, candidates)})"
    return Fitness(chosen, reason, by_relevance)


def search(registry: Registry, query: str, *, limit: int = 10, prefer_bin: bool | None = None) -> list[CrateCandidate]:
    """Ranked candidates for ``query``; ``prefer_bin=None`` decides from the query's words."""
    if not query.strip():
        raise SearchError("The search query is empty. Say what the tool should do, e.g. 'render markdown to html'.")
    prefer = wants_tool(query) if prefer_bin is None else prefer_bin
    # ask for more than needed: the binary boost may lift a lower-ranked crate into the top
    found = registry.search(query, limit=max(limit * 3, 20))
    if any("evidence" not in c.parts for c in found):  # a registry without an index of its own (crates.io)
        shares = ranking.evidence_in(query, [(c.name, c.description, " ".join(c.keywords)) for c in found])
        found = [
            c if "evidence" in c.parts else replace(c, parts={**c.parts, "evidence": e})
            for c, e in zip(found, shares, strict=True)
        ]
    if not asks_to_see(query):  # a viewer's output is a view: no answer to a request for a value (:func:`unfit`)
        found = [replace(c, parts={**c.parts, "view_only": 1.0}) if c.has_bin and viewer(c) else c for c in found]
    return rank(found, prefer_bin=prefer)[:limit]


_WORD = re.compile(r"[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*")


def _exact_terms(query: str) -> set[str]:
    """Words with letters and digits (``SHA-256``, ``base64``) and acronyms (``CSV``), squashed."""
    terms = set()
    for word in _WORD.findall(query):
        letters, digits = any(ch.isalpha() for ch in word), any(ch.isdigit() for ch in word)
        if (letters and digits) or (len(word) >= 2 and word.isalpha() and word.isupper()):
            terms.add(_squash(word))
    return terms


def _squash(text: str) -> str:
    return re.sub(r"[-_\s]", "", text.lower())


def boost_exact_terms(candidates: list[CrateCandidate], query: str) -> list[CrateCandidate]:
    """Re-rank so that crates naming an exact term of the query come first among near equals.

    Terms are the specific words of a request: a name with a number
    (``SHA-256``, ``base64``, ``utf-8``) or an acronym (``CSV``, ``JSON``).
    Full-text search splits ``SHA-256`` into ``sha`` and ``256`` and so
    cannot tell the crate that implements SHA-256 from one that mentions a
    hash; a crate whose name, description or keywords contain the whole term
    gets :data:`TERM_BOOST`. The edit loop's search uses it: with a model,
    the crate that does the named thing matters more than having a binary.

    Examples
    --------
    >>> [c.name for c in boost_exact_terms([CrateCandidate("blake3", "1", "hash", 16.0),
    ...     CrateCandidate("sha2", "1", "SHA-224, SHA-256 and SHA-512", 15.0)], "print the SHA-256")]
    ['sha2', 'blake3']
    """
    terms = _exact_terms(query)
    if not terms:
        return candidates

    def named(c: CrateCandidate) -> bool:
        text = _squash(" ".join([c.name, c.description, *c.keywords]))
        return any(term in text for term in terms)

    boosted = [
        replace(c, score=round(c.score * TERM_BOOST, 4), parts={**c.parts, "term": TERM_BOOST}) if named(c) else c
        for c in candidates
    ]
    return sorted(boosted, key=lambda c: -c.score)


#: how each multiplying part is named in :func:`why`
_FACTORS = (
    ("popularity", "popularity"),
    ("name", "name match"),
    ("coverage", "coverage"),
    ("bin", "binary"),
    ("term", "exact term"),
)


def why(candidate: CrateCandidate) -> str:
    """Why a candidate scores what it does, in one short line.

    The parts multiply: bm25 relevance, the popularity prior's factor (with
    the reverse-dependency prior it comes from), the name match, the binary
    boost and the exact-term boost; factors of 1 are left out. With semantic
    search the words' score and the meaning's are added first
    (:func:`~flakebot_magic.registry.ranking.fuse`). A registry that reports
    no parts (crates.io) gives its own score.

    Examples
    --------
    >>> why(CrateCandidate("toml", "0.5.11", score=20.0,
    ...     parts={"relevance": 8.0, "prior": 4.1, "popularity": 1.49, "name": 1.5}))
    'relevance 8.00 x popularity 1.49 (prior 4.10) x name match 1.50'
    >>> why(CrateCandidate("walkdir", "2.3.2", score=0.6, parts={"relevance": 0.0, "words": 0.0,
    ...     "meaning": 1.0, "similarity": 0.52}))
    '0.35 x words 0.00 + 0.65 x meaning 1.00 (similarity 0.52)'
    """
    parts = candidate.parts
    if "relevance" not in parts:
        return f"registry score {candidate.score:.2f}"
    words = [f"relevance {parts['relevance']:.2f}"]
    for key, label in _FACTORS[:3]:
        factor = parts.get(key, 1.0)
        if factor != 1.0:
            extra = f" (prior {parts.get('prior', 0.0):.2f})" if key == "popularity" else ""
            words.append(f"{label} {factor:.2f}{extra}")
    if "meaning" in parts:
        weight = ranking.SEMANTIC_WEIGHT
        detail = f" ({' x '.join(words)})" if parts.get("relevance") else ""
        text = [
            f"{1 - weight:g} x words {parts['words']:.2f}{detail} + {weight:g} x meaning {parts['meaning']:.2f} "
            f"(similarity {parts['similarity']:.2f})"
        ]
    else:
        text = [" x ".join(words)]
    for key, label in _FACTORS[3:]:
        factor = parts.get(key, 1.0)
        if factor != 1.0:
            text.append(f"{label} {factor:.2f}")
    return " x ".join(text)
