"""The Jupyter server extension in a real ``jupyter server``: API, auth, XSRF, dashboard, proxy, stop."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st
from jupyter_process import JupyterProcess, free_port
from polling import wait_for

from flakebot_magic import cli
from flakebot_magic.config import Settings
from flakebot_magic.manage.tools import TOOL_JSON_KEYS, tool_json
from flakebot_magic.records import steering
from flakebot_magic.records.inventory import Inventory, ToolRecord
from flakebot_magic.records.runlog import log_path
from flakebot_magic.server.dashboard import _tojson
from flakebot_magic.server.proxy_rules import LIST_HEADERS, TOOL_RESPONSE_HEADERS, forwarded_headers

_ECHO_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class Echo(BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.dumps({
                "method": self.command, "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": self.rfile.read(length).decode(),
            }).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Tool", "echo")
            self.send_header("Set-Cookie", "tool=1")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _answer
        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
    """
)


def _record(name: str, store: Path, **changes: object) -> ToolRecord:
    store.mkdir(parents=True, exist_ok=True)
    (store / "manifest.json").write_text(
        json.dumps(
            {
                "crate": "tinyecho",
                "version": "0.2.0",
                "checksum": "c0ffee",
                "commit": "a" * 40,
                "backend": "cargo",
            }
        )
    )
    record = ToolRecord(
        name=name,
        crate="tinyecho",
        version="0.2.0",
        binary=str(store / "bin" / "tinyecho"),
        store_path=str(store),
        source_hash="0123456789abcdef",
        checksum="c0ffee",
        checksum_kind="sha256",
        registry="dir:/r",
        workspace="",
        commit="a" * 40,
        description="Echo words",
        created=time.time(),
    )
    for key, value in changes.items():
        setattr(record, key, value)
    return record


@pytest.fixture(scope="module")
def echo() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER, str(port)], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    with httpx.Client() as client:
        while True:
            try:
                client.get(url)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    yield proc, url
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, echo: tuple[subprocess.Popen[bytes], str]) -> Settings:
    cache = tmp_path_factory.mktemp("cache")
    settings = Settings(cache_dir=cache)
    inventory = Inventory(settings.cache.tools)
    inventory.save(_record("te", cache / "store" / "te"))
    proc, url = echo
    inventory.save(
        _record(
            "web",
            cache / "store" / "web",
            kind="http",
            status="running",
            pid=proc.pid,
            url=url,
            started=time.time(),
            token="tool-secret",
        )
    )
    inventory.save(_record("gone", cache / "store" / "gone", kind="http", status="stopped", url=url))
    inventory.save(
        _record("far", cache / "store" / "far", kind="http", status="running", pid=proc.pid, url="http://192.0.2.1:80")
    )
    path = log_path(settings, "te")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("== build started\nbuild|    Compiling tinyecho v0.2.0\n== build done\n")
    inventory.update("te", log_path=str(path))
    return settings


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[JupyterProcess]:
    root = tmp_path_factory.mktemp("root")
    jupyter = JupyterProcess(root, env={"FLAKEBOT_CACHE_DIR": str(settings.cache_dir)}).start()
    yield jupyter
    jupyter.stop()


def test_extension_is_enabled_by_the_installed_config() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter_server", "extension", "list"], capture_output=True, text=True, timeout=60
    )
    listing = done.stdout + done.stderr
    assert "flakebot_magic.server" in listing and "enabled" in listing.split("flakebot_magic.server", 1)[1][:40]


@pytest.mark.parametrize(
    "path", ["/flakebot/api", "/flakebot/api/tools", "/flakebot/api/tools/te", "/flakebot/api/tools/te/logs"]
)
def test_api_without_a_token_is_forbidden(server: JupyterProcess, path: str) -> None:
    with server.client(token=False) as client:
        assert client.get(path).status_code == 403
        assert client.get(path, params={"token": "wrong"}).status_code == 403


def test_dashboard_without_a_token_goes_to_the_login_page(server: JupyterProcess) -> None:
    with server.client(token=False) as client:
        response = client.get("/flakebot/")
    assert response.status_code == 302 and "/login" in response.headers["location"]


