"""What a search means: the query's concepts, bm25 in SQLite FTS5, how much of the request a crate covers, and a popularity prior.

Used by the directory registry when it builds its index and when it answers
a query (and by :mod:`flakebot_magic.stages.search` for registries that
report no evidence of their own):

* Words are stemmed by SQLite FTS5's ``porter`` tokenizer (:data:`TOKENIZER`),
  in the index and in the query alike: "parsing", "parser" and "parses"
  meet "parse". (Measured against the stemmer this module used to carry, and
  against the ``bm25s`` and ``rank-bm25`` packages, on the tuning half of
  ``tests/search_paraphrases.toml``: ``benchmarks/compare_rankers.py``.)
* :func:`concepts` turns a request into what it asks for: each word that is
  not a stopword, with the words the registry's vocabulary offers for it: a
  correction one edit away when the typed word is unknown or far rarer
  ("markdwon" -> ``markdown``), two adjacent words run together when the
  registry writes them so ("file name" -> ``filename``), and the small
  :data:`SYNONYMS` table's abbreviations (``md`` -> ``markdown``).
* :func:`match_concepts` asks FTS5 which crates hold each concept, anywhere
  and in their own words (name, description, keywords, what their binaries
  say), so that :func:`coverage` gives the share of the request, weighted by
  each concept's rarity (bm25's idf), that a crate's text covers.
* :func:`.prior.reverse_dependencies` over the registry's dependency graph
  gives a popularity prior (:mod:`.prior`).
* :func:`.examples.named` reads what a request shows instead of naming (an
  identifier in camelCase, a regex, a hex string) and adds the words crates
  use for it.

The lexical score (:func:`combine`) is::

    score = relevance * (1 + prior.PRIOR_WEIGHT * log(1 + prior)) * name * coverage ** COVERAGE_POWER

where ``relevance`` is FTS5's bm25 over weighted columns, ``prior`` the
crate's reverse-dependency count scaled so that the mean crate has 1.0,
``name`` is :data:`NAME_BOOST` when the crate's name is one of the query's
words (a user who says "TOML" means the crate called ``toml``), and
``coverage`` the share of the request's concepts its text holds, weights
tuned on the tuning half of ``tests/search_paraphrases.toml``.

With a sentence-embedding model (:mod:`.embedding`), words and meaning are
fused (:func:`fuse`), its form and weights chosen on the tuning half only.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from . import examples
from .prior import prior_factor

__all__ = [
    "COVERAGE_POWER",
    "EVIDENCE_POWER",
    "NAME_BOOST",
    "SEMANTIC_FLOOR",
    "SEMANTIC_MIN_SIMILARITY",
    "SEMANTIC_POOL",
    "SEMANTIC_WEIGHT",
    "STOPWORDS",
    "SYNONYMS",
    "TOKENIZER",
    "Concept",
    "clean",
    "combine",
    "concepts",
    "coverage",
    "edits1",
    "evidence_in",
    "fuse",
    "match_concepts",
    "match_expression",
    "name_key",
    "name_keys",
    "tokens",
]

#: how FTS5 splits and stems text, in the index and in queries
TOKENIZER = "porter unicode61 remove_diacritics 2"
#: the factor for a crate whose name is one of the query's terms
NAME_BOOST = 1.5
#: how strongly the share of the request a crate covers weighs in its score
COVERAGE_POWER = 0.25
#: evidence weighs each concept by idf to this power: the rarer words of a request say what it is about
EVIDENCE_POWER = 2.0
#: how much meaning weighs against words in a fused score (:func:`fuse`), chosen with the crates' three views
#: (:func:`.embedding.crate_texts`) on the tuning split of every evaluation file: ``benchmarks/tune_search.py``
SEMANTIC_WEIGHT = 0.65
#: how many crates closest in meaning join the crates found by words ...
SEMANTIC_POOL = 40
#: ... when their ``meaning`` (:func:`fuse`) is above this: a crate found by meaning alone must be at least
#: half as far above the registry's mean as the closest crate (0.0 to 0.5 ranked the tuning half alike;
#: without it a small registry listed every crate for any request)
SEMANTIC_FLOOR = 0.5
#: ... and their cosine similarity to the request at least this (unrelated sentences score about 0 to 0.2;
#: 0.2 ranked the tuning half as no floor did, 0.3 lost a top-10)
SEMANTIC_MIN_SIMILARITY = 0.2

_STOPWORD_TEXT = """a an and are as at be by for from in into is it its of on or that the this to with
    which what when how make makes made some any all my me i we you your our can will
    should would please write build create given use using tool tools command program
    text file files data from line lines like
    do does did doing done get gets got getting im there their they them these those then than
    so if but not no just also only very much more most other each every about onto out up
    want wants need needs something thing things way let lets was were been being am has have had
    where whether while who why without one ones it's don doesn isn can't"""
#: words that say nothing about which crate is wanted (common English function words, and
#: words every request uses: "tool", "file", "make")
STOPWORDS = frozenset(_STOPWORD_TEXT.split())

#: Abbreviations and everyday phrasings -> the words crates use for the same thing.
#: Keys are lowercase words or two-word phrases as typed (a phrase is one
#: concept); values are alternatives added to the query, words or phrases
#: (they never replace its words). Kept small on purpose: an entry
#: belongs here when users say one thing and crate descriptions say another.
SYNONYMS: Mapping[str, tuple[str, ...]] = {
    "md": ("markdown",),
    "commonmark": ("markdown",),
    "web page": ("html",),
    "webpage": ("html",),
    "hexdump": ("hex dump", "hex viewer"),
    "hex dump": ("hexdump", "hex viewer"),
    "hexadecimal": ("hex",),
    "b64": ("base64",),
    "regexp": ("regex",),
    "regular expression": ("regex",),
    "uri": ("url",),
    "web address": ("url",),
    "web link": ("url",),
    "web links": ("url",),
    "tarball": ("tar",),
    "guid": ("uuid",),
    "base16": ("hex",),
    "urls": ("url",),
    "web server": ("http server",),
    "webserver": ("http server",),
    "yml": ("yaml",),
    "tsv": ("csv",),
    "sha256": ("sha2",),
    "sha512": ("sha2",),
    "sha 256": ("sha2",),
    "sha 512": ("sha2",),
    "msgpack": ("messagepack",),
    "datetime": ("date", "time"),
    "colour": ("color",),
    "colours": ("color",),
    "argv": ("argument",),
    "args": ("argument",),
    "rng": ("random",),
    "gz": ("gzip",),
    "zstandard": ("zstd",),
    "jinja": ("template",),
}

_WORD = re.compile(r"[a-z0-9]+")
_LINK = re.compile(r"\b(?:https?|ftp)://[^\s)\]>\"']*|\bwww\.[^\s)\]>\"']*", re.I)
_CODE = re.compile(r"^```.*?^```", re.S | re.M)
_MANIFEST = re.compile(r"\bCargo\.toml\b", re.I)
_LETTERS = "abcdefghijklmnopqrstuvwxyz0123456789"
#: a word is corrected when it is this rare (in how many crates it matches) ...
RARE = 3
#: ... and a word one edit away is this many times as common
CORRECTION_RATIO = 10
#: two words are run together when the joined word is in at least this many crates' text
MIN_DF = 2
#: a word is also read as two ("uppercase": upper case) when it matches in fewer crates than this
SPLIT = 10
#: how many words may stand between the words of a two-word alternative ("upper case", "file name")
NEAR = 2
#: :func:`match_concepts` asks for the wanted crates only when a concept is in more crates' text than this
MATCH_UNFILTERED = 2000


def tokens(text: str) -> list[str]:
    """Lowercase ASCII words and numbers, in order (``"SHA-256 sums"`` -> ``sha 256 sums``)."""
    return _WORD.findall(text.lower())


def clean(text: str) -> str:
    """``text`` as the index stores it: links, fenced code and the name of cargo's manifest dropped.

    Nearly every README is full of links and says "add this to your
    Cargo.toml" over a code block of dependencies: left in, "http" and
    "toml" are in a third of all documents, bm25 gives them little weight,
    and "HTTP server" cannot find the HTTP server nor "TOML" the toml crate.
    A README's prose says what the crate does; its code is Rust.

    Examples
    --------
    >>> clean("Parsing URLs, see https://docs.rs/url and add it to Cargo.toml.")
    'Parsing URLs, see   and add it to .'
    """
    return _CODE.sub(" ", _MANIFEST.sub("", _LINK.sub(" ", text)))


def edits1(word: str) -> set[str]:
    """Every string one deletion, transposition, replacement or insertion away from ``word``.

    Examples
    --------
    >>> {"markdown", "hostname", "blake3"} <= edits1("markdwon") | edits1("hostnmae") | edits1("balke3")
    True
    """
    splits = [(word[:i], word[i:]) for i in range(len(word) + 1)]
    return (
        {a + b[1:] for a, b in splits if b}
        | {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
        | {a + c + b[1:] for a, b in splits if b for c in _LETTERS}
        | {a + c + b for a, b in splits for c in _LETTERS}
    )


#: how many crates' text holds each of some words (a registry's vocabulary)
DocumentFrequency = Callable[[Collection[str]], Mapping[str, int]]


@dataclass(frozen=True)
class Concept:
    """One thing a request asks for: a word as typed, and every word that counts as it.

    ``df``: in how many crates' text the word (or, for a typo, its
    correction) appears; 0 when the registry did not say.
    """

    word: str
    alternatives: tuple[str, ...]
    df: int = 0
    #: what also counts as the concept for coverage, but is not ranked on (the two words a rare word
    #: may be written as: "uppercase" as upper case)
    loose: tuple[str, ...] = ()


def _no_vocabulary(words: Collection[str]) -> Mapping[str, int]:
    return {}


def concepts(
    query: str, df: DocumentFrequency = _no_vocabulary, matches: DocumentFrequency = _no_vocabulary
) -> list[Concept]:
    """What ``query`` asks for, one :class:`Concept` per word that is not a stopword.

    ``df`` says in how many crates' text each word appears as written (the
    registry's vocabulary); ``matches`` in how many it matches once stemmed
    ("texts" matches wherever "text" is).

    Two adjacent words the vocabulary has run together ("file name" ->
    ``filename``, "SHA 256" -> ``sha256``) are one concept, met by the
    joined word or by both words; a word that matches in fewer than
    :data:`SPLIT` crates may be met by two words it is made of ("uppercase":
    upper case). A concept's other alternatives: its :data:`SYNONYMS` (also
    of the two-word phrase it starts), the doer of a verb and the verb of a
    doer ("parse": parser), and, for a word
    that matches in fewer than :data:`RARE` crates, the two commonest words
    one edit away that are :data:`CORRECTION_RATIO` times as common (a typo:
    any known word when the typed one matches nowhere). Numbers are no
    concepts of their own, only parts of a joined word. Stopwords go unless
    nothing else is left. The names of the examples the request shows
    (:func:`.examples.with_names`: "myVariableName" is camel case) are words of it.

    An alternative with a space means its words close together (:func:`match_expression`).

    Examples
    --------
    >>> [c.alternatives for c in concepts("Render md to HTML")]
    [('render',), ('md', 'markdown'), ('html',)]
    >>> vocabulary = {"filename": 40, "file": 400, "name": 300, "markdown": 25}.get
    >>> [c.alternatives for c in concepts("a markdwon file name", lambda ws: {w: vocabulary(w, 0) for w in ws})]
    [('markdwon', 'markdown'), ('filename', 'file name')]
    """
    words = [w for w in tokens(examples.with_names(query)) if len(w) > 1 or w.isdigit()]
    content = {w for w in words if w not in STOPWORDS} or set(words)
    pairs = {a + b for a, b in pairwise(words) if a + b not in STOPWORDS and (a in content or b in content)}
    known = df(content | pairs)
    matched = matches({w for w in content if not w.isdigit()}) if matches is not _no_vocabulary else known
    rare = [w for w in content if matched.get(w, 0) < RARE and _correctable(w)]
    edits = {w: edits1(w) - STOPWORDS for w in rare}
    agents = {w: _agent_forms(w) for w in content if w.isalpha() and len(w) >= 3}
    halves = {w: _halves(w) for w in content if matched.get(w, 0) < SPLIT and w.isalpha()}
    parts = {part for pairs_of_word in halves.values() for pair in pairs_of_word for part in pair}
    near = df(set().union(*edits.values(), *agents.values(), parts))
    found: dict[str, Concept] = {}
    i = 0
    while i < len(words):
        word, following = words[i], words[i + 1] if i + 1 < len(words) else ""
        i += 1
        joined = word + following
        # a number qualifies the word before it ("SHA 256", "base 64"): one concept, as does a joined word
        numbered = following.isdigit() and word.isalpha() and word in content
        phrase = f"{word} {following}"
        if following and joined in pairs and (numbered or phrase in SYNONYMS or known.get(joined, 0) >= MIN_DF):
            i += 1
            extra = [*SYNONYMS.get(phrase, ()), *SYNONYMS.get(joined, ())]
            frequency = known.get(joined, 0) or min(matched.get(w, 0) for w in (word, following) if w in content)
            found.setdefault(phrase, _concept(phrase, [joined, *extra], frequency))
            continue
        if word not in content or word.isdigit() or len(word) < 2 or word in found:
            continue
        own = matched.get(word, 0)
        corrections = sorted(
            (e for e in edits.get(word, ()) if near.get(e, 0) >= max(1, CORRECTION_RATIO * own)),
            key=lambda e: (not _transposed(word, e), -near[e]),
        )[:2]
        forms = [f for f in agents.get(word, ()) if near.get(f, 0)]
        split = tuple(f"{a} {b}" for a, b in halves.get(word, ()) if near.get(a, 0) and near.get(b, 0))[:1]
        extra = [*SYNONYMS.get(word, ()), *forms, *corrections]
        frequency = own or (near[corrections[0]] if corrections else 0)
        found[word] = replace(_concept(word, [word, *extra], frequency), loose=split)
    return list(found.values())


def _agent_forms(word: str) -> set[str]:
    """The doer of a verb ("parse": parser, "view": viewer, "compress": compressor).

    The ``porter`` stemmer leaves "parser" and "viewer" whole (too short a
    stem to strip ``-er``), so "parsing" would not find "a parser"; the
    vocabulary says which of these forms exist. (Not the other way: "render"
    is no doer of "rend".)

    Examples
    --------
    >>> sorted(_agent_forms("parsing"))
    ['parser', 'parsor']
    >>> _agent_forms("viewer")
    set()
    """
    if word.endswith(("er", "or")):
        return set()
    base = word
    for ending in ("ing", "ed", "es", "s"):
        if word.endswith(ending) and len(word) - len(ending) >= 3:
            base = word[: -len(ending)]
            break
    stem = base[:-1] if base.endswith("e") else base
    return {stem + "er", stem + "or"}


def _halves(word: str) -> list[tuple[str, str]]:
    """Ways to read ``word`` as two words of three letters or more ("uppercase": upper case), middle first."""
    cuts = sorted(range(3, len(word) - 2), key=lambda i: abs(len(word) / 2 - i))
    return [(word[:i], word[i:]) for i in cuts]


def _correctable(word: str) -> bool:
    """A word a typo may hide in: three letters or more, not a number, not an abbreviation we know."""
    return len(word) >= 3 and not word.isdigit() and word not in SYNONYMS


def _transposed(word: str, other: str) -> bool:
    """Whether ``other`` is ``word`` with two neighbouring letters swapped (the commonest typo)."""
    if len(word) != len(other) or sorted(word) != sorted(other):
        return False
    return sum(a != b for a, b in zip(word, other, strict=True)) == 2


def _concept(word: str, alternatives: list[str], frequency: int) -> Concept:
    kept: list[str] = []
    for alternative in [word if " " in word else "", *alternatives]:
        for part in [alternative] if " " in alternative else tokens(alternative):
            if part and part not in kept:
                kept.append(part)
    if " " in word:  # the joined word first, then both words
        kept = [*kept[1:], kept[0]]
    return Concept(word, tuple(kept), frequency)


def match_expression(found: Sequence[Concept], *, loose: bool = False) -> str:
    """The FTS5 query for crates holding any alternative of any concept (the words of one with a space
    within :data:`NEAR` words of each other); with ``loose``, a concept's loose alternatives too.

    Examples
    --------
    >>> match_expression(concepts("md to html"))
    '"md" OR "markdown" OR "html"'
    >>> match_expression([Concept("file name", ("filename", "file name"))])
    '"filename" OR NEAR("file" "name", 2)'
    """
    alternatives = dict.fromkeys(a for c in found for a in (*c.alternatives, *(c.loose if loose else ())))
    return " OR ".join(
        f"NEAR({' '.join(f'{chr(34)}{w}{chr(34)}' for w in a.split())}, {NEAR})" if " " in a else f'"{a}"'
        for a in alternatives
    )


def idf(df: int, n: int) -> float:
    """bm25's inverse document frequency of a word in ``df`` of ``n`` crates (always positive)."""
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def coverage(matched: Iterable[int], found: Sequence[Concept], n: int, power: float = 1.0) -> float:
    """The share of the request (concepts weighted by :func:`idf` to ``power``) that the concepts at ``matched`` cover.

    Examples
    --------
    >>> found = [Concept("markdown", ("markdown",), 10), Concept("render", ("render",), 200)]
    >>> round(coverage([0], found, 600), 2), coverage([0, 1], found, 600)
    (0.79, 1.0)
    """
    weights = [idf(c.df, n) ** power for c in found]
    total = sum(weights)
    return sum(weights[i] for i in set(matched)) / total if total else 0.0


