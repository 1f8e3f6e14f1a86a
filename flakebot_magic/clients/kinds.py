"""The table of tool kinds: a kind's name -> its client class, whose class attributes and methods are its behaviour.

Dispatched as :data:`flakebot_magic.backends.BACKENDS` is: code that acts on a
tool's kind looks the name up here and asks the row; no module compares kind
names (``tests/clients/test_kinds.py`` reads the package and refuses such a
comparison). A row is a :class:`~flakebot_magic.clients.base.ToolClient`
subclass, and says:

* ``kind``: its name in the tool contract (``kind = "mcp"``) and in the tool inventory;
* ``server``: a long-running process (an MCP server, an HTTP service: started
  by ``load`` and, confined, by a build that reads its functions; watched,
  its output kept, stopped by ``stop``), or a tool that runs only while it is
  called (a command-line tool: nothing to start or stop);
* how it starts, confined and not: its client's own start (``CliTool.__call__``,
  ``McpTool._launch``, ``HttpTool._launch``), in the sandbox
  (:class:`~flakebot_magic.clients.base.Confinement`) whenever
  ``confined_now`` says so, else as the user with the allowlisted environment;
* ``noun``, ``a_noun``: how a person reads it; ``contract_text``: what a model
  is told it must do; ``asked_by``: the words by which a request asks for it;
* ``bridged``: MCP clients reach it through flakebot's bridge; ``proxied``: it
  answers HTTP, so the Jupyter server's proxy forwards to it;
* its client: the class itself (``make_tool`` makes it).

One rule decides a kind the request did not ask for (:func:`unasked`): the
edit loop refuses a contract that names one, and a build that deploys one
(the crate's own table) says so. Adding a kind is one module and one row:
docs/ARCHITECTURE.md, "Adding a tool kind".
"""

from __future__ import annotations

from ..errors import DeployError
from .base import DEFAULT_KIND, ToolClient
from .cli_tool import CliTool
from .http import HttpTool
from .mcp import McpTool

__all__ = ["KINDS", "a_noun", "asked_kinds", "for_model", "is_server", "kind_of", "proxied", "unasked"]

#: every tool kind, by its name in the contract; the first is the default
KINDS: dict[str, type[ToolClient]] = {kind.kind: kind for kind in (CliTool, McpTool, HttpTool)}


def kind_of(name: str) -> type[ToolClient]:
    """The row of the kind called ``name``; :class:`~flakebot_magic.errors.DeployError` for a name no row has."""
    kind = KINDS.get(name) if isinstance(name, str) else None
    if kind is None:
        raise DeployError(
            f"{name!r} is not a tool kind this flakebot knows (it knows {', '.join(KINDS)}). "
            "The tool was built by another flakebot: build it again with this one."
        )
    return kind


def is_server(name: str) -> bool:
    """Whether a tool of the kind ``name`` runs as a long-running process (an unknown kind: no, nothing to stop)."""
    kind = KINDS.get(name)
    return kind is not None and kind.server


def a_noun(name: str) -> str:
    """A tool of the kind ``name`` in a sentence ("an HTTP service"), even for a kind no row has."""
    kind = KINDS.get(name)
    return kind.a_noun if kind is not None else f"a tool of the kind {name!r}, which this flakebot does not know"


def proxied(name: str) -> bool:
    """Whether the Jupyter server's proxy may forward to a running tool of the kind ``name``."""
    kind = KINDS.get(name)
    return kind is not None and kind.proxied


def asked_kinds(request: str) -> list[str]:
    """The kinds ``request``'s words ask for: the default kind always, and each kind whose words it has."""
    return [name for name, kind in KINDS.items() if kind.asked_by is None or kind.asked_by.search(request)]


def unasked(kind: str, request: str, *, had: str = DEFAULT_KIND) -> str:
    """Why a tool of the kind ``kind`` may not be made for ``request``; "" when it may.

    The one rule for a kind the request did not ask for: it may be made when
    the request's words ask for it (:func:`asked_kinds`), or when the tool
    already was one before this work (``had``: the crate as published, or the
    tool a ``--continue`` changes). A model that names another kind in the
    contract is refused (the edit loop's contract check, in these words), so
    no model turns a command-line request into a service that flakebot would
    start. A crate's own table is named to the person at deploy.
    """
    if kind == had or kind in asked_kinds(request):
        return ""
    chosen, before = kind_of(kind), KINDS.get(had)
    keep = f'set kind = "{had}" ({before.a_noun}) as the crate had it' if before else f'set kind = "{DEFAULT_KIND}"'
    asked = " or ".join(KINDS[name].a_noun for name in asked_kinds(request))
    return (
        f'kind = "{kind}" makes {chosen.a_noun}, which the request does not ask for (it asks for {asked}); '
        f"{keep}. Only the person's request may ask for another kind."
    )


def for_model() -> str:
    """The tool contract as the edit loop's system prompt states it: the table's keys, then each kind's duty."""
    others = " or ".join(kind.a_noun for name, kind in KINDS.items() if kind.asked_by is not None)
    names = ", ".join(f'"{name}"' for name in KINDS)
    return (
        "The tool contract (checked by code): Cargo.toml must contain\n"
        "[package.metadata.flakebot]\n"
        f'kind = "{DEFAULT_KIND}"    # one of {names}; "{DEFAULT_KIND}" unless the request asks for {others}; '
        "a kind the request does not ask for is refused\n"
        'bin = "NAME"    # the binary target to deploy; it must exist and build\n'
        + "\n".join(kind.contract_text for kind in KINDS.values() if kind.contract_text)
        + " See docs/tool-contract.md."
    )