def test_api_lists_tools_with_status_and_provenance(server: JupyterProcess) -> None:
    with server.client() as client:
        index = client.get("/flakebot/api").json()
        tools = {t["name"]: t for t in client.get("/flakebot/api/tools").json()["tools"]}
        one = client.get("/flakebot/api/tools/te").json()
        missing = client.get("/flakebot/api/tools/nope")
        listing = client.get("/flakebot/api/tools").text + client.get("/flakebot/").text
    assert "tool-secret" not in listing  # the tool's token stays with the proxy
    assert index["tools"] == "/flakebot/api/tools"
    assert set(tools) == {"far", "gone", "te", "web"}
    assert tools["web"]["status"] == "running" and tools["web"]["links"]["proxy"] == "/flakebot/proxy/web/"
    assert tools["te"]["status"] == "ready" and "proxy" not in tools["te"]["links"]
    assert one["provenance"]["crate"] == "tinyecho" and one["provenance"]["commit"] == "a" * 40
    assert missing.status_code == 404


def test_logs(server: JupyterProcess) -> None:
    with server.client() as client:
        logs = client.get("/flakebot/api/tools/te/logs").json()
        assert client.get("/flakebot/api/tools/nope/logs").status_code == 404
    assert "Compiling tinyecho" in logs["text"]