def match_concepts(
    db: sqlite3.Connection, table: str, found: Sequence[Concept], rowids: Collection[int], own: Sequence[float]
) -> dict[int, tuple[set[int], set[int]]]:
    """For each of ``rowids``: which concepts (by index) its row holds anywhere, and in its own columns.

    ``own`` has one weight per column of the FTS5 ``table``: 1 for a column
    holding what the crate says of itself (name, description, keywords, what
    its binaries say), 0 for the rest. One query per concept, every match kept here (a rowid list in SQL is
    7x slower); a row matched in a column of weight 0 only scores 0 there.
    """
    result: dict[int, tuple[set[int], set[int]]] = {r: (set(), set()) for r in rowids}
    if not rowids:
        return result
    marks = ", ".join("?" * len(own))
    ids = ", ".join(str(int(r)) for r in rowids)
    for index, concept in enumerate(found):
        where = f" AND rowid IN ({ids})" if concept.df > MATCH_UNFILTERED else ""
        rows = db.execute(
            f"SELECT rowid, bm25({table}, {marks}) FROM {table} WHERE {table} MATCH ?{where}",
            (*own, match_expression([concept], loose=True)),
        ).fetchall()
        for rowid, own_score in ((r, o) for r, o in rows if r in result):
            result[rowid][0].add(index)
            if own_score:
                result[rowid][1].add(index)
    return result


