"""Maintained BM25 libraries against flakebot's ranker, on the paraphrase evaluation (issue 20).

    .venv/bin/pip install bm25s PyStemmer rank-bm25     # measurement only, not dependencies
    .venv/bin/python benchmarks/compare_rankers.py [--split tune|held-out] [--old COMMIT]

Every ranker sees the same documents (each crate's name, description,
keywords, categories and README, from Debian's registry) and the same query
words (stopwords dropped), and its bm25 relevance goes through the same
popularity prior, name match and binary preference
(:func:`flakebot_magic.registry.ranking.combine`,
:func:`flakebot_magic.stages.search.rank`), so only the text ranking
differs:

* ``old``: flakebot's ranker at ``--old`` (default: the commit that added the
  paraphrases, before any tuning for issue 20), run from a ``git archive`` of it:
  FTS5 ``unicode61`` over text stemmed by its own Porter stemmer, and synonyms;
* ``fts5-porter``: SQLite FTS5, ``porter unicode61`` tokenizer (SQLite's own
  Porter stemmer), bm25 with the same column weights;
* ``fts5-porter+trigram``: the same plus FTS5's ``trigram`` tokenizer over
  names, descriptions and keywords (character trigrams of every query word,
  any of them), the two bm25 scores normalised and added;
* ``bm25s``: the ``bm25s`` package with PyStemmer's English stemmer, the
  fields concatenated (repeated by their weight);
* ``rank-bm25``: ``rank_bm25.BM25Okapi`` over the same tokens;
* ``current``: flakebot's ranker as it is in this checkout.

Printed: top-1/3/10 and the fitness verdicts (``search_eval``) per ranker
(for the libraries, the fitness check's evidence comes from each
candidate's name, description and keywords, ``ranking.evidence_in``).
The query's stopwords and synonyms are this checkout's, so rows other than
``old`` move with them.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402
from flakebot_magic.registry import ranking  # noqa: E402
from flakebot_magic.registry.base import CrateCandidate  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry, read_manifest  # noqa: E402
from flakebot_magic.stages import search as search_stage  # noqa: E402
from flakebot_magic.testing.search_eval import Case, Outcome, judge, load_cases, summarize  # noqa: E402

#: the commit that added tests/search_paraphrases.toml (nothing tuned yet)
BEFORE_TUNING = "9a1dfc9"
FIELDS = ("name", "description", "keywords", "categories", "readme")
WEIGHTS = (10.0, 4.0, 5.0, 2.0, 0.5)
_LINK = re.compile(r"\b(?:https?|ftp)://\S*|\bwww\.\S*", re.I)


def documents(registry: Path) -> dict[str, dict[str, str]]:
    """Every crate's text fields by name (the newest version of each name)."""
    from flakebot_magic.registry.crate_files import readme

    docs: dict[str, dict[str, str]] = {}
    for manifest_path in sorted(registry.glob("*/Cargo.toml")):
        try:
            package = read_manifest(manifest_path).get("package", {})
        except Exception:
            continue
        name = package.get("name")
        if not isinstance(name, str):
            continue
        docs[name] = {
            "name": f"{name} {name.replace('-', ' ').replace('_', ' ')} {ranking.name_key(name)}",
            "description": str(package.get("description", "")),
            "keywords": " ".join(k for k in package.get("keywords", []) if isinstance(k, str)),
            "categories": " ".join(c for c in package.get("categories", []) if isinstance(c, str)),
            "readme": _LINK.sub(" ", readme(manifest_path.parent, package)),
        }
    return docs


def query_words(text: str) -> list[str]:
    """The query's words less stopwords, with the synonym table's additions (unstemmed)."""
    words = [w for w in ranking.tokens(text) if len(w) > 1]
    kept = [w for w in words if w not in ranking.STOPWORDS] or words
    out: dict[str, None] = {}
    for i, word in enumerate(kept):
        out.setdefault(word, None)
        extra = list(ranking.SYNONYMS.get(word, ()))
        if i + 1 < len(kept):
            extra += ranking.SYNONYMS.get(f"{word} {kept[i + 1]}", ())
        for synonym in extra:
            for part in ranking.tokens(synonym):
                out.setdefault(part, None)
    return list(out)


class Finisher:
    """bm25 relevance by crate name -> candidates through the prior, the name match and the binary preference."""

    def __init__(self, registry: DirectoryRegistry) -> None:
        self.registry = registry
        db = registry._connect()
        self.prior = dict(db.execute("SELECT name, max(prior) FROM crates GROUP BY name"))
        self.cached: dict[str, CrateCandidate] = {}

    def candidates(self, text: str, relevance: dict[str, float]) -> list[CrateCandidate]:
        keys = ranking.name_keys(text)
        scored = []
        for name, rel in sorted(relevance.items(), key=lambda kv: -kv[1])[:60]:
            if rel <= 0:
                continue
            parts = ranking.combine(rel, self.prior.get(name, 0.0), named=ranking.name_key(name) in keys)
            base = self.cached.get(name) or self.cached.setdefault(name, self.registry.get(name))
            scored.append(
                CrateCandidate(**{**base.__dict__, "score": parts.pop("score"), "parts": parts})  # type: ignore[arg-type]
            )
        scored.sort(key=lambda c: -c.score)
        # the fitness check needs each candidate's evidence: from its name, description and keywords
        shares = ranking.evidence_in(text, [(c.name, c.description, " ".join(c.keywords)) for c in scored[:30]])
        pool = [replace(c, parts={**c.parts, "evidence": e}) for c, e in zip(scored, shares, strict=False)]
        return search_stage.rank(pool, prefer_bin=True)[:10]