def test_dashboard_lists_the_tools(server: JupyterProcess) -> None:
    with server.client() as client:
        page = client.get("/flakebot/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    for name in ("te", "web", "gone"):
        assert f"data-name='{name}'" in page.text
    assert "Compiling tinyecho" in page.text and "/flakebot/proxy/web/" in page.text


def test_the_command_the_api_and_the_dashboard_give_one_json_shape(
    server: JupyterProcess, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    with server.client() as client:
        one = client.get("/flakebot/api/tools/te").json()
        listed = {t["name"]: t for t in client.get("/flakebot/api/tools").json()["tools"]}
        page = client.get("/flakebot/").text
    embedded = re.search(r"<script type='application/json' id='flakebot-tools'>(.*?)</script>", page, re.S)
    assert embedded is not None
    shown = {t["name"]: t for t in json.loads(embedded.group(1))}
    cache = ["--cache-dir", str(settings.cache_dir)]
    assert cli.main(["show", "te", "--json", *cache]) == 0
    command_show = json.loads(capsys.readouterr().out)
    assert cli.main(["list", "--json", *cache]) == 0
    command_list = {t["name"]: t for t in json.loads(capsys.readouterr().out)}
    record = Inventory(settings.cache.tools).get("te")
    assert record is not None
    expected = json.loads(json.dumps(tool_json(record, settings)))
    assert set(TOOL_JSON_KEYS) <= set(expected) and "token" not in expected
    for shape in (one, listed["te"], shown["te"], command_show, command_list["te"]):
        assert shape == expected
    assert set(listed) == set(shown) == set(command_list)
    for name in listed:  # an http tool's too, token left out everywhere
        assert set(listed[name]) == set(shown[name]) == set(command_list[name]) == set(expected)


_HEADER_NAMES = st.sampled_from(sorted(TOOL_RESPONSE_HEADERS)).map(
    lambda name: "".join(c.upper() if i % 2 else c for i, c in enumerate(name))
) | st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}", fullmatch=True)


def _clean(value: str) -> bool:
    return not any((ord(c) < 32 and c != "\t") or 127 <= ord(c) < 160 for c in value)


@examples(max_examples=300, deadline=None, database=None)
@given(st.lists(st.tuples(_HEADER_NAMES, st.text(max_size=20)), max_size=12))
def test_a_tool_response_header_passes_only_when_allowlisted_and_clean(headers: list[tuple[str, str]]) -> None:
    kept = dict((name.lower(), value) for name, value in forwarded_headers(headers))
    assert set(kept) <= TOOL_RESPONSE_HEADERS and len(kept) == len(forwarded_headers(headers))
    assert all(_clean(value) for value in kept.values())
    seen: set[str] = set()
    for name, value in headers:  # nothing lost: an allowlisted, clean header arrives (a later one of a list, too)
        lowered = name.lower()
        if lowered in TOOL_RESPONSE_HEADERS and _clean(value):
            if lowered not in seen:
                assert kept[lowered].startswith(value)
            else:
                assert value in kept[lowered] or lowered not in LIST_HEADERS
            seen.add(lowered)


def test_the_dashboards_json_cannot_end_its_script_element() -> None:
    hostile = [{"description": "</script><script>alert(1)</script><!-- & -->"}]
    text = str(_tojson(hostile))
    assert not set(text) & set("<>&") and json.loads(text) == hostile


def test_proxy_forwards_to_the_tool_without_jupyters_credentials(server: JupyterProcess) -> None:
    with server.client() as client:
        response = client.get("/flakebot/proxy/web/hello/there", params={"x": "1"}, headers={"X-Mine": "yes"})
        posted = client.post("/flakebot/proxy/web/submit", content=b"payload")
        root = client.get("/flakebot/proxy/web")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert "x-tool" not in response.headers  # not on the allowlist (tests/security/test_proxy_hostile_tool.py)
    # a tool sets no cookies on Jupyter's origin
    assert not any("tool=1" in c for c in response.headers.get_list("set-cookie"))
    echoed = response.json()
    assert echoed["path"] == "/hello/there?x=1" and echoed["headers"]["x-mine"] == "yes"
    # Jupyter's credentials stay behind; the tool's own token goes along
    assert echoed["headers"]["authorization"] == "Bearer tool-secret" and "cookie" not in echoed["headers"]
    assert posted.json()["body"] == "payload" and posted.json()["method"] == "POST"
    assert root.json()["path"] == "/"


def test_proxy_refuses_what_it_must(server: JupyterProcess) -> None:
    with server.client() as client:
        assert client.get("/flakebot/proxy/te/").status_code == 404  # a command-line tool
        assert client.get("/flakebot/proxy/gone/").status_code == 503  # not running
        assert client.get("/flakebot/proxy/far/").status_code == 403  # not a loopback address
        assert client.get("/flakebot/proxy/nope/").status_code == 404
    with server.client(token=False) as client:
        assert client.get("/flakebot/proxy/web/").status_code in (302, 403)


def test_post_with_the_login_cookie_but_no_xsrf_is_forbidden(server: JupyterProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        login = browser.get("/login")
        xsrf = login.cookies.get("_xsrf") or browser.cookies.get("_xsrf")
        assert xsrf
        logged_in = browser.post("/login", data={"password": server.token, "_xsrf": xsrf})
        assert logged_in.status_code == 302
        assert browser.get("/flakebot/api/tools").status_code == 200  # the cookie authenticates
        forged = browser.post("/flakebot/api/tools/te/stop")
        assert forged.status_code == 403
        cross_site = browser.post(
            "/flakebot/api/tools/te/stop", headers={"X-XSRFToken": xsrf, "Origin": "http://evil.example"}
        )
        assert cross_site.status_code == 403
        allowed = browser.post("/flakebot/api/tools/te/stop", headers={"X-XSRFToken": xsrf})
        assert allowed.status_code == 200 and "nothing to stop" in allowed.json()["message"]


#: what a browser sends of where a request comes from: (headers, whether the proxy may pass it with the login cookie)
WHERE_FROM = [
    ({"Sec-Fetch-Site": "same-origin"}, True),  # a page of Jupyter's own origin (the dashboard's "open")
    ({"Sec-Fetch-Site": "none"}, True),  # typed in the address bar, a bookmark
    ({"Sec-Fetch-Site": "cross-site"}, False),
    ({"Sec-Fetch-Site": "same-site"}, False),  # another port or subdomain is another origin
    ({"Sec-Fetch-Site": "cross-site", "Origin": "SELF", "Referer": "SELF/x"}, False),  # the browser's word wins
    ({"Origin": "SELF"}, True),  # an old browser: no fetch metadata, its Origin or Referer tells
    ({"Referer": "SELF/flakebot/"}, True),
    ({"Origin": "https://evil.example"}, False),
    ({"Referer": "https://evil.example/page"}, False),
    ({"Referer": "SELF.evil.example/page"}, False),
    ({"Origin": "null"}, False),
    ({}, False),  # says nothing of where it comes from (a page can suppress the Referer)
]


@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"])
def test_the_proxy_passes_a_cookie_request_of_any_method_only_from_jupyters_own_pages(
    server: JupyterProcess, method: str
) -> None:
    """The invariant: a request the login cookie authenticates reaches a tool (with the tool's token) only when
    it came from Jupyter's own origin, whatever its method; a request with Jupyter's token always does."""
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        login = browser.get("/login")
        xsrf = login.cookies.get("_xsrf") or browser.cookies.get("_xsrf")
        assert browser.post("/login", data={"password": server.token, "_xsrf": xsrf}).status_code == 302
        for where, passes in WHERE_FROM:
            headers = {k: v.replace("SELF", server.url.rstrip("/")) for k, v in where.items()}
            if method not in ("GET", "HEAD", "OPTIONS"):
                headers["X-XSRFToken"] = str(xsrf)  # even with it: the proxy's rule is where the request came from
            answer = browser.request(
                method, "/flakebot/proxy/web/admin/delete", params={"everything": "1"}, headers=headers
            )
            if passes and method == "HEAD":  # the echo tool answers HEAD 501: it got there
                assert answer.status_code == 501, (where, answer.status_code)
            elif passes:
                assert answer.status_code == 200, (where, answer.status_code, answer.text[:200])
                assert answer.json()["method"] == method
            else:
                assert answer.status_code == 403, (where, answer.status_code, answer.text[:200])
    with server.client() as client:  # Jupyter's token: no browser, no cookie to ride on
        answer = client.request(method, "/flakebot/proxy/web/x", headers={"Sec-Fetch-Site": "cross-site"})
        assert answer.status_code == (501 if method == "HEAD" else 200)


def test_steer_queues_a_message_for_the_running_session(server: JupyterProcess, settings: Settings) -> None:
    with steering.running(settings.cache, "te") as inbox, server.client() as client:
        sent = client.post("/flakebot/api/tools/te/steer", json={"text": "also accept --upper"})
        assert sent.status_code == 200, sent.text
        # a tool built for the first time has no record yet; its session can be steered all the same
        with steering.running(settings.cache, "fresh") as fresh:
            first = client.post("/flakebot/api/tools/fresh/steer", json={"text": "use the hex crate"})
            assert first.status_code == 200, first.text
            assert [m.text for m in fresh.take()] == ["use the hex crate"]
        messages = inbox.take()
    assert [(m.text, m.source) for m in messages] == [("also accept --upper", "api")]
    assert sent.json()["name"] == "te" and sent.json()["text"] == "also accept --upper"


def test_steer_refuses_what_it_must(server: JupyterProcess, settings: Settings) -> None:
    with server.client() as client:
        idle = client.post("/flakebot/api/tools/te/steer", json={"text": "hello"})
        unknown = client.post("/flakebot/api/tools/nope/steer", json={"text": "hello"})
        with steering.running(settings.cache, "te") as inbox:
            bad = [
                client.post("/flakebot/api/tools/te/steer", content=b"not json"),
                client.post("/flakebot/api/tools/te/steer", json={"text": ""}),
                client.post("/flakebot/api/tools/te/steer", json={"text": 5}),
                client.post("/flakebot/api/tools/te/steer", json=["hello"]),
                client.post("/flakebot/api/tools/te/steer", json={"text": "x" * (steering.MAX_MESSAGE_BYTES + 1)}),
            ]
            assert inbox.take() == []
    assert idle.status_code == 409
    assert "No edit session of 'te' is running" in idle.json()["message"] and "--resume" in idle.json()["message"]
    assert "with %%flakebot --name te" in idle.json()["message"]  # as written: tornado doubled each % (issue 21)
    assert unknown.status_code == 404
    assert [r.status_code for r in bad] == [400] * 5
    assert "limit" in bad[-1].json()["message"]


def test_steer_needs_jupyters_login_and_the_xsrf_token(server: JupyterProcess, settings: Settings) -> None:
    with steering.running(settings.cache, "te") as inbox:
        with server.client(token=False) as client:
            assert client.post("/flakebot/api/tools/te/steer", json={"text": "a"}).status_code == 403
            assert (
                client.post("/flakebot/api/tools/te/steer", params={"token": "wrong"}, json={"text": "a"}).status_code
                == 403
            )
        with httpx.Client(base_url=server.url, timeout=30) as browser:
            login = browser.get("/login")
            xsrf = login.cookies.get("_xsrf") or browser.cookies.get("_xsrf")
            assert xsrf
            assert browser.post("/login", data={"password": server.token, "_xsrf": xsrf}).status_code == 302
            forged = browser.post("/flakebot/api/tools/te/steer", json={"text": "forged"})
            wrong = browser.post(
                "/flakebot/api/tools/te/steer", json={"text": "forged"}, headers={"X-XSRFToken": "not-" + xsrf}
            )
            cross_site = browser.post(
                "/flakebot/api/tools/te/steer",
                json={"text": "forged"},
                headers={"X-XSRFToken": xsrf, "Origin": "http://evil.example"},
            )
            assert inbox.take() == []  # nothing refused got through
            allowed = browser.post(
                "/flakebot/api/tools/te/steer", json={"text": "from the page"}, headers={"X-XSRFToken": xsrf}
            )
            assert [m.text for m in inbox.take()] == ["from the page"]
    assert (forged.status_code, wrong.status_code, cross_site.status_code) == (403, 403, 403)
    assert allowed.status_code == 200


def test_stop_kills_the_recorded_process_group(
    server: JupyterProcess, settings: Settings, echo: tuple[subprocess.Popen[bytes], str]
) -> None:
    proc, _ = echo
    with server.client() as client:
        response = client.post("/flakebot/api/tools/web/stop")
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "stopped"
        assert proc.wait(timeout=10) is not None
        assert client.get("/flakebot/api/tools/web").json()["status"] == "stopped"
        assert client.get("/flakebot/proxy/web/").status_code == 503
    assert Inventory(settings.cache.tools).get("web").pid is None  # type: ignore[union-attr]


@pytest.mark.cargo
def test_proxy_reaches_a_flakebot_built_http_service(
    server: JupyterProcess, settings: Settings, tmp_path: Path
) -> None:
    """The demo-http fixture crate, built and started by the real pipeline, reached through Jupyter's auth."""
    from flakebot_magic.clients import lifecycle
    from flakebot_magic.pipeline import Pipeline
    from flakebot_magic.testing.overlay import FIXTURES, overlay_registry

    registry = overlay_registry(tmp_path / "registry", [FIXTURES / "demo-http"])
    build = Settings(cache_dir=settings.cache_dir, registry=str(registry), backend="cargo")
    tool = Pipeline(build).run("", crate="demo-http", name="svc")
    try:
        tool.start()  # type: ignore[attr-defined]
        with server.client() as client:
            listed = client.get("/flakebot/api/tools/svc").json()
            assert listed["kind"] == "http" and listed["status"] == "running" and "token" not in listed
            greeting = client.get("/flakebot/proxy/svc/greet", params={"name": "Ada"})
            assert greeting.status_code == 200, greeting.text
            assert "Ada" in greeting.json()["greeting"]
            stopped = client.post("/flakebot/api/tools/svc/stop").json()
            assert stopped["status"] == "stopped"
            assert client.get("/flakebot/proxy/svc/greet", params={"name": "Ada"}).status_code == 503
    finally:
        tool.close()  # type: ignore[attr-defined]
        lifecycle.unregister(tool)  # type: ignore[arg-type]


# -- issue 21: failed builds listed, Stop only for a running tool, "open" where the service answers ------------

_HEALTH_ONLY = textwrap.dedent(
    """
    import sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class HealthOnly(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[1])), HealthOnly).serve_forever()
    """
)


def test_the_dashboard_shows_failed_builds_stop_states_and_where_open_goes(
    server: JupyterProcess, settings: Settings
) -> None:
    from flakebot_magic.errors import Cancelled
    from flakebot_magic.events import RunFinished, StageStarted
    from flakebot_magic.records.runlog import RunLog

    log = RunLog(settings)
    log(StageStarted("build"))
    error = Cancelled("Stopped during `cargo build`.")
    log(RunFinished(ok=False, error=error))
    log.save("hex2", request="hex-encode standard input", error=error)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _HEALTH_ONLY, str(port)], start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            try:
                return httpx.get(url + "/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_for(answers, 20, "the health-only service")
        record = _record("api", settings.cache_dir / "store" / "api", kind="http", status="running")
        record.pid, record.url, record.started = proc.pid, url, time.time()
        Inventory(settings.cache.tools).save(record)
        with server.client() as client:
            listed = {t["name"]: t for t in client.get("/flakebot/api/tools").json()["tools"]}
            one = client.get("/flakebot/api/tools/hex2")
            logs = client.get("/flakebot/api/tools/hex2/logs")
            page = client.get("/flakebot/").text
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        Inventory(settings.cache.tools).remove("api")
    assert listed["hex2"]["status"] == "cancelled" and listed["hex2"]["request"] == "hex-encode standard input"
    assert set(listed["hex2"]) == set(listed["te"])  # one shape for every entry
    assert one.status_code == 200 and one.json() == listed["hex2"]
    assert logs.status_code == 200 and "its last build was cancelled" in logs.json()["text"]
    assert "<td class='status' data-status='cancelled'>cancelled</td>" in page and "Stopped during" in page
    stops = dict(re.findall(r"<button class='stop' data-name='(\w+)'( disabled)?>Stop", page))
    assert stops["gone"] == " disabled" and stops["api"] == ""  # stopped: off; running: on
    assert "te" not in stops and "hex2" not in stops  # a command-line tool or a failed build has nothing to stop
    # a service without "/": open goes to its health path; one that answers at "/" opens there
    assert "href='/flakebot/proxy/api/health'" in page
