"""crates.io over HTTP: polite search, version metadata, sparse-index checksums, verified downloads."""

from __future__ import annotations

import contextlib
import copy
import email.utils
import hashlib
import importlib.metadata
import io
import json
import os
import re
import tarfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from ..errors import RegistryError, SearchError
from .base import CrateCandidate, FetchedSource

__all__ = [
    "DEFAULT_API_URL",
    "DEFAULT_INDEX_URL",
    "MAX_RETRY_AFTER",
    "CratesIoRegistry",
    "sparse_index_path",
    "user_agent",
]

DEFAULT_API_URL = "https://crates.io"
DEFAULT_INDEX_URL = "https://index.crates.io"
#: the longest ``Retry-After`` (seconds) that is waited out; a longer one fails at once
MAX_RETRY_AFTER = 60.0
#: the longest wait between retries when the server does not say how long
_MAX_BACKOFF = 30.0
_PROJECT_URL = "https://github.com/flakebot/flakebot-magic"
_OFFLINE_HINT = "Try again later, or search an offline directory registry instead with --registry PATH."
# crates.io's own rule for crate names (and the only ones safe in a URL path)
_CRATE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_SEMVER = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


def user_agent() -> str:
    """The User-Agent flakebot sends, as crates.io's crawler policy asks.

    Examples
    --------
    >>> user_agent().startswith("flakebot-magic/")
    True
    """
    try:
        version = importlib.metadata.version("flakebot-magic")
    except importlib.metadata.PackageNotFoundError:
        version = "0+unknown"
    return f"flakebot-magic/{version} ({_PROJECT_URL})"


def sparse_index_path(name: str) -> str:
    """The path of a crate's file in a sparse index, by cargo's prefix rule.

    Parameters
    ----------
    name
        The crate name; the path is lowercased, as cargo does for sparse indexes.

    Examples
    --------
    >>> sparse_index_path("a"), sparse_index_path("cc"), sparse_index_path("Syn")
    ('1/a', '2/cc', '3/s/syn')
    >>> sparse_index_path("serde")
    'se/rd/serde'
    """
    lower = name.lower()
    if not lower:
        raise ValueError("a crate name cannot be empty")
    if len(lower) == 1:
        return f"1/{lower}"
    if len(lower) == 2:
        return f"2/{lower}"
    if len(lower) == 3:
        return f"3/{lower[0]}/{lower}"
    return f"{lower[0:2]}/{lower[2:4]}/{lower}"


def _semver_key(version: str) -> tuple[Any, ...]:
    """Sort key giving semver precedence; unparseable versions sort lowest."""
    match = _SEMVER.match(version)
    if match is None:
        return (-1, -1, -1, 0, ())
    major, minor, patch, pre = match.groups()
    if pre is None:
        return (int(major), int(minor), int(patch), 1, ())
    idents = tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in pre.split("."))
    return (int(major), int(minor), int(patch), 0, idents)


def _is_prerelease(version: str) -> bool:
    return _SEMVER.match(version) is not None and "-" in version.split("+", 1)[0]


class _RateLimiter:
    """Spaces the starts of calls at least ``min_interval`` apart, across threads."""

    def __init__(
        self,
        min_interval: float,
        *,
        sleep: Callable[[float], None],
        clock: Callable[[], float],
    ) -> None:
        self._min_interval = max(0.0, min_interval)
        self._sleep = sleep
        self._clock = clock
        self._lock = threading.Lock()
        self._next_start: float | None = None

    def wait(self) -> None:
        # The lock is held while sleeping on purpose: waiting callers queue up
        # and each takes the next free slot.
        with self._lock:
            now = self._clock()
            start = now if self._next_start is None else max(now, self._next_start)
            if start > now:
                self._sleep(start - now)
            self._next_start = start + self._min_interval


def _retry_after_seconds(response: httpx.Response) -> float | None:
    """Seconds the server asks us to wait, from ``Retry-After`` (seconds or HTTP date)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    # Measure against the server's own clock when it sent one: skew-proof.
    now = datetime.now(timezone.utc)
    date_header = response.headers.get("date")
    if date_header:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            now = email.utils.parsedate_to_datetime(date_header)
            if now.tzinfo is None:
                now = now.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def _describe(response: httpx.Response) -> str:
    text = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
    detail = _error_detail(response)
    return f"{text}: {detail}" if detail else text


def _error_detail(response: httpx.Response) -> str:
    """crates.io's ``{"errors": [{"detail": ...}]}`` text, if any."""
    try:
        data = response.json()
    except ValueError:
        return ""
    if isinstance(data, dict) and isinstance(data.get("errors"), list):
        details = [str(err.get("detail", "")) for err in data["errors"] if isinstance(err, dict)]
        return "; ".join(d for d in details if d)
    return ""


