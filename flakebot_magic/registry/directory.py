"""A cargo ``directory`` source (Debian's registry, ``cargo vendor``) searched through SQLite FTS5.

The index is built once per machine and registry and shared by every cache dir
(:mod:`.shared_index` says where it lives and how two builders meet), and is
rebuilt when the registry changes (its entries or its mtime) and on any error
reading it (a damaged page or row: a cache is made again); in memory where it
cannot be written (a full disk), so search and cached builds still work. It holds, per
crate, its name, description, keywords, categories, what its binaries say
they do (:func:`.crate_files.binary_text`) and its README, stemmed by FTS5's
``porter`` tokenizer; what its binaries read (:func:`.crate_files.binary_input`);
a popularity prior (reverse-dependency counts over the registry's dependency
graph); and the registry's vocabulary (in how many crates each word appears),
which corrects a query's typos and joins its split words. Searching is a
bm25-ranked FTS5 query over the query's concepts, times the prior and the
share of the request each crate covers: see :mod:`.ranking` for the score.

With a sentence-embedding model (:mod:`.embedding`), the index also holds
each crate's meaning (the mean of the embeddings of three views of it:
:func:`.embedding.crate_texts`) and, for a crate with a tool binary, the embedding of what that
binary says of itself; the model's identity is part of the index's
signature, so a new model rebuilds it. A search then embeds the request,
adds the crates closest in meaning to those found by words, and fuses both
scores (:func:`.ranking.fuse`). Without a model (or with
``$FLAKEBOT_EMBEDDING_MODEL=off``) search is lexical, as before, and
:attr:`DirectoryRegistry.semantic_off` says why.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import sqlite3
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

from ..errors import ConfigError, RegistryError, SearchError
from ..host.fsutil import load_json, read_inside
from ..host.storage import ran_out_of_space, translate
from ..host.trees import copy_tree
from . import embedding, examples, prior, ranking
from .base import MAX_SOURCE_BYTES, MAX_SOURCE_FILES, CrateCandidate, FetchedSource
from .crate_files import fixture_binary, read_manifest
from .index_fill import COLUMNS_FTS, fill_index
from .semver import matches, newest
from .shared_index import SYSTEM_INDEX_DIR, Progress, SharedIndex, index_name, index_places
from .vendored import checked_source, tree_sha256

__all__ = ["DirectoryRegistry", "fixture_binary", "read_manifest", "tree_sha256"]

#: bump when the schema or what is indexed changes
INDEX_VERSION = 11
#: the index's text columns, their bm25 weights, and which hold what a crate says of itself
_COLUMNS_FTS = COLUMNS_FTS
_WEIGHTS = (10.0, 4.0, 5.0, 2.0, 2.0, 0.5)
_OWN = (1.0, 1.0, 1.0, 0.0, 1.0, 0.0)
#: how many rows bm25 hands to the coverage step, at least
_POOL = 80


_P = ParamSpec("_P")
_T = TypeVar("_T")


def _remade_when_damaged(
    read: Callable[Concatenate[DirectoryRegistry, _P], _T],
) -> Callable[Concatenate[DirectoryRegistry, _P], _T]:
    """A read of the index that meets damage (a bad page, a row that does not decode) makes it again, reads again."""

    def again(self: DirectoryRegistry, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return read(self, *args, **kwargs)
        except (sqlite3.DatabaseError, ValueError, TypeError):
            self._discard()
        try:
            return read(self, *args, **kwargs)
        except sqlite3.DatabaseError as exc:
            raise translate(exc, "searching the crate index", self.index_path) from exc

    functools.update_wrapper(again, read)
    return again


class DirectoryRegistry:
    """A cargo directory source: one unpacked crate per subdirectory.

    Parameters
    ----------
    path
        The directory (``/usr/share/cargo/registry``, or a ``cargo vendor`` output).
    cache_dir
        The cache dir: its ``index/`` is the last place the search index is
        looked for and kept (:func:`.shared_index.index_places`).
    embedding_model
        The ``embedding_model`` setting (:func:`semantic_model`): a model
        directory, ``off``, or None for the installed model if any.
    places
        Where the index is looked for, in order (default: the machine's, the
        user's, the cache dir's own); ``system`` is the machine's place, which
        only ``flakebot index --system`` writes.
    """

    offline = True

    def __init__(
        self,
        path: Path | str,
        cache_dir: Path,
        *,
        embedding_model: str | None = None,
        places: Sequence[Path] | None = None,
        system: Path | None = SYSTEM_INDEX_DIR,
    ) -> None:
        self.path = Path(path).expanduser().resolve()
        if not self.path.is_dir():
            raise ConfigError(
                f"The registry path {self.path} does not exist or is not a directory. "
                "Give --registry a cargo directory source (e.g. the output of `cargo vendor`), "
                "or install Debian's crates with `make install`."
            )
        self.id = f"dir:{self.path}"
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._model, self.semantic_off = embedding.semantic_model(embedding_model)
        self._vectors: embedding.CrateVectors | None = None
        name = index_name(self.path, self._model.identity if self._model else "-", INDEX_VERSION)
        found = list(places) if places is not None else index_places(Path(cache_dir), system=system)
        self.index = SharedIndex(found, name, system=system)

    @property
    def index_path(self) -> Path:
        """The index file in use (once searched), or where a build would write it."""
        return self.index.path

    # -- the index ---------------------------------------------------------

    def signature(self) -> str:
        """Changes whenever a crate is added to or removed from the registry."""
        entries = sorted(os.listdir(self.path))
        digest = hashlib.sha256(os.fsencode("\n".join(entries)))  # names as bytes: UTF-8 or not
        digest.update(str(self.path.stat().st_mtime_ns).encode())
        digest.update(str(INDEX_VERSION).encode())
        digest.update(f"model:{self._model.identity if self._model else '-'}".encode())
        return digest.hexdigest()

    def _connect(self, progress: Progress | None = None) -> sqlite3.Connection:
        with self._lock:
            if self._db is None:
                signature = self.signature()
                self._db = self.index.connect(signature, lambda db, report: self._fill(db, signature, report), progress)
            return self._db

    def index_ready(self) -> bool:
        """Whether an index of this registry is built already (in any place): a search starts at once."""
        with self._lock:
            if self._db is None:
                self._db = self.index.find(self.signature())
            return self._db is not None

    def prepare_index(self, progress: Progress | None = None) -> None:
        """Open the index, building it when no place has it: ``progress`` is told ``(done, total)`` as it goes."""
        self._connect(progress)

    def build_index(self, place: Path, progress: Progress | None = None) -> Path:
        """Build the index into ``place`` whatever is there (``flakebot index``); its path."""
        signature = self.signature()
        with self._lock:
            if self._db is not None:
                self._db.close()
            self._db = self.index.build(
                signature, lambda db, report: self._fill(db, signature, report), progress, place=place
            )
            self._vectors = None
        return self.index.path

    def _discard(self) -> None:
        """Close the index and set it aside (removed when it is this user's): the next read makes it again."""
        self._vectors = None
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self.index.discard()

    def _fill(self, db: sqlite3.Connection, signature: str, report: Progress) -> None:
        fill_index(db, self.path, self._model, signature, report)

    def _load_vectors(self) -> embedding.CrateVectors:
        if self._vectors is None:
            self._vectors = embedding.load_vectors(self._connect())
        return self._vectors

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- the Registry interface --------------------------------------------

    def _candidate(
        self, row: tuple[Any, ...], score: float = 0.0, parts: dict[str, float] | None = None
    ) -> CrateCandidate:
        name, version, _dir, description, keywords, categories, license_, homepage, repository, bins, reads = row
        bin_names = tuple(load_json(bins))
        return CrateCandidate(
            name=name,
            version=version,
            description=description,
            score=score,
            has_bin=bool(bin_names),
            bin_names=bin_names,
            reads_stdin=reads == "stdin",
            reads=reads,
            keywords=tuple(load_json(keywords)),
            categories=tuple(load_json(categories)),
            license=license_,
            homepage=homepage,
            repository=repository,
            registry=self.id,
            checksum=None,
            parts=parts or {},
        )

    _COLUMNS = "c.name, c.version, c.dir, c.description, c.keywords, c.categories, c.license, c.homepage, c.repository, c.bins, c.input"

    @_remade_when_damaged
    def frequencies(self, words: Collection[str]) -> dict[str, int]:
        """In how many crates' text each of ``words`` appears (words it never saw left out)."""
        db, wanted = self._connect(), list(words)
        found: dict[str, int] = {}
        for start in range(0, len(wanted), 30_000):  # SQLite's limit on bound parameters
            chunk = wanted[start : start + 30_000]
            marks = ", ".join("?" * len(chunk))
            found.update(db.execute(f"SELECT word, df FROM words WHERE word IN ({marks})", chunk).fetchall())
        return found

    @_remade_when_damaged
    def matches(self, words: Collection[str]) -> dict[str, int]:
        """In how many crates each of ``words`` matches, stemmed as the index stems it."""
        db = self._connect()
        return {
            word: db.execute("SELECT count(*) FROM crates_fts WHERE crates_fts MATCH ?", (f'"{word}"',)).fetchone()[0]
            for word in words
            if ranking.tokens(word) == [word]
        }

    @_remade_when_damaged
    def search(self, query: str, limit: int = 10) -> list[CrateCandidate]:
        """Candidates best first; each carries its score parts (``relevance``, ``prior``,
        ``popularity``, ``name``, ``coverage``, ``evidence``: see :func:`.ranking.combine`; with
        semantic search also ``lexical``, ``words``, ``similarity``, ``meaning`` and, for a crate with
        a tool binary, ``own_similarity``: see :func:`.ranking.fuse`)."""
        db = self._connect()
        found = ranking.concepts(query, self.frequencies, self.matches)
        if not found:  # no word at all: nothing to mean either
            return []
        # embedding the request on a worker thread while its words were ranked was slower than this (both
        # need the interpreter, and the machine's two cores)
        # the names of the examples it shows too ("myVariableName": camel case): the model reads them better
        searched = examples.with_names(query)
        meaning = embedding.encoder_for(self._model).encode([searched])[0] if self._model is not None else None
        rows = self._lexical_rows(db, query, found, limit)
        similarity: dict[int, float] = {}
        own: dict[int, float] = {}
        vectors = self._load_vectors() if meaning is not None else None
        if vectors is None or not vectors.ids:  # no model, or an empty registry: words only
            meaning = None
        if meaning is not None and vectors is not None:
            ids, matrix = vectors.ids, vectors.matrix
            cosines = matrix @ meaning
            similarity = dict(zip(ids, cosines.tolist(), strict=True))
            own = dict(zip(vectors.own_ids, (vectors.own_matrix @ meaning).tolist(), strict=True))
            known = {r[0] for r in rows}
            mean, best_similarity = float(cosines.mean()), float(cosines.max())
            floor = mean + ranking.SEMANTIC_FLOOR * (best_similarity - mean)
            closest = [
                ids[i]
                for i in cosines.argsort()[::-1][: ranking.SEMANTIC_POOL]
                if ids[i] not in known and cosines[i] > max(floor, ranking.SEMANTIC_MIN_SIMILARITY)
            ]
            rows += self._rows_by_id(db, query, found, closest)
        if not rows:
            return []
        matched = ranking.match_concepts(db, "crates_fts", found, [r[0] for r in rows], _OWN)
        documents = self._documents()
        scored = []
        for row in rows:
            anywhere, mine = matched[row[0]]
            parts = ranking.combine(
                row[-3],
                row[-2],
                named=bool(row[-1]),
                covered=ranking.coverage(anywhere, found, documents),
                evidence=ranking.coverage(mine, found, documents, ranking.EVIDENCE_POWER),
            )
            scored.append((row, parts))
        if meaning is not None:
            best_lexical = max(parts["score"] for _, parts in scored)
            for row, parts in scored:
                lexical = parts["score"]
                fused, words, closeness = ranking.fuse(lexical, best_lexical, similarity[row[0]], mean, best_similarity)
                parts.update(
                    score=fused, lexical=lexical, words=words, similarity=similarity[row[0]], meaning=closeness
                )
                if row[0] in own:
                    parts["own_similarity"] = own[row[0]]
        # per name: the newest version's row, scored as the best-scoring version of the name
        best: dict[str, tuple[tuple[Any, ...], dict[str, float]]] = {}
        for row, parts in scored:
            name, version = row[1], row[2]
            kept = best.get(name)
            if kept is None:
                best[name] = (row, parts)
                continue
            chosen = parts if parts["score"] > kept[1]["score"] else kept[1]
            newer = newest([kept[0][2], version]) == version != kept[0][2]
            best[name] = (row if newer else kept[0], chosen)
        ranked = sorted(best.values(), key=lambda kept: -kept[1]["score"])[:limit]
        return [self._candidate(row[1:-3], parts.pop("score"), parts) for row, parts in ranked]

    def _lexical_rows(
        self, db: sqlite3.Connection, query: str, found: list[ranking.Concept], limit: int
    ) -> list[tuple[Any, ...]]:
        """The best rows by words: relevance x popularity x name first (as :func:`.ranking.combine`
        computes them); coverage is computed on these."""
        keys = sorted(ranking.name_keys(query, found)) or [""]
        named = f"(c.key IN ({', '.join('?' * len(keys))}))"
        weights = ", ".join("?" * len(_WEIGHTS))
        rows: list[tuple[Any, ...]] = db.execute(
            f"SELECT c.id, {self._COLUMNS}, -bm25(crates_fts, {weights}) AS relevance, c.prior, {named} AS named"
            " FROM crates_fts JOIN crates c ON c.id = crates_fts.rowid WHERE crates_fts MATCH ?"
            " ORDER BY relevance * (1 + ? * c.log_prior) * (CASE WHEN named THEN ? ELSE 1 END) DESC LIMIT ?",
            (
                *_WEIGHTS,
                *keys,
                ranking.match_expression(found),
                prior.PRIOR_WEIGHT,
                ranking.NAME_BOOST,
                max(limit * 3, _POOL),
            ),
        ).fetchall()
        return rows

    def _rows_by_id(
        self, db: sqlite3.Connection, query: str, found: list[ranking.Concept], ids: list[int]
    ) -> list[tuple[Any, ...]]:
        """Rows shaped as :meth:`_lexical_rows`' for crates found by meaning: no bm25 relevance (words
        that ranked them below the lexical pool count for nothing), their prior and name match."""
        if not ids:
            return []
        keys = sorted(ranking.name_keys(query, found)) or [""]
        marks = ", ".join("?" * len(keys))
        rows: list[tuple[Any, ...]] = db.execute(
            f"SELECT c.id, {self._COLUMNS}, 0.0, c.prior, (c.key IN ({marks})) FROM crates c"
            f" WHERE c.id IN ({', '.join(str(int(i)) for i in ids)})",
            keys,
        ).fetchall()
        return rows

    def _documents(self) -> int:
        row = self._connect().execute("SELECT value FROM meta WHERE key = 'documents'").fetchone()
        return int(row[0]) if row else 0

    @_remade_when_damaged
    def binaries(self) -> list[CrateCandidate]:
        """Every crate that ships a binary (test fixtures are never indexed as binaries), by name; its newest
        version."""
        rows = self._connect().execute(f"SELECT {self._COLUMNS} FROM crates c WHERE c.bins != '[]'").fetchall()
        newest_of: dict[str, tuple[Any, ...]] = {}
        for row in rows:
            kept = newest_of.get(row[0])
            if kept is None or newest([kept[1], row[1]]) == row[1] != kept[1]:
                newest_of[row[0]] = row
        return [self._candidate(newest_of[name]) for name in sorted(newest_of)]

    @_remade_when_damaged
    def versions(self, name: str) -> list[str]:
        """Every version of ``name`` in the registry (Debian's has one per crate)."""
        db = self._connect()
        return [r[0] for r in db.execute("SELECT version FROM crates WHERE name = ?", (name,))]

    def can_satisfy(self, name: str, requirement: str) -> bool:
        return any(matches(requirement or "*", v) for v in self.versions(name))

    @_remade_when_damaged
    def recorded_checksum(self, name: str, version: str) -> str | None:
        """The checksum cargo will write into Cargo.lock for this crate (what the source records)."""
        row = (
            self._connect().execute("SELECT dir FROM crates WHERE name = ? AND version = ?", (name, version)).fetchone()
        )
        if row is None:
            return None
        try:
            recorded = load_json(read_inside(self.path / row[0], ".cargo-checksum.json", 16 * 1024 * 1024)[0])
        except (OSError, ValueError):
            return None
        value = recorded.get("package") if isinstance(recorded, dict) else None
        return value if isinstance(value, str) else None

    @_remade_when_damaged
    def get(self, name: str, version: str | None = None) -> CrateCandidate:
        db = self._connect()
        rows = db.execute(f"SELECT {self._COLUMNS} FROM crates c WHERE c.name = ?", (name,)).fetchall()
        if not rows:
            normalized = name.replace("_", "-")
            rows = db.execute(
                f"SELECT {self._COLUMNS} FROM crates c WHERE replace(c.name, '_', '-') = ?", (normalized,)
            ).fetchall()
        if not rows:
            similar = self._close_names(name)
            hint = f" Did you mean {' or '.join(similar)}?" if similar else ""
            raise SearchError(
                f"There is no crate named {name!r} in the registry {self.path}.{hint} "
                "Check the spelling, or install it (Debian: `apt-get install librust-<name>-dev`).",
            )
        by_version = {row[1]: row for row in rows}
        if version is None:
            return self._candidate(by_version[newest(list(by_version))])
        if version not in by_version:
            raise SearchError(
                f"The registry has {name} at {', '.join(sorted(by_version))}, not {version}.",
            )
        return self._candidate(by_version[version])

    def _close_names(self, name: str) -> list[str]:
        """Crate names a few edits away from ``name`` (a typo), closest first; none when nothing is close."""
        names = [r[0] for r in self._connect().execute("SELECT DISTINCT name FROM crates ORDER BY name")]
        by_key: dict[str, str] = {}
        for known in names:
            by_key.setdefault(ranking.name_key(known), known)
        close = difflib.get_close_matches(ranking.name_key(name), list(by_key), n=3, cutoff=0.8)
        return [by_key[key] for key in close]

    @_remade_when_damaged
    def source_dir(self, candidate: CrateCandidate) -> Path:
        db = self._connect()
        row = db.execute(
            "SELECT dir FROM crates WHERE name = ? AND version = ?", (candidate.name, candidate.version)
        ).fetchone()
        if row is None:
            raise SearchError(f"{candidate.id} is not in the registry {self.path}.")
        directory: str = row[0]
        return self.path / directory

    def fetch(self, candidate: CrateCandidate, dest: Path) -> FetchedSource:
        """Copy the crate's directory into ``dest``: regular files (capped), directories and symlinks as links.

        A FIFO, a device or a socket is left out (the fork's import names what
        it never takes); the copy stops with a RegistryError past
        :data:`~.base.MAX_SOURCE_BYTES` or :data:`~.base.MAX_SOURCE_FILES`.
        ``.cargo-checksum.json`` is checked, never trusted (:func:`_checked_source`).
        """
        source = self.source_dir(candidate)
        if source.is_symlink():  # the registry's own entry links to the crate (an overlay): followed this once
            source = Path(os.path.realpath(source))
        # Debian's packaging notes and cargo's vendoring checksums sit beside the crate
        beside = {".cargo-checksum.json", "debian"}
        try:
            # an explicit stack, no symlink followed (kept as links), no FIFO read, capped: a crate of any shape
            copy_tree(
                source,
                dest,
                links=True,
                skip=lambda rel: rel in beside,
                max_bytes=MAX_SOURCE_BYTES,
                max_files=MAX_SOURCE_FILES,
            )
        except OSError as exc:
            if ran_out_of_space(exc, dest):  # this disk's, never the crate's
                raise translate(exc, f"copying {candidate.id} into its workspace", dest) from exc
            raise RegistryError(
                f"{candidate.id} in {self.path} could not be copied as plain files: {str(exc)[:300]}. It holds "
                f"special files, or more than a crate may ({MAX_SOURCE_BYTES:,} bytes, {MAX_SOURCE_FILES:,} files); "
                "choose another crate."
            ) from exc
        return checked_source(source, dest)

    def cargo_config(self) -> str:
        return (
            '[source.crates-io]\nreplace-with = "flakebot-offline"\n\n'
            f'[source.flakebot-offline]\ndirectory = "{self.path}"\n'
        )
