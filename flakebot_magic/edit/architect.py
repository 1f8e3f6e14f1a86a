"""The architect: one request, before any engineer, that reads the crate and the request and writes a plan.

Its reply is plain text: a short plan (which files, which functions, which
tests) and, when the cell has no ``>>>`` examples, a few examples of use
(an input and the exact expected output). Every engineer gets the plan with
the request, as words: a model's plan carries no acceptance examples, so the
judge never runs anything it says (only the person's own examples). The request carries ``X-Flakebot-Role:
architect`` and may use its own model (``--architect-model``).
"""

from __future__ import annotations

from pathlib import Path

from ..events import EventBus
from ..llm.channel import ModelChannel
from ..registry.base import CrateCandidate
from .prompt import readme_summary, repo_map

__all__ = ["MAX_PLAN_CHARS", "ask_architect"]

#: the plan is cut here before the engineers see it
MAX_PLAN_CHARS = 8000


def ask_architect(
    channel: ModelChannel,
    request: str,
    root: Path,
    *,
    crate: CrateCandidate | None,
    bus: EventBus,
    want_examples: bool,
) -> str:
    """The architect's plan for ``request`` on the workspace ``root`` (capped at :data:`MAX_PLAN_CHARS`).

    The request goes through ``channel`` (role ``architect``): the run's budget, the reply caps, a cancel.
    """
    about = f"{crate.name} {crate.version}: {crate.description}" if crate is not None else root.name
    examples = (
        "\nThen, under a line 'Examples:', write two to four examples of use the finished tool must meet, for the "
        "engineers to test against: an input (standard input, flags) and the exact expected output."
        if want_examples
        else ""
    )
    messages = [
        {
            "role": "system",
            "content": "You are the architect of flakebot's edit loop. Engineers will change a Rust crate into a "
            "command-line tool that does what the user asks; you do not edit files. Write a short, concrete plan "
            "(at most 15 lines): which files to change, which functions to add or reuse, which tests to add, and "
            "the pitfalls." + examples,
        },
        {
            "role": "user",
            "content": f"The request: {request}\n\nThe crate: {about}\n\nREADME (summary):\n"
            f"{readme_summary(root, 1200)}\n\nFiles:\n{repo_map(root, 3000)}",
        },
    ]
    bus.notice("edit", f"the architect ({channel.model.describe()}) is writing a plan")
    text = channel.complete(messages).content.strip()
    bus.notice("edit", f"the architect's plan: {text.splitlines()[0][:160]}")
    return text[:MAX_PLAN_CHARS]