def evidence_in(query: str, texts: Sequence[Sequence[str]]) -> list[float]:
    """The share of ``query`` each of ``texts`` (a crate's own words, in a few fields) covers.

    For registries without an index of their own (crates.io): the texts go
    into an in-memory FTS5 table with the index's tokenizer, and the same
    :func:`match_concepts` and :func:`coverage` apply, with every concept
    weighted alike (no vocabulary says how rare a word is).

    Examples
    --------
    >>> evidence_in("render markdown to html", [("md2html", "Render Markdown as HTML", ""), ("url", "URLs", "")])
    [1.0, 0.0]
    """
    found = concepts(query)
    if not texts or not found:
        return [0.0] * len(texts)
    width = max(len(t) for t in texts)
    columns = [f"c{i}" for i in range(width)]
    db = sqlite3.connect(":memory:")
    try:
        db.execute(f"CREATE VIRTUAL TABLE own USING fts5({', '.join(columns)}, tokenize='{TOKENIZER}')")
        db.executemany(
            f"INSERT INTO own (rowid, {', '.join(columns)}) VALUES (?, {', '.join('?' * width)})",
            [(i + 1, *text, *([""] * (width - len(text)))) for i, text in enumerate(texts)],
        )
        matched = match_concepts(db, "own", found, range(1, len(texts) + 1), [1.0] * width)
    finally:
        db.close()
    return [coverage(matched[i + 1][1], found, 0, EVIDENCE_POWER) for i in range(len(texts))]


