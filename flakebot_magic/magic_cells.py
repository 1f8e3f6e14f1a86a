"""How a kernel's input reaches the ``%%flakebot`` magic: IPython's input transformers, adjusted.

* :func:`spare_examples`: IPython strips ``>>>`` prompts from a pasted doctest before a cell runs; a
  ``%%flakebot`` cell keeps them (they are its acceptance examples);
* :func:`install_transformer`: a cell that is one ``%%flakebot`` call (or one ``%flakebot rebuild`` line)
  awaits its build on the kernel's loop, so the widget's Cancel button works while it builds;
  :func:`uninstall_transformer` (``%unload_ext``) takes it away.

With :mod:`flakebot_magic.magics` and :mod:`flakebot_magic.commands`' decorators, the only code importing IPython.
"""

from __future__ import annotations

import re
import sys
from typing import Any

__all__ = ["install_transformer", "spare_examples", "uninstall_transformer"]

#: a whole cell that is one ``%%flakebot`` cell, or one ``%flakebot rebuild`` line, after IPython's transforms
_CELL_CALL = re.compile(r"^get_ipython\(\)\.run_cell_magic\('flakebot', (.*)\)\s*$", re.S)
_REBUILD_CALL = re.compile(r"^get_ipython\(\)\.run_line_magic\('flakebot', ('rebuild\b[^']*')\)\s*$")
_SELF = "get_ipython().magics_manager.registry['FlakebotMagics']"


class _SparingFlakebot:
    """IPython's prompt stripper, except in a ``%%flakebot`` cell: its ``>>>`` lines are acceptance examples.

    IPython removes ``>>>`` and ``...`` prompts from a pasted doctest before a
    cell runs, so a cell magic never sees them; ``%%flakebot`` needs them.
    """

    def __init__(self, strip: Any) -> None:
        self.strip = strip

    def __call__(self, lines: list[str]) -> list[str]:
        if any(line.lstrip().startswith("%%flakebot") for line in lines):
            return lines
        return list(self.strip(lines))


def spare_examples(shell: Any) -> None:
    """Keep the ``>>>`` examples of ``%%flakebot`` cells (see :class:`_SparingFlakebot`)."""
    manager = getattr(shell, "input_transformer_manager", None)
    transforms = getattr(manager, "cleanup_transforms", None)
    if not isinstance(transforms, list):
        return
    try:
        from IPython.core.inputtransformer2 import PromptStripper
    except ImportError:  # pragma: no cover - an IPython without it strips nothing
        return
    transforms[:] = [_SparingFlakebot(t) if isinstance(t, PromptStripper) else t for t in transforms]


def install_transformer(shell: Any) -> None:
    """Make a ``%%flakebot`` cell (and ``%flakebot rebuild``) await its build on the kernel's loop.

    A cell magic runs synchronously; while it runs, the kernel's event loop
    is blocked, so a click on the widget's Cancel button (a comm message)
    would wait until the build ends. A cell whose code awaits runs on the
    kernel's loop instead, and ipykernel dispatches comm messages while it
    awaits (and turns a kernel interrupt into cancelling it). So, after
    IPython's own transforms, a cell that is exactly one ``%%flakebot`` call
    becomes ``await <the magics>.run_cell_async(line, body)``. Only with
    IPython's asyncio runner and autoawait on; otherwise the cell runs as usual.
    """
    if any(getattr(t, "__name__", "") == "_await_flakebot" for t in shell.input_transformers_post):
        return

    def _await_flakebot(lines: list[str]) -> list[str]:
        if len(lines) != 1 or not _async_ok(shell) or _inside_running_code():
            return lines
        cell = _CELL_CALL.match(lines[0])
        if cell:
            return [f"await {_SELF}.run_cell_async({cell.group(1)})\n"]
        rebuild = _REBUILD_CALL.match(lines[0])
        if rebuild:
            return [f"await {_SELF}.run_line_async({rebuild.group(1)})\n"]
        return lines

    shell.input_transformers_post.append(_await_flakebot)


def _inside_running_code() -> bool:
    """Whether this transform was asked for by code that runs inside a cell: another magic, not the kernel.

    ``%%time``, ``%%capture`` and other cell magics that wrap ``%%flakebot``
    transform (and compile, or run) their body while the outer cell runs; a
    top-level ``await`` there is a SyntaxError or needs a loop that is busy.
    Such a ``%%flakebot`` runs the synchronous way (Ctrl-C or a kernel
    interrupt still cancels it; the widget's Cancel button waits for the cell).
    """
    from IPython.core.interactiveshell import InteractiveShell

    running = {getattr(InteractiveShell, name).__code__ for name in ("run_code", "run_cell_magic", "run_line_magic")}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code in running:
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


def uninstall_transformer(shell: Any) -> None:
    shell.input_transformers_post[:] = [
        t for t in shell.input_transformers_post if getattr(t, "__name__", "") != "_await_flakebot"
    ]


def _async_ok(shell: Any) -> bool:
    try:
        from IPython.core.async_helpers import _asyncio_runner
    except ImportError:  # pragma: no cover - IPython without autoawait
        return False
    return bool(getattr(shell, "autoawait", False)) and shell.loop_runner is _asyncio_runner