def corrections(words: list[str], df: dict[str, int]) -> list[str]:
    """Vocabulary words one edit from a query word that is unknown or far rarer than them."""
    extra: list[str] = []
    for word in words:
        if len(word) < 3 or word.isdigit():
            continue
        own = df.get(word, 0)
        close = sorted(((df[e], e) for e in ranking.edits1(word) if df.get(e, 0) >= max(2, 10 * own)), reverse=True)
        extra += [e for _, e in close[:2]]
    return extra


def fts5_ranker(
    docs: dict[str, dict[str, str]], trigram: bool, edits: bool = False
) -> Callable[[str], dict[str, float]]:
    db = sqlite3.connect(":memory:")
    df: dict[str, int] = {}
    for doc in docs.values():
        for word in set(ranking.tokens(" ".join(doc.values()))):
            df[word] = df.get(word, 0) + 1
    db.execute(f"CREATE VIRTUAL TABLE words USING fts5({', '.join(FIELDS)}, tokenize='porter unicode61')")
    if trigram:
        db.execute("CREATE VIRTUAL TABLE grams USING fts5(text, tokenize='trigram')")
    names = list(docs)
    for rowid, name in enumerate(names, 1):
        doc = docs[name]
        db.execute(
            f"INSERT INTO words (rowid, {', '.join(FIELDS)}) VALUES (?,?,?,?,?,?)", (rowid, *(doc[f] for f in FIELDS))
        )
        if trigram:
            db.execute(
                "INSERT INTO grams (rowid, text) VALUES (?, ?)",
                (rowid, " ".join([doc["name"], doc["description"], doc["keywords"]]).lower()),
            )

    def search(text: str) -> dict[str, float]:
        words = query_words(text)
        if not words:
            return {}
        if edits:
            words += corrections(words, df)
        match = " OR ".join(f'"{w}"' for w in words)
        rows = db.execute(
            "SELECT rowid, -bm25(words, ?, ?, ?, ?, ?) FROM words WHERE words MATCH ?", (*WEIGHTS, match)
        ).fetchall()
        scores = {names[r - 1]: s for r, s in rows}
        if trigram:
            grams = {w[i : i + 3] for w in words if len(w) >= 3 for i in range(len(w) - 2)}
            if grams:
                query = " OR ".join(f'"{g}"' for g in grams)
                tri = db.execute("SELECT rowid, -bm25(grams) FROM grams WHERE grams MATCH ?", (query,)).fetchall()
                top_w = max(scores.values(), default=1.0) or 1.0
                top_t = max((s for _, s in tri), default=1.0) or 1.0
                for r, s in tri:
                    name = names[r - 1]
                    scores[name] = scores.get(name, 0.0) + 0.5 * top_w * s / top_t
        return scores

    return search


def _weighted_tokens(doc: dict[str, str], tokenize: Callable[[str], list[str]]) -> list[str]:
    tokens: list[str] = []
    for field, weight in zip(FIELDS, WEIGHTS, strict=True):
        tokens += tokenize(doc[field]) * max(1, round(weight * 2))
    return tokens


def bm25s_ranker(docs: dict[str, dict[str, str]]) -> Callable[[str], dict[str, float]]:
    import bm25s
    import Stemmer

    stemmer = Stemmer.Stemmer("english")

    def tokenize(text: str) -> list[str]:
        return list(stemmer.stemWords(ranking.tokens(text)))

    names = list(docs)
    corpus = [_weighted_tokens(docs[n], tokenize) for n in names]
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(t, len(vocab)) for t in doc] for doc in corpus]
    retriever = bm25s.BM25()
    retriever.index(bm25s.tokenization.Tokenized(ids=ids, vocab=vocab), show_progress=False)

    def search(text: str) -> dict[str, float]:
        query = [t for t in tokenize(" ".join(query_words(text))) if t in vocab]
        if not query:
            return {}
        scores = retriever.get_scores(query)
        return {names[i]: float(s) for i, s in enumerate(scores) if s > 0}

    return search


def rank_bm25_ranker(docs: dict[str, dict[str, str]]) -> Callable[[str], dict[str, float]]:
    import Stemmer
    from rank_bm25 import BM25Okapi

    stemmer = Stemmer.Stemmer("english")

    def tokenize(text: str) -> list[str]:
        return list(stemmer.stemWords(ranking.tokens(text)))

    names = list(docs)
    bm25 = BM25Okapi([_weighted_tokens(docs[n], tokenize) for n in names])

    def search(text: str) -> dict[str, float]:
        query = tokenize(" ".join(query_words(text)))
        if not query:
            return {}
        return {names[i]: float(s) for i, s in enumerate(bm25.get_scores(query)) if s > 0}

    return search


