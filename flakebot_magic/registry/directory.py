"""A cargo ``directory`` source (Debian's registry, ``cargo vendor``) searched through SQLite FTS5.

The index lives in the cache dir, one SQLite file per registry path, and is
rebuilt when the registry changes (its entries or its mtime) and on any error
reading it (a damaged page or row: a cache is made again); in memory where it
cannot be written (a full disk), so search and cached builds still work. Searching is a
bm25-ranked FTS5 query over name, description, keywords, categories and
README text, stemmed and with synonyms expanded, times a popularity prior
(reverse-dependency counts over the registry's dependency graph) computed
when the index is built: see :mod:`.ranking` for the score.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import math
import os
import re
import secrets
import shutil
import sqlite3
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

from ..errors import ConfigError, SearchError
from ..fsutil import atomic_write
from ..storage import translate
from . import ranking
from .base import CrateCandidate, FetchedSource
from .semver import matches, newest

__all__ = ["DirectoryRegistry", "fixture_binary", "read_manifest", "tree_sha256"]

#: bump when the schema or what is indexed changes
INDEX_VERSION = 7
README_LIMIT = 16_000
#: bm25 column weights: name, description, keywords, categories, readme
_WEIGHTS = (10.0, 4.0, 5.0, 2.0, 0.5)


def read_manifest(path: Path) -> dict[str, Any]:
    """Parse a Cargo.toml into plain Python values."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)
    import tomlkit

    return tomlkit.parse(text).unwrap()


