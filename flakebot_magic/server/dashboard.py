"""The dashboard page, ``/flakebot/``: the tools with status, provenance and logs, and Stop buttons.

The page is the Jinja2 templates in ``templates/`` (package data: HTML, CSS
and JS in files of their own, as jupyter_server's ``examples/simple`` keeps
them); this module only gathers what they show. Everything shown may quote
crates, builds and tools, so the environment decides safety once for every
value: its ``finalize`` makes each string safe to show
(:func:`~flakebot_magic.untrusted.safe_text`: control, escape and bidi
characters replaced), then autoescape HTML-escapes it, quotes included (the
templates single-quote every attribute); data for the page's script goes
through ``tojson``, which cannot end its ``<script>`` element.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import jinja2
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from markupsafe import Markup
from tornado import httpclient, web

from .._version import __version__
from ..clients.kinds import is_server
from ..config import Settings
from ..errors import UsageError
from ..manage import tools
from ..records.inventory import Inventory
from ..records.provenance import shown_fields
from ..untrusted import safe_data, safe_text
from .origin import RefuseCrossOrigin

__all__ = ["TEMPLATES", "DashboardHandler", "DashboardRow", "render_dashboard", "templates"]

#: the package-data directory (of ``flakebot_magic.server``) that holds the page's templates
TEMPLATES = "templates"


def _shown(value: Any) -> Any:
    """Every ``{{ value }}`` of a template: a string made safe to show; markup the templates made (``tojson``)
    as it is. Autoescape escapes what this returns."""
    if isinstance(value, Markup):
        return value
    return safe_text(value) if isinstance(value, str) else value


def _tojson(value: Any) -> Markup:
    """Jinja's ``tojson`` (no ``<``, ``>``, ``&`` or ``'`` left to end a script element or an attribute) of the
    data made safe to show first, as every other value is."""
    return jinja2.utils.htmlsafe_json_dumps(safe_data(value))


@cache
def templates() -> jinja2.Environment:
    """The templates, read from the installed package (``importlib.resources``: a wheel's package data)."""
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("flakebot_magic.server", TEMPLATES),
        autoescape=True,
        finalize=_shown,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    environment.filters["tojson"] = _tojson
    return environment


@dataclass(frozen=True)
class DashboardRow:
    """One tool's rows: ``tool`` in the API's shape (:func:`flakebot_magic.manage.tools.tool_json`), and what
    the page shows beside it."""

    tool: dict[str, Any]
    log: str
    started: str
    #: an http tool's "open" link (the proxy, then where it answers) and that entry path; "" for none
    open: str = ""
    entry: str = ""

    @property
    def stoppable(self) -> bool:
        return is_server(str(self.tool["kind"]))

    @property
    def details(self) -> list[tuple[str, str]]:
        """The provenance's fields that have a value (a failed build's: its request, workspace and log), as
        ``(field, text)`` for the page's definition list; the same fields ``show NAME`` prints."""
        tool = self.tool
        data = tool["provenance"] or {k: tool[k] for k in ("request", "workspace", "log_path")}
        return list(shown_fields(data).items())


def render_dashboard(
    shown: list[dict[str, Any]],
    rows: list[DashboardRow],
    *,
    counted: str,
    registry: str,
    api: str,
    xsrf: str,
    version: str = __version__,
) -> str:
    """The page: ``shown`` (the tools in the API's shape, for the page's script) and their ``rows``."""
    page = templates().get_template("dashboard.html")
    return page.render(shown=shown, rows=rows, counted=counted, registry=registry, api=api, xsrf=xsrf, version=version)


class DashboardHandler(RefuseCrossOrigin, ExtensionHandlerMixin, JupyterHandler):
    """``GET /flakebot/``: the dashboard (``@web.authenticated``: the login page without Jupyter's login)."""

    auth_resource = "flakebot"

    def initialize(self, name: str, settings: Settings) -> None:
        super().initialize(name)
        self.flakebot = settings

    async def _entry(self, tool: dict[str, Any]) -> str:
        """Where an http tool's "open" goes: its root when that answers, else its health path (which must)."""
        record = Inventory(self.flakebot.cache.tools).get(tool["name"])
        if record is None or not record.url or tools.status_of(record) != "running":
            return "/"
        client = tools.tool_of(record, self.flakebot, check=False)  # only its contract is read, never run
        health = getattr(getattr(client, "contract", None), "health", "/health")
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

    def _row(self, tool: dict[str, Any], base: str, entry: str | None) -> DashboardRow:
        try:
            log = tools.logs(self.flakebot, tool["name"], last=200)
        except UsageError:
            log = ""
        started = tool["started"] or tool["created"]
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(started)) if started else ""
        if entry is None:
            return DashboardRow(tool, log, when)
        return DashboardRow(tool, log, when, open=base + tool["links"]["proxy"].rstrip("/") + entry, entry=entry)

    @web.authenticated
    @authorized
    async def get(self) -> None:
        base = self.base_url.rstrip("/")
        listing = tools.table(self.flakebot)
        shown = safe_data(listing.data)  # each tool as tools.tool_json (a failed build as its attempt): the API's shape
        proxied = [tool for tool in shown if "proxy" in tool["links"]]
        entries = dict(zip([t["name"] for t in proxied], await asyncio.gather(*map(self._entry, proxied)), strict=True))
        count, failed = len(listing.records), len(listing.attempts)
        counted = f"{count} tool{'' if count == 1 else 's'}" + (
            f", {failed} build{'' if failed == 1 else 's'} that made none" if failed else ""
        )
        token = self.xsrf_token
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(
            render_dashboard(
                shown,
                [self._row(tool, base, entries.get(tool["name"])) for tool in shown],
                counted=counted,
                registry=str(self.flakebot.cache.tools),
                api=f"{base}/flakebot/api/tools",
                xsrf=token.decode() if isinstance(token, bytes) else token,
            )
        )
