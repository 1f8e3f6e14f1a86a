"""The extension's request handlers: REST API, dashboard page, authenticated proxy to http tools.

What the proxy lets through is decided in :mod:`flakebot_magic.server.proxy_rules`.

Every handler is ``@web.authenticated`` (no Jupyter login or token: 403 for
the API, the login page for pages) and ``@authorized`` on the ``flakebot``
resource. Requests that change something (POST) also pass Jupyter's XSRF
check unless they carry the token.

What they serve may quote crates, builds and tools: every string of the
API's JSON goes through :func:`flakebot_magic.untrusted.safe_data`, every
text of the dashboard through :func:`~flakebot_magic.untrusted.safe_html`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from typing import Any
from urllib.parse import urlsplit

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler, JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import httpclient, web

from .. import __version__
from ..config import Settings
from ..errors import SteeringError, StorageError, UsageError
from ..manage import tools
from ..manage.doctor import prepare
from ..records.inventory import Inventory, ToolRecord
from ..records.runlog import attempt_of
from ..records.steering import is_running
from ..untrusted import safe_data, safe_html, safe_line
from .proxy_rules import (
    HOP_BY_HOP,
    MAX_PROXY_RESPONSE,
    PRIVATE_REQUEST,
    TOOL_CSP,
    forwarded_headers,
    proxied_location,
    strip_private_query,
)

__all__ = [
    "DashboardHandler",
    "IndexHandler",
    "ProxyHandler",
    "ToolHandler",
    "ToolLogsHandler",
    "ToolSteerHandler",
    "ToolStopHandler",
    "ToolsHandler",
]


class _RefuseCrossOrigin:
    """Refuse a cross-origin write with 403 Forbidden (Jupyter's own check answers 404).

    Same rule as Jupyter's: a request authenticated by its token needs no
    further check; one authenticated by the login cookie must come from
    Jupyter's own origin and carry the XSRF token.
    """

    def check_xsrf_cookie(self) -> None:
        handler: Any = self
        if (
            hasattr(handler, "_jupyter_current_user")
            and not handler.token_authenticated
            and not handler.settings.get("disable_check_xsrf", False)
            and not handler.check_origin()
        ):
            raise web.HTTPError(403, "Blocking a cross-origin request")
        super().check_xsrf_cookie()  # type: ignore[misc]


class _API(_RefuseCrossOrigin, ExtensionHandlerMixin, APIHandler):
    auth_resource = "flakebot"

    def initialize(self, name: str, settings: Settings) -> None:
        super().initialize(name)
        self.flakebot = settings

    def _record(self, name: str) -> ToolRecord:
        try:
            record = Inventory(self.flakebot.cache.tools).get(name)
        except StorageError as exc:
            raise web.HTTPError(503, str(exc)) from None
        if record is None:
            raise web.HTTPError(404, f"no tool named {name!r}")
        return record

    def _listing(self) -> tools.ToolTable:
        """The tools and the names whose last build made no tool, after what every command does first
        (an unfinished build finished, a registry repaired)."""
        try:
            for note in prepare(self.flakebot):
                self.log.warning("flakebot: %s", note)
            return tools.table(self.flakebot)
        except StorageError as exc:
            raise web.HTTPError(503, str(exc)) from None

    def _answer(self, data: Any) -> None:
        """Finish with ``data`` as JSON, every string in it made safe to show (the dashboard shows them)."""
        self.finish(json.dumps(safe_data(data)))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Jupyter's JSON error, its ``message`` the text raised as written.

        tornado doubles every ``%`` of a message given without arguments
        (``%%flakebot`` read ``%%%%flakebot``); :meth:`HTTPError.get_message`
        is the message itself.
        """
        error = (kwargs.get("exc_info") or (None, None, None))[1]
        if not isinstance(error, web.HTTPError) or not error.get_message():
            super().write_error(status_code, **kwargs)
            return
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": error.get_message(), "reason": error.reason}))


class IndexHandler(_API):
    """``GET /flakebot/api``: what this API offers."""

    @web.authenticated
    @authorized
    def get(self) -> None:
        self._answer(
            {
                "version": __version__,
                "tools": "/flakebot/api/tools",
                "dashboard": "/flakebot/",
                "cache_dir": str(self.flakebot.cache_dir),
            }
        )


class ToolsHandler(_API):
    """``GET /flakebot/api/tools``: every tool, with status and provenance; a failed or cancelled build's name too."""

    @web.authenticated
    @authorized
    def get(self) -> None:
        # the listing the dashboard shows: the tools, and the names whose last build made no tool
        self._answer({"tools": self._listing().data})


class ToolHandler(_API):
    """``GET /flakebot/api/tools/NAME``: one tool (or, for a name whose last build made no tool, that build)."""

    @web.authenticated
    @authorized
    def get(self, name: str) -> None:
        attempt = attempt_of(self.flakebot, name) if Inventory(self.flakebot.cache.tools).get(name) is None else None
        if attempt is not None:  # a name whose last build made no tool: that build
            self._answer(tools.tool_json(attempt, self.flakebot))
            return
        self._answer(tools.tool_json(self._record(name), self.flakebot))


class ToolLogsHandler(_API):
    """``GET /flakebot/api/tools/NAME/logs[?tail=N]``: its build log (and process output when known here)."""

    @web.authenticated
    @authorized
    def get(self, name: str) -> None:
        try:
            tail = int(self.get_query_argument("tail", "500"))
        except ValueError:
            raise web.HTTPError(400, "tail must be a number") from None
        try:
            answer = tools.tool_logs(self.flakebot, name, last=tail or None)
        except UsageError as exc:
            raise web.HTTPError(404, str(exc)) from None
        self._answer(answer.data)


class ToolStopHandler(_API):
    """``POST /flakebot/api/tools/NAME/stop``: stop the tool's process."""

    @web.authenticated
    @authorized
    async def post(self, name: str) -> None:
        self._record(name)
        # stopping waits for the process to go: keep the server's loop free meanwhile
        answer = await asyncio.get_running_loop().run_in_executor(None, tools.stop_tools, self.flakebot, name)
        [stopped] = answer.data
        self._answer(stopped)


class ToolSteerHandler(_API):
    """``POST /flakebot/api/tools/NAME/steer`` with ``{"text": "..."}``: a message for NAME's running edit session.

    The session gives it to the model in its next request. 404: no such tool
    and no session building it; 409: the tool exists but no edit session of
    it runs (the message says how to start one); 400: the body is not
    ``{"text": "..."}`` or the text is refused (empty, too long). The answer
    is ``{"name", "text", "source", "queued"}``.
    """

    @web.authenticated
    @authorized
    def post(self, name: str) -> None:
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, 'the body must be JSON: {"text": "..."}') from None
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise web.HTTPError(400, 'the body must be JSON with the message: {"text": "..."}')
        try:
            answer = tools.steer(self.flakebot, name, text, source="api")
        except SteeringError as exc:
            if is_running(self.flakebot.cache_dir, name):
                raise web.HTTPError(400, str(exc)) from None  # the session runs: the text was refused
            if Inventory(self.flakebot.cache.tools).get(name) is None:
                raise web.HTTPError(404, f"no tool named {name!r}, and no edit session building it") from None
            raise web.HTTPError(409, str(exc)) from None
        except UsageError as exc:
            raise web.HTTPError(400, str(exc)) from None
        self._answer(answer.data)