def tree_sha256(root: Path, *, exclude: tuple[str, ...] = (".git", "target")) -> str:
    """sha256 over every file's relative path and bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(_walk(root, exclude)):
        rel = path.relative_to(root).as_posix()
        digest.update(rel.encode() + b"\0")
        if path.is_symlink():
            digest.update(b"L" + os.readlink(path).encode())
        else:
            digest.update(b"F" + path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def _walk(root: Path, exclude: tuple[str, ...]) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == root:
            dirnames[:] = [d for d in dirnames if d not in exclude]
        for filename in filenames:
            yield Path(dirpath) / filename


#: words in a binary's name or path that mark a test, example or benchmark helper, never a tool
_FIXTURE_WORDS = frozenset(
    {"fixture", "fixtures", "test", "tests", "testing", "example", "examples", "bench", "benches"}
)
#: directories whose binaries are helpers of the crate's own tests
_FIXTURE_DIRS = ("tests/", "examples/", "benches/", "fixtures/", "test/")
#: features that only development needs: a binary requiring one is a helper (``criterion``: benchmarks)
_DEV_FEATURES = re.compile(r"test|bench|fixture|criterion|example|dev\b|internal|unstable", re.I)


def fixture_binary(name: str, path: str = "", required_features: tuple[str, ...] = ()) -> str:
    """Why a binary target is a test, example or benchmark helper rather than a tool ("" when it is a tool).

    Told apart by its name's words (``stdio-fixture``, ``gen_hash_test``,
    ``*-do-not-use``), its path (under ``tests/``, ``examples/``,
    ``benches/``) or features it requires that only development needs.

    Examples
    --------
    >>> fixture_binary("stdio-fixture")
    "its name says it is a test fixture ('stdio-fixture')"
    >>> fixture_binary("hexyl", "src/main.rs")
    ''
    """
    words = set(re.split(r"[-_.\s]+", name.lower()))
    if words & _FIXTURE_WORDS or "do-not-use" in name.lower():
        return f"its name says it is a test fixture ({name!r})"
    clean = path.replace("\\", "/").lstrip("./")
    if clean.startswith(_FIXTURE_DIRS) or any(f"/{d}" in clean for d in _FIXTURE_DIRS):
        return f"it lives under {clean.split('/')[0]}/ ({clean})"
    if any(_DEV_FEATURES.search(f) for f in required_features):
        return f"it needs the development-only feature(s) {', '.join(required_features)}"
    return ""


def _default_bin_path(crate_dir: Path, name: str) -> str:
    """Where cargo looks for a ``[[bin]]`` that gives no ``path``."""
    for path in (f"src/bin/{name}.rs", f"src/bin/{name}/main.rs"):
        if (crate_dir / path).is_file():
            return path
    return "src/main.rs"


def _bin_targets(crate_dir: Path, manifest: dict[str, Any]) -> list[tuple[str, str, tuple[str, ...]]]:
    """The binary targets cargo would build: name, path and required features of each."""
    package = manifest.get("package", {})
    targets: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for b in manifest.get("bin", []):
        if isinstance(b, dict) and isinstance(b.get("name"), str):
            features = b.get("required-features") or b.get("required_features") or []
            given = b.get("path")
            path = given if isinstance(given, str) else _default_bin_path(crate_dir, b["name"])
            targets.setdefault(b["name"], (b["name"], path, tuple(str(f) for f in features if isinstance(f, str))))
    if package.get("autobins", True) is not False:
        if (crate_dir / "src" / "main.rs").is_file():
            name = package.get("name", crate_dir.name)
            targets.setdefault(name, (name, "src/main.rs", ()))
        bin_dir = crate_dir / "src" / "bin"
        if bin_dir.is_dir():
            for entry in sorted(bin_dir.iterdir()):
                if entry.suffix == ".rs":
                    targets.setdefault(entry.stem, (entry.stem, f"src/bin/{entry.name}", ()))
                elif (entry / "main.rs").is_file():
                    targets.setdefault(entry.name, (entry.name, f"src/bin/{entry.name}/main.rs", ()))
    return list(targets.values())


_STDIN = re.compile(rb"\bstdin\b")
#: how much of a binary's sources the stdin scan reads
_SCAN_LIMIT = 512 * 1024


def _test_sources(crate_dir: Path) -> bytes:
    """The crate's own test code (``tests/``, ``src/**/test.rs`` and ``tests.rs``), capped."""
    paths = sorted((crate_dir / "tests").rglob("*.rs")) if (crate_dir / "tests").is_dir() else []
    paths += [p for p in sorted((crate_dir / "src").rglob("*.rs")) if p.name in ("test.rs", "tests.rs")]
    text, budget = [], _SCAN_LIMIT
    for path in paths:
        if budget <= 0 or path.is_symlink() or not path.is_file():
            continue
        try:
            with path.open("rb") as handle:
                text.append(handle.read(budget))
        except OSError:
            continue
        budget -= len(text[-1])
    return b"\n".join(text)


#: a binary this small that the crate's tests run by name is a test helper, not a tool
_HELPER_BYTES = 4096


def _helper(source: Path, name: str, tests: bytes) -> bool:
    try:
        small = source.is_file() and source.stat().st_size < _HELPER_BYTES
    except OSError:
        small = False
    return small and f'"{name}"'.encode() in tests


def _bin_names(crate_dir: Path, manifest: dict[str, Any]) -> list[str]:
    """The binary targets cargo would build for this manifest that are tools (test fixtures left out).

    Besides :func:`fixture_binary`'s signs, a library's binary that is not
    named after the crate, whose source is small and that the crate's own
    tests run by name (duct's ``cat``, ``x_to_y``) is a test helper.
    """
    package = manifest.get("package", {})
    targets = [t for t in _bin_targets(crate_dir, manifest) if not fixture_binary(*t)]
    crate = str(package.get("name", crate_dir.name))
    lib = (crate_dir / "src" / "lib.rs").is_file() or isinstance(manifest.get("lib"), dict)
    if lib and any(name != crate for name, _, _ in targets):
        tests = _test_sources(crate_dir)
        targets = [t for t in targets if t[0] == crate or not _helper(crate_dir / t[1], t[0], tests)]
    return [name for name, _, _ in targets]


