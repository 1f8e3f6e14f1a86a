"""A TEST DOUBLE of crates.io: its API, sparse index and downloads over real HTTP on 127.0.0.1.

It is not crates.io. It serves an in-memory set of :class:`FakeCrate` s with
the same URL layout and JSON shapes as the real service, labels every answer
``Server: fake-crates.io (test double)``, records every request, and can be
told to misbehave (429 with ``Retry-After``, 5xx, dropped connections,
corrupted downloads) so the client's politeness and verification can be tested
without a network.
"""

from __future__ import annotations

import email.utils
import gzip
import hashlib
import io
import json
import re
import tarfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

__all__ = ["SERVER_HEADER", "FakeCrate", "FakeCratesIo", "RecordedRequest", "build_crate"]

#: the ``Server`` header on every answer, so nobody mistakes it for the real thing
SERVER_HEADER = "fake-crates.io (test double)"
_DATE = "2024-01-01T00:00:00.000000+00:00"


@dataclass
class FakeCrate:
    """One version of one crate served by :class:`FakeCratesIo`.

    Several ``FakeCrate`` s with the same ``name`` are versions of one crate.

    Parameters
    ----------
    files
        Relative path -> text content, packed under ``{name}-{version}/``. A
        minimal ``Cargo.toml`` (and ``src/main.rs`` or ``src/lib.rs``) is added
        when missing.
    archive
        Exact ``.crate`` bytes to serve instead of building one from ``files``
        (for malformed or hostile archives); the index checksum matches it.
    """

    name: str
    version: str
    description: str = ""
    keywords: Sequence[str] = ()
    categories: Sequence[str] = ()
    bin_names: Sequence[str] = ()
    files: dict[str, str] = field(default_factory=dict)
    license: str = "MIT"
    homepage: str = ""
    repository: str = ""
    yanked: bool = False
    archive: bytes | None = None

    def crate_bytes(self) -> bytes:
        """The ``.crate`` archive served for this version."""
        if self.archive is not None:
            return self.archive
        return build_crate(self.name, self.version, self._all_files())

    def _all_files(self) -> dict[str, str]:
        files = dict(self.files)
        if "Cargo.toml" not in files:
            lines = [
                "[package]",
                f'name = "{self.name}"',
                f'version = "{self.version}"',
                'edition = "2021"',
                f"description = {json.dumps(self.description)}",
                f'license = "{self.license}"',
            ]
            for bin_name in self.bin_names:
                if bin_name != self.name:
                    lines += ["", "[[bin]]", f'name = "{bin_name}"', f'path = "src/bin/{bin_name}.rs"']
            files["Cargo.toml"] = "\n".join(lines) + "\n"
            for bin_name in self.bin_names:
                path = "src/main.rs" if bin_name == self.name else f"src/bin/{bin_name}.rs"
                files.setdefault(path, f'fn main() {{\n    println!("{bin_name}");\n}}\n')
            if not self.bin_names:
                files.setdefault("src/lib.rs", 'pub fn hello() -> &\'static str {\n    "hello"\n}\n')
        return files


