"""What to build: the request every front door hands to the pipeline.

A :class:`BuildRequest` is plain data (the words, the tool's name, a crate, a
``--continue``, and the :class:`RunFlags` of this one run: ``--rebuild``,
``--resume``, ``--candidates``, ``--plan``); how to build it (cache dir,
registry, backend, model) is in :class:`~flakebot_magic.config.Settings`.

Its words carry their origin as a type (:data:`RequestText`): the person's own
(:class:`PersonText`: a cell, a command line, ``build()``'s argument, a suite
file the person chose to run) or anyone else's (:class:`UntrustedText`: a
model's plan, an agent's request, a request recorded in a notebook or the
cache, a tool's output pasted into a follow-up). Only the person's words carry
acceptance examples: :func:`~flakebot_magic.stages.accept.split_request`
takes a :class:`PersonText`, and mypy refuses anything else there. A plain
``str`` given as a request's words is untrusted (:meth:`BuildRequest.__post_init__`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .options import OPTION_BY_NAME, accepted

__all__ = [
    "BuildRequest",
    "PersonText",
    "RequestText",
    "RunFlags",
    "UntrustedText",
    "keep_origin",
    "split_run_flags",
]


class PersonText(str):
    """Words the person wrote: a cell, a command line, ``build()``'s argument, a suite file they chose to run.

    The one kind of text whose ``>>>`` lines are acceptance examples. Made only
    at those doors (``tests/security/test_sinks.py`` lists where). What is made
    from it (``strip()``, a slice, a concatenation) is a plain ``str`` again:
    keep the origin with :func:`keep_origin`, never by wrapping new words.
    """

    __slots__ = ()


class UntrustedText(str):
    """Text somebody else wrote: a model's plan, an agent's request, a request recorded in a notebook or the cache,
    a tool's output (a failing example's error, an eval's feedback). Its ``>>>`` lines are words, never examples."""

    __slots__ = ()


#: a request's words, by origin
RequestText = PersonText | UntrustedText


def keep_origin(text: RequestText, changed: str) -> RequestText:
    """``changed`` (made from ``text``: stripped, cut) with ``text``'s origin.

    >>> type(keep_origin(PersonText(" md "), " md ".strip())).__name__
    'PersonText'
    """
    if isinstance(text, PersonText):
        return PersonText(changed)
    return UntrustedText(changed)


def _flag(name: str) -> Any:
    """A :class:`RunFlags` field whose default is the option ``name``'s (:data:`~flakebot_magic.options.OPTIONS`)."""
    opt = OPTION_BY_NAME[name]
    return field(default_factory=lambda: copy.deepcopy(opt.default_value()))


def split_run_flags(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A front door's ``values`` as the settings' and the run flags (``Option.run_flag``: the request's).

    >>> split_run_flags({"model": "m", "rebuild": True})
    ({'model': 'm'}, {'rebuild': True})
    """
    flags = {k: v for k, v in values.items() if k in OPTION_BY_NAME and OPTION_BY_NAME[k].run_flag}
    return {k: v for k, v in values.items() if k not in flags}, flags


@dataclass(frozen=True)
class RunFlags:
    """How one run goes: the options marked :attr:`~flakebot_magic.options.Option.run_flag` but ``follow_up``
    (``--continue``, a :class:`BuildRequest` field of its own). Their meaning and defaults are in
    :data:`~flakebot_magic.options.OPTIONS`.

    ``rebuild``: fork and build again, the cache not used; ``resume``:
    continue the tool's last unfinished edit session; ``candidates``: edit
    sessions racing; ``plan``: ask the architect first.

    >>> RunFlags()
    RunFlags(rebuild=False, resume=False, candidates=1, plan=False)
    >>> RunFlags.given({"candidates": 3, "plan": None}).candidates
    3
    """

    rebuild: bool = _flag("rebuild")
    resume: bool = _flag("resume")
    candidates: int = _flag("candidates")
    plan: bool = _flag("plan")

    @classmethod
    def given(cls, values: Mapping[str, Any], base: RunFlags | None = None) -> RunFlags:
        """``base`` (default: the defaults) with the flags in ``values`` that are not None, each checked as the
        option table says (:func:`~flakebot_magic.options.accepted`; a UsageError names what is wrong).
        Names that are not run flags are an error: a front door splits its options first
        (:func:`split_run_flags`)."""
        known = {f.name for f in fields(cls)}
        changes: dict[str, Any] = {}
        for name, value in values.items():
            if name not in known:
                raise TypeError(f"{name!r} is not a run flag (those are {', '.join(sorted(known))})")
            if value is not None:
                changes[name] = accepted(OPTION_BY_NAME[name], value)
        return replace(base or cls(), **changes)


@dataclass(frozen=True)
class BuildRequest:
    """One tool to build.

    Parameters
    ----------
    text
        What the tool should do, in words; ``>>>`` lines in the person's own
        words (:class:`PersonText`) are acceptance examples, in anyone else's
        (:class:`UntrustedText`, what a plain ``str`` becomes) they are words.
        May be empty when ``crate`` names the crate.
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
    flags
        How this run goes (:class:`RunFlags`: rebuild, resume, candidates, plan).

    Examples
    --------
    >>> BuildRequest("Render Markdown text to HTML.", name="md")
    BuildRequest(text='Render Markdown text to HTML.', name='md', crate=None, follow_up=False, requested_by='', flags=RunFlags(rebuild=False, resume=False, candidates=1, plan=False))
    >>> BuildRequest("", crate="tinyecho").label
    'tinyecho'
    """

    text: RequestText = field(default_factory=lambda: UntrustedText(""))
    name: str | None = None
    crate: str | None = None
    follow_up: bool = False
    requested_by: str = ""
    flags: RunFlags = field(default_factory=RunFlags)

    def __post_init__(self) -> None:
        # words of no stated origin are nobody's in particular: untrusted, never the person's
        if not isinstance(self.text, (PersonText, UntrustedText)):
            object.__setattr__(self, "text", UntrustedText(self.text))

    def with_options(self, values: Mapping[str, Any]) -> BuildRequest:
        """This request with the run flags a front door was given (option names; None: not given):
        ``follow_up`` and the :class:`RunFlags`.

        >>> BuildRequest("x").with_options({"follow_up": True, "rebuild": True}).flags.rebuild
        True
        """
        flags = {k: v for k, v in values.items() if k != "follow_up"}
        follow_up = values.get("follow_up")
        return replace(
            self,
            follow_up=self.follow_up if follow_up is None else bool(follow_up),
            flags=RunFlags.given(flags, self.flags),
        )

    @property
    def label(self) -> str:
        """A short name for the run (thread names, log files): the tool's name, the crate, or ``request``."""
        return self.name or self.crate or "request"

    @classmethod
    def of(
        cls,
        request: BuildRequest | str,
        *,
        name: str | None = None,
        crate: str | None = None,
        follow_up: bool = False,
    ) -> BuildRequest:
        """``request`` itself, or a request for the text ``request`` with the other fields (a plain ``str`` is
        untrusted words; the person's are a :class:`PersonText`).

        The shorthand ``Pipeline(settings).run("", crate="tinyecho")`` goes
        through here; a ``BuildRequest`` passed with further fields is an error.
        """
        if isinstance(request, BuildRequest):
            if name is not None or crate is not None or follow_up:
                raise TypeError("pass name, crate and follow_up inside the BuildRequest, not beside it")
            return request
        text = request if isinstance(request, (PersonText, UntrustedText)) else UntrustedText(request)
        return cls(text, name=name, crate=crate, follow_up=follow_up)