def _reads_stdin(crate_dir: Path, manifest: dict[str, Any]) -> bool:
    """Whether a binary's own sources mention standard input (a tool that can be handed text).

    A static look, made when the index is built: ``src/main.rs``, ``src/bin/``
    and ``[[bin]]`` paths. A binary that reads only a file path cannot take
    the string its Python client is called with.
    """
    targets = _bin_targets(crate_dir, manifest)
    # a test fixture reading stdin says nothing about the tool
    fixtures = {crate_dir / p for n, p, f in targets if fixture_binary(n, p, f)}
    paths = [crate_dir / p for n, p, f in targets if crate_dir / p not in fixtures]
    if any(p.is_relative_to(crate_dir / "src" / "bin") for p in paths):  # their modules sit beside them
        paths += [p for p in sorted((crate_dir / "src" / "bin").rglob("*.rs")) if p not in fixtures and p not in paths]
    budget = _SCAN_LIMIT
    for path in paths:
        if budget <= 0:
            break
        try:
            if path.is_symlink() or not path.is_file():
                continue
            with path.open("rb") as handle:
                text = handle.read(budget)
        except OSError:
            continue
        budget -= len(text)
        if _STDIN.search(text):
            return True
    return False


def _readme(crate_dir: Path, package: dict[str, Any]) -> str:
    readme = package.get("readme")
    candidates = [readme] if isinstance(readme, str) else []
    candidates += ["README.md", "README", "readme.md", "README.rst", "README.txt"]
    for name in candidates:
        path = crate_dir / name
        if path.is_file():
            return path.read_text(encoding="utf-8", errors="replace")[:README_LIMIT]
    return ""


def _fts_query(query: str) -> str:
    """The FTS5 query: any of the query's stemmed terms and their synonyms."""
    return " OR ".join(f'"{term}"' for term in ranking.query_terms(query))


