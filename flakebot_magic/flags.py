"""How the options table (:mod:`flakebot_magic.options`) becomes each front door's flags, and the management
commands' own flags, defined once for ``flakebot COMMAND`` and ``%flakebot COMMAND``.

* :func:`add_arguments`: argparse's arguments (``flakebot build`` and the other commands);
* :func:`magic_argument_decorators`: IPython's ``@argument`` decorators for the ``%%flakebot`` line (this and
  :mod:`flakebot_magic.magics` are the only code importing IPython);
* :func:`config_traits`: the ``FlakebotMagics`` config traits (``%config FlakebotMagics.model = ...``);
* :data:`TAIL`, :data:`ALL`: the management flags (``logs --tail``, ``stop``/``clean``/``load`` ``--all``),
  added by :meth:`ManagementFlag.add_to` to a command's parser or the magic's.

Examples
--------
>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> TAIL.add_to(parser)
>>> parser.parse_args(["--tail", "5"]).tail, parser.parse_args([]).tail
(5, 200)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .options import OPTIONS, Option

__all__ = [
    "ALL",
    "TAIL",
    "ManagementFlag",
    "add_arguments",
    "config_traits",
    "magic_argument_decorators",
]


@dataclass(frozen=True)
class ManagementFlag:
    """A flag of the management commands (not a build option): its one definition, for the command and the magic.

    ``uses`` is what it does with each command that takes it, ``{command: words}``: the command's parser says
    its own (``flakebot stop --help``), the magic's one ``%flakebot`` line lists them all (``With `stop`: ...``).
    """

    flag: str
    uses: dict[str, str]
    type: type | None = None  # None: a switch (store_true)
    default: Any = None
    metavar: str | None = None
    #: what the command's help adds after its words (``Default: 200.``)
    default_doc: str = ""

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def _kwargs(self, help_text: str) -> dict[str, Any]:
        if self.type is None:
            return {"action": "store_true", "help": help_text}
        return {"type": self.type, "default": self.default, "metavar": self.metavar, "help": help_text}

    def add_to(self, parser: argparse.ArgumentParser, command: str | None = None) -> None:
        """Add the flag to a command's parser (its words for ``command``; default: the first command's)."""
        words = self.uses[command] if command is not None else next(iter(self.uses.values()))
        parser.add_argument(
            self.flag, **self._kwargs(_sentence(words) + (f" {self.default_doc}" if self.default_doc else ""))
        )

    def magic_argument(self) -> Callable[[Any], Any]:
        """IPython's ``@argument`` for the ``%flakebot`` line: what it does with each command that takes it."""
        from IPython.core.magic_arguments import argument

        text = " ".join(f"With `{command}`: {words}." for command, words in self.uses.items())
        return argument(self.flag, **self._kwargs(text))


#: ``logs --tail N``: the log's last lines
TAIL = ManagementFlag(
    "--tail",
    {"logs": "how many of the last lines to show (0: all)"},
    type=int,
    default=200,
    metavar="N",
    default_doc="Default: 200.",
)
#: ``--all``: every tool, for the commands that take a name
ALL = ManagementFlag(
    "--all",
    {
        "load": "every tool built earlier",
        "stop": "every running tool",
        "clean": "every tool, workspace, store entry and the index (running tools are stopped)",
    },
)


def _sentence(text: str) -> str:
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _argparse_kwargs(opt: Option, *, defaults: bool) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": opt.name, "help": _sentence(opt.help)}
    if opt.type is not bool and not opt.choices:
        kwargs["metavar"] = opt.flags[0].lstrip("-").replace("-", "_").upper()
    if opt.type is bool:
        kwargs["action"] = "store_true"
        # None, not False: "not given" lets the kernel's config trait or the Settings default decide
        kwargs["default"] = None
    else:
        kwargs["type"] = opt.type
        if opt.choices:
            kwargs["choices"] = list(opt.choices)
        kwargs["default"] = None
    if defaults:
        kwargs["help"] += _default_text(opt)
    return kwargs


def _default_text(opt: Option) -> str:
    otherwise = opt.default_doc or (str(opt.default) if opt.default is not None else "")
    if opt.env:
        return f" Default: ${opt.env}" + (f", else {otherwise}." if otherwise else ".")
    if opt.default_doc:
        return f" Default: {opt.default_doc}."
    if opt.default not in (None, False):
        return f" Default: {opt.default}."
    return ""


def _flags(opt: Option) -> list[str]:
    return [*opt.flags, *([opt.short] if opt.short else [])]


def add_arguments(parser: argparse.ArgumentParser, *, skip: Iterable[str] = ()) -> None:
    """Add every per-build option to an argparse parser, in argument groups."""
    groups: dict[str, Any] = {}
    for opt in OPTIONS:
        if not opt.per_build or opt.name in skip:
            continue
        target = parser if opt.group == "build" else groups.setdefault(opt.group, parser.add_argument_group(opt.group))
        target.add_argument(*_flags(opt), **_argparse_kwargs(opt, defaults=True))


def magic_argument_decorators() -> list[Callable[[Any], Any]]:
    """``@argument(...)`` decorators for the per-build options, in table order."""
    from IPython.core.magic_arguments import argument

    return [argument(*_flags(o), **_argparse_kwargs(o, defaults=False)) for o in OPTIONS if o.per_build]


def config_traits() -> dict[str, Any]:
    """traitlets traits (``.tag(config=True)``) for the options that are kernel settings."""
    from traitlets import Bool, Dict, Enum, Float, Int, Unicode

    traits: dict[str, Any] = {}
    for opt in OPTIONS:
        if not opt.config:
            continue
        help_text = _sentence(opt.help) + _default_text(opt)
        if opt.choices:
            trait: Any = Enum(list(opt.choices), None, allow_none=True, help=help_text)
        elif opt.type is dict:
            trait = Dict(None, allow_none=True, help=help_text)
        elif opt.type is bool:
            trait = Bool(None, allow_none=True, help=help_text)
        elif opt.type is int:
            trait = Int(None, allow_none=True, help=help_text)
        elif opt.type is float:
            trait = Float(None, allow_none=True, help=help_text)
        else:
            trait = Unicode(None, allow_none=True, help=help_text)
        traits[opt.name] = trait.tag(config=True)
    return traits
