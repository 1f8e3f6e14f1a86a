"""The management commands, as a user types them: ``%flakebot COMMAND`` (and ``flakebot COMMAND``), written once.

Their command lines too: the management flags (:data:`TAIL`, :data:`ALL`), defined once for ``flakebot COMMAND``
and ``%flakebot COMMAND``, and the options table (:mod:`flakebot_magic.options`) as each front door's flags:
argparse's (:func:`add_arguments`), the magic's ``@argument`` decorators (:func:`magic_argument_decorators`:
with :mod:`flakebot_magic.magics` and :mod:`flakebot_magic.magic_cells`, the only code importing IPython) and
its config traits (:func:`config_traits`).

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
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import Cancelled

__all__ = [
    "ALL",
    "COMMAND_NAMES",
    "IF_UNTRUSTED",
    "IF_UNTRUSTED_HELP",
    "LINE_COMMANDS",
    "LINE_USAGE",
    "TAIL",
    "ManagementFlag",
    "explain_usage",
    "sentence",
    "typed",
    "what_next",
]

#: the magic's line commands: usage and what each does; the usage lines, the COMMAND argument's
#: help, the magic's docstring and the errors that list them are made from this table
LINE_COMMANDS = (
    ("list", "the tools: name, kind, crate@version, hash, backend, status, started"),
    ("show NAME", "where NAME came from (provenance)"),
    ("logs NAME", "its build log (and its process output, for http/mcp tools)"),
    ("load NAME|--all", "put tools built earlier in the kernel (after a restart), unbuilt"),
    ("stop NAME|--all", "stop a tool's process (http/mcp tools)"),
    ("rebuild NAME", "fork and build NAME again from its crate"),
    ("steer NAME TEXT", "a message for NAME's running edit session (the model reads it next)"),
    ("cargo NAME ARGS", "cargo in NAME's workspace, in the sandbox its builds run in"),
    ("search QUERY", "ranked crate candidates"),
    ("catalog [WORDS]", "what builds a tool with no model (a crate's own binary), each with a ready cell"),
    ("push NAME", "copy a nix-built tool and its proof to the team's binary cache (--push-to), signed (--secret-key)"),
    (
        "pull NAME NOTEBOOK",
        "the exact tool NOTEBOOK recorded, from the team's cache (--substituters), checked against "
        "--trusted-public-keys and the recorded hash; refused unless signed (--rebuild: build it here instead)",
    ),
    (
        "verify NAME",
        "rebuild a nix-built tool (nix build --rebuild) and say whether it is bit-identical to what was deployed "
        "or pulled (its narHash); the answer, its time and nix's words on a difference go in its provenance (show)",
    ),
    (
        "clean [--all]",
        "remove unused workspaces and store entries (never what it cannot prove unused: "
        "with a damaged tool inventory it stops and says why)",
    ),
    ("help", "this help (as %%flakebot? shows it)"),
    ("dashboard", "a link to the tools' dashboard (the Jupyter server's /flakebot/ page)"),
    (
        "doctor",
        "check the tool inventory; rebuild it from the store and workspaces when it is damaged "
        "(this also happens by itself when needed)",
    ),
)
LINE_USAGE = " | ".join(usage for usage, _ in LINE_COMMANDS)
COMMAND_NAMES = ", ".join(usage.split()[0] for usage, _ in LINE_COMMANDS)

#: what ``pull`` does with a path no trusted key signed (or whose hash is not the recorded one), and why
IF_UNTRUSTED = ("stop", "rebuild")
IF_UNTRUSTED_HELP = (
    "when no trusted key signed the tool (or its hash is not the recorded one): stop, or rebuild it here "
    "and say whether the result is bit-identical to the recorded store path"
)


#: shlex's ValueError message for an unclosed quote (the magic's line is split as a shell would), and what to do
_SHLEX_ERRORS = {
    "No closing quotation": 'The %%flakebot line has a quote that is never closed: close it ("a b") or remove it.',
}


def explain_usage(message: str, parser: Any) -> str:
    """argparse's complaint, with the nearest option to an unknown one and a pointer to ``%%flakebot?``.

    >>> import argparse
    >>> parser = argparse.ArgumentParser()
    >>> _ = parser.add_argument("--crate")
    >>> explain_usage("unrecognized arguments: --crat", parser)
    'Unknown option --crat: did you mean --crate? `%%flakebot?` lists the options.'
    >>> explain_usage("No closing quotation", parser)
    'The %%flakebot line has a quote that is never closed: close it ("a b") or remove it. `%%flakebot?` lists the options.'
    """
    if message in _SHLEX_ERRORS:  # the line could not be split into words
        return f"{_SHLEX_ERRORS[message]} `%%flakebot?` lists the options."
    unknown = message.removeprefix("unrecognized arguments: ").split() if "unrecognized arguments" in message else []
    if not unknown:
        return f"{message}. `%%flakebot?` lists the options."
    known = {flag.lstrip("-"): flag for action in parser._actions for flag in action.option_strings}
    words = []
    for word in unknown:
        near = difflib.get_close_matches(word.split("=", 1)[0].lstrip("-"), list(known), n=1, cutoff=0.75)
        kind = "option" if word.startswith("-") else "word"
        words.append(f"Unknown {kind} {word}" + (f": did you mean {known[near[0]]}?" if near else "."))
    return " ".join(words) + " `%%flakebot?` lists the options."


#: who reads the advice this process makes: ``"notebook"`` once the IPython extension is loaded, ``"shell"`` in the
#: ``flakebot`` command, ``""`` (both forms) anywhere else (a server, a library caller). Set by :func:`advise`.
_AUDIENCE = {"now": ""}


def advise(audience: str) -> None:
    """Make every later advice of this process name the ``"notebook"`` form, the ``"shell"`` form, or both (``""``).

    A process has one reader: a kernel with the extension loaded is a
    notebook's, the ``flakebot`` command's is a shell's.
    """
    if audience not in ("", "notebook", "shell"):
        raise ValueError(f"unknown audience {audience!r}")
    _AUDIENCE["now"] = audience


def typed(line: str, notebook: str = "") -> str:
    """A command, in advice, as a person types it: in a shell and in a notebook (both, unless :func:`advise` said
    who reads this process's advice).

    ``line`` is what follows ``flakebot`` in a shell; ``notebook`` the notebook's form when it is not
    ``%flakebot LINE`` (a build is a ``%%flakebot`` cell; ``pull`` takes the notebook as a word), or, not
    starting with ``%``, what to do there in words.

    >>> typed("verify md")
    '`flakebot verify md` (or `%flakebot verify md` in a notebook)'
    >>> typed("build ... --rebuild --name md", "%%flakebot --rebuild --name md")
    '`flakebot build ... --rebuild --name md` (or a `%%flakebot --rebuild --name md` cell in a notebook)'
    >>> typed("build --name md --resume", "the same cell with --resume")
    '`flakebot build --name md --resume` (or the same cell with --resume in a notebook)'
    """
    notebook = notebook or f"%flakebot {line}"
    if notebook.startswith("%%"):
        shown = f"a `{notebook}` cell"
    elif notebook.startswith("%"):
        shown = f"`{notebook}`"
    else:
        shown = notebook
    audience = _AUDIENCE["now"]
    if audience == "notebook":
        return shown
    if audience == "shell":
        return f"`flakebot {line}`"
    return f"`flakebot {line}` (or {shown} in a notebook)"


def what_next(error: Cancelled) -> Cancelled:
    """A cancelled cell's message ends with what to do next: the cell, run again, builds it."""
    if "Run the cell again" not in str(error):
        error.args = (f"{error}\nRun the cell again to build it.",)
    return error


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
            self.flag, **self._kwargs(sentence(words) + (f" {self.default_doc}" if self.default_doc else ""))
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


def sentence(text: str) -> str:
    """``text`` as a sentence: a capital first, a full stop last (an option's or a flag's help)."""
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")
