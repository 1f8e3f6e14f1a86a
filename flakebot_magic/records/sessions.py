"""What a tool's edit sessions recorded (tokens and cost, the candidates and the winner), and how ``show`` says it.

The pipeline records these in the store manifest (and the inventory record):
``usage`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
``calls``, ``cost_usd``), ``winner`` (the index of the candidate deployed)
and ``candidates`` (each with ``index``, ``status``, ``crate`` and its
score's parts, under ``score`` or beside them). ``show --json`` and the REST
API give them as recorded; ``show`` as text gives one sentence each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .provenance import render_text

__all__ = ["SESSION_KEYS", "candidate_text", "render_with_sessions", "session_parts", "usage_text"]

#: what a tool's edit sessions add to its provenance when they recorded it
SESSION_KEYS = ("usage", "winner", "candidates")


def session_parts(manifest: Mapping[str, Any] | None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The :data:`SESSION_KEYS` a store manifest has, else the inventory record's ``extra``; absent ones left out.

    >>> session_parts({"winner": 1, "model": "m"}, {"usage": {"prompt_tokens": 3}})
    {'usage': {'prompt_tokens': 3}, 'winner': 1}
    """
    found: dict[str, Any] = {}
    for key in SESSION_KEYS:
        for source in (manifest or {}, extra or {}):
            # a build without a model records an empty usage: nothing to say (not "cost unknown")
            if source.get(key) not in (None, {}, []):
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


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" if count == 1 else f"{count:,} {word}s"


def candidate_text(candidate: Mapping[str, Any]) -> str:
    """One line for a candidate: index, status, crate, its score's parts (the judge's, in its order of priority).

    >>> candidate_text({"index": 1, "status": "winner", "crate": "tinyhex", "score": {"contract_met": True,
    ...                 "green": True, "examples_passed": 2, "examples_total": 2, "tests_passed": 5,
    ...                 "tests_failed": 0, "clippy_warnings": 1, "diff_lines": 12, "note": ""}})
    '#1 winner  tinyhex  green, contract met, examples 2/2, 5 tests passed, 1 clippy warning, 12 diff lines'
    >>> candidate_text({"index": 2, "status": "cancelled", "score": None, "error": "", "iterations": 1})
    '#2 cancelled  not scored (1 iteration)'
    """
    score = candidate.get("score")
    words: list[str] = []
    if isinstance(score, Mapping):
        if "green" in score:
            words.append("green" if score.get("green") else "not green")
        words.append("contract met" if score.get("contract_met") else "contract not met")
        total = _int(score.get("examples_total"))
        if total:
            words.append(f"examples {_int(score.get('examples_passed'))}/{total}")
        words.append(f"{_plural(_int(score.get('tests_passed')), 'test')} passed")
        failed = _int(score.get("tests_failed"))
        if failed:
            words.append(f"{failed} failed")
        words.append(_plural(_int(score.get("clippy_warnings")), "clippy warning"))
        words.append(_plural(_int(score.get("diff_lines")), "diff line"))
        if score.get("note"):
            words.append(str(score["note"]))
    elif "score" in candidate:  # the judge never scored it (stopped, or failed first)
        iterations = _int(candidate.get("iterations"))
        words.append("not scored" + (f" ({_plural(iterations, 'iteration')})" if iterations else ""))
        if candidate.get("error"):
            words.append(str(candidate["error"]))
    head = f"#{candidate.get('index', '?')} {candidate.get('status') or ''}".rstrip()
    return "  ".join(part for part in (head, str(candidate.get("crate") or ""), ", ".join(words)) if part)


def render_with_sessions(data: Mapping[str, Any]) -> str:
    """:func:`~flakebot_magic.records.provenance.render_text` of a provenance, its :data:`SESSION_KEYS` as sentences.

    >>> print(render_with_sessions({"crate": "tinyhex", "winner": 0,
    ...                             "candidates": [{"index": 0, "status": "winner"}, {"index": 1, "status": "lost"}]}))
    crate       tinyhex
    winner      candidate 0
    candidates  #0 winner
                #1 lost
    """
    plain = {
        k: v
        for k, v in data.items()
        if k not in (*SESSION_KEYS, "usage_all_sessions") and v is not None and str(v).strip()
    }
    lines: dict[str, list[str]] = {}
    usage = data.get("usage")
    if isinstance(usage, Mapping):
        lines["usage"] = [usage_text(usage)]
    every = data.get("usage_all_sessions")
    if isinstance(every, Mapping):
        count = every.get("sessions")
        lines["all sessions"] = [f"{usage_text(every)} over {count} edit session{'' if count == 1 else 's'}"]
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
