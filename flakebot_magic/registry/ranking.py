"""What a search means: an English stemmer, a small synonym table, and a popularity prior from the dependency graph.

Three pieces, all plain Python, used by the directory registry when it
builds its index and when it answers a query:

* :func:`stem` strips English suffixes (a reduced Porter stemmer: plurals,
  ``-ed``/``-ing``, the common derivational endings), so "parsing",
  "parser" and "parses" meet "parse". It runs over indexed text and query
  words alike.
* :data:`SYNONYMS` maps abbreviations and everyday phrasings to the words
  crates describe themselves with (``md`` -> ``markdown``, ``b64`` ->
  ``base64``, ``hex dump`` -> ``hexdump``). :func:`query_terms` adds them to
  a query's own words.
* :func:`reverse_dependencies` over the registry's dependency graph (each
  crate's ``[dependencies]`` and ``[build-dependencies]`` names) gives a
  popularity prior, computed once when the index is built: a crate much of
  the registry builds on (``toml``, ``url``) is more often what a user
  means than one that merely repeats the query's words. (PageRank over the
  same graph was measured too and ranked worse: it piles its weight on
  infrastructure such as ``proc-macro2`` and ``serde_derive``, which no
  request asks for.)

The score (:func:`combine`) is::

    score = relevance * (1 + PRIOR_WEIGHT * log(1 + prior)) * name

where ``relevance`` is FTS5's bm25 over weighted columns, ``prior`` is the
crate's reverse-dependency count scaled so that the mean crate has 1.0, and ``name`` is
:data:`NAME_BOOST` when the crate's name is one of the query's terms (a
user who says "TOML" means the crate called ``toml``), else 1. The weights
were tuned on the "tune" half of ``tests/search_requests.toml``;
``make bench`` reports both halves.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from itertools import pairwise
from typing import Any

__all__ = [
    "NAME_BOOST",
    "PRIOR_WEIGHT",
    "STOPWORDS",
    "SYNONYMS",
    "analyze",
    "combine",
    "dependency_names",
    "name_key",
    "name_keys",
    "prior_factor",
    "query_terms",
    "reverse_dependencies",
    "stem",
    "tokens",
]

#: how strongly the popularity prior lifts a relevant crate (``w`` in the score)
PRIOR_WEIGHT = 0.3
#: the factor for a crate whose name is one of the query's terms
NAME_BOOST = 1.5

_STOPWORD_TEXT = """a an and are as at be by for from in into is it its of on or that the this to with
    which what when how make makes made some any all my me i we you your our can will
    should would please write build create given use using tool tools command program
    text file files data from line lines like"""
#: words that say nothing about which crate is wanted
STOPWORDS = frozenset(_STOPWORD_TEXT.split())

#: Abbreviations and everyday phrasings -> the words crates use for the same thing.
#: Keys are lowercase words or two-word phrases as typed; values are added to
#: the query (they never replace its words). Kept small on purpose: an entry
#: belongs here when users say one thing and crate descriptions say another.
SYNONYMS: Mapping[str, tuple[str, ...]] = {
    "md": ("markdown",),
    "commonmark": ("markdown",),
    "web page": ("html",),
    "webpage": ("html",),
    "hexdump": ("hex", "viewer"),
    "hex dump": ("hexdump", "viewer"),
    "hexadecimal": ("hex",),
    "b64": ("base64",),
    "regexp": ("regex",),
    "regular expression": ("regex",),
    "uri": ("url",),
    "urls": ("url",),
    "web server": ("http", "server"),
    "webserver": ("http", "server"),
    "yml": ("yaml",),
    "tsv": ("csv",),
    "sha256": ("sha2", "sha"),
    "sha512": ("sha2", "sha"),
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
_VOWELS = frozenset("aeiou")


def tokens(text: str) -> list[str]:
    """Lowercase ASCII words and numbers, in order (``"SHA-256 sums"`` -> ``sha 256 sums``)."""
    return _WORD.findall(text.lower())


def analyze(text: str) -> str:
    """``text`` as the index stores it: links dropped, stemmed words joined by spaces.

    Links go because nearly every README is full of them: left in, "http"
    is in most documents, bm25 gives it no weight, and "HTTP server" cannot
    find the HTTP server.

    Examples
    --------
    >>> analyze("Parsing URLs, see https://docs.rs/url and <http://example.com/a>.")
    'pars url see and'
    """
    return " ".join(stem(w) for w in tokens(_LINK.sub(" ", text)))


# -- the stemmer -------------------------------------------------------------


def _consonant(word: str, i: int) -> bool:
    ch = word[i]
    if ch in _VOWELS:
        return False
    if ch == "y":
        return i == 0 or not _consonant(word, i - 1)
    return True


def _measure(stem_: str) -> int:
    """Porter's m: the number of vowel-consonant sequences in ``stem_``."""
    m, previous_vowel = 0, False
    for i in range(len(stem_)):
        vowel = not _consonant(stem_, i)
        if previous_vowel and not vowel:
            m += 1
        previous_vowel = vowel
    return m


