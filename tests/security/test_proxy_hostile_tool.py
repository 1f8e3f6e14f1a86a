"""Attacks through Jupyter's proxy by a hostile http tool, in a real ``jupyter server``.

The tool serves HTML with a script (it would run on Jupyter's origin and
drive the kernel API), grants itself CORS, sets cookies, redirects the browser
off-site (an open redirect on Jupyter's host), answers with more than the cap,
and logs every request it gets, to collect Jupyter's token. The proxy must
sandbox its pages, drop what it may not set, keep redirects under the proxy,
refuse the oversized answer, and never pass on Jupyter's credentials.

The response headers are an allowlist (issue 19: ``Refresh: 0; url=`` passed,
an off-site redirect, and ``Clear-Site-Data``, ``Link``,
``Service-Worker-Allowed``): the tool sends every header of a long list (what
browsers obey today, hop-by-hop ones, random names, odd spellings) and
exactly the allowlisted ones arrive, each with the tool's value.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from jupyter_process import JupyterProcess, free_port

from flakebot_magic.config import Settings
from flakebot_magic.records.inventory import Inventory, ToolRecord
from flakebot_magic.server.proxy_rules import TOOL_RESPONSE_HEADERS

#: response headers a tool might send: what browsers obey on an origin (storage, workers, redirects,
#: preloads, reporting, cross-origin grants, authentication prompts), hop-by-hop and server-set ones,
#: and what only some servers use; the allowlist's own are among them
_KNOWN = """
Set-Cookie Set-Cookie2 Clear-Site-Data Service-Worker-Allowed Service-Worker Strict-Transport-Security
Public-Key-Pins Public-Key-Pins-Report-Only Expect-CT Alt-Svc Accept-CH Accept-CH-Lifetime Critical-CH
Origin-Agent-Cluster Origin-Trial Supports-Loading-Mode Speculation-Rules No-Vary-Search Set-Login
Permissions-Policy Feature-Policy Document-Policy Require-Document-Policy Document-Isolation-Policy
Content-Security-Policy Content-Security-Policy-Report-Only X-Content-Security-Policy X-WebKit-CSP
Cross-Origin-Opener-Policy Cross-Origin-Embedder-Policy Cross-Origin-Resource-Policy
Cross-Origin-Opener-Policy-Report-Only Cross-Origin-Embedder-Policy-Report-Only
Access-Control-Allow-Origin Access-Control-Allow-Credentials Access-Control-Allow-Headers
Access-Control-Allow-Methods Access-Control-Expose-Headers Access-Control-Max-Age
Access-Control-Allow-Private-Network Timing-Allow-Origin Report-To Reporting-Endpoints NEL
Refresh Link Location Content-Location SourceMap X-SourceMap X-Frame-Options X-XSS-Protection
X-Content-Type-Options X-DNS-Prefetch-Control X-Download-Options X-Permitted-Cross-Domain-Policies
X-Robots-Tag X-UA-Compatible Referrer-Policy WWW-Authenticate Proxy-Authenticate Authentication-Info
Proxy-Authentication-Info Server Date Via Warning Age Server-Timing Trailer Upgrade Keep-Alive
Observe-Browsing-Topics Activate-Storage-Access Attribution-Reporting-Register-Source
Attribution-Reporting-Register-Trigger Ad-Auction-Allowed Tk Digest Content-Digest Repr-Digest
Want-Digest Content-MD5 X-Powered-By X-Request-Id X-Tool P3P Large-Allocation Signature
Signature-Input Content-Base Content-Script-Type Content-Style-Type Default-Style Window-Target
X-Accel-Redirect X-Sendfile X-Accel-Buffering Status Ping-From Ping-To Link-Template Sec-WebSocket-Accept
Content-Type Content-Encoding Content-Language Content-Disposition Content-Range Cache-Control
Expires Pragma ETag Last-Modified Vary Accept-Ranges Allow Retry-After
"""
KNOWN_HEADERS = _KNOWN.split()


def _hostile_headers() -> list[tuple[str, str]]:
    """Every known header, odd spellings of some, and random names; each value marked ``tool-sent``."""
    rng = random.Random(19)
    names = [*KNOWN_HEADERS, "sEt-CoOkIe", "REFRESH", "link", "Clear-site-data", "Vary"]
    names += ["X-" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz-") for _ in range(12)) for _ in range(40)]
    names += ["".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(8)) for _ in range(10)]
    values = {
        "refresh": "0; url=http://evil.example/tool-sent",
        "link": "<http://evil.example/x.css>; rel=stylesheet; tool-sent",
        "location": "http://evil.example/tool-sent",
        "content-type": "text/plain; tool-sent=1",
        "etag": '"tool-sent"',
    }
    return [(name, values.get(name.lower(), f"tool-sent-{i}")) for i, name in enumerate(names)]


_HOSTILE = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    LOG = sys.argv[2]
    HEADERS = json.load(open(sys.argv[3]))

    class Hostile(BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            body_in = self.rfile.read(length).decode(errors="replace")
            with open(LOG, "a") as log:  # everything the tool ever sees
                log.write(json.dumps({"path": self.path, "headers": dict(self.headers.items()), "body": body_in}) + "\\n")
            path = self.path.split("?")[0]
            if path.startswith("/go/"):
                self.send_response(302)
                self.send_header("Location", {"off": "http://evil.example/", "scheme": "//evil.example/x",
                                              "slash": "/\\\\evil.example", "inside": "/after?x=1",
                                              "relative": "next", "up": "../../../api/kernels"}[path[4:]])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path in ("/headers", "/plain"):
                body = b"headers"
                self.send_response(200)
                for name, value in (HEADERS if path == "/headers" else []):
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if path == "/ctl":  # escape sequences in an allowlisted header and in the reason phrase
                self.send_response(200, "OK \x1b]0;pwned\x07")
                self.send_header("Content-Language", "en\x1b]52;c;ZXZpbA==\x07")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                return
            if path == "/big":
                self.send_response(200)
                self.send_header("Content-Length", str(3 * 1024 * 1024))
                self.end_headers()
                try:
                    for _ in range(3):
                        self.wfile.write(b"b" * (1024 * 1024))
                except OSError:
                    pass
                return
            body = (b"<html><body><script>fetch('/api/kernels', {method: 'POST'})</script>"
                    b"<p>hello</p></body></html>")
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Security-Policy", "script-src *")
            self.send_header("Access-Control-Allow-Origin", "http://evil.example")
            self.send_header("Access-Control-Allow-Credentials", "true")
            self.send_header("Set-Cookie", "username-127-0-0-1=stolen; Path=/")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        do_GET = do_POST = _answer
        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[1])), Hostile).serve_forever()
    """
)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    log = tmp_path_factory.mktemp("hostile") / "requests.jsonl"
    log.touch()
    headers = log.parent / "headers.json"
    headers.write_text(json.dumps(_hostile_headers()))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _HOSTILE, str(port), str(log), str(headers)], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    with httpx.Client() as client:
        while True:
            try:
                client.get(url + "/ready")
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
    yield proc, url, log
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, hostile: tuple[subprocess.Popen[bytes], str, Path]
) -> Iterator[JupyterProcess]:
    proc, url, _ = hostile
    cache = tmp_path_factory.mktemp("cache")
    settings = Settings(cache_dir=cache)
    store = cache / "store" / "evil"
    store.mkdir(parents=True)
    (store / "manifest.json").write_text(json.dumps({"crate": "evil", "version": "0.1.0", "backend": "cargo"}))
    Inventory(settings.cache.tools).save(
        ToolRecord(
            name="evil",
            crate="evil",
            version="0.1.0",
            binary=str(store / "bin" / "evil"),
            store_path=str(store),
            source_hash="0" * 16,
            checksum="",
            checksum_kind="",
            registry="dir:/r",
            workspace="",
            commit="",
            description="A hostile service",
            created=time.time(),
            kind="http",
            status="running",
            pid=proc.pid,
            url=url,
            started=time.time(),
            token="the-tools-own-token",
        )
    )
    root = tmp_path_factory.mktemp("root")
    jupyter = JupyterProcess(root, env={"FLAKEBOT_CACHE_DIR": str(cache)})
    config = Path(jupyter.env["JUPYTER_CONFIG_DIR"])
    config.mkdir(parents=True, exist_ok=True)
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"FlakebotExtension": {"proxy_max_bytes": 1024 * 1024}})
    )
    jupyter.start()
    yield jupyter
    jupyter.stop()


