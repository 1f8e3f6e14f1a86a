"""What crosses the proxy to an http tool: which request headers and query parameters stay with Jupyter, which response headers a tool may send (an allowlist), where a ``Location`` may point."""

from __future__ import annotations

import posixpath
from urllib.parse import unquote_plus, urlsplit

from ..untrusted import is_safe

__all__ = [
    "HOP_BY_HOP",
    "LIST_HEADERS",
    "MAX_PROXY_RESPONSE",
    "PRIVATE_REQUEST",
    "TOOL_CSP",
    "TOOL_RESPONSE_HEADERS",
    "forwarded_headers",
    "proxied_location",
    "strip_private_query",
]


#: request headers that belong to one hop, never forwarded
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "content-length",
}
#: Jupyter's credentials stay with Jupyter (the Referer may carry ``?token=``)
PRIVATE_REQUEST = {"host", "cookie", "authorization", "x-xsrftoken", "x-xsrf-token", "referer"}
#: query parameters that are Jupyter's credentials, never the tool's
_PRIVATE_QUERY = {"token", "_xsrf"}
#: the response headers a tool's answer keeps through the proxy: what its body is, how this one URL
#: may be cached, what the resource allows. Every other header is dropped, known or not: a header
#: on Jupyter's origin can act on the whole origin (Set-Cookie, Clear-Site-Data, Service-Worker-
#: Allowed, Strict-Transport-Security, Alt-Svc, Accept-CH), load or run things (Link, Refresh,
#: SourceMap), grant other origins access (Access-Control-*, Cross-Origin-*, Timing-Allow-Origin)
#: or report to them (Report-To, NEL, Reporting-Endpoints); whatever browsers obey next is not
#: on the list either. ``Location`` has a rule of its own (:func:`proxied_location`).
TOOL_RESPONSE_HEADERS = frozenset(
    {
        "content-type",
        "content-encoding",
        "content-language",
        "content-disposition",
        "content-range",
        "cache-control",
        "expires",
        "pragma",
        "etag",
        "last-modified",
        "vary",
        "accept-ranges",
        "allow",
        "retry-after",
    }
)
#: of those, the ones that are lists: several lines of one join into one (RFC 9110, 5.3); of the
#: others only the first counts
LIST_HEADERS = frozenset({"content-encoding", "content-language", "cache-control", "pragma", "vary", "allow"})
#: what every tool response served on Jupyter's origin carries: the page is sandboxed (a unique
#: origin, no scripts), so a tool's HTML cannot use Jupyter's session; only Jupyter may frame it
TOOL_CSP = "sandbox; frame-ancestors 'self'"
#: the largest tool response the proxy passes on
MAX_PROXY_RESPONSE = 64 * 1024 * 1024


def forwarded_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The response headers of a tool's answer that reach the browser: only :data:`TOOL_RESPONSE_HEADERS`.

    A value with a control character is dropped; a list header given on
    several lines becomes one, a single-valued one keeps its first line.

    >>> forwarded_headers([("Content-Type", "text/html"), ("Refresh", "0; url=http://evil.example/"),
    ...     ("Vary", "Accept"), ("vary", "Origin"), ("Set-Cookie", "a=1"), ("ETag", '"x\\x1b"')])
    [('Content-Type', 'text/html'), ('Vary', 'Accept, Origin')]
    """
    kept: dict[str, tuple[str, str]] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered not in TOOL_RESPONSE_HEADERS or not is_safe(value) or "\n" in value:
            continue
        if lowered not in kept:
            kept[lowered] = (name, value)
        elif lowered in LIST_HEADERS:
            kept[lowered] = (kept[lowered][0], f"{kept[lowered][1]}, {value}")
    return list(kept.values())


def strip_private_query(query: str) -> str:
    """``query`` without Jupyter's ``token`` and ``_xsrf`` parameters; the rest byte for byte.

    >>> strip_private_query("x=1&token=abc&y=a%20b")
    'x=1&y=a%20b'
    """
    kept = [part for part in query.split("&") if unquote_plus(part.split("=", 1)[0]) not in _PRIVATE_QUERY]
    return "&".join(part for part in kept if part)


def proxied_location(location: str, prefix: str, request_path: str) -> str | None:
    """Where a tool's redirect may send the browser: a path under ``prefix``, else None (dropped).

    ``prefix`` is the proxy's path for the tool (``/flakebot/proxy/NAME``);
    ``request_path`` the path the browser asked for. Absolute and
    scheme-relative URLs are dropped (an open redirect), a path-absolute one
    is put under the prefix, a relative one is resolved against the request
    and kept only if it stays under the prefix.

    >>> proxied_location("/login", "/flakebot/proxy/web", "/flakebot/proxy/web/a")
    '/flakebot/proxy/web/login'
    >>> proxied_location("http://evil.example/", "/flakebot/proxy/web", "/flakebot/proxy/web/") is None
    True
    """
    location = location.strip()
    if not location or any(c in location for c in "\\\r\n\t") or any(ord(c) < 32 for c in location):
        return None
    parts = urlsplit(location)
    if parts.scheme or parts.netloc or location.startswith("//"):
        return None
    if parts.path.startswith("/"):
        path = prefix.rstrip("/") + parts.path
    elif parts.path:
        path = posixpath.join(posixpath.dirname(request_path), parts.path)
    else:
        path = request_path
    trailing = "/" if path.endswith("/") else ""
    path = posixpath.normpath(path) + trailing
    path = path.replace("//", "/")
    root = prefix.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    return path + (f"?{parts.query}" if parts.query else "") + (f"#{parts.fragment}" if parts.fragment else "")
