"""CratesIoRegistry against a fake crates.io over real HTTP on 127.0.0.1."""

from __future__ import annotations

import hashlib
import io
import itertools
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from flakebot_magic.errors import RegistryError, SearchError
from flakebot_magic.registry import Registry
from flakebot_magic.registry.cratesio import (
    CratesIoRegistry,
    sparse_index_path,
    user_agent,
)
from flakebot_magic.testing.fake_cratesio import (
    SERVER_HEADER,
    FakeCrate,
    FakeCratesIo,
    build_crate,
)

if TYPE_CHECKING:  # the fixture's class; conftest modules are not imported by name
    from tests.registry.conftest import FakeTime

MakeRegistry = Callable[..., CratesIoRegistry]


def _api_paths(fake: FakeCratesIo) -> list[str]:
    return [r.path for r in fake.requests]


# -- the protocol and identity ------------------------------------------------


def test_implements_registry_protocol(registry: CratesIoRegistry, fake_cratesio: FakeCratesIo) -> None:
    assert isinstance(registry, Registry)
    assert registry.offline is False
    # another index than crates.io's: cargo is pointed at it (sparse), as at a mirror
    assert f'registry = "sparse+{fake_cratesio.index_url.rstrip("/")}/"' in registry.cargo_config()
    assert 'replace-with = "flakebot-index"' in registry.cargo_config()
    assert registry.id == fake_cratesio.url  # not the default api_url


def test_default_id_is_crates_io() -> None:
    with CratesIoRegistry() as registry:  # makes no request
        assert registry.id == "crates.io"
        assert registry.cargo_config() == ""  # cargo's own default


def test_closes_only_its_own_client(fake_cratesio: FakeCratesIo) -> None:
    with httpx.Client() as client:
        registry = CratesIoRegistry(api_url=fake_cratesio.url, client=client, min_interval=0)
        registry.close()
        assert not client.is_closed
    with CratesIoRegistry(api_url=fake_cratesio.url) as owned:
        pass
    assert owned._client.is_closed


@pytest.mark.parametrize(
    ("name", "path"),
    [
        ("a", "1/a"),
        ("cc", "2/cc"),
        ("syn", "3/s/syn"),
        ("Syn", "3/s/syn"),
        ("serde", "se/rd/serde"),
        ("toml", "to/ml/toml"),
        ("Inflector", "in/fl/inflector"),
        ("serde_json", "se/rd/serde_json"),
    ],
)
def test_sparse_index_prefix_rule(name: str, path: str) -> None:
    assert sparse_index_path(name) == path


def test_user_agent_is_descriptive(registry: CratesIoRegistry, fake_cratesio: FakeCratesIo) -> None:
    registry.get("jsonfmt")
    agent = user_agent()
    assert agent.startswith("flakebot-magic/")
    assert "(https://github.com/flakebot/flakebot-magic)" in agent
    assert fake_cratesio.requests
    assert {r.headers["user-agent"] for r in fake_cratesio.requests} == {agent}


def test_user_agent_sent_with_a_caller_client(fake_cratesio: FakeCratesIo) -> None:
    with (
        httpx.Client() as client,
        CratesIoRegistry(
            api_url=fake_cratesio.url, index_url=fake_cratesio.index_url, client=client, min_interval=0
        ) as registry,
    ):
        registry.search("json", limit=1)
    assert all(r.headers["user-agent"] == user_agent() for r in fake_cratesio.requests)


def test_fake_labels_itself_a_test_double(fake_cratesio: FakeCratesIo) -> None:
    with httpx.Client() as client:
        response = client.get(f"{fake_cratesio.url}/api/v1/crates", params={"q": "json"})
    assert response.headers["server"] == SERVER_HEADER


# -- search ---------------------------------------------------------------------


def test_search_returns_scored_candidates_with_binaries(
    registry: CratesIoRegistry, fake_cratesio: FakeCratesIo
) -> None:
    found = registry.search("json", limit=10)
    names = [c.name for c in found]
    assert set(names) == {"jsonfmt", "json-core", "yaml2json"}
    assert [c.score for c in found] == sorted((c.score for c in found), reverse=True)
    assert all(c.score > 0 for c in found)
    assert len({c.score for c in found}) == len(found)

    by_name = {c.name: c for c in found}
    fmt = by_name["jsonfmt"]
    assert fmt.version == "1.2.0"
    assert fmt.has_bin and fmt.bin_names == ("jsonfmt",)
    assert fmt.description == "Pretty-print and reformat JSON from the command line"
    assert fmt.license == "MIT"
    assert fmt.homepage == "https://example.invalid/jsonfmt"
    assert fmt.repository == "https://example.invalid/jsonfmt.git"
    assert fmt.registry == registry.id
    assert fmt.checksum == fake_cratesio.checksum("jsonfmt", "1.2.0")
    assert by_name["yaml2json"].bin_names == ("yaml2json", "json2yaml")
    lib = by_name["json-core"]
    assert not lib.has_bin and lib.bin_names == ()
    assert lib.license == "MIT OR Apache-2.0"


