"""What a tool's edit sessions recorded (tokens and cost, the candidates and the winner), and how ``show`` says it.

The pipeline records these in the store manifest (and the registry record):
``usage`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
``calls``, ``cost_usd``), ``winner`` (the index of the candidate deployed)
and ``candidates`` (each with ``index``, ``status``, ``crate`` and its
score's parts, under ``score`` or beside them). ``show --json`` and the REST
API give them as recorded; ``show`` as text gives one sentence each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .provenance import render_text

__all__ = ["SESSION_KEYS", "candidate_text", "render_with_sessions", "session_parts", "usage_text"]

#: what a tool's edit sessions add to its provenance when they recorded it
SESSION_KEYS = ("usage", "winner", "candidates")


def session_parts(manifest: Mapping[str, Any] | None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The :data:`SESSION_KEYS` a store manifest has, else the registry record's ``extra``; absent ones left out.

    >>> session_parts({"winner": 1, "model": "m"}, {"usage": {"prompt_tokens": 3}})
    {'usage': {'prompt_tokens': 3}, 'winner': 1}
    """
    found: dict[str, Any] = {}
    for key in SESSION_KEYS:
        for source in (manifest or {}, extra or {}):
            if source.get(key) is not None:
                found[key] = source[key]
                break
    return found


def _count(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value if value is not None else 0)


def usage_text(usage: Mapping[str, Any]) -> str:
    """One line for a session's ``usage``: tokens by kind, model calls, the cost.

    >>> usage_text({"prompt_tokens": 12000, "completion_tokens": 800, "cached_tokens": 4000, "calls": 3,
    ...             "cost_usd": 0.0061})
    '12,000 prompt tokens (4,000 cached) + 800 completion tokens, 3 model calls, $0.0061'
    >>> usage_text({"prompt_tokens": 10, "completion_tokens": 5, "cost_usd": None})
    '10 prompt tokens + 5 completion tokens, cost unknown (no price for the model: see the prices setting)'
    """
    text = f"{_count(usage.get('prompt_tokens'))} prompt tokens"
    if usage.get("cached_tokens"):
        text += f" ({_count(usage['cached_tokens'])} cached)"
    text += f" + {_count(usage.get('completion_tokens'))} completion tokens"
    if usage.get("calls"):
        text += f", {_count(usage['calls'])} model calls"
    cost = usage.get("cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        return text + f", ${cost:.4f}"
    return text + ", cost unknown (no price for the model: see the prices setting)"


#: a score's parts (the judge's, in its order of priority) as a person reads them
_SCORE_WORDS: dict[str, Callable[[Any], str]] = {
    "contract_met": lambda v: "contract met" if v else "contract not met",
    "tests_passed": lambda v: f"{_count(v)} tests passed",
    "tests_failed": lambda v: f"{_count(v)} failed",
    "clippy_warnings": lambda v: f"{_count(v)} clippy warnings",
    "diff_lines": lambda v: f"{_count(v)} diff lines",
}


def candidate_text(candidate: Mapping[str, Any]) -> str:
    """One line for a candidate: index, status, crate, its score's parts.

    >>> candidate_text({"index": 1, "status": "winner", "crate": "tinyhex", "score": {"contract_met": True,
    ...                 "examples_passed": 2, "examples_total": 2, "tests_passed": 5, "tests_failed": 0,
    ...                 "clippy_warnings": 0, "diff_lines": 12}})
    '#1 winner  tinyhex  contract met, examples 2/2, 5 tests passed, 0 failed, 0 clippy warnings, 12 diff lines'
    """
    score = candidate.get("score")
    parts: Mapping[str, Any] = (
        score
        if isinstance(score, Mapping)
        else {k: v for k, v in candidate.items() if k not in ("index", "status", "crate", "score")}
    )
    words = []
    for key, value in parts.items():
        if key == "examples_total":
            continue
        if key == "examples_passed":
            total = parts.get("examples_total")
            words.append(f"examples {_count(value)}" + (f"/{_count(total)}" if total is not None else ""))
        elif key in _SCORE_WORDS:
            words.append(_SCORE_WORDS[key](value))
        elif value is None or isinstance(value, str | int | float):
            words.append(f"{key} {value}")
    head = f"#{candidate.get('index', '?')} {candidate.get('status') or ''}".rstrip()
    return "  ".join(part for part in (head, str(candidate.get("crate") or ""), ", ".join(words)) if part)


def render_with_sessions(data: Mapping[str, Any]) -> str:
    """:func:`~flakebot_magic.provenance.render_text` of a provenance, its :data:`SESSION_KEYS` as sentences.

    >>> print(render_with_sessions({"crate": "tinyhex", "winner": 0,
    ...                             "candidates": [{"index": 0, "status": "winner"}, {"index": 1, "status": "lost"}]}))
    crate       tinyhex
    winner      candidate 0
    candidates  #0 winner
                #1 lost
    """
    plain = {k: v for k, v in data.items() if k not in SESSION_KEYS}
    lines: dict[str, list[str]] = {}
    usage = data.get("usage")
    if isinstance(usage, Mapping):
        lines["usage"] = [usage_text(usage)]
    if data.get("winner") is not None:
        lines["winner"] = [f"candidate {data['winner']}"]
    candidates = data.get("candidates")
    if isinstance(candidates, list):
        lines["candidates"] = [candidate_text(c) for c in candidates if isinstance(c, Mapping)]
    width = max((len(k) for k in (*plain, *lines)), default=0)
    rows = [render_text({key.ljust(width): value}) for key, value in plain.items()]
    for key, values in lines.items():
        rows += [f"{key if i == 0 else '':<{width}}  {value}" for i, value in enumerate(values)]
    return "\n".join(rows)
