"""What a valid tool name is: the one rule for every name that becomes a kernel variable, a file or directory in
the cache (a lock, a journal, a workspace, a steering mailbox) and a part of the server's URLs.

It sits in ``host/`` because the cache's files are named by it (:mod:`.locks` checks each name it is given);
``--name``, the journals, steering, ``flakebot cargo``, eval tasks and the server ask it too.
"""

from __future__ import annotations

import keyword
import re

__all__ = ["MAX_TOOL_NAME", "TOOL_NAME_PATTERN", "check_tool_name", "is_tool_name", "tool_name"]


#: the longest tool name
MAX_TOOL_NAME = 128
#: what a tool's name is: an ASCII Python identifier (the name the kernel gets), as a regular expression
TOOL_NAME_PATTERN = rf"[A-Za-z_][A-Za-z0-9_]{{0,{MAX_TOOL_NAME - 1}}}"
_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)


def is_tool_name(name: object) -> bool:
    """Whether ``name`` can name a tool: the one rule (the kernel's variable, the files in the cache, the URLs).

    An ASCII Python identifier of at most :data:`MAX_TOOL_NAME` characters that
    is not a keyword: it names a variable in the kernel, files and directories
    in the cache and a part of the server's URLs, so it holds no ``/``, ``.``
    or ``-``.

    >>> [is_tool_name(n) for n in ("md", "pulldown_cmark", "../x", "a-b", "class", "café", "")]
    [True, True, False, False, False, False, False]
    """
    return isinstance(name, str) and _TOOL_NAME.fullmatch(name) is not None and not keyword.iskeyword(name)


def tool_name(crate: str) -> str:
    """A valid tool name made from a crate's name: ``pulldown-cmark`` -> ``pulldown_cmark``.

    >>> tool_name("pulldown-cmark"), tool_name("2d"), tool_name("class")
    ('pulldown_cmark', '_2d', 'class_')
    """
    name = re.sub(r"[^A-Za-z0-9_]", "_", crate)[: MAX_TOOL_NAME - 1]
    if not name or name[0].isdigit():
        name = "_" + name
    if keyword.iskeyword(name):
        name += "_"
    return name


def check_tool_name(name: object, *, what: str = "") -> str:
    """``name`` when it is a tool name (:func:`is_tool_name`), else a :class:`~flakebot_magic.errors.UsageError`.

    ``what`` names where it came from (``--name``) in the message.

    >>> check_tool_name("md")
    'md'
    >>> check_tool_name("../x", what="--name")
    Traceback (most recent call last):
    ...
    flakebot_magic.errors.UsageError: --name '../x' is not a valid tool name (a Python identifier: letters, digits and '_', not a keyword); try '___x'.
    """
    if is_tool_name(name):
        assert isinstance(name, str)
        return name
    from ..errors import UsageError

    hint = f"; try {tool_name(name)!r}" if isinstance(name, str) and name else ""
    raise UsageError(
        f"{what + ' ' if what else ''}{name!r} is not a valid tool name (a Python identifier: letters, digits "
        f"and '_', not a keyword){hint}."
    )