class DirectoryRegistry:
    """A cargo directory source: one unpacked crate per subdirectory.

    Parameters
    ----------
    path
        The directory (``/usr/share/cargo/registry``, or a ``cargo vendor`` output).
    cache_dir
        Where the search index is kept.
    """

    offline = True

    def __init__(self, path: Path | str, cache_dir: Path) -> None:
        self.path = Path(path).expanduser().resolve()
        if not self.path.is_dir():
            raise ConfigError(
                f"The registry path {self.path} does not exist or is not a directory. "
                "Give --registry a cargo directory source (e.g. the output of `cargo vendor`), "
                "or install Debian's crates with `make install`."
            )
        self.id = f"dir:{self.path}"
        key = hashlib.sha256(str(self.path).encode()).hexdigest()[:16]
        self.index_path = Path(cache_dir) / "index" / f"{key}.sqlite"
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    # -- the index ---------------------------------------------------------

    def signature(self) -> str:
        """Changes whenever a crate is added to or removed from the registry."""
        entries = sorted(os.listdir(self.path))
        digest = hashlib.sha256("\n".join(entries).encode())
        digest.update(str(self.path.stat().st_mtime_ns).encode())
        digest.update(str(INDEX_VERSION).encode())
        return digest.hexdigest()

    def _connect(self) -> sqlite3.Connection:
        with self._lock:
            if self._db is not None:
                return self._db
            self.index_path.parent.mkdir(parents=True, exist_ok=True)
            signature = self.signature()
            try:
                db = sqlite3.connect(self.index_path, check_same_thread=False)
            except sqlite3.DatabaseError:  # not even openable: an empty one stands in, made again below
                db = sqlite3.connect(":memory:", check_same_thread=False)
            try:
                row = db.execute("SELECT value FROM meta WHERE key = 'signature'").fetchone()
            except sqlite3.DatabaseError:
                row = None
            if row is None or row[0] != signature:
                db.close()
                try:
                    self._rebuild(signature)
                    db = sqlite3.connect(self.index_path, check_same_thread=False)
                except (OSError, sqlite3.Error):
                    # the cache dir cannot take the index (a full disk): this process keeps one in memory
                    with contextlib.suppress(OSError):
                        self.index_path.unlink(missing_ok=True)
                    db = sqlite3.connect(":memory:", check_same_thread=False)
                    self._fill(db, signature)
            self._db = db
            return db

    def _rows(self, sql: str, params: tuple[Any, ...] = (), *, candidates: bool = False) -> list[Any]:
        """One query's rows (``candidates``: checked as :attr:`_COLUMNS`); a damaged index is made again, once."""
        for attempt in range(2):
            db = self._connect()
            try:
                rows = db.execute(sql, params).fetchall()
                for row in rows if candidates else ():
                    _check_row(row)
                return rows
            except sqlite3.DatabaseError as exc:
                if attempt:
                    raise translate(exc, "searching the crate index", self.index_path) from exc
                with self._lock:
                    if self._db is db:  # another thread may have made it again already
                        db.close()
                        self._db = None
                        with contextlib.suppress(OSError):
                            self.index_path.unlink(missing_ok=True)
        raise AssertionError("unreachable: the loop returns or raises")

    def _rebuild(self, signature: str) -> None:
        # built beside under a fresh name, then written in one step by atomic_write (a planted symlink replaced)
        tmp = self.index_path.with_suffix(f".tmp{os.getpid()}-{secrets.token_hex(4)}")
        try:
            with closing(sqlite3.connect(tmp)) as db:
                self._fill(db, signature)
            atomic_write(self.index_path, tmp.read_bytes(), make_parents=True)
        finally:
            tmp.unlink(missing_ok=True)

    def _fill(self, db: sqlite3.Connection, signature: str) -> None:
        """Index every crate of the registry into the empty database ``db``."""
        db.executescript(
            """
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE crates (
                id INTEGER PRIMARY KEY, name TEXT, version TEXT, dir TEXT,
                description TEXT, keywords TEXT, categories TEXT, license TEXT,
                homepage TEXT, repository TEXT, bins TEXT, stdin INTEGER NOT NULL DEFAULT 0,
                key TEXT, prior REAL DEFAULT 0, log_prior REAL DEFAULT 0
            );
            CREATE INDEX crates_name ON crates(name);
            CREATE VIRTUAL TABLE crates_fts USING fts5(
                name, description, keywords, categories, readme,
                content='', tokenize='unicode61'
            );
            """
        )
        # the popularity prior: which crates each crate builds on, by name (all versions together)
        depends_on: dict[str, set[str]] = {}
        for entry in sorted(os.listdir(self.path)):
            crate_dir = self.path / entry
            manifest_path = crate_dir / "Cargo.toml"
            if not manifest_path.is_file():
                continue
            try:
                manifest = read_manifest(manifest_path)
            except Exception:  # a broken manifest must not break search of the rest
                continue
            package = manifest.get("package", {})
            name, version = package.get("name"), package.get("version")
            if not isinstance(name, str) or not isinstance(version, str):
                continue
            keywords = [k for k in package.get("keywords", []) if isinstance(k, str)]
            categories = [c for c in package.get("categories", []) if isinstance(c, str)]
            description = " ".join(str(package.get("description", "")).split())
            bins = _bin_names(crate_dir, manifest)
            depends_on.setdefault(name, set()).update(ranking.dependency_names(manifest))
            cursor = db.execute(
                "INSERT INTO crates (name, version, dir, description, keywords, categories,"
                " license, homepage, repository, bins, stdin, key) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
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
                    int(bool(bins) and _reads_stdin(crate_dir, manifest)),
                    ranking.name_key(name),
                ),
            )
            # the index holds stemmed words (ranking.analyze), the same stems the query is turned into
            db.execute(
                "INSERT INTO crates_fts (rowid, name, description, keywords, categories, readme) VALUES (?,?,?,?,?,?)",
                (
                    cursor.lastrowid,
                    ranking.analyze(name) + " " + ranking.name_key(name),
                    ranking.analyze(description),
                    ranking.analyze(" ".join(keywords)),
                    ranking.analyze(" ".join(categories)),
                    ranking.analyze(_readme(crate_dir, package)),
                ),
            )
        priors = ranking.reverse_dependencies(depends_on)
        db.executemany(
            "UPDATE crates SET prior = ?, log_prior = ? WHERE name = ?",
            [(p, math.log1p(p), n) for n, p in priors.items()],
        )
        db.execute("INSERT INTO meta VALUES ('signature', ?)", (signature,))
        db.commit()

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- the Registry interface --------------------------------------------

    def _candidate(
        self, row: tuple[Any, ...], score: float = 0.0, parts: dict[str, float] | None = None
    ) -> CrateCandidate:
        name, version, _dir, description, keywords, categories, license_, homepage, repository, bins, stdin = row
        bin_names = tuple(json.loads(bins))
        return CrateCandidate(
            name=name,
            version=version,
            description=description,
            score=score,
            has_bin=bool(bin_names),
            bin_names=bin_names,
            reads_stdin=bool(stdin),
            keywords=tuple(json.loads(keywords)),
            categories=tuple(json.loads(categories)),
            license=license_,
            homepage=homepage,
            repository=repository,
            registry=self.id,
            checksum=None,
            parts=parts or {},
        )

    _COLUMNS = "c.name, c.version, c.dir, c.description, c.keywords, c.categories, c.license, c.homepage, c.repository, c.bins, c.stdin"

    def search(self, query: str, limit: int = 10) -> list[CrateCandidate]:
        """Candidates best first; each carries its score parts (``relevance``, ``prior``,
        ``popularity``, ``name``: see :func:`.ranking.combine`)."""
        fts = _fts_query(query)
        if not fts:
            return []
        keys = sorted(ranking.name_keys(query)) or [""]
        named = f"(c.key IN ({', '.join('?' * len(keys))}))"
        # relevance x popularity x name, as ranking.combine computes it, so LIMIT keeps the right rows
        rows = self._rows(
            f"SELECT {self._COLUMNS}, -bm25(crates_fts, ?, ?, ?, ?, ?) AS relevance, c.prior, {named} AS named"
            " FROM crates_fts JOIN crates c ON c.id = crates_fts.rowid WHERE crates_fts MATCH ?"
            " ORDER BY relevance * (1 + ? * c.log_prior) * (CASE WHEN named THEN ? ELSE 1 END) DESC LIMIT ?",
            (*_WEIGHTS, *keys, fts, ranking.PRIOR_WEIGHT, ranking.NAME_BOOST, max(limit * 4, 40)),
            candidates=True,
        )
        best: dict[str, CrateCandidate] = {}
        for row in rows:
            parts = ranking.combine(row[-3], row[-2], named=bool(row[-1]))
            candidate = self._candidate(row[:-3], parts.pop("score"), parts)
            kept = best.get(candidate.name)
            if kept is None or newest([kept.version, candidate.version]) == candidate.version != kept.version:
                # the newest version, scored as the best-scoring version of the name
                better = candidate if kept is None or candidate.score >= kept.score else kept
                best[candidate.name] = _with_score(candidate, better.score, better.parts)
        return sorted(best.values(), key=lambda c: -c.score)[:limit]

    def versions(self, name: str) -> list[str]:
        """Every version of ``name`` in the registry (Debian's has one per crate)."""
        return [r[0] for r in self._rows("SELECT version FROM crates WHERE name = ?", (name,))]

    def can_satisfy(self, name: str, requirement: str) -> bool:
        return any(matches(requirement or "*", v) for v in self.versions(name))

    def recorded_checksum(self, name: str, version: str) -> str | None:
        """The checksum cargo will write into Cargo.lock for this crate (what the source records)."""
        found = self._rows("SELECT dir FROM crates WHERE name = ? AND version = ?", (name, version))
        if not found:
            return None
        row = found[0]
        try:
            value = json.loads((self.path / row[0] / ".cargo-checksum.json").read_text()).get("package")
        except (OSError, ValueError):
            return None
        return value if isinstance(value, str) else None

    def get(self, name: str, version: str | None = None) -> CrateCandidate:
        rows = self._rows(f"SELECT {self._COLUMNS} FROM crates c WHERE c.name = ?", (name,), candidates=True)
        if not rows:
            normalized = name.replace("_", "-")
            rows = self._rows(
                f"SELECT {self._COLUMNS} FROM crates c WHERE replace(c.name, '_', '-') = ?",
                (normalized,),
                candidates=True,
            )
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
        names = [r[0] for r in self._rows("SELECT DISTINCT name FROM crates ORDER BY name")]
        by_key: dict[str, str] = {}
        for known in names:
            by_key.setdefault(ranking.name_key(known), known)
        close = difflib.get_close_matches(ranking.name_key(name), list(by_key), n=3, cutoff=0.8)
        return [by_key[key] for key in close]

    def source_dir(self, candidate: CrateCandidate) -> Path:
        rows = self._rows("SELECT dir FROM crates WHERE name = ? AND version = ?", (candidate.name, candidate.version))
        if not rows:
            raise SearchError(f"{candidate.id} is not in the registry {self.path}.")
        directory: str = rows[0][0]
        return self.path / directory

    def fetch(self, candidate: CrateCandidate, dest: Path) -> FetchedSource:
        source = self.source_dir(candidate)

        def not_published(directory: str, names: list[str]) -> set[str]:
            # Debian's packaging notes and cargo's vendoring checksums sit beside the crate
            return {".cargo-checksum.json", "debian"} & set(names) if Path(directory) == source else set()

        shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True, ignore=not_published)
        recorded = _crate_checksum(source)
        if recorded:
            return FetchedSource(path=dest, checksum=recorded, checksum_kind="crate-sha256")
        return FetchedSource(
            path=dest,
            checksum=tree_sha256(dest),
            checksum_kind="tree-sha256",
            notes=("The registry records no .crate checksum; the checksum is the sha256 of the source tree.",),
        )

    def cargo_config(self) -> str:
        return (
            '[source.crates-io]\nreplace-with = "flakebot-offline"\n\n'
            f'[source.flakebot-offline]\ndirectory = "{self.path}"\n'
        )

    def cargo_config_args(self) -> list[str]:
        """The same configuration as ``--config`` arguments, so nothing is written to the workspace."""
        return [
            "--config",
            'source.crates-io.replace-with="flakebot-offline"',
            "--config",
            f'source.flakebot-offline.directory="{self.path}"',
        ]


