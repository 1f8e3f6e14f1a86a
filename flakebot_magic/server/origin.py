"""The rule every flakebot handler holds a write to: no cross-origin request passes (403, where Jupyter says 404)."""

from __future__ import annotations

from typing import Any

from tornado import web

__all__ = ["RefuseCrossOrigin"]


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