def name_key(name: str) -> str:
    """A crate name as compared with query terms: lowercase, ``-`` and ``_`` and a ``-rs`` suffix dropped.

    Examples
    --------
    >>> [name_key(n) for n in ["tiny_http", "pulldown-cmark", "prettytable-rs"]]
    ['tinyhttp', 'pulldowncmark', 'prettytable']
    """
    return re.sub(r"[-_]", "", re.sub(r"[-_]rs$", "", name.lower()))


def name_keys(query: str, found: Sequence[Concept] | None = None) -> set[str]:
    """What in a query could be a crate's name: each word (and without a plural ``s``), each
    alternative of its concepts, and each two adjacent words run together ("tiny http" -> ``tinyhttp``)."""
    words = [w for w in tokens(query) if w not in STOPWORDS]
    keys = set(words) | {w[:-1] for w in words if w.endswith("s") and len(w) > 3}
    keys |= {a + b for a, b in pairwise(words)}
    for concept in found if found is not None else concepts(query):
        keys.update(name_key(a) for a in concept.alternatives)
    return keys


def combine(
    relevance: float,
    prior: float,
    *,
    named: bool,
    covered: float = 1.0,
    evidence: float | None = None,
    weight: float | None = None,
) -> dict[str, float]:
    """The score and its parts, as a candidate carries them.

    ``covered``: the share of the request the crate's text covers
    (:func:`coverage`); ``evidence``: the share its own words cover (name,
    description, keywords, what its binaries say), kept as a part for the
    fitness check, not scored.

    Examples
    --------
    >>> combine(10.0, 0.0, named=False)["score"]
    10.0
    >>> round(combine(10.0, math.e - 1, named=True, covered=0.5)["score"], 2)
    16.4
    """
    factor = prior_factor(prior, weight)
    name = NAME_BOOST if named else 1.0
    parts = {
        "relevance": relevance,
        "prior": prior,
        "popularity": factor,
        "name": name,
        "coverage": covered,
        "score": relevance * factor * name * covered**COVERAGE_POWER,
    }
    if evidence is not None:
        parts["evidence"] = evidence
    return parts


