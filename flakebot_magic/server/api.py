"""The extension's REST API: ``/flakebot/api/...``, the tools with status, provenance and logs; stop; steer.

Every handler is ``@web.authenticated`` (no Jupyter login or token: 403)
and ``@authorized`` on the ``flakebot`` resource. Requests that change
something (POST) also pass Jupyter's XSRF check unless they carry the token
(:class:`~flakebot_magic.server.origin.RefuseCrossOrigin`). What they answer
may quote crates, builds and tools: every string of the JSON goes through
:func:`flakebot_magic.untrusted.safe_data`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from .._version import __version__
from ..config import Settings
from ..errors import SteeringError, StorageError, UsageError
from ..host.fsutil import load_json
from ..manage import tools
from ..manage.doctor import prepare
from ..records.inventory import Inventory, ToolRecord
from ..records.runlog import attempt_of
from ..records.steering import is_running
from ..untrusted import safe_data
from .origin import RefuseCrossOrigin

__all__ = [
    "IndexHandler",
    "ToolHandler",
    "ToolLogsHandler",
    "ToolSteerHandler",
    "ToolStopHandler",
    "ToolsHandler",
]


class _API(RefuseCrossOrigin, ExtensionHandlerMixin, APIHandler):
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
            body = load_json(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, 'the body must be JSON: {"text": "..."}') from None
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise web.HTTPError(400, 'the body must be JSON with the message: {"text": "..."}')
        try:
            answer = tools.steer(self.flakebot, name, text, source="api")
        except SteeringError as exc:
            if is_running(self.flakebot.cache, name):
                raise web.HTTPError(400, str(exc)) from None  # the session runs: the text was refused
            if Inventory(self.flakebot.cache.tools).get(name) is None:
                raise web.HTTPError(404, f"no tool named {name!r}, and no edit session building it") from None
            raise web.HTTPError(409, str(exc)) from None
        except UsageError as exc:
            raise web.HTTPError(400, str(exc)) from None
        self._answer(answer.data)
