"""The choice of crate: fitness without a model, the model's choice among the best candidates with one.

Without a model a crate is deployed as published only when its binary is a
tool for the request (:func:`.search.fitness`); otherwise the run stops with
:class:`~flakebot_magic.errors.NeedsModelError` naming the best candidates.
With a model, one chat request (role ``chooser``, through the run's
:class:`~flakebot_magic.llm.channel.ModelChannel`: its tokens are charged to
the run's budget, ``--max-cost`` can stop it, a cancel cuts it) shows it the
best candidates (description, README summary, public items) and it answers
with ``choose_crate(crate, reason)``; an unusable answer falls back to the
ranking, with a notice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..commands import typed
from ..errors import ModelError, NeedsModelError
from ..events import EventBus
from ..host.fsutil import load_json
from ..host.process import CancelToken
from ..llm.budget import Budget
from ..llm.channel import ModelChannel
from ..llm.limits import ReplyLimits
from ..llm.model import ModelConfig
from ..llm.reply import Reply
from ..registry.base import CrateCandidate, Registry
from ..registry.crate_files import read_capped, readme_summary
from ..untrusted import safe_line, safe_text
from . import search as search_stage

__all__ = [
    "CHOICES",
    "CHOOSER_FUNCTION",
    "CHOOSE_CRATE",
    "CLOSE_SHARE",
    "LISTED",
    "Choice",
    "choose_by_model",
    "choose_without_model",
    "chooser_channel",
    "refusal",
    "summary_of",
]

#: how many candidates the model chooses among
CHOICES = 5
#: caps on what the model is shown of each candidate
README_CHARS = 600
PUBLIC_ITEMS = 25
_PUB = re.compile(rb"^[ \t]*pub\s+(?:async\s+)?(fn|struct|enum|trait|mod)\s+([A-Za-z_][A-Za-z0-9_]*)", re.M)
#: the function the chooser must call (``tool_choice``), and the schema the model is offered
CHOOSE_CRATE = {"type": "function", "function": {"name": "choose_crate"}}
CHOOSER_FUNCTION = {
    "type": "function",
    "function": {
        "name": "choose_crate",
        "description": "Choose the crate to start the tool from, and say why in one sentence.",
        "parameters": {
            "type": "object",
            "properties": {
                "crate": {"type": "string", "description": "the crate's name, one of the candidates"},
                "reason": {"type": "string", "description": "why this crate fits the request"},
            },
            "required": ["crate", "reason"],
        },
    },
}


#: with ``--candidates``, a crate whose search score is at least this share of the chosen one's is a close second
CLOSE_SHARE = 0.9


@dataclass(frozen=True)
class Choice:
    """The crate a run starts from, who chose it (``ranking``, ``fitness``, ``model``, ``user``) and why."""

    candidate: CrateCandidate
    by: str
    reason: str
    #: the other candidates, best first (the next ones to try when a fork fails)
    alternatives: list[CrateCandidate] = field(default_factory=list)

    def close_alternatives(self) -> list[CrateCandidate]:
        """The crates the search found close to the chosen one: a score within :data:`CLOSE_SHARE` of its.

        None when a person named the crate (``--crate``, ``--continue``).
        """
        if self.by not in ("model", "ranking", "fitness"):
            return []
        best = max([self.candidate.score, *(c.score for c in self.alternatives)], default=0.0)
        if best <= 0:
            return []
        floor = min(self.candidate.score, best) * CLOSE_SHARE
        return [c for c in self.alternatives if c.id != self.candidate.id and c.score >= floor]

    def to_json(self) -> dict[str, Any]:
        return {
            "crate": self.candidate.name,
            "version": self.candidate.version,
            "by": self.by,
            "reason": self.reason,
            "alternatives": [c.name for c in self.alternatives[:CHOICES]],
        }


def choose_without_model(candidates: list[CrateCandidate], request: str, *, words_only: str = "") -> Choice:
    """The crate to deploy as published, or :class:`NeedsModelError` saying why none fits.

    The error lists the best candidates by relevance (the right library
    among them, :func:`refusal`) and carries them as ``candidates``.
    ``words_only`` is why the registry searched by words alone and how to
    turn search by meaning on (:func:`~flakebot_magic.stages.search.words_only`).
    """
    fit = search_stage.fitness(candidates)
    if fit.chosen is not None:
        others = [c for c in search_stage.fitting(candidates) if c is not fit.chosen]
        return Choice(fit.chosen, "fitness", fit.reason, others)
    raise NeedsModelError(refusal(request, fit, words_only), candidates=fit.candidates)


#: how many candidates a refusal lists, and how long a summary may be
LISTED = 5
SUMMARY_CHARS = 72


def refusal(request: str, fit: search_stage.Fitness, words_only: str = "") -> str:
    """What a :class:`NeedsModelError` says, in at most nine short lines.

    What was asked and why nothing fits; the :data:`LISTED` best candidates,
    each with its summary cut at a word and the binary it ships if any; and
    the ways forward: ``--crate`` naming the best binary when its own text
    fits (``fit.binary``), a model, and, when the search weighed words alone
    (``words_only``, the registry's sentence), how to turn meaning on.

    Examples
    --------
    >>> fit = search_stage.Fitness(None, "none of the 2 candidates ships a binary",
    ...     [CrateCandidate("textwrap", "0.16.0", "Wrap text to a width, with hyphenation and more")])
    >>> print(refusal("wrap text", fit))
    No crate does 'wrap text' as published: none of the 2 candidates ships a binary.
    The best candidate (a library needs a model to become a tool):
      textwrap 0.16.0: Wrap text to a width, with hyphenation and more
    Configure a model (--model NAME, with --provider or --base-url), or build a crate's own binary with --crate NAME: `flakebot catalog WORDS` (or `%flakebot catalog WORDS` in a notebook) lists what builds with no model.
    """
    shown = fit.candidates[:LISTED]
    lines = [f"No crate does {_shorten(request, 60)!r} as published: {fit.reason}."]
    binaries = [search_stage.tools_of(candidate) for candidate in shown]
    if shown:
        count = "The best candidate" if len(shown) == 1 else f"The {len(shown)} best candidates"
        # a library needs a model to become a tool; a binary that does something else needs one to be adapted
        why = "a model could adapt one" if any(binaries) else "a library needs a model to become a tool"
        lines.append(f"{count} ({why}):")
    for candidate, tools in zip(shown, binaries, strict=True):
        binary = f" [binary {tools[0]}{_how_it_reads(candidate.reads)}]" if tools else ""
        lines.append(
            f"  {candidate.name} {candidate.version}{binary}: {_shorten(candidate.description, SUMMARY_CHARS)}"
        )
    model = "configure a model (--model NAME, with --provider or --base-url)"
    # what builds with no model, searchable: the catalog (issue 37)
    catalog = f"{typed('catalog WORDS')} lists what builds with no model."
    if fit.binary:
        lines.append(f"Build {fit.binary} as published with --crate {fit.binary}, or {model}. {catalog}")
    else:
        lines.append(f"C{model[1:]}, or build a crate's own binary with --crate NAME: {catalog}")
    if words_only:
        lines.append(f"{words_only[0].upper()}{words_only[1:].rstrip('.')}.")
    return "\n".join(lines)


def _how_it_reads(reads: str) -> str:
    """What a refusal says of a listed binary that takes no text (why a binary listed first was passed over)."""
    return {"file": ", reads files only", "none": ", reads no input"}.get(reads, "")


def _shorten(text: str, limit: int) -> str:
    """``text`` on one line, cut at a word with an ellipsis when longer than ``limit``.

    Examples
    --------
    >>> _shorten("A native Rust encoder and decoder of TOML-formatted files and streams", 40)
    'A native Rust encoder and decoder of…'
    """
    text = " ".join(safe_line(text).split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:.-") + "…"


def summary_of(registry: Registry, candidate: CrateCandidate) -> dict[str, Any]:
    """What the model is shown of one candidate: description, README start, public items, binaries."""
    data: dict[str, Any] = {
        "crate": candidate.name,
        "version": candidate.version,
        "description": candidate.description,
        "binaries": list(search_stage.tools_of(candidate)),
    }
    source_dir = getattr(registry, "source_dir", None)
    if source_dir is None:
        return data
    try:
        root = Path(source_dir(candidate))
    except Exception:  # a crate the registry cannot place: the description is enough
        return data
    data["readme"] = _readme_start(root)
    data["public_items"] = _public_items(root)
    return data


def _readme_start(root: Path) -> str:
    for name in ("README.md", "README", "readme.md", "README.markdown"):
        text = read_capped(root, name, 16_000).decode("utf-8", "replace")
        if text:  # badges, links and headings say little; the first prose does
            return safe_text(readme_summary(text, README_CHARS))
    return ""


def _public_items(root: Path) -> list[str]:
    found: dict[str, None] = {}
    for kind, name in _PUB.findall(read_capped(root, "src/lib.rs", 256 * 1024)):
        found.setdefault(f"{kind.decode()} {name.decode()}", None)
        if len(found) >= PUBLIC_ITEMS:
            break
    return list(found)


def chooser_channel(
    model: ModelConfig, *, bus: EventBus, budget: Budget, limits: ReplyLimits, cancel: CancelToken
) -> ModelChannel:
    """The chooser's channel: ``choose_crate`` offered and required, the run's budget charged, the run's cancel."""
    return ModelChannel(
        model,
        role="chooser",
        stage="search",
        bus=bus,
        budget=budget,
        limits=limits,
        tools=[CHOOSER_FUNCTION],
        tool_choice=CHOOSE_CRATE,
        cancel=cancel,
    )


def choose_by_model(
    channel: ModelChannel,
    registry: Registry,
    request: str,
    candidates: list[CrateCandidate],
    bus: EventBus,
) -> Choice:
    """The model's choice among the best ``candidates`` (one request), or the ranking's with a notice.

    ``channel`` is :func:`chooser_channel`'s. The answer is a
    ``choose_crate`` function call (or the same JSON as plain content) naming one of the candidates. A model
    that fails (:class:`~flakebot_magic.errors.ModelError`) leaves the ranking standing; a spent budget or a
    cancel stops the run.
    """
    shown = candidates[:CHOICES]
    if len(shown) == 1:  # nothing to choose between: no request
        return Choice(shown[0], "ranking", "the only candidate")
    summaries = [summary_of(registry, c) for c in shown]
    messages = [
        {
            "role": "system",
            "content": "You pick the Rust crate a command-line tool will be built from. The crate will be "
            "forked and edited until it does what the user asked; a library is a fine start. "
            "Call choose_crate with one candidate's name and a one-sentence reason.",
        },
        {
            "role": "user",
            "content": f"Request: {request}\n\nCandidates (best ranked first):\n" + json.dumps(summaries, indent=1),
        },
    ]
    fallback = shown[0]
    try:
        answer = _answer(channel.complete(messages))
    except ModelError as exc:  # the model failed this one request: the ranking still stands
        answer = None
        problem = f"{type(exc).__name__}: {str(exc)[:200]}"
    else:
        problem = "its answer named no candidate" if answer is None else ""
    if answer is not None:
        name, reason = answer
        for candidate in shown:
            if candidate.name == name:
                return Choice(
                    candidate, "model", reason or "(no reason given)", [c for c in shown if c is not candidate]
                )
        problem = f"it chose {name!r}, which is not one of the candidates"
    bus.notice(
        "search",
        f"the model's choice of crate was unusable ({problem}); starting from the best ranked, {fallback.name}",
        "warning",
    )
    return Choice(fallback, "ranking", f"the model's choice was unusable ({problem})", shown[1:])


def _answer(reply: Reply) -> tuple[str, str] | None:
    """``(crate, reason)`` from a reply: a ``choose_crate`` call, or that JSON as content."""
    texts = [str(c["function"]["arguments"] or "") for c in reply.calls if c["function"]["name"] == "choose_crate"]
    texts.append(reply.content)
    for text in texts:
        # the first "{" to the last "}" (what a greedy \{.*\} finds, without a regex's scan per "{")
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end < start:
            continue
        try:
            data = load_json(text[start : end + 1])
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("crate"), str):
            return data["crate"].strip(), str(data.get("reason", "")).strip()[:500]
    return None