# -- the dashboard ------------------------------------------------------------------


#: a log or provenance line as long as it likes scrolls inside its own box (``width:0;
#: min-width:100%``: a box that adds nothing to the table's width, then fills its cell), so
#: opening one never widens the table past the screen
_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#1f2328}
h1{font-size:20px;margin:0 0 4px} .sub{color:#57606a;margin:0 0 16px;font-size:13px}
table{border-collapse:collapse;width:100%;font-size:14px}
th{text-align:left;border-bottom:2px solid #d0d7de;padding:6px 8px}
td{border-bottom:1px solid #eaeef2;padding:6px 8px;vertical-align:top}
code{font-size:12px} pre{font-size:12px;background:#f6f8fa;padding:8px;max-height:360px;overflow:auto;margin:4px 0}
.tool-details pre{width:0;min-width:100%;box-sizing:border-box}
.tool-details div{overflow-wrap:anywhere}
.status{font-weight:600} .status[data-status=ready],.status[data-status=running]{color:#1a7f37}
.status[data-status=stopped]{color:#57606a} .status[data-status=failed]{color:#cf222e}
.status[data-status=cancelled]{color:#9a6700} button:disabled{cursor:default}
details summary{cursor:pointer;color:#0969da;font-size:13px} button{cursor:pointer}
.empty{color:#57606a;padding:24px 0}
"""

_SCRIPT = """
const xsrf = document.querySelector('meta[name=xsrf]').content;
async function stopTool(button, name) {
  button.disabled = true;
  const r = await fetch(`${API}/${encodeURIComponent(name)}/stop`,
                        {method: 'POST', headers: {'X-XSRFToken': xsrf}, credentials: 'same-origin'});
  const body = await r.json().catch(() => ({}));
  document.querySelector(`tr.tool[data-name="${name}"] .message`).textContent = body.message || r.statusText;
  refresh();
}
async function refresh() {
  const r = await fetch(API, {credentials: 'same-origin'});
  if (!r.ok) return;
  const names = [];
  for (const tool of (await r.json()).tools) {
    names.push(tool.name);
    const cell = document.querySelector(`tr.tool[data-name="${tool.name}"] .status`);
    if (cell) { cell.textContent = tool.status; cell.dataset.status = tool.status; }
    const stop = document.querySelector(`tr.tool[data-name="${tool.name}"] button.stop`);
    if (stop) { stop.disabled = tool.status !== 'running'; }
  }
  const shown = JSON.parse(document.getElementById('flakebot-tools').textContent).map(tool => tool.name);
  if (names.join() !== shown.join()) location.reload();
}
setInterval(refresh, 5000);
"""


def _script_json(data: Any) -> str:
    """JSON to put inside a ``<script>`` element: no ``<``, ``>`` or ``&`` can end it or open a comment."""
    return json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class DashboardHandler(_RefuseCrossOrigin, ExtensionHandlerMixin, JupyterHandler):
    """``GET /flakebot/``: the tools with status, provenance and logs, and Stop buttons."""

    auth_resource = "flakebot"

    def initialize(self, name: str, settings: Settings) -> None:
        super().initialize(name)
        self.flakebot = settings

    async def _entry(self, tool: dict[str, Any]) -> str:
        """Where an http tool's "open" goes: its root when that answers, else its health path (which must)."""
        record = Inventory(self.flakebot.cache.tools).get(tool["name"])
        if record is None or not record.url or tools.status_of(record) != "running":
            return "/"
        health = getattr(getattr(tools.tool_of(record, self.flakebot), "contract", None), "health", "/health")
        headers = {"Authorization": f"Bearer {record.token}"} if record.token else {}
        client = httpclient.AsyncHTTPClient(force_instance=True)
        try:
            answer = await client.fetch(
                record.url.rstrip("/") + "/", headers=headers, request_timeout=2.0, raise_error=False
            )
        except Exception:  # not answering: the health path is the safer link
            return health
        finally:
            client.close()
        return "/" if 0 < answer.code < 400 else health

    @web.authenticated
    @authorized
    async def get(self) -> None:
        base = self.base_url.rstrip("/")
        listing = tools.table(self.flakebot)
        shown = safe_data(listing.data)  # each tool as tools.tool_json (a failed build as its attempt): the API's shape
        entries = await asyncio.gather(*(self._entry(tool) for tool in shown if "proxy" in tool["links"]))
        entry = dict(zip([tool["name"] for tool in shown if "proxy" in tool["links"]], entries, strict=True))
        e = safe_html
        rows = []
        for tool in shown:
            name, status = tool["name"], tool["status"]
            try:
                log = tools.logs(self.flakebot, name, last=200)
            except UsageError:
                log = ""
            actions = []
            if "proxy" in tool["links"]:
                path = tool["links"]["proxy"].rstrip("/") + entry[name]
                actions.append(f"<a href='{e(base + path)}' title='{e(entry[name])}'>open</a>")
            if tool["kind"] in ("http", "mcp"):
                # a stopped tool has nothing to stop: the button says so by being off
                off = "" if status == "running" else " disabled"
                actions.append(f"<button class='stop' onclick=\"stopTool(this, '{e(name)}')\"{off}>Stop</button>")
            started = tool["started"] or tool["created"]
            details = tool["provenance"] or {k: tool[k] for k in ("request", "workspace", "log_path")}
            rows.append(
                f"<tr class='tool' data-name='{e(name)}'>"
                f"<td><b>{e(name)}</b></td><td>{e(tool['kind'])}</td>"
                f"<td><code>{e(tool['crate'])}{'@' + e(tool['version']) if tool['version'] else ''}</code></td>"
                f"<td><code>{e(tool['source_hash'][:12])}</code></td><td>{e(tool['backend'])}</td>"
                f"<td class='status' data-status='{e(status)}'>{e(status)}</td>"
                f"<td>{e(time.strftime('%Y-%m-%d %H:%M', time.localtime(started))) if started else ''}</td>"
                f"<td>{' '.join(actions)} <span class='message'></span></td></tr>"
                f"<tr class='tool-details' data-name='{e(name)}'><td colspan='8'>"
                f"<div>{e(tool['description'])}</div>"
                f"<details><summary>{'provenance' if tool['provenance'] else 'the build'}</summary>"
                f"<pre>{e(json.dumps(details, indent=2))}</pre></details>"
                f"<details><summary>log</summary><pre>{e(log)}</pre></details></td></tr>"
            )
        body = (
            "<table><thead><tr><th>name</th><th>kind</th><th>crate@version</th><th>hash</th><th>backend</th>"
            "<th>status</th><th>started</th><th></th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
            if rows
            else "<p class='empty'>No tools yet. Build one in a notebook with <code>%%flakebot</code>.</p>"
        )
        api = json.dumps(f"{base}/flakebot/api/tools")
        tools_count, failed = len(listing.records), len(listing.attempts)
        counted = f"{tools_count} tool{'' if tools_count == 1 else 's'}" + (
            f", {failed} build{'' if failed == 1 else 's'} that made none" if failed else ""
        )
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            "<!doctype html><html><head><meta charset='utf-8'><title>flakebot tools</title>"
            f"<meta name='xsrf' content='{e(self.xsrf_token.decode() if isinstance(self.xsrf_token, bytes) else self.xsrf_token)}'>"
            f"<style>{_STYLE}</style></head><body>"
            f"<h1>flakebot tools</h1><p class='sub'>{counted} · registry "
            f"<code>{e(str(self.flakebot.cache.tools))}</code> · flakebot-magic {e(__version__)}</p>"
            f"{body}<script type='application/json' id='flakebot-tools'>{_script_json(shown)}</script>"
            f"<script>const API = {api};{_SCRIPT}</script></body></html>"
        )


# -- the proxy ------------------------------------------------------------------------


def _is_loopback(host: str | None) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class ProxyHandler(_RefuseCrossOrigin, ExtensionHandlerMixin, JupyterHandler):
    """``/flakebot/proxy/NAME/PATH``: an http tool's service, behind Jupyter's login.

    Only tools that listen on a loopback address are proxied. Jupyter's
    credentials never reach the tool: its cookies, ``Authorization`` and XSRF
    headers, the ``Referer`` and the ``token``/``_xsrf`` query parameters are
    not passed on; the tool's own token (recorded by the kernel that started
    it) is added. What the tool answers is untrusted: it is served with
    ``Content-Security-Policy: sandbox`` (its HTML runs in a unique origin,
    without scripts, so it cannot drive Jupyter's API), with only the headers
    of :data:`TOOL_RESPONSE_HEADERS` (:func:`forwarded_headers`: no cookies,
    CORS grants, ``Refresh``, ``Link`` ...) and the standard reason phrase, no
    off-site redirect (a ``Location`` stays under the proxy's prefix or is
    dropped), and at most ``max_response`` bytes (the ``proxy_max_bytes``
    setting, default :data:`MAX_PROXY_RESPONSE`).
    """

    auth_resource = "flakebot"
    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    def initialize(self, name: str, settings: Settings, timeout: float, max_response: int = MAX_PROXY_RESPONSE) -> None:
        super().initialize(name)
        self.flakebot = settings
        self.timeout = timeout
        self.max_response = max_response

    async def _forward(self, name: str, path: str | None) -> None:
        record = Inventory(self.flakebot.cache.tools).get(name)
        if record is None:
            raise web.HTTPError(404, f"no tool named {name!r}")
        if record.kind != "http" or not record.url:
            raise web.HTTPError(404, f"{name} is not an http tool")
        target = urlsplit(record.url)
        if target.scheme != "http" or not _is_loopback(target.hostname):
            raise web.HTTPError(403, f"{name} does not listen on a loopback address")
        if tools.status_of(record) != "running":
            raise web.HTTPError(503, f"{name} is not running; start it from its notebook")
        url = record.url.rstrip("/") + (path or "/")
        query = strip_private_query(self.request.query)
        if query:
            url += "?" + query
        headers = {
            k: v
            for k, v in self.request.headers.get_all()
            if k.lower() not in HOP_BY_HOP and k.lower() not in PRIVATE_REQUEST
        }
        headers["Accept-Encoding"] = "identity"  # the size cap counts what the browser gets
        if record.token:  # a flakebot http tool answers only requests that carry its token
            headers["Authorization"] = f"Bearer {record.token}"
        method = self.request.method or "GET"
        declared: list[int] = []
        chunks: list[bytes] = []
        received = 0

        def on_header(line: str) -> None:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length" and value.strip().isdigit():
                declared.append(int(value.strip()))

        def on_chunk(chunk: bytes) -> None:
            nonlocal received
            received += len(chunk)
            chunks.append(chunk)

        request = httpclient.HTTPRequest(
            url,
            method=method,
            headers=headers,
            body=self.request.body if method in ("POST", "PUT", "PATCH") else None,
            follow_redirects=False,
            decompress_response=False,
            allow_nonstandard_methods=True,
            request_timeout=self.timeout,
            header_callback=on_header,
            streaming_callback=on_chunk,
        )
        # its own client: the body limit is this proxy's (the connection is cut past it), not the
        # server's shared client's
        client = httpclient.AsyncHTTPClient(force_instance=True, max_body_size=self.max_response)
        try:
            response = await client.fetch(request, raise_error=False)
        except Exception as exc:  # the tool cut the connection, timed out, or passed the limit
            if received >= self.max_response or any(size > self.max_response for size in declared):
                raise web.HTTPError(
                    502,
                    f"{name}'s answer is larger than {self.max_response // (1024 * 1024)} MiB; it was not passed on",
                ) from None
            raise web.HTTPError(502, f"{name} did not answer: {safe_line(str(exc))}") from None
        finally:
            client.close()
        if response.code == 599:
            raise web.HTTPError(502, f"{name} did not answer: {safe_line(str(response.error))}")
        self.set_status(response.code)  # the standard reason phrase, not the tool's words
        self.clear_header("Content-Type")
        for key, value in forwarded_headers(list(response.headers.get_all())):
            self.set_header(key, value)
        location = response.headers.get("Location")
        if location is not None:
            prefix = f"{self.base_url.rstrip('/')}/flakebot/proxy/{name}"
            safe = proxied_location(location, prefix, self.request.path)
            if safe is not None:
                self.set_header("Location", safe)
        self.set_header("Content-Security-Policy", TOOL_CSP)
        self.set_header("X-Content-Type-Options", "nosniff")
        if method != "HEAD":
            for chunk in chunks:
                self.write(chunk)
        self.finish()

    @web.authenticated
    @authorized
    async def get(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    @authorized
    async def head(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    @authorized
    async def post(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    @authorized
    async def put(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    @authorized
    async def patch(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    @authorized
    async def delete(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    @authorized
    async def options(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)
