"""The authenticated proxy to http tools: ``/flakebot/proxy/NAME/PATH``, behind Jupyter's login.

What it lets through (headers, redirects, sizes) is decided in
:mod:`flakebot_magic.server.proxy_rules`.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import httpclient, web

from ..clients.kinds import proxied
from ..config import Settings
from ..manage import tools
from ..records.inventory import Inventory
from ..untrusted import safe_line
from .origin import RefuseCrossSite
from .proxy_rules import (
    HOP_BY_HOP,
    MAX_PROXY_RESPONSE,
    PRIVATE_REQUEST,
    TOOL_CSP,
    forwarded_headers,
    proxied_location,
    strip_private_query,
)

__all__ = ["ProxyHandler"]


def _is_loopback(host: str | None) -> bool:
    if host in ("localhost",):
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


class ProxyHandler(RefuseCrossSite, ExtensionHandlerMixin, JupyterHandler):
    """``/flakebot/proxy/NAME/PATH``: an http tool's service, behind Jupyter's login.

    Only tools that listen on a loopback address are proxied. Jupyter's
    credentials never reach the tool: its cookies, ``Authorization`` and XSRF
    headers, the ``Referer`` and the ``token``/``_xsrf`` query parameters are
    not passed on; the tool's own token (recorded by the kernel that started
    it) is added, so a request another site made is refused whatever its method
    (:class:`~flakebot_magic.server.origin.RefuseCrossSite`). What the tool answers is untrusted: it is served with
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
        self.refuse_cross_site()  # any method: the tool's token is added below
        record = Inventory(self.flakebot.cache.tools).get(name)
        if record is None:
            raise web.HTTPError(404, f"no tool named {name!r}")
        if not proxied(record.kind):
            raise web.HTTPError(404, f"{name} is not an http tool")
        if not record.url:  # stopped, or running confined: reached only through the socket of its kernel
            raise web.HTTPError(503, f"{name} is not running where the proxy can reach it; start it from its notebook")
        target = urlsplit(record.url)
        if target.scheme != "http" or not _is_loopback(target.hostname):
            raise web.HTTPError(403, f"{name} does not listen on a loopback address")
        if tools.status_of(record) != "running":
            raise web.HTTPError(503, f"{name} is not running; start it from its notebook")
        url, headers = self._outgoing(record.url, record.token, path)
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

    def _outgoing(self, base: str, token: str, path: str | None) -> tuple[str, dict[str, str]]:
        """The URL and headers of the request passed on: Jupyter's credentials left out, the tool's token added."""
        url = base.rstrip("/") + (path or "/")
        query = strip_private_query(self.request.query)
        if query:
            url += "?" + query
        headers = {
            k: v
            for k, v in self.request.headers.get_all()
            if k.lower() not in HOP_BY_HOP and k.lower() not in PRIVATE_REQUEST
        }
        headers["Accept-Encoding"] = "identity"  # the size cap counts what the browser gets
        if token:  # a flakebot http tool answers only requests that carry its token
            headers["Authorization"] = f"Bearer {token}"
        return url, headers

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