def test_search_keeps_requests_to_the_limit(registry: CratesIoRegistry, fake_cratesio: FakeCratesIo) -> None:
    found = registry.search("json", limit=2)
    assert len(found) == 2
    paths = _api_paths(fake_cratesio)
    assert paths[0] == "/api/v1/crates"
    assert fake_cratesio.requests[0].query["per_page"] == ["2"]
    assert fake_cratesio.requests[0].query["q"] == ["json"]
    assert len(paths) == 3  # one search + one version lookup per result


def test_search_uses_newest_stable_version(registry: CratesIoRegistry) -> None:
    (tool,) = registry.search("tool", limit=1)
    assert tool.version == "0.2.0"  # not the yanked 0.2.1 nor the 0.3.0 beta


def test_search_without_results(registry: CratesIoRegistry) -> None:
    assert registry.search("no-such-thing-anywhere") == []
    assert registry.search("   ") == []


# -- get ---------------------------------------------------------------------------


def test_get_newest_non_yanked_with_index_checksum(registry: CratesIoRegistry, fake_cratesio: FakeCratesIo) -> None:
    tool = registry.get("tool")
    assert tool.version == "0.2.0"
    assert tool.checksum == fake_cratesio.checksum("tool", "0.2.0")
    assert "/index/to/ol/tool" in _api_paths(fake_cratesio)


def test_get_reads_keywords_and_categories(registry: CratesIoRegistry) -> None:
    fmt = registry.get("jsonfmt")
    assert fmt.keywords == ("json", "cli", "formatter")
    assert fmt.categories == ("command-line-utilities",)
    assert fmt.has_bin and fmt.bin_names == ("jsonfmt",)


def test_get_exact_version(registry: CratesIoRegistry) -> None:
    assert registry.get("tool", "0.3.0-beta.1").version == "0.3.0-beta.1"
    assert registry.get("jsonfmt", "1.1.0").version == "1.1.0"


def test_get_unknown_crate(registry: CratesIoRegistry) -> None:
    with pytest.raises(SearchError, match=r"no crate named nope-nope on crates\.io") as info:
        registry.get("nope-nope")
    assert not isinstance(info.value, RegistryError)


def test_get_unknown_version_lists_versions(registry: CratesIoRegistry) -> None:
    with pytest.raises(SearchError) as info:
        registry.get("tool", "9.9.9")
    message = str(info.value)
    assert "no version 9.9.9 of tool" in message
    assert "0.3.0-beta.1, 0.2.1 (yanked), 0.2.0, 0.1.0" in message


def test_get_rejects_invalid_names_without_a_request(registry: CratesIoRegistry, fake_cratesio: FakeCratesIo) -> None:
    with pytest.raises(SearchError, match="not a valid crate name"):
        registry.get("../../etc/passwd")
    assert fake_cratesio.requests == []


# -- fetch ------------------------------------------------------------------------


def test_fetch_unpacks_and_verifies(registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, tmp_path: Path) -> None:
    candidate = registry.get("jsonfmt")
    dest = tmp_path / "src"
    source = registry.fetch(candidate, dest)
    expected = hashlib.sha256(fake_cratesio.archive("jsonfmt", "1.2.0")).hexdigest()
    assert source.path == dest
    assert source.checksum == expected
    assert source.checksum_kind == "crate-sha256"
    assert (dest / "Cargo.toml").read_text().startswith("[package]")
    assert (dest / "src" / "main.rs").read_text() == 'fn main() { println!("{{}}"); }\n'
    assert (dest / "README.md").exists()
    assert not (dest / "jsonfmt-1.2.0").exists()
    # the download went through crates.io's redirect
    assert "/api/v1/crates/jsonfmt/1.2.0/download" in _api_paths(fake_cratesio)
    assert "/static/crates/jsonfmt/jsonfmt-1.2.0.crate" in _api_paths(fake_cratesio)


def test_fetch_from_a_search_candidate(registry: CratesIoRegistry, tmp_path: Path) -> None:
    lib = next(c for c in registry.search("json") if c.name == "json-core")
    registry.fetch(lib, tmp_path / "lib")
    assert (tmp_path / "lib" / "src" / "lib.rs").exists()