def test_a_tools_html_is_sandboxed_and_sets_nothing_on_jupyters_origin(server: JupyterProcess) -> None:
    with server.client() as client:
        page = client.get("/flakebot/proxy/evil/")
    assert page.status_code == 200 and "<script>" in page.text  # served, but ...
    policies = page.headers.get_list("content-security-policy")
    assert policies == ["sandbox; frame-ancestors 'self'"]  # ... in a unique origin, without scripts
    assert page.headers["x-content-type-options"] == "nosniff"
    # no cross-origin grant of the tool's (Jupyter's own, for token-authenticated requests, may stay)
    assert "evil.example" not in page.headers.get("access-control-allow-origin", "")
    assert "access-control-allow-credentials" not in page.headers
    assert not any("stolen" in c for c in page.headers.get_list("set-cookie"))


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ("off", None),
        ("scheme", None),
        ("slash", None),
        ("up", None),
        ("inside", "/flakebot/proxy/evil/after?x=1"),
        ("relative", "/flakebot/proxy/evil/go/next"),
    ],
)
def test_redirects_stay_under_the_proxy(server: JupyterProcess, where: str, expected: str | None) -> None:
    with server.client() as client:
        answer = client.get(f"/flakebot/proxy/evil/go/{where}")
    assert answer.status_code == 302
    assert answer.headers.get("location") == expected
    assert answer.headers["content-security-policy"].startswith("sandbox")