def build_crate(name: str, version: str, files: Mapping[str, str]) -> bytes:
    """A deterministic ``.crate`` (gzip'd tar) with ``files`` under ``{name}-{version}/``."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in sorted(files):
                data = files[path].encode()
                info = tarfile.TarInfo(f"{name}-{version}/{path}")
                info.size = len(data)
                info.mode = 0o644
                info.mtime = 0
                tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake saw it; ``time`` is ``time.monotonic()`` on arrival."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    time: float


@dataclass
class _Fault:
    kind: str  # "status" or "drop"
    status: int = 0
    retry_after: str | None = None
    retry_after_date: float | None = None


def _semver_key(version: str) -> tuple[Any, ...]:
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?", version)
    if match is None:
        return (-1, -1, -1, 0, ())
    major, minor, patch, pre = match.groups()
    if pre is None:
        return (int(major), int(minor), int(patch), 1, ())
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (int(major), int(minor), int(patch), 0, parts)


def _index_path(name: str) -> str:
    lower = name.lower()
    if len(lower) <= 2:
        return f"{len(lower)}/{lower}"
    if len(lower) == 3:
        return f"3/{lower[0]}/{lower}"
    return f"{lower[:2]}/{lower[2:4]}/{lower}"


class FakeCratesIo:
    """A TEST DOUBLE of crates.io on 127.0.0.1, serving ``crates`` from memory.

    Endpoints (same shapes as crates.io's)::

        GET /api/v1/crates?q=&per_page=&page=      search
        GET /api/v1/crates/{name}                  crate, its versions, keywords, categories
        GET /api/v1/crates/{name}/{version}        one version (bin_names, license, checksum)
        GET /api/v1/crates/{name}/{version}/download   302 to /static/crates/...
        GET /static/crates/{name}/{name}-{version}.crate
        GET /index/config.json, /index/{prefix}/{name}   sparse index

    Examples
    --------
    >>> with FakeCratesIo([FakeCrate("hello", "1.0.0", bin_names=["hello"])]) as fake:
    ...     fake.url.startswith("http://127.0.0.1:")
    True
    """

    def __init__(self, crates: Sequence[FakeCrate] = ()) -> None:
        self.crates: list[FakeCrate] = list(crates)
        self.requests: list[RecordedRequest] = []
        self._faults: list[_Fault] = []
        self._corrupt: set[tuple[str, str]] = set()
        self._corrupt_all = False
        self._lock = threading.Lock()
        self._archives: dict[tuple[str, str], bytes] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> str:
        """Start serving on a free port of 127.0.0.1; returns the base URL."""
        if self._server is not None:
            return self.url
        fake = self

        class Handler(_Handler):
            owner = fake

        server = _Server(("127.0.0.1", 0), Handler)
        self._server = server
        self.url = f"http://127.0.0.1:{server.server_address[1]}"
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-crates.io",
            daemon=True,
        )
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and release the port."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeCratesIo:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def index_url(self) -> str:
        """Base URL of the sparse index."""
        return f"{self.url}/index"

    # -- fault injection -----------------------------------------------------

    def respond_429(self, count: int = 1, *, retry_after: float | None = 1, http_date: bool = False) -> None:
        """Answer the next ``count`` requests 429, with ``Retry-After`` in seconds
        (or as an HTTP date that many seconds after the answer's ``Date``)."""
        for _ in range(count):
            if retry_after is None:
                self._add_fault(_Fault("status", 429))
            elif http_date:
                self._add_fault(_Fault("status", 429, retry_after_date=float(retry_after)))
            else:
                self._add_fault(_Fault("status", 429, retry_after=f"{retry_after:g}"))

    def respond_status(self, status: int = 503, count: int = 1) -> None:
        """Answer the next ``count`` requests with ``status`` (e.g. 500, 503)."""
        for _ in range(count):
            self._add_fault(_Fault("status", status))

    def respond_503(self, count: int = 1) -> None:
        """Answer the next ``count`` requests 503 Service Unavailable."""
        self.respond_status(503, count)

    def drop_connections(self, count: int = 1) -> None:
        """Close the connection without answering the next ``count`` requests."""
        for _ in range(count):
            self._add_fault(_Fault("drop"))

    def corrupt_download(self, name: str | None = None, version: str | None = None) -> None:
        """Serve a corrupted ``.crate`` (so its checksum mismatches the index):
        for ``name``@``version``, or for every crate when no name is given."""
        with self._lock:
            if name is None:
                self._corrupt_all = True
            else:
                self._corrupt.add((name, version or ""))

    def clear_faults(self) -> None:
        """Forget pending faults and corruptions; behave like crates.io again."""
        with self._lock:
            self._faults.clear()
            self._corrupt.clear()
            self._corrupt_all = False

    def _add_fault(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _next_fault(self) -> _Fault | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    def _is_corrupt(self, name: str, version: str) -> bool:
        with self._lock:
            return self._corrupt_all or (name, version) in self._corrupt or (name, "") in self._corrupt

    # -- data ----------------------------------------------------------------

    def archive(self, name: str, version: str) -> bytes:
        """The exact ``.crate`` bytes served for ``name``@``version``."""
        key = (name, version)
        with self._lock:
            if key not in self._archives:
                crate = self._find(name, version)
                if crate is None:
                    raise KeyError(f"{name}@{version}")
                self._archives[key] = crate.crate_bytes()
            return self._archives[key]

    def checksum(self, name: str, version: str) -> str:
        """sha256 of the ``.crate`` served for ``name``@``version``, as the index lists it."""
        return hashlib.sha256(self.archive(name, version)).hexdigest()

    def _versions(self, name: str) -> list[FakeCrate]:
        # crates.io treats names case- and -/_-insensitively
        wanted = name.lower().replace("_", "-")
        found = [c for c in self.crates if c.name.lower().replace("_", "-") == wanted]
        return sorted(found, key=lambda c: _semver_key(c.version), reverse=True)

    def _find(self, name: str, version: str) -> FakeCrate | None:
        for crate in self._versions(name):
            if crate.version == version:
                return crate
        return None

    def _names(self) -> list[str]:
        seen: dict[str, None] = {}
        for crate in self.crates:
            seen.setdefault(crate.name, None)
        return list(seen)

    def _summary(self, name: str) -> dict[str, Any]:
        versions = self._versions(name)
        live = [c for c in versions if not c.yanked]
        stable = [c for c in live if _semver_key(c.version)[3] == 1]
        newest = (stable or live or versions)[0]
        return {
            "id": newest.name,
            "name": newest.name,
            "description": newest.description,
            "homepage": newest.homepage or None,
            "documentation": None,
            "repository": newest.repository or None,
            "max_version": live[0].version if live else "0.0.0",
            "max_stable_version": stable[0].version if stable else None,
            "newest_version": versions[0].version,
            "num_versions": len(versions),
            "downloads": 0,
            "recent_downloads": 0,
            "created_at": _DATE,
            "updated_at": _DATE,
            "exact_match": False,
            # crates.io's search listing leaves these null; the crate page fills them
            "keywords": None,
            "categories": None,
            "versions": None,
            "badges": [],
            "links": {"versions": f"/api/v1/crates/{newest.name}/versions"},
        }

    def _version_json(self, crate: FakeCrate) -> dict[str, Any]:
        return {
            "id": abs(hash((crate.name, crate.version))) % 10**6,
            "crate": crate.name,
            "num": crate.version,
            "dl_path": f"/api/v1/crates/{crate.name}/{crate.version}/download",
            "yanked": crate.yanked,
            "license": crate.license,
            "bin_names": list(crate.bin_names),
            "has_lib": not crate.bin_names,
            "checksum": self.checksum(crate.name, crate.version),
            "crate_size": len(self.archive(crate.name, crate.version)),
            "created_at": _DATE,
            "updated_at": _DATE,
            "downloads": 0,
            "features": {},
            "links": {},
        }

    def _search(self, query: str) -> list[str]:
        terms = [t for t in re.split(r"\s+", query.lower()) if t]
        scored: list[tuple[int, str]] = []
        for name in self._names():
            newest = self._versions(name)[0]
            lname = name.lower()
            score = 0
            for term in terms:
                if lname == term:
                    score += 10
                elif term in lname:
                    score += 3
                if any(term == k.lower() for k in newest.keywords):
                    score += 2
                if term in newest.description.lower():
                    score += 1
            if score:
                scored.append((score, name))
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [name for _, name in scored]

    def _index_lines(self, name: str) -> str:
        lines = []
        for crate in reversed(self._versions(name)):
            lines.append(
                json.dumps(
                    {
                        "name": crate.name,
                        "vers": crate.version,
                        "deps": [],
                        "cksum": self.checksum(crate.name, crate.version),
                        "features": {},
                        "yanked": crate.yanked,
                        "links": None,
                        "v": 2,
                    }
                )
            )
        return "\n".join(lines) + "\n"

    def _record(self, handler: BaseHTTPRequestHandler, arrived: float) -> None:
        parts = urlsplit(handler.path)
        with self._lock:
            self.requests.append(
                RecordedRequest(
                    method=handler.command,
                    path=parts.path,
                    query=parse_qs(parts.query),
                    headers={k.lower(): v for k, v in handler.headers.items()},
                    time=arrived,
                )
            )


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks up the host's FQDN, which can stall on DNS
        TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Handler(BaseHTTPRequestHandler):
    owner: FakeCratesIo
    protocol_version = "HTTP/1.1"
    server_version = SERVER_HEADER
    sys_version = ""
    timeout = 10  # idle keep-alive connections give up instead of hanging
    disable_nagle_algorithm = True  # headers and body go out in two writes

    def version_string(self) -> str:
        return SERVER_HEADER

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read self.owner.requests instead

    def do_GET(self) -> None:
        arrived = time.monotonic()
        self.owner._record(self, arrived)
        fault = self.owner._next_fault()
        if fault is not None:
            self._fault(fault)
            return
        parts = urlsplit(self.path)
        try:
            self._route(parts.path, parse_qs(parts.query))
        except Exception as exc:  # a bug in the fake must show, not hang the client
            self._json(500, {"errors": [{"detail": f"fake-crates.io bug: {exc!r}"}]})

    def _route(self, path: str, query: dict[str, list[str]]) -> None:
        owner = self.owner
        segments = [s for s in path.split("/") if s]
        if segments[:3] == ["api", "v1", "crates"]:
            rest = segments[3:]
            if not rest:
                return self._search(query)
            name = rest[0]
            versions = owner._versions(name)
            if not versions:
                return self._not_found(f"crate `{name}` does not exist")
            if len(rest) == 1:
                return self._crate(versions)
            crate = owner._find(name, rest[1])
            if crate is None:
                return self._not_found(f"crate `{name}` does not have a version `{rest[1]}`")
            if len(rest) == 2:
                return self._json(200, {"version": owner._version_json(crate)})
            if len(rest) == 3 and rest[2] == "download":
                location = f"/static/crates/{quote(crate.name)}/{quote(crate.name)}-{quote(crate.version)}.crate"
                return self._send(302, b"", "text/plain", extra={"Location": location})
        elif segments[:2] == ["static", "crates"] and len(segments) == 4:
            name, file = segments[2], segments[3]
            for crate in owner._versions(name):
                if file == f"{crate.name}-{crate.version}.crate":
                    data = owner.archive(crate.name, crate.version)
                    if owner._is_corrupt(crate.name, crate.version):
                        data = data[:-1] + bytes([data[-1] ^ 0xFF])
                    return self._send(200, data, "application/gzip")
        elif segments[:1] == ["index"]:
            if segments[1:] == ["config.json"]:
                return self._json(200, {"dl": f"{owner.url}/api/v1/crates", "api": owner.url})
            if len(segments) >= 3:
                name = segments[-1]
                versions = owner._versions(name)
                if versions and "/".join(segments[1:]) == _index_path(name):
                    return self._send(200, owner._index_lines(name).encode(), "text/plain")
            return self._send(404, b"not found\n", "text/plain")
        return self._not_found("Not Found")

    def _search(self, query: dict[str, list[str]]) -> None:
        q = (query.get("q") or [""])[0]
        per_page = max(1, min(100, int((query.get("per_page") or ["10"])[0])))
        page = max(1, int((query.get("page") or ["1"])[0]))
        names = self.owner._search(q)
        chosen = names[(page - 1) * per_page : page * per_page]
        crates = [self.owner._summary(n) for n in chosen]
        for item in crates:
            item["exact_match"] = item["name"].lower() == q.strip().lower()
        more = page * per_page < len(names)
        self._json(
            200,
            {
                "crates": crates,
                "meta": {
                    "total": len(names),
                    "next_page": f"?q={quote(q)}&per_page={per_page}&page={page + 1}" if more else None,
                    "prev_page": None,
                },
            },
        )

    def _crate(self, versions: list[FakeCrate]) -> None:
        owner = self.owner
        summary = owner._summary(versions[0].name)
        newest = versions[0]
        summary["keywords"] = list(newest.keywords)
        summary["categories"] = list(newest.categories)
        summary["versions"] = [owner._version_json(c)["id"] for c in versions]
        self._json(
            200,
            {
                "crate": summary,
                "versions": [owner._version_json(c) for c in versions],
                "keywords": [{"id": k, "keyword": k, "crates_cnt": 1, "created_at": _DATE} for k in newest.keywords],
                "categories": [
                    {"id": c, "category": c, "slug": c, "description": "", "crates_cnt": 1, "created_at": _DATE}
                    for c in newest.categories
                ],
            },
        )

    def _fault(self, fault: _Fault) -> None:
        if fault.kind == "drop":
            self.close_connection = True
            return
        now = time.time()
        extra = {}
        if fault.retry_after is not None:
            extra["Retry-After"] = fault.retry_after
        if fault.retry_after_date is not None:
            extra["Retry-After"] = email.utils.formatdate(now + fault.retry_after_date, usegmt=True)
        body = json.dumps({"errors": [{"detail": f"fake-crates.io injected {fault.status}"}]}).encode()
        self._send(fault.status, body, "application/json", extra=extra, date=now)

    def _not_found(self, detail: str) -> None:
        self._json(404, {"errors": [{"detail": detail}]})

    def _json(self, status: int, data: object) -> None:
        self._send(status, json.dumps(data).encode(), "application/json; charset=utf-8")

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str,
        *,
        extra: Mapping[str, str] | None = None,
        date: float | None = None,
    ) -> None:
        self.send_response_only(status)
        self.send_header("Server", SERVER_HEADER)
        self.send_header("Date", email.utils.formatdate(date if date is not None else time.time(), usegmt=True))
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