def test_fetch_corrupt_download(registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, tmp_path: Path) -> None:
    candidate = registry.get("jsonfmt")
    fake_cratesio.corrupt_download("jsonfmt", "1.2.0")
    with pytest.raises(RegistryError, match="corrupt or tampered with") as info:
        registry.fetch(candidate, tmp_path / "src")
    good = fake_cratesio.checksum("jsonfmt", "1.2.0")
    assert good in str(info.value)
    assert not (tmp_path / "src").exists()


def test_fetch_refuses_checksum_disagreeing_with_index(registry: CratesIoRegistry, tmp_path: Path) -> None:
    from dataclasses import replace

    candidate = replace(registry.get("jsonfmt"), checksum="0" * 64)
    with pytest.raises(RegistryError, match=r"disagrees with crates\.io's index"):
        registry.fetch(candidate, tmp_path / "src")


def test_fetch_refuses_non_empty_dest(registry: CratesIoRegistry, tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "x").write_text("x")
    with pytest.raises(RegistryError, match="not an empty directory"):
        registry.fetch(registry.get("jsonfmt"), tmp_path / "here")


def _evil_archive(name: str, version: str, members: list[tarfile.TarInfo]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        ok = f"fine {name}\n".encode()
        info = tarfile.TarInfo(f"{name}-{version}/Cargo.toml")
        info.size = len(ok)
        tar.addfile(info, io.BytesIO(ok))
        for member in members:
            data = b"pwned\n" if member.isfile() else b""
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data else None)
    return raw.getvalue()


def _symlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    return info


def _hardlink(name: str, target: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.LNKTYPE
    info.linkname = target
    return info


@pytest.mark.parametrize(
    "member",
    [
        tarfile.TarInfo("evil-1.0.0/../../escaped.txt"),
        tarfile.TarInfo("/tmp/flakebot-escaped.txt"),
        tarfile.TarInfo("other-dir/escaped.txt"),
        _symlink("evil-1.0.0/link", "../../../etc/passwd"),
        _symlink("evil-1.0.0/abs", "/etc/passwd"),
        _hardlink("evil-1.0.0/hard", "/etc/passwd"),
        _hardlink("evil-1.0.0/hard", "evil-1.0.0/../../x"),
    ],
    ids=["dotdot", "absolute", "outside-top", "symlink-up", "symlink-abs", "hardlink-abs", "hardlink-up"],
)
def test_fetch_refuses_path_escapes(tmp_path: Path, make_registry: MakeRegistry, member: tarfile.TarInfo) -> None:
    archive = _evil_archive("evil", "1.0.0", [member])
    with FakeCratesIo([FakeCrate("evil", "1.0.0", archive=archive)]) as fake:
        registry = make_registry(api_url=fake.url, index_url=fake.index_url)
        dest = tmp_path / "work" / "src"
        with pytest.raises(RegistryError, match=r"refusing to unpack evil@1\.0\.0"):
            registry.fetch(registry.get("evil"), dest)
        registry.close()
    assert not dest.exists()  # checked before anything is written
    assert not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "work" / "escaped.txt").exists()


def test_fetch_keeps_links_that_stay_inside(tmp_path: Path, make_registry: MakeRegistry) -> None:
    archive = _evil_archive("linky", "1.0.0", [_symlink("linky-1.0.0/src/alias.toml", "../Cargo.toml")])
    with FakeCratesIo([FakeCrate("linky", "1.0.0", archive=archive)]) as fake:
        registry = make_registry(api_url=fake.url, index_url=fake.index_url)
        registry.fetch(registry.get("linky"), tmp_path / "src")
        registry.close()
    assert (tmp_path / "src" / "src" / "alias.toml").read_text() == "fine linky\n"


def test_fetch_rejects_a_broken_archive(tmp_path: Path, make_registry: MakeRegistry) -> None:
    with FakeCratesIo([FakeCrate("broken", "1.0.0", archive=b"not a tarball")]) as fake:
        registry = make_registry(api_url=fake.url, index_url=fake.index_url)
        with pytest.raises(RegistryError, match="not a well-formed crate"):
            registry.fetch(registry.get("broken"), tmp_path / "src")
        registry.close()


def test_build_crate_is_deterministic() -> None:
    assert build_crate("a", "1.0.0", {"x": "y"}) == build_crate("a", "1.0.0", {"x": "y"})


# -- retries -------------------------------------------------------------------------


def test_429_retry_after_seconds_is_honoured(
    registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime
) -> None:
    fake_cratesio.respond_429(count=2, retry_after=7)
    assert registry.get("tool").version == "0.2.0"
    assert fake_time.sleeps == [7.0, 7.0]
    assert _api_paths(fake_cratesio)[:3] == ["/api/v1/crates/tool"] * 3


