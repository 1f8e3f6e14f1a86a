"""Stage 1: find the crate that is the best starting point for a request."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import SearchError
from ..registry.base import CrateCandidate, Registry
from ..registry.directory import fixture_binary

__all__ = [
    "BIN_BOOST",
    "FIT_RATIO",
    "FIT_SHARE",
    "TERM_BOOST",
    "Fitness",
    "boost_exact_terms",
    "fitness",
    "fittest_binary",
    "open_registry",
    "rank",
    "relevance",
    "search",
    "tools_of",
    "wants_tool",
    "why",
]

#: how much a binary target multiplies a candidate's score when a tool is wanted
BIN_BOOST = 1.75
#: a binary that takes text is preferred over a better-ranked one that does not, down to this share of its score
FIT_RATIO = 0.5
#: a binary is deployed as published only when its relevance is at least this share of the best candidate's
FIT_SHARE = 0.6
#: how much naming an exact term of the request (``SHA-256``, ``base64``) multiplies a score
TERM_BOOST = 2.0

_TOOL_WORDS = re.compile(
    r"\b(tool|command|cli|binary|program|app|utility|executable|convert|render|print|"
    r"view|viewer|show|dump|format|compute|hash|encode|decode)(?:s|es|er|ers|ing|ed|d)?\b",
    re.I,
)


def open_registry(spec: str | None, cache_dir: Path) -> Registry:
    """A registry from a user's ``--registry``: a directory path, ``crates.io``, or None.

    None means Debian's registry when it is installed, crates.io otherwise.
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

    return DirectoryRegistry(spec, cache_dir)


def wants_tool(query: str) -> bool:
    """Does the request ask for something to run (rather than a library to read about)?"""
    return bool(_TOOL_WORDS.search(query))


def rank(candidates: list[CrateCandidate], *, prefer_bin: bool) -> list[CrateCandidate]:
    """Re-rank a registry's candidates: binaries first among equals when a tool is wanted."""
    if not prefer_bin:
        return sorted(candidates, key=lambda c: -c.score)
    boosted = [
        replace(c, score=c.score * BIN_BOOST, parts={**c.parts, "bin": BIN_BOOST}) if c.has_bin else c
        for c in candidates
    ]
    # a binary wins ties too: in a small registry bm25 can score every match near zero
    return sorted(boosted, key=lambda c: (-c.score, not c.has_bin))


def fittest_binary(candidates: list[CrateCandidate]) -> CrateCandidate | None:
    """The binary to deploy as published: the best one that can be handed text, if one ranks close.

    A deployed tool is called with a string (``md("# Hi")``), which its
    client passes on standard input. A binary whose sources never read
    standard input (only a file path) cannot take it, so among binaries
    scoring at least :data:`FIT_RATIO` of the best, the first that reads
    standard input wins; without one, the best binary. None: no binary.

    Examples
    --------
    >>> fittest_binary([CrateCandidate("markdown", "0.3.0", score=49.6, has_bin=True),
    ...     CrateCandidate("pulldown-cmark", "0.9.2", score=27.0, has_bin=True, reads_stdin=True)]).name
    'pulldown-cmark'
    """
    binaries = [c for c in candidates if c.has_bin]
    if not binaries:
        return None
    best = binaries[0]
    for candidate in binaries:
        if candidate.score < best.score * FIT_RATIO:
            break
        if candidate.reads_stdin:
            return candidate
    return best


def relevance(candidate: CrateCandidate) -> float:
    """A candidate's score without the binary boost: how well it matches the request as a crate."""
    return candidate.score / candidate.parts.get("bin", 1.0)


def tools_of(candidate: CrateCandidate) -> tuple[str, ...]:
    """The binaries of a candidate that are tools: test, example and benchmark fixtures left out.

    A directory registry leaves fixtures out of its index already; a
    registry that only knows names (crates.io) is checked by name here.
    """
    return tuple(name for name in candidate.bin_names if not fixture_binary(name))


@dataclass(frozen=True)
class Fitness:
    """What may be deployed as published for a request: ``chosen``, or None and ``reason`` why not.

    ``candidates`` are the best candidates by relevance (binary or not), for
    the listing a :class:`~flakebot_magic.errors.NeedsModelError` shows.
    """

    chosen: CrateCandidate | None
    reason: str
    candidates: list[CrateCandidate] = field(default_factory=list)


