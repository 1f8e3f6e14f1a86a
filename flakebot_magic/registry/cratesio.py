"""crates.io over HTTP: polite search, version metadata, sparse-index checksums, verified downloads."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import httpx

from ..errors import RegistryError, SearchError
from ..host.fsutil import load_json
from .base import CrateCandidate, FetchedSource
from .crate_archive import unpack_crate
from .cratesio_http import MAX_RETRY_AFTER, OFFLINE_HINT, PoliteClient, user_agent
from .semver import Version

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
# crates.io's own rule for crate names (and the only ones safe in a URL path)
_CRATE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")


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


def _semver_key(version: str) -> tuple[int, Version]:
    """Sort key giving semver precedence (:class:`~.semver.Version`); unparseable versions sort lowest."""
    try:
        return (1, Version(version))
    except ValueError:
        return (0, Version("0.0.0"))


def _is_prerelease(version: str) -> bool:
    try:
        return bool(Version(version).pre)
    except ValueError:
        return False


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
        self._owns_client = client is None
        self._client = (
            client if client is not None else httpx.Client(timeout=timeout, headers={"User-Agent": self.user_agent})
        )
        self._http = PoliteClient(
            self._client,
            user_agent=self.user_agent,
            min_interval=min_interval,
            retries=retries,
            timeout=timeout,
            sleep=sleep,
            clock=clock,
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

    @property
    def retries(self) -> int:
        """How many times a failed request is retried."""
        return self._http.retries

    @property
    def timeout(self) -> float:
        """Seconds allowed for each request."""
        return self._http.timeout

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
        data = self._http.get_json(
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
            raise RegistryError(f"crates.io's search answer has no 'crates' list. {OFFLINE_HINT}")
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
            try:
                candidate = self._candidate(
                    crate,
                    details,
                    version=version,
                    # crates.io ranks best first; turn rank into higher-is-better
                    score=float(len(found) - rank) / len(found),
                    checksum=_text(details.get("checksum")) or None,
                )
            except RegistryError:  # a name, version or binary that is no path component: not offered
                continue
            candidates.append(candidate)
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
        data = self._http.get_json(
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
        response = self._http.get(url, what=f"download {candidate.id}", follow_redirects=True)
        if response.status_code == 404:
            raise RegistryError(
                f"crates.io has no download for {candidate.id} (HTTP 404). "
                "The version may have been deleted; choose another version."
            )
        self._http.raise_for_status(response, f"download {candidate.id}")
        archive = response.content
        actual = hashlib.sha256(archive).hexdigest()
        if actual != expected:
            raise RegistryError(
                f"the download of {candidate.id} was corrupt or tampered with: its "
                f"sha256 is {actual} but crates.io's index says {expected}. Nothing "
                "was unpacked. Try again; if it persists, report it to the crates.io team."
            )
        unpack_crate(archive, dest, top=f"{name}-{version}", label=candidate.id)
        return FetchedSource(path=dest, checksum=actual, checksum_kind="crate-sha256")

    def cargo_config(self) -> str:
        """Nothing for crates.io itself (cargo's default); for another index (a mirror), cargo's crates.io replaced by it."""
        if self.index_url == DEFAULT_INDEX_URL:
            return ""
        index = self.index_url.replace("\\", "").replace('"', "")
        return (
            '[source.crates-io]\nreplace-with = "flakebot-index"\n\n'
            f'[source.flakebot-index]\nregistry = "sparse+{index}/"\n'
        )

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
        data = self._http.get_json(
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
        response = self._http.get(url, what=what)
        if response.status_code in (404, 410, 451):
            raise RegistryError(
                f"crates.io's index has no entry for {name} ({url} answered "
                f"{response.status_code}). The crate may have been removed."
            )
        self._http.raise_for_status(response, what)
        for line in response.text.splitlines():
            if not line.strip():
                continue
            try:
                record = load_json(line)
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