def measure(
    label: str, cases: list[Case], ranked: Callable[[str], list[CrateCandidate]]
) -> tuple[dict[str, Any], float]:
    outcomes, times = [], []
    for case in cases:
        started = time.perf_counter()
        found = ranked(case.text)
        times.append(time.perf_counter() - started)
        verdict, decided = judge(case, found) if found else ("miss", "")
        outcomes.append(Outcome(case, tuple(c.name for c in found), verdict, decided))
    times.sort()
    return summarize(outcomes), times[len(times) // 2] * 1000


_OLD_SCRIPT = """
import json, sys
from pathlib import Path
from flakebot_magic.errors import NeedsModelError
from flakebot_magic.registry.directory import DirectoryRegistry
from flakebot_magic.stages import search as search_stage
from flakebot_magic.stages.choose import choose_without_model
registry = DirectoryRegistry(sys.argv[1], Path(sys.argv[2]))
out = []
for text in json.loads(sys.stdin.read()):
    found = search_stage.search(registry, text, limit=10, prefer_bin=True)
    try:
        decided = ["deploy", choose_without_model(found, text).candidate.name]
    except NeedsModelError as exc:
        decided = ["refuse", [c.name for c in exc.candidates[:5]]]
    out.append([[c.name for c in found], decided])
print(json.dumps(out))
"""


def old_ranker(commit: str, registry: Path, cases: list[Case]) -> dict[str, Any]:
    """The ranker at ``commit``, run in a child from a ``git archive`` of its package."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "flakebot_magic"], capture_output=True, check=True
    ).stdout
    with tempfile.TemporaryDirectory(prefix="fb-old-ranker-") as tmp:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        done = subprocess.run(
            [sys.executable, "-c", _OLD_SCRIPT, str(registry), str(Path(tmp) / "cache")],
            input=json.dumps([c.text for c in cases]),
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONPATH": tmp, "PATH": "/usr/bin:/bin"},
            cwd=tmp,  # `python -c` puts its working directory first on sys.path: not this checkout
        )
    outcomes = []
    for case, (names, (kind, decided)) in zip(cases, json.loads(done.stdout), strict=True):
        if kind == "deploy":
            verdict = "deploy" if decided in case.tools else "wrong"
        else:
            verdict = "refuse" if set(decided) & set(case.accept) else "miss"
        outcomes.append(Outcome(case, tuple(names), verdict, str(decided)))
    return summarize(outcomes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", type=Path, default=DEBIAN_REGISTRY)
    parser.add_argument("--split", default="tune", choices=("tune", "held-out"))
    parser.add_argument("--old", default=BEFORE_TUNING, help="the commit whose ranker is 'old'")
    parser.add_argument("--only", nargs="*", help="measure only these rankers")
    args = parser.parse_args()
    cases = [c for c in load_cases() if c.split == args.split]
    with tempfile.TemporaryDirectory(prefix="fb-rankers-") as tmp:
        registry = DirectoryRegistry(args.registry, Path(tmp))
        finisher = Finisher(registry)
        docs = documents(args.registry)
        rows: list[tuple[str, dict[str, Any], str]] = []

        def library(label: str, make: Callable[[], Callable[[str], dict[str, float]]]) -> None:
            if args.only and label not in args.only:
                return
            relevance = make()
            summary, p50 = measure(label, cases, lambda t: finisher.candidates(t, relevance(t)))
            rows.append((label, summary[args.split], f"{p50:.2f} ms"))

        if not args.only or "old" in args.only:
            rows.append(("old", old_ranker(args.old, args.registry, cases)[args.split], "-"))
        library("fts5-porter", lambda: fts5_ranker(docs, trigram=False))
        library("fts5-porter+trigram", lambda: fts5_ranker(docs, trigram=True))
        library("fts5-porter+edits", lambda: fts5_ranker(docs, trigram=False, edits=True))
        library("bm25s", lambda: bm25s_ranker(docs))
        library("rank-bm25", lambda: rank_bm25_ranker(docs))
        if not args.only or "current" in args.only:
            summary, p50 = measure(
                "current", cases, lambda t: search_stage.search(registry, t, limit=10, prefer_bin=True)
            )
            rows.append(("current", summary[args.split], f"{p50:.2f} ms"))
        registry.close()
    n = len(cases)
    print(f"{args.split} half: {n} paraphrases of {len({c.request for c in cases})} requests")
    print("| ranker | top-1 | top-3 | top-10 | deploy / refuse / miss / wrong | search p50 |")
    print("|---|---|---|---|---|---|")
    for label, s, p50 in rows:
        verdicts = " / ".join(str(s[v]) for v in ("deploy", "refuse", "miss", "wrong"))
        print(f"| {label} | {s['top1']:.2f} | {s['top3']:.2f} | {s['top10']:.2f} | {verdicts} | {p50} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["documents", "main", "math"]