def fitness(candidates: list[CrateCandidate]) -> Fitness:
    """Whether a candidate's binary is a real tool for the request, and which.

    A binary is deployed as published only when its crate's relevance (the
    score without the binary boost) is at least :data:`FIT_SHARE` of the best
    candidate's: a crate that has a binary but is about something else (a
    command-line parser's test fixture for "wrap text") is no tool for the
    request. Test, example and benchmark binaries never count. Among the
    binaries that fit, :func:`fittest_binary` prefers one that reads
    standard input.

    Examples
    --------
    >>> found = [CrateCandidate("textwrap", "0.16.0", score=9.1, parts={"relevance": 9.1}),
    ...     CrateCandidate("open", "3.0.2", score=5.3, has_bin=True, bin_names=("open",), parts={"bin": 1.75})]
    >>> fit = fitness(found)
    >>> fit.chosen is None, fit.candidates[0].name
    (True, 'textwrap')
    """
    by_relevance = sorted(candidates, key=lambda c: -relevance(c))
    if not by_relevance:
        return Fitness(None, "no crate matches the request")
    best = by_relevance[0]
    binaries = [c for c in candidates if c.has_bin and tools_of(c)]
    if not binaries:
        fixtures = [c for c in candidates if c.has_bin]
        why = f"none of the {len(candidates)} best candidates ships a binary"
        if fixtures:
            why += f" that is a tool ({', '.join(c.name for c in fixtures[:3])} ship only test fixtures)"
        return Fitness(None, why, by_relevance)
    top = max(binaries, key=relevance)
    share = relevance(top) / relevance(best) if relevance(best) > 0 else 1.0
    if top is not best and share < FIT_SHARE:
        return Fitness(
            None,
            f"the best binary, {top.name}, matches the request {share:.0%} as well as {best.name} "
            f"(a library): it is not a tool for this request",
            by_relevance,
        )
    # the top binary fits; one beside it that can be handed text is preferred (fittest_binary)
    chosen = fittest_binary(binaries) or top
    return Fitness(
        chosen, f"{chosen.name} ships the binary {tools_of(chosen)[0]} and ranks with the best", by_relevance
    )


def search(registry: Registry, query: str, *, limit: int = 10, prefer_bin: bool | None = None) -> list[CrateCandidate]:
    """Ranked candidates for ``query``; ``prefer_bin=None`` decides from the query's words."""
    if not query.strip():
        raise SearchError("The search query is empty. Say what the tool should do, e.g. 'render markdown to html'.")
    prefer = wants_tool(query) if prefer_bin is None else prefer_bin
    # ask for more than needed: the binary boost may lift a lower-ranked crate into the top
    found = registry.search(query, limit=max(limit * 3, 20))
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
_FACTORS = (("popularity", "popularity"), ("name", "name match"), ("bin", "binary"), ("term", "exact term"))


def why(candidate: CrateCandidate) -> str:
    """Why a candidate scores what it does, in one short line.

    The parts multiply: bm25 relevance, the popularity prior's factor (with
    the reverse-dependency prior it comes from), the name match, the binary
    boost and the exact-term boost; factors of 1 are left out. A registry
    that reports no parts (crates.io) gives its own score.

    Examples
    --------
    >>> why(CrateCandidate("toml", "0.5.11", score=20.0,
    ...     parts={"relevance": 8.0, "prior": 4.1, "popularity": 1.49, "name": 1.5}))
    'relevance 8.00 x popularity 1.49 (prior 4.10) x name match 1.50'
    """
    parts = candidate.parts
    if "relevance" not in parts:
        return f"registry score {candidate.score:.2f}"
    text = [f"relevance {parts['relevance']:.2f}"]
    for key, label in _FACTORS:
        factor = parts.get(key, 1.0)
        if factor != 1.0:
            extra = f" (prior {parts.get('prior', 0.0):.2f})" if key == "popularity" else ""
            text.append(f"{label} {factor:.2f}{extra}")
    return " x ".join(text)