def fuse(
    lexical: float, best_lexical: float, similarity: float, mean: float, best: float, weight: float | None = None
) -> tuple[float, float, float]:
    """``(score, words, meaning)``: ``(1 - weight) * words + weight * meaning``, each share in [0, 1].

    ``words`` is ``lexical / best_lexical`` (the best crate by words has 1);
    ``meaning`` is how far the crate's cosine similarity to the request is
    above the registry's ``mean``, as a share of the closest crate's (``best``)
    lead: 0 at or below the mean, 1 for the closest. ``weight`` defaults to
    :data:`SEMANTIC_WEIGHT`. The crates found by words are joined by the
    :data:`SEMANTIC_POOL` closest in meaning (meaning above
    :data:`SEMANTIC_FLOOR`, similarity at least :data:`SEMANTIC_MIN_SIMILARITY`).

    Examples
    --------
    >>> fuse(10.0, 20.0, 0.6, 0.2, 0.6), fuse(0.0, 20.0, 0.1, 0.2, 0.6)
    ((0.825, 0.5, 1.0), (0.0, 0.0, 0.0))
    """
    w = SEMANTIC_WEIGHT if weight is None else weight
    words = min(max(lexical, 0.0) / best_lexical, 1.0) if best_lexical > 0 else 0.0
    meaning = min(max((similarity - mean) / (best - mean), 0.0), 1.0) if best > mean else 0.0
    return (1.0 - w) * words + w * meaning, words, meaning