def _check_row(row: tuple[Any, ...]) -> None:
    """Raise ``sqlite3.DatabaseError`` unless ``row`` (:attr:`DirectoryRegistry._COLUMNS` first) is what was written."""
    try:
        texts = [row[i] for i in (0, 1, 2, 3, 6, 7, 8)] + [t for i in (4, 5, 9) for t in json.loads(row[i])]
        if not all(isinstance(text, str) for text in texts):
            raise TypeError("a field of the wrong type")
    except (TypeError, ValueError) as exc:
        raise sqlite3.DatabaseError(f"a damaged crate row {row[:2]!r}: {exc}") from exc


def _with_score(candidate: CrateCandidate, score: float, parts: dict[str, float]) -> CrateCandidate:
    from dataclasses import replace

    return replace(candidate, score=score, parts=parts)


def _crate_checksum(source: Path) -> str | None:
    """The ``.crate`` sha256 that ``cargo vendor`` records; Debian's registry has none."""
    try:
        data = json.loads((source / ".cargo-checksum.json").read_text())
    except (OSError, ValueError):
        return None
    package = data.get("package")
    if isinstance(package, str) and re.fullmatch(r"[0-9a-f]{64}", package) and package != _PLACEHOLDER:
        return package
    return None


#: Debian marks some crates with the sha256 of "0" instead of a real checksum
_PLACEHOLDER = hashlib.sha256(b"0").hexdigest()