def test_jupyters_credentials_never_reach_the_tool(
    server: JupyterProcess, hostile: tuple[subprocess.Popen[bytes], str, Path]
) -> None:
    _, _, log = hostile
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        # a browser that logged in with ?token= (the URL Jupyter prints) and holds its cookies
        assert browser.get("/tree", params={"token": server.token}).status_code in (200, 302, 404)
        cookie_names = list(browser.cookies.keys())
        got = browser.get(
            "/flakebot/proxy/evil/page",
            params={"token": server.token, "x": "1", "_xsrf": "jupyters-xsrf"},
            headers={"Referer": f"{server.url}/lab?token={server.token}", "X-XSRFToken": "jupyters-xsrf"},
        )
        assert got.status_code == 200
        posted = browser.post(
            f"/flakebot/proxy/evil/form?token={server.token}",
            headers={"Authorization": f"token {server.token}"},
            content=b"field=1",
        )
        assert posted.status_code == 200
    seen = log.read_text()
    assert seen  # the tool did get the requests ...
    assert server.token not in seen  # ... but never Jupyter's token: not in the query, a header or a cookie
    assert "jupyters-xsrf" not in seen
    requests = [json.loads(line) for line in seen.splitlines()]
    page = next(r for r in requests if r["path"].startswith("/page"))
    assert page["path"] == "/page?x=1"
    headers = {k.lower(): v for k, v in page["headers"].items()}
    assert headers["authorization"] == "Bearer the-tools-own-token"
    assert "cookie" not in headers and "referer" not in headers
    assert not any(name in json.dumps(requests) for name in cookie_names if name.startswith("username"))


def test_an_answer_past_the_cap_is_refused(server: JupyterProcess) -> None:
    with server.client() as client:
        answer = client.get("/flakebot/proxy/evil/big")
    assert answer.status_code == 502
    assert len(answer.content) < 1024 * 1024


def test_only_allowlisted_response_headers_reach_the_browser(server: JupyterProcess) -> None:
    with server.client() as client:
        plain = client.get("/flakebot/proxy/evil/plain")  # what Jupyter itself sends around a tool's answer
        answer = client.get("/flakebot/proxy/evil/headers")
    assert answer.status_code == 200 and answer.content == b"headers"
    sent = _hostile_headers()
    arrived = {name.lower() for name, value in answer.headers.multi_items() if "tool-sent" in value}
    allowed_sent = {name.lower() for name, _ in sent} & TOOL_RESPONSE_HEADERS
    # the property, over the whole header set: a header of the tool's arrives if and only if it is allowed
    assert arrived == allowed_sent
    for name, value in sent:  # ... with the tool's value (list headers given twice, joined)
        if name.lower() in TOOL_RESPONSE_HEADERS:
            assert value in answer.headers[name]
    # the rest is Jupyter's own: the same names it sends around any answer, and the proxy's policy
    own = {name.lower() for name, value in answer.headers.multi_items() if "tool-sent" not in value}
    assert own <= {name.lower() for name in plain.headers} | {"etag"}
    assert answer.headers.get_list("content-security-policy") == ["sandbox; frame-ancestors 'self'"]
    for dangerous in ("refresh", "clear-site-data", "link", "service-worker-allowed", "set-cookie", "location"):
        assert all("tool-sent" not in value for value in answer.headers.get_list(dangerous))


def test_control_characters_in_a_tools_status_line_or_headers_never_reach_the_browser(server: JupyterProcess) -> None:
    with server.client() as client:
        answer = client.get("/flakebot/proxy/evil/ctl")
    raw = "\n".join([answer.reason_phrase, *(f"{k}: {v}" for k, v in answer.headers.multi_items()), answer.text])
    assert "\x1b" not in raw and "\x07" not in raw and "ZXZpbA" not in raw
    assert answer.status_code in (200, 502)  # dropped, or refused whole (tornado's client does): never a 500