def _strings(value: object) -> tuple[str, ...]:
    """A tuple of the non-empty strings in a JSON list (``null`` gives ``()``)."""
    if not isinstance(value, list):
        return ()
    return tuple(item for item in value if isinstance(item, str) and item)


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) else ""


class CratesIoRegistry:
    """crates.io, the public Rust registry, read through its HTTP API and sparse index.

    Every request carries a descriptive User-Agent and a timeout, request
    starts are spaced at least ``min_interval`` seconds apart (crates.io's
    crawler policy asks for one a second), and 429/5xx answers and transport
    errors are retried, honouring ``Retry-After``.

    Parameters
    ----------
    api_url
        Base URL of the web API (``/api/v1/...``).
    index_url
        Base URL of the sparse index (a ``sparse+`` prefix is accepted).
    download_url
        Base URL for ``{name}/{version}/download``; defaults to
        ``{api_url}/api/v1/crates``.
    client
        The ``httpx.Client`` to use; one is made (and closed by :meth:`close`)
        when not given.
    min_interval
        Least number of seconds between the starts of two requests.
    retries
        How many times a failed request is retried before giving up.
    timeout
        Seconds allowed for each request.
    sleep, clock
        Injected for tests; ``time.sleep`` and ``time.monotonic`` by default.

    Examples
    --------
    >>> with CratesIoRegistry() as registry:  # doctest: +SKIP
    ...     best = registry.search("json pretty printer", limit=5)[0]
    ...     source = registry.fetch(registry.get(best.name), Path("src"))
    """

    offline = False

    def __init__(
        self,
        *,
        api_url: str = DEFAULT_API_URL,
        index_url: str = DEFAULT_INDEX_URL,
        download_url: str | None = None,
        client: httpx.Client | None = None,
        min_interval: float = 1.0,
        retries: int = 3,
        timeout: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.index_url = index_url.removeprefix("sparse+").rstrip("/")
        self.download_url = download_url.rstrip("/") if download_url else f"{self.api_url}/api/v1/crates"
        self.id = "crates.io" if self.api_url == DEFAULT_API_URL else self.api_url
        self.user_agent = user_agent()
        self.retries = max(0, retries)
        self.timeout = timeout
        self._sleep = sleep
        self._limiter = _RateLimiter(min_interval, sleep=sleep, clock=clock)
        self._owns_client = client is None
        self._client = (
            client if client is not None else httpx.Client(timeout=timeout, headers={"User-Agent": self.user_agent})
        )

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP client if this registry made it."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> CratesIoRegistry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"CratesIoRegistry(api_url={self.api_url!r}, index_url={self.index_url!r})"

    # -- Registry protocol -------------------------------------------------

    def search(self, query: str, limit: int = 10) -> list[CrateCandidate]:
        """Crates matching ``query``, best first, each at its newest version.

        Costs one search request plus one version request per result.

        Parameters
        ----------
        query
            Free text, as typed into crates.io's search box.
        limit
            Most results wanted (crates.io pages hold at most 100).
        """
        query = query.strip()
        if not query or limit < 1:
            return []
        per_page = min(limit, 100)
        data = self._get_json(
            f"{self.api_url}/api/v1/crates",
            params={"q": query, "per_page": str(per_page)},
            what=f"search crates.io for {query!r}",
        )
        if data is None:
            raise RegistryError(
                f"{self.api_url} has no search API (/api/v1/crates answered 404). Check the registry URL."
            )
        results = data.get("crates")
        if not isinstance(results, list):
            raise RegistryError(f"crates.io's search answer has no 'crates' list. {_OFFLINE_HINT}")
        found = [c for c in results[:per_page] if isinstance(c, dict)]
        candidates: list[CrateCandidate] = []
        for rank, crate in enumerate(found):
            name = crate.get("name")
            version = crate.get("max_stable_version") or crate.get("max_version")
            if not isinstance(name, str) or not isinstance(version, str):
                continue
            if not _CRATE_NAME.match(name):
                continue
            details = self._version_details(name, version)
            if details is None:  # listed but the version is gone (yanked, deleted)
                continue
            candidates.append(
                self._candidate(
                    crate,
                    details,
                    version=version,
                    # crates.io ranks best first; turn rank into higher-is-better
                    score=float(len(found) - rank) / len(found),
                    checksum=_text(details.get("checksum")) or None,
                )
            )
        return candidates

    def get(self, name: str, version: str | None = None) -> CrateCandidate:
        """One crate by name, at ``version`` or its newest non-yanked version.

        The candidate's ``checksum`` comes from the sparse index, the same
        record cargo checks downloads against.

        Raises
        ------
        SearchError
            No such crate, or no such version (the message lists the versions).
        RegistryError
            crates.io could not be read.
        """
        self._check_name(name)
        data = self._get_json(
            f"{self.api_url}/api/v1/crates/{quote(name)}",
            what=f"read crate {name} from crates.io",
        )
        if data is None:
            raise SearchError(
                f"no crate named {name} on crates.io. Check the spelling, or search for it without naming a crate."
            )
        crate = data.get("crate")
        versions = [v for v in data.get("versions") or [] if isinstance(v, dict)]
        if not isinstance(crate, dict):
            raise RegistryError(f"crates.io's answer for {name} has no 'crate' object.")
        canonical = crate.get("name")
        if not isinstance(canonical, str) or not canonical:
            canonical = name
        chosen = self._pick_version(canonical, versions, version)
        number = str(chosen["num"])
        if "bin_names" not in chosen:  # older API answers omit it: ask the version
            chosen = self._version_details(canonical, number) or chosen
        keywords = _strings(crate.get("keywords")) or tuple(
            str(k.get("keyword") or k.get("id"))
            for k in data.get("keywords") or []
            if isinstance(k, dict) and (k.get("keyword") or k.get("id"))
        )
        categories = tuple(
            str(c.get("category") or c.get("slug") or c.get("id"))
            for c in data.get("categories") or []
            if isinstance(c, dict) and (c.get("category") or c.get("slug") or c.get("id"))
        ) or _strings(crate.get("categories"))
        return self._candidate(
            {**crate, "name": canonical, "keywords": list(keywords), "categories": list(categories)},
            chosen,
            version=number,
            score=1.0,
            checksum=self._index_checksum(canonical, number),
        )

    def fetch(self, candidate: CrateCandidate, dest: Path) -> FetchedSource:
        """Download ``candidate``'s ``.crate``, verify it, unpack it into ``dest``.

        The archive's sha256 must match the sparse index's ``cksum``; members
        are unpacked without the top ``{name}-{version}/`` directory, and any
        member that would land outside ``dest`` is refused before anything is
        written.

        Raises
        ------
        RegistryError
            The download failed, was corrupt or tampered with, or is not a
            well-formed crate archive.
        """
        name, version = candidate.name, candidate.version
        self._check_name(name)
        dest = Path(dest)
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise RegistryError(
                f"cannot unpack {candidate.id} into {dest}: it is not an empty "
                "directory. Remove it or choose another destination."
            )
        expected = self._index_checksum(name, version)
        if candidate.checksum and candidate.checksum.lower() != expected:
            raise RegistryError(
                f"the checksum given for {candidate.id} ({candidate.checksum}) "
                f"disagrees with crates.io's index ({expected}). "
                "Look the crate up again with get() before fetching it."
            )
        url = f"{self.download_url}/{quote(name)}/{quote(version)}/download"
        response = self._request(url, what=f"download {candidate.id}", follow_redirects=True)
        if response.status_code == 404:
            raise RegistryError(
                f"crates.io has no download for {candidate.id} (HTTP 404). "
                "The version may have been deleted; choose another version."
            )
        self._raise_for_status(response, f"download {candidate.id}")
        archive = response.content
        actual = hashlib.sha256(archive).hexdigest()
        if actual != expected:
            raise RegistryError(
                f"the download of {candidate.id} was corrupt or tampered with: its "
                f"sha256 is {actual} but crates.io's index says {expected}. Nothing "
                "was unpacked. Try again; if it persists, report it to the crates.io team."
            )
        _unpack_crate(archive, dest, top=f"{name}-{version}", label=candidate.id)
        return FetchedSource(path=dest, checksum=actual, checksum_kind="crate-sha256")

    def cargo_config(self) -> str:
        """Nothing: cargo's default registry is crates.io."""
        return ""

    # -- helpers -----------------------------------------------------------

    @staticmethod
    def _check_name(name: str) -> None:
        if not _CRATE_NAME.match(name):
            raise SearchError(
                f"{name!r} is not a valid crate name: crate names are 1 to 64 "
                "ASCII letters, digits, '-' or '_', starting with a letter."
            )

    def _candidate(
        self,
        crate: Mapping[str, Any],
        details: Mapping[str, Any],
        *,
        version: str,
        score: float,
        checksum: str | None,
    ) -> CrateCandidate:
        bin_names = tuple(b for b in details.get("bin_names") or [] if isinstance(b, str) and b)
        return CrateCandidate(
            name=str(crate["name"]),
            version=version,
            description=_text(crate.get("description")) or _text(details.get("description")),
            score=score,
            has_bin=bool(bin_names),
            bin_names=bin_names,
            keywords=_strings(crate.get("keywords")) or _strings(details.get("keywords")),
            categories=_strings(crate.get("categories")) or _strings(details.get("categories")),
            license=_text(details.get("license")) or _text(crate.get("license")),
            homepage=_text(crate.get("homepage")) or _text(details.get("homepage")),
            repository=_text(crate.get("repository")) or _text(details.get("repository")),
            registry=self.id,
            checksum=checksum,
        )

    def _pick_version(self, name: str, versions: list[dict[str, Any]], wanted: str | None) -> dict[str, Any]:
        usable = [v for v in versions if isinstance(v.get("num"), str)]
        if wanted is not None:
            for entry in usable:
                if entry["num"] == wanted:
                    return entry
            listed = sorted(usable, key=lambda v: _semver_key(v["num"]), reverse=True)
            shown = ", ".join(v["num"] + (" (yanked)" if v.get("yanked") else "") for v in listed)
            raise SearchError(f"crates.io has no version {wanted} of {name}. Available versions: {shown or 'none'}.")
        live = [v for v in usable if not v.get("yanked")]
        if not live:
            raise SearchError(
                f"every version of {name} on crates.io is yanked. Name a version explicitly, or choose another crate."
            )
        stable = [v for v in live if not _is_prerelease(v["num"])]
        return max(stable or live, key=lambda v: _semver_key(v["num"]))

    def _version_details(self, name: str, version: str) -> dict[str, Any] | None:
        data = self._get_json(
            f"{self.api_url}/api/v1/crates/{quote(name)}/{quote(version)}",
            what=f"read {name}@{version} from crates.io",
        )
        if data is None:
            return None
        details = data.get("version")
        return details if isinstance(details, dict) else None

    def _index_checksum(self, name: str, version: str) -> str:
        url = f"{self.index_url}/{sparse_index_path(name)}"
        what = f"read the sparse index entry of {name}"
        response = self._request(url, what=what)
        if response.status_code in (404, 410, 451):
            raise RegistryError(
                f"crates.io's index has no entry for {name} ({url} answered "
                f"{response.status_code}). The crate may have been removed."
            )
        self._raise_for_status(response, what)
        for line in response.text.splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # cargo skips lines it cannot read, too
            if isinstance(record, dict) and record.get("vers") == version:
                cksum = record.get("cksum")
                if isinstance(cksum, str) and re.fullmatch(r"[0-9a-fA-F]{64}", cksum):
                    return cksum.lower()
                raise RegistryError(
                    f"crates.io's index entry for {name}@{version} has no valid "
                    f"cksum ({cksum!r}); it cannot be verified, so it is not fetched."
                )
        raise RegistryError(
            f"crates.io's index lists no version {version} of {name}. "
            "Look the crate up again with get() to choose a published version."
        )

    def _get_json(self, url: str, *, what: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        """The JSON object at ``url``, or None on 404."""
        response = self._request(url, what=what, params=params)
        if response.status_code == 404:
            return None
        self._raise_for_status(response, what)
        try:
            data = response.json()
        except ValueError as exc:
            raise RegistryError(
                f"could not {what}: {url} answered with something that is not JSON. {_OFFLINE_HINT}"
            ) from exc
        if not isinstance(data, dict):
            raise RegistryError(f"could not {what}: {url} answered with JSON that is not an object.")
        return data

    def _raise_for_status(self, response: httpx.Response, what: str) -> None:
        if response.is_success:
            return
        hint = (
            " crates.io refuses clients it cannot identify; check the User-Agent."
            if response.status_code == 403
            else f" {_OFFLINE_HINT}"
        )
        raise RegistryError(f"could not {what}: {response.request.url} answered {_describe(response)}.{hint}")

    def _request(
        self,
        url: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        follow_redirects: bool = False,
    ) -> httpx.Response:
        """GET ``url`` politely, retrying 429, 5xx and transport errors."""
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            self._limiter.wait()
            try:
                response = self._client.get(
                    url,
                    params=params,
                    headers={"User-Agent": self.user_agent, "Accept": "application/json"},
                    timeout=self.timeout,
                    follow_redirects=follow_redirects,
                )
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                delay = self._backoff(attempt)
            else:
                if response.status_code != 429 and response.status_code < 500:
                    return response
                last = _describe(response)
                asked = _retry_after_seconds(response)
                if asked is not None and asked > MAX_RETRY_AFTER:
                    raise RegistryError(
                        f"could not {what}: {url} answered {last} and asked us to wait "
                        f"{asked:.0f} s before trying again, longer than flakebot "
                        f"waits ({MAX_RETRY_AFTER:.0f} s). {_OFFLINE_HINT}"
                    )
                delay = asked if asked is not None else self._backoff(attempt)
            if attempt + 1 < attempts:
                self._sleep(delay)
        raise RegistryError(
            f"could not {what}: {url} failed {attempts} time(s), last with {last}. "
            f"crates.io may be down, unreachable from here, or rate-limiting this "
            f"machine. {_OFFLINE_HINT}"
        )

    @staticmethod
    def _backoff(attempt: int) -> float:
        return float(min(_MAX_BACKOFF, 2.0**attempt))


# -- unpacking ---------------------------------------------------------------


def _unpack_crate(archive: bytes, dest: Path, *, top: str, label: str) -> None:
    """Unpack a ``.crate`` (tar.gz) into ``dest``, stripping ``top/``; refuse escapes."""
    with _tar_errors(label), tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = _safe_members(tar.getmembers(), top=top, label=label)
        dest.mkdir(parents=True, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:  # pragma: no cover - Python without PEP 706
            tar.extractall(dest, members=members)


@contextlib.contextmanager
def _tar_errors(label: str) -> Iterator[None]:
    """Turn tarfile's and the OS's complaints into RegistryError."""
    try:
        yield
    except tarfile.TarError as exc:  # FilterError is a TarError too
        raise RegistryError(
            f"the archive of {label} is not a well-formed crate ({exc}); it was not unpacked. Try another version."
        ) from exc
    except (EOFError, OSError) as exc:
        raise RegistryError(
            f"could not unpack {label}: {exc}. Check the destination is writable, or try another version."
        ) from exc


def _escape(label: str, member: str, why: str) -> RegistryError:
    return RegistryError(
        f"refusing to unpack {label}: archive member {member!r} {why}. The crate "
        "archive is malformed or malicious; nothing was unpacked."
    )


def _inside(path: str) -> bool:
    """True when a relative POSIX path stays within its root after resolving ``..``."""
    if not path or path.startswith("/") or PurePosixPath(path).is_absolute():
        return False
    depth = 0
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        else:
            depth += 1
    return True


def _safe_members(members: list[tarfile.TarInfo], *, top: str, label: str) -> list[tarfile.TarInfo]:
    """Copies of ``members`` renamed without ``top/``, or RegistryError if any escapes."""
    prefix = f"{top}/"
    kept: list[tarfile.TarInfo] = []
    for member in members:
        name = member.name
        if "\\" in name or "\x00" in name or os.path.isabs(name) or name.startswith("/"):
            raise _escape(label, name, "has an absolute or non-POSIX path")
        if ".." in name.split("/"):
            raise _escape(label, name, "contains '..'")
        if name.rstrip("/") == top and member.isdir():
            continue
        if not name.startswith(prefix):
            raise _escape(label, name, f"is not under {prefix}")
        relative = name[len(prefix) :].strip("/")
        if not relative or not _inside(relative):
            raise _escape(label, name, "points outside the crate directory")
        if not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise _escape(label, name, "is a device, pipe or other special file")
        renamed = copy.copy(member)
        renamed.name = relative
        if member.issym():
            target = member.linkname
            parent = relative.rsplit("/", 1)[0] if "/" in relative else ""
            joined = f"{parent}/{target}" if parent else target
            if target.startswith("/") or os.path.isabs(target) or not _inside(joined):
                raise _escape(label, name, f"is a symlink pointing outside ({target!r})")
        elif member.islnk():
            target = member.linkname
            if not target.startswith(prefix) or not _inside(target[len(prefix) :]):
                raise _escape(label, name, f"is a hard link pointing outside ({target!r})")
            renamed.linkname = target[len(prefix) :]
        kept.append(renamed)
    return kept
