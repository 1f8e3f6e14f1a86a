"""What to build: the request every front door hands to the pipeline.

A :class:`BuildRequest` is plain data (the words, the tool's name, a crate, a
``--continue``); how to build it (cache dir, registry, backend, model) is in
:class:`~flakebot_magic.config.Settings`.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BuildRequest"]


@dataclass(frozen=True)
class BuildRequest:
    """One tool to build.

    Parameters
    ----------
    text
        What the tool should do, in words; ``>>>`` lines in it are acceptance
        examples. May be empty when ``crate`` names the crate.
    name
        The tool's name (a Python identifier); default: from the crate's name.
    crate
        Build this crate instead of searching for one.
    follow_up
        ``--continue``: apply ``text`` to the existing tool ``name`` (its
        workspace and history) instead of starting afresh.
    requested_by
        An agent that asks (an MCP client's name, ``notebook``); empty for the
        user. An agent's build never replaces a tool someone else asked for.

    Examples
    --------
    >>> BuildRequest("Render Markdown text to HTML.", name="md")
    BuildRequest(text='Render Markdown text to HTML.', name='md', crate=None, follow_up=False, requested_by='')
    >>> BuildRequest("", crate="tinyecho").label
    'tinyecho'
    """

    text: str = ""
    name: str | None = None
    crate: str | None = None
    follow_up: bool = False
    requested_by: str = ""

    @property
    def label(self) -> str:
        """A short name for the run (thread names, log files): the tool's name, the crate, or ``request``."""
        return self.name or self.crate or "request"

    @classmethod
    def of(
        cls, request: BuildRequest | str, *, name: str | None = None, crate: str | None = None, follow_up: bool = False
    ) -> BuildRequest:
        """``request`` itself, or a request for the text ``request`` with the other fields.

        The shorthand ``Pipeline(settings).run("", crate="tinyecho")`` goes
        through here; a ``BuildRequest`` passed with further fields is an error.
        """
        if isinstance(request, BuildRequest):
            if name is not None or crate is not None or follow_up:
                raise TypeError("pass name, crate and follow_up inside the BuildRequest, not beside it")
            return request
        return cls(request, name=name, crate=crate, follow_up=follow_up)
