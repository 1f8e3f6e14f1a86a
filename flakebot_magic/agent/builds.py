"""Builds an agent asks for: the same pipeline as every front door, within the agent limits, recording who asked.

One :class:`AgentSession` is one agent's conversation with flakebot (an MCP
connection, a notebook kernel). Before each build it checks the settings'
agent limits: ``allow_agent_builds``, ``agent_max_builds`` builds and
``agent_token_budget`` model tokens for the builds together (each build's edit
loop gets ``token_budget`` or what is left of the tokens, whichever is less).
The limits are counted in an :class:`AgentBudget`: a session's own, or one a
front door shares between its sessions (``flakebot mcp --http`` counts every
session and every stateless request of its process together, so a new
handshake never buys new builds). A refused build raises
:class:`~flakebot_magic.errors.ConfigError` saying which limit and which
setting raises it. After a build the tool's inventory record names who asked
(``requested_by``: the MCP client's name, or ``notebook``), so ``show`` and
the provenance say it was an agent's build.

Examples
--------
>>> session = AgentSession(Settings(), requested_by="claude-code")        # doctest: +SKIP
>>> tool = session.build("view a file as hex", name="hex")                 # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ..clients import ToolClient
from ..config import Settings
from ..errors import ConfigError
from ..events import Event, ModelUsage, Observer
from ..pipeline.background import BackgroundRun, start_build
from ..records.inventory import Inventory
from ..request import BuildRequest, RunFlags, UntrustedText

__all__ = ["AgentBudget", "AgentBuild", "AgentSession", "BuildReport"]


@dataclass
class BuildReport:
    """One agent build: the tool, and what it cost the session."""

    tool: ToolClient
    requested_by: str
    tokens: int


class _TokenMeter:
    """Counts the model tokens a build spent: what its edit loop reports (runs on the pipeline's thread).

    The loop reports once per session however it ends
    (:class:`~flakebot_magic.events.ModelUsage`), so a failed or cancelled
    build is charged what it really spent; a build without a model, nothing.
    """

    def __init__(self) -> None:
        self.tokens = 0

    def __call__(self, event: Event) -> None:
        if isinstance(event, ModelUsage) and event.final:  # the running totals are not charged twice
            self.tokens += event.tokens


class AgentBudget:
    """What agents' builds have used of the agent limits: builds started, model tokens spent. One per session,
    or shared by the sessions of one front door's process (see the module)."""

    def __init__(self) -> None:
        self.builds = 0
        self.tokens = 0
        self.lock = threading.Lock()


class AgentSession:
    """One agent's builds, counted against the agent limits of ``settings``.

    Parameters
    ----------
    settings
        The user's settings (registry, backend, model, limits): every agent
        build uses them, as the magic and the command do.
    requested_by
        Who asks: an MCP client's name (``clientInfo.name``), or ``notebook``.
    flags
        How each build goes (``--candidates``, ``--plan``... given to ``flakebot mcp``, or the kernel's).
    budget
        Where the builds are counted: shared with the other sessions of a front door, or this session's own.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        requested_by: str,
        flags: RunFlags | None = None,
        budget: AgentBudget | None = None,
    ) -> None:
        self.settings = settings
        self.flags = flags or RunFlags()
        self.requested_by = requested_by or "agent"
        self.budget = budget if budget is not None else AgentBudget()
        self._lock = self.budget.lock

    @property
    def builds(self) -> int:
        """Builds started against the budget (this session's and those it shares it with)."""
        return self.budget.builds

    @builds.setter
    def builds(self, value: int) -> None:
        self.budget.builds = value

    @property
    def tokens(self) -> int:
        """Model tokens spent against the budget."""
        return self.budget.tokens

    @tokens.setter
    def tokens(self, value: int) -> None:
        self.budget.tokens = value

    # -- limits ------------------------------------------------------------------

    def refusal(self) -> str | None:
        """Why the next build would be refused (None: it may run)."""
        settings = self.settings
        if not settings.allow_agent_builds:
            return (
                "Agent builds are off on this machine (the allow_agent_builds setting). The tools already "
                "built can still be called; ask the user to build the tool, or to turn allow_agent_builds on."
            )
        if self.builds >= settings.agent_max_builds:
            return (
                f"The {settings.agent_max_builds} agent builds allowed here are used (the agent_max_builds setting). "
                "Use the tools already built, or ask the user to raise agent_max_builds."
            )
        if settings.model is not None and self.tokens >= settings.agent_token_budget:
            return (
                f"Agent builds here have spent {self.tokens:,} of their {settings.agent_token_budget:,} model "
                "tokens (the agent_token_budget setting). Use the tools already built, or ask the user to raise it."
            )
        return None

    def _reserve(self) -> Settings:
        """Count one build (before it starts, so builds at once cannot pass the cap); its settings."""
        with self._lock:
            why = self.refusal()
            if why is not None:
                raise ConfigError(why)
            self.builds += 1
            left = self.settings.agent_token_budget - self.tokens
            return replace(self.settings, token_budget=max(1, min(self.settings.token_budget, left)))

    # -- building ----------------------------------------------------------------

    def start(
        self, request: str, *, name: str | None = None, crate: str | None = None, requested_by: str | None = None
    ) -> AgentBuild:
        """Start a build on a background thread (counted now); :meth:`AgentBuild.wait` finishes it.

        ``requested_by`` names who asks for this build when it is not the session's client (a stateless
        MCP request names its client on each request)."""
        settings = self._reserve()
        meter = _TokenMeter()
        who = requested_by or self.requested_by
        # an agent's words: its ">>>" lines are words for the model, never acceptance examples
        build = BuildRequest(
            UntrustedText(request or ""), name=name or None, crate=crate or None, requested_by=who, flags=self.flags
        )
        try:
            run = start_build(settings, build, extra_observers=[meter])
        except BaseException:
            with self._lock:
                self.builds -= 1
            raise
        return AgentBuild(self, run, meter, who)

    def build(
        self, request: str, *, name: str | None = None, crate: str | None = None, observers: Iterable[Observer] = ()
    ) -> BuildReport:
        """Build and wait (Ctrl-C cancels); the tool and what it cost."""
        return self.start(request, name=name, crate=crate).wait(observers)

    def _charge(self, tokens: int) -> None:
        with self._lock:
            self.tokens += tokens


class AgentBuild:
    """A running agent build: wait for it, or cancel it (the pipeline stops as on Cancel, the workspace kept)."""

    def __init__(
        self, session: AgentSession, run: BackgroundRun[ToolClient], meter: _TokenMeter, who: str = ""
    ) -> None:
        self.session = session
        self.run = run
        self._meter = meter
        self.requested_by = who or session.requested_by

    def cancel(self, reason: str = "cancelled by the agent") -> None:
        self.run.cancel(reason)

    def wait(self, observers: Iterable[Observer] = (), *, tick: Callable[[], None] | None = None) -> BuildReport:
        """Wait for the build, delivering its events to ``observers`` on this thread; record who asked."""
        try:
            tool: ToolClient = self.run.wait(list(observers), tick=tick)
        finally:
            self.session._charge(self._meter.tokens)
        return self._report(tool)

    async def wait_async(
        self, observers: Iterable[Observer] = (), *, tick: Callable[[], None] | None = None
    ) -> BuildReport:
        """:meth:`wait` awaited on the running event loop (cancelling the awaiting task cancels the build)."""
        try:
            tool: ToolClient = await self.run.wait_async(list(observers), tick=tick)
        finally:
            self.session._charge(self._meter.tokens)
        return self._report(tool)

    def _report(self, tool: ToolClient) -> BuildReport:
        who = self.requested_by
        Inventory(self.session.settings.cache.tools).update(tool.name, requested_by=who)
        return BuildReport(tool, who, self._meter.tokens)
