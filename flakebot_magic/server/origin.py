"""The rules of cross-site requests: every flakebot handler refuses a cross-origin write (403, where Jupyter says
404); the proxy to http tools refuses a cross-site request of any method (a tool's GET may act, and the proxy adds
the tool's own token)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tornado import web

__all__ = ["RefuseCrossOrigin", "RefuseCrossSite"]

#: what a browser says (``Sec-Fetch-Site``) of a request a page of this very origin made, or the person typed
_OWN_SITE = ("same-origin", "none")


class RefuseCrossOrigin:
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


class RefuseCrossSite(RefuseCrossOrigin):
    """Also refuse a cross-site request of any method, GET included (403), when the login cookie authenticates it.

    Jupyter's XSRF check passes GET, HEAD and OPTIONS, so a page on any site could make the browser send them with
    the cookie. A handler that forwards them with credentials of its own (the proxy adds a tool's token) calls
    :meth:`refuse_cross_site` first. A request passes when the browser says it came from this origin or from the
    address bar (``Sec-Fetch-Site``); without that header (an old browser), when its ``Origin`` or ``Referer``
    names this server; a request that says nothing of where it came from is refused, with what to do.
    """

    def refuse_cross_site(self) -> None:
        handler: Any = self
        if handler.token_authenticated or handler.settings.get("disable_check_xsrf", False):
            return
        headers = handler.request.headers
        site = headers.get("Sec-Fetch-Site")
        if site is not None:
            if site.strip().lower() in _OWN_SITE:
                return
            raise web.HTTPError(403, "Blocking a request another site made: open the tool from the flakebot dashboard")
        said = headers.get("Origin") or headers.get("Referer")
        if not said:
            raise web.HTTPError(
                403,
                "Blocking a request that does not say where it comes from: open the tool from the flakebot "
                "dashboard in a current browser, or send Jupyter's token (Authorization: token ...)",
            )
        parts = urlsplit(said)
        if parts.scheme != handler.request.protocol or parts.netloc.lower() != handler.request.host.lower():
            raise web.HTTPError(403, "Blocking a request another site made: open the tool from the flakebot dashboard")
