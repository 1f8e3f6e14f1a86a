"""What a directory registry's search index holds, written into an empty SQLite database (:func:`fill_index`).

Per crate: its name, description, keywords, categories, what its binaries say
they do (:func:`.crate_files.binary_text`) and its README, stemmed by FTS5's
``porter`` tokenizer; what its binaries read (:func:`.crate_files.binary_input`);
a popularity prior (reverse-dependency counts over the registry's dependency
graph); the registry's vocabulary; and, with a sentence model, each crate's
meaning (:func:`.embedding.store_vectors`).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from pathlib import Path

from ..errors import RegistryError
from . import embedding, prior, ranking
from .base import check_crate_field
from .crate_files import binary_input, binary_text, read_manifest, readme, tool_binaries
from .shared_index import Progress

__all__ = ["COLUMNS_FTS", "fill_index"]

#: the index's text columns (their bm25 weights and which hold what a crate says of itself: the directory
#: registry's ``_WEIGHTS`` and ``_OWN``)
COLUMNS_FTS = ("name", "description", "keywords", "categories", "usage", "readme")


def fill_index(
    db: sqlite3.Connection, path: Path, model: embedding.ModelFiles | None, signature: str, report: Progress
) -> None:
    """Index every crate of the registry into the empty database ``db``, telling ``report`` how far."""
    db.executescript(
        f"""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
        CREATE TABLE crates (
            id INTEGER PRIMARY KEY, name TEXT, version TEXT, dir TEXT,
            description TEXT, keywords TEXT, categories TEXT, license TEXT,
            homepage TEXT, repository TEXT, bins TEXT, input TEXT NOT NULL DEFAULT '',
            key TEXT, prior REAL DEFAULT 0, log_prior REAL DEFAULT 0
        );
        CREATE INDEX crates_name ON crates(name);
        CREATE VIRTUAL TABLE crates_fts USING fts5(
            {", ".join(COLUMNS_FTS)}, content='', tokenize='{ranking.TOKENIZER}'
        );
        CREATE TABLE words (word TEXT PRIMARY KEY, df INTEGER NOT NULL) WITHOUT ROWID;
        {embedding.VECTORS_TABLE};
        """
    )
    embedded: list[tuple[int, tuple[str, ...], str]] = []  # per crate row: its views, and its binary's text
    # the popularity prior: which crates each crate builds on, by name (all versions together)
    depends_on: dict[str, set[str]] = {}
    vocabulary: dict[str, int] = {}
    documents = 0
    entries = sorted(os.listdir(path))
    # reading the crates, then (with a model) embedding them, each told as one share of the whole
    whole = len(entries) * (2 if model is not None else 1)
    report(0, whole)
    for done, entry in enumerate(entries):
        if done % 50 == 0 and done:
            report(done, whole)
        crate_dir = path / entry
        manifest_path = crate_dir / "Cargo.toml"
        if not manifest_path.is_file():
            continue
        try:
            manifest = read_manifest(manifest_path)
        except Exception:  # a broken manifest must not break search of the rest
            continue
        package = manifest.get("package", {})
        name, version = package.get("name"), package.get("version")
        try:
            check_crate_field("name", name)
            check_crate_field("version", version)
        except RegistryError:  # no valid name or version: not a crate flakebot can offer
            continue
        assert isinstance(name, str) and isinstance(version, str)
        keywords = [k for k in package.get("keywords", []) if isinstance(k, str)]
        categories = [c for c in package.get("categories", []) if isinstance(c, str)]
        description = " ".join(str(package.get("description", "")).split())
        bins = [b for b in tool_binaries(crate_dir, manifest) if _valid_binary(b)]
        said = binary_text(crate_dir, manifest) if bins else ""
        readme_text = readme(crate_dir, package)
        depends_on.setdefault(name, set()).update(prior.dependency_names(manifest))
        cursor = db.execute(
            "INSERT INTO crates (name, version, dir, description, keywords, categories,"
            " license, homepage, repository, bins, input, key) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                name,
                version,
                entry,
                description,
                json.dumps(keywords),
                json.dumps(categories),
                str(package.get("license", "")),
                str(package.get("homepage", "")),
                str(package.get("repository", "")),
                json.dumps(bins),
                binary_input(crate_dir, manifest) if bins else "",
                ranking.name_key(name),
            ),
        )
        text = (
            f"{name} {name.replace('-', ' ').replace('_', ' ')} {ranking.name_key(name)}",
            description,
            " ".join(keywords),
            " ".join(categories),
            ranking.clean(said),
            ranking.clean(readme_text),
        )
        db.execute(
            f"INSERT INTO crates_fts (rowid, {', '.join(COLUMNS_FTS)}) VALUES (?,?,?,?,?,?,?)",
            (cursor.lastrowid, *text),
        )
        documents += 1
        embedded.append(
            (
                int(cursor.lastrowid or 0),
                *embedding.crate_texts(name, description, keywords, text[-1], said if bins else None),
            )
        )
        for word in set(ranking.tokens(" ".join(text))):
            vocabulary[word] = vocabulary.get(word, 0) + 1
    priors = prior.reverse_dependencies(depends_on)
    db.executemany(
        "UPDATE crates SET prior = ?, log_prior = ? WHERE name = ?",
        [(p, math.log1p(p), n) for n, p in priors.items()],
    )
    db.executemany("INSERT INTO words VALUES (?, ?)", vocabulary.items())
    if model is not None:
        read = len(entries)
        embedding.store_vectors(db, model, embedded, lambda d, n: report(read + d * read // max(n, 1), whole))
    db.execute("INSERT INTO meta VALUES ('signature', ?)", (signature,))
    db.execute("INSERT INTO meta VALUES ('registry', ?)", (str(path),))
    db.execute("INSERT INTO meta VALUES ('documents', ?)", (str(documents),))
    db.commit()
    report(whole, whole)


def _valid_binary(name: str) -> bool:
    try:
        check_crate_field("binary", name)
    except RegistryError:
        return False
    return True