def test_429_retry_after_http_date_is_honoured(
    registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime
) -> None:
    fake_cratesio.respond_429(count=1, retry_after=12, http_date=True)
    registry.get("tool")
    assert fake_time.sleeps == [12.0]


def test_429_asking_too_long_a_wait_fails_at_once(
    registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime
) -> None:
    fake_cratesio.respond_429(count=1, retry_after=3600)
    with pytest.raises(RegistryError, match="wait 3600 s") as info:
        registry.get("tool")
    assert "--registry PATH" in str(info.value)
    assert fake_time.sleeps == []


def test_503_is_retried_with_backoff(
    registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime
) -> None:
    fake_cratesio.respond_503(count=2)
    found = registry.search("json", limit=1)
    assert len(found) == 1
    assert fake_time.sleeps == [1.0, 2.0]  # exponential, no Retry-After given


def test_dropped_connection_is_retried(
    registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime
) -> None:
    fake_cratesio.drop_connections(1)
    assert registry.get("tool").version == "0.2.0"
    assert fake_time.sleeps == [1.0]


def test_retries_exhausted(make_registry: MakeRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime) -> None:
    registry = make_registry(retries=2)
    fake_cratesio.respond_503(count=10)
    with pytest.raises(RegistryError) as info:
        registry.search("json")
    message = str(info.value)
    assert "failed 3 time(s)" in message
    assert "HTTP 503" in message
    assert "--registry PATH" in message
    assert len(fake_cratesio.requests) == 3
    assert fake_time.sleeps == [1.0, 2.0]


def test_unreachable_host_gives_registry_error(fake_time: FakeTime) -> None:
    # a port nothing listens on, on loopback
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with (
        CratesIoRegistry(
            api_url=f"http://127.0.0.1:{port}",
            retries=1,
            min_interval=0,
            sleep=fake_time.sleep,
            clock=fake_time.clock,
            timeout=2,
        ) as registry,
        pytest.raises(RegistryError, match="ConnectError"),
    ):
        registry.search("json")
    assert fake_time.sleeps == [1.0]


def test_other_client_errors_are_not_retried(
    registry: CratesIoRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime
) -> None:
    fake_cratesio.respond_status(403, count=1)
    with pytest.raises(RegistryError, match="HTTP 403"):
        registry.get("tool")
    assert fake_time.sleeps == []
    assert len(fake_cratesio.requests) == 1


# -- rate limit --------------------------------------------------------------------------


def test_rate_limit_spaces_requests_with_injected_clock(
    make_registry: MakeRegistry, fake_cratesio: FakeCratesIo, fake_time: FakeTime
) -> None:
    registry = make_registry(min_interval=1.0)
    registry.search("json", limit=3)  # 1 search + 3 version requests
    assert len(fake_cratesio.requests) == 4
    assert fake_time.sleeps == [1.0, 1.0, 1.0]


#: the real-time tests' interval, and the most a request's trip to the server may lag behind its start (a loaded
#: machine delayed one by 46 ms, and the next arrived 52 ms after it with 100 ms between their starts)
REAL_INTERVAL, TRIP_JITTER = 0.3, 0.15


def _assert_spaced(times: list[float], interval: float, *, count: int) -> None:
    """Arrival times at the server: starts are spaced by ``interval``; an arrival lags its start by a trip of
    0 to :data:`TRIP_JITTER`, so two arrivals ``k`` apart are at least ``k * interval - TRIP_JITTER`` apart
    (without the limit, gaps would be ~1 ms)."""
    assert len(times) == count
    gaps = [b - a for a, b in itertools.pairwise(times)]
    for i, j in itertools.combinations(range(count), 2):
        assert times[j] - times[i] >= (j - i) * interval - TRIP_JITTER, gaps


def test_rate_limit_with_real_time(make_registry: MakeRegistry, fake_cratesio: FakeCratesIo) -> None:
    interval = REAL_INTERVAL
    registry = make_registry(min_interval=interval, sleep=time.sleep, clock=time.monotonic)
    registry.search("json", limit=3)
    registry.get("tool")
    _assert_spaced([r.time for r in fake_cratesio.requests], interval, count=6)


def test_rate_limit_holds_across_threads(make_registry: MakeRegistry, fake_cratesio: FakeCratesIo) -> None:
    interval = REAL_INTERVAL
    registry = make_registry(min_interval=interval, sleep=time.sleep, clock=time.monotonic)
    errors: list[BaseException] = []

    def work() -> None:
        try:
            registry.get("jsonfmt")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    _assert_spaced(sorted(r.time for r in fake_cratesio.requests), interval, count=6)