def _has_vowel(stem_: str) -> bool:
    return any(not _consonant(stem_, i) for i in range(len(stem_)))


def _ends_cvc(word: str) -> bool:
    """Consonant-vowel-consonant at the end, the last not w, x or y ("hop", not "snow")."""
    return (
        len(word) >= 3
        and _consonant(word, -1 + len(word))
        and not _consonant(word, len(word) - 2)
        and _consonant(word, len(word) - 3)
        and word[-1] not in "wxy"
    )


#: derivational endings rewritten when the stem before them has m > 0
_STEP2 = (
    ("ational", "ate"),
    ("tional", "tion"),
    ("enci", "ence"),
    ("anci", "ance"),
    ("izer", "ize"),
    ("ization", "ize"),
    ("ation", "ate"),
    ("ator", "ate"),
    ("alism", "al"),
    ("iveness", "ive"),
    ("fulness", "ful"),
    ("ousness", "ous"),
    ("aliti", "al"),
    ("iviti", "ive"),
    ("biliti", "ble"),
    ("entli", "ent"),
    ("ousli", "ous"),
    ("alli", "al"),
    ("eli", "e"),
    ("bli", "ble"),
)
_STEP3 = (("icate", "ic"), ("ative", ""), ("alize", "al"), ("iciti", "ic"), ("ical", "ic"), ("ful", ""), ("ness", ""))
#: endings removed when the stem before them has m > 1
_STEP4 = (
    "ement",
    "ance",
    "ence",
    "able",
    "ible",
    "ment",
    "ant",
    "ent",
    "ism",
    "ate",
    "iti",
    "ous",
    "ive",
    "ize",
    "ion",
    "al",
    "er",
    "ic",
    "ou",
)


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A reduced Porter stemmer for one lowercase word.

    Plurals and ``-ed``/``-ing`` go (step 1), then the common derivational
    endings are folded (steps 2-4) and a final ``e`` dropped (step 5), each
    only when enough of the word stays. Words of one or two letters and
    words with digits (``sha256``, ``base64``) are kept as they are.

    Examples
    --------
    >>> [stem(w) for w in ["parsing", "parser", "parses", "dates", "compression", "colored", "sha256"]]
    ['pars', 'pars', 'pars', 'date', 'compress', 'color', 'sha256']
    """
    if len(word) <= 2 or not word.isalpha():
        return word
    # step 1a: plurals
    if word.endswith(("sses", "ies")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss") and not word.endswith("us"):
        word = word[:-1]
    # step 1b: -eed, -ed, -ing
    if word.endswith("eed"):
        if _measure(word[:-3]) > 0:
            word = word[:-1]
    else:
        for suffix in ("ed", "ing"):
            base = word[: -len(suffix)]
            if word.endswith(suffix) and _has_vowel(base):
                word = base
                if word.endswith(("at", "bl", "iz")):
                    word += "e"
                elif (
                    len(word) >= 2
                    and word[-1] == word[-2]
                    and _consonant(word, len(word) - 1)
                    and word[-1] not in "lsz"
                ):
                    word = word[:-1]
                elif _measure(word) == 1 and _ends_cvc(word):
                    word += "e"
                break
    # step 1c: y -> i after a vowel-bearing stem
    if word.endswith("y") and _has_vowel(word[:-1]):
        word = word[:-1] + "i"
    for suffix, replacement in _STEP2:
        if word.endswith(suffix):
            if _measure(word[: -len(suffix)]) > 0:
                word = word[: -len(suffix)] + replacement
            break
    for suffix, replacement in _STEP3:
        if word.endswith(suffix):
            if _measure(word[: -len(suffix)]) > 0:
                word = word[: -len(suffix)] + replacement
            break
    for suffix in _STEP4:
        if word.endswith(suffix):
            base = word[: -len(suffix)]
            # unlike Porter, "-er" goes after any stem: "parser", "viewer", "decoder" meet their verbs
            wanted = 0 if suffix == "er" else 1
            if _measure(base) > wanted and (suffix != "ion" or base.endswith(("s", "t"))):
                word = base
            break
    # step 5: a final e, and a double l
    if word.endswith("e"):
        base = word[:-1]
        m = _measure(base)
        if m > 1 or (m == 1 and not _ends_cvc(base)):
            word = base
    if word.endswith("ll") and _measure(word) > 1:
        word = word[:-1]
    return word


# -- the query ---------------------------------------------------------------


def query_terms(query: str) -> list[str]:
    """A query's words, their synonyms and abbreviations expanded, as stemmed index terms.

    Stopwords go unless nothing else is left. Each term appears once, in the
    order first seen; a synonym of several words becomes one term per word.

    Examples
    --------
    >>> query_terms("Render md to HTML")
    ['rend', 'md', 'markdown', 'html']
    >>> query_terms("a hex dump viewer")
    ['hex', 'hexdump', 'view', 'dump']
    """
    words = [w for w in tokens(query) if len(w) > 1]
    kept = [w for w in words if w not in STOPWORDS] or words
    terms: dict[str, None] = {}
    for i, word in enumerate(kept):
        terms.setdefault(stem(word), None)
        extra = list(SYNONYMS.get(word, ()))
        if i + 1 < len(kept):
            extra += SYNONYMS.get(f"{word} {kept[i + 1]}", ())
        for synonym in extra:
            for part in tokens(synonym):
                terms.setdefault(stem(part), None)
    return list(terms)


def name_key(name: str) -> str:
    """A crate name as compared with query terms: lowercase, ``-`` and ``_`` and a ``-rs`` suffix dropped.

    Examples
    --------
    >>> [name_key(n) for n in ["tiny_http", "pulldown-cmark", "prettytable-rs"]]
    ['tinyhttp', 'pulldowncmark', 'prettytable']
    """
    return re.sub(r"[-_]", "", re.sub(r"[-_]rs$", "", name.lower()))


def name_keys(query: str) -> set[str]:
    """What in a query could be a crate's name: each word, its stem, its synonyms, and
    each two adjacent words run together ("tiny http" -> ``tinyhttp``)."""
    words = [w for w in tokens(query) if w not in STOPWORDS]
    keys = set(words) | {stem(w) for w in words} | {a + b for a, b in pairwise(words)}
    for i, word in enumerate(words):
        keys.update(name_key(s) for s in SYNONYMS.get(word, ()))
        if i + 1 < len(words):
            keys.update(name_key(s) for s in SYNONYMS.get(f"{word} {words[i + 1]}", ()))
    return keys


# -- the popularity prior ----------------------------------------------------


def dependency_names(manifest: Mapping[str, Any]) -> set[str]:
    """The crates a manifest builds on: ``[dependencies]`` and ``[build-dependencies]``,
    also under ``[target.*]``, by their registry name (``package = "..."`` renames
    followed). Dev-dependencies are left out: they say what a crate is tested
    with, not what it is built on."""
    tables: list[Any] = [
        manifest.get("dependencies"),
        manifest.get("build-dependencies"),
        manifest.get("build_dependencies"),
    ]
    targets = manifest.get("target")
    if isinstance(targets, Mapping):
        for target in targets.values():
            if isinstance(target, Mapping):
                tables += [target.get("dependencies"), target.get("build-dependencies")]
    names: set[str] = set()
    for table in tables:
        if not isinstance(table, Mapping):
            continue
        for key, spec in table.items():
            renamed = spec.get("package") if isinstance(spec, Mapping) else None
            names.add(renamed if isinstance(renamed, str) else str(key))
    return names


def reverse_dependencies(edges: Mapping[str, Iterable[str]]) -> dict[str, float]:
    """How many crates build on each crate, scaled so that the mean crate has 1.0.

    ``edges`` maps each crate to the crates it depends on. Names outside
    ``edges`` (dependencies the registry does not hold) and a crate's
    dependency on itself are ignored.

    Examples
    --------
    >>> reverse_dependencies({"app": ["toml", "log"], "lib": ["log"], "toml": [], "log": []})
    {'app': 0.0, 'lib': 0.0, 'log': 2.6666666666666665, 'toml': 1.3333333333333333}
    """
    counts = dict.fromkeys(sorted(edges), 0)
    for name, dependencies in edges.items():
        for dependency in set(dependencies):
            if dependency in counts and dependency != name:
                counts[dependency] += 1
    mean = sum(counts.values()) / len(counts) if counts else 0
    return {name: (count / mean if mean else 0.0) for name, count in counts.items()}


def prior_factor(prior: float, weight: float | None = None) -> float:
    """``1 + weight * log(1 + prior)``: how much the prior multiplies relevance
    (``weight`` defaults to :data:`PRIOR_WEIGHT`)."""
    w = PRIOR_WEIGHT if weight is None else weight
    return 1.0 + w * math.log1p(max(prior, 0.0))


def combine(relevance: float, prior: float, *, named: bool, weight: float | None = None) -> dict[str, float]:
    """The score and its parts, as a candidate carries them.

    Examples
    --------
    >>> combine(10.0, 0.0, named=False)["score"]
    10.0
    >>> round(combine(10.0, math.e - 1, named=True)["score"], 2)
    19.5
    """
    factor = prior_factor(prior, weight)
    name = NAME_BOOST if named else 1.0
    return {
        "relevance": relevance,
        "prior": prior,
        "popularity": factor,
        "name": name,
        "score": relevance * factor * name,
    }
