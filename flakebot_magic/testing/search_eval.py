"""The paraphrase evaluation of search and fitness (``tests/search_paraphrases.toml``), for the tests and ``make bench``.

For every paraphrase of a request it records where the accepted crates rank
(top-1, top-3, top-10 of :func:`~flakebot_magic.stages.search.search`) and
what the pipeline would decide without a model
(:func:`~flakebot_magic.stages.choose.choose_without_model`), judged as:

* ``deploy``: the deployed crate's binary is one of the request's ``tools``;
* ``refuse``: an honest :class:`~flakebot_magic.errors.NeedsModelError`, with an
  accepted crate among the first five it lists;
* ``miss``: a NeedsModelError that lists no accepted crate in its first five;
* ``wrong``: any other deploy (a binary that does not do what was asked).

The two halves (``tune`` and ``held-out``) are reported apart; the split is by
request, fixed when the data was written.

A third set, ``tests/search_paraphrases_fresh.toml`` (:func:`load_fresh_cases`),
holds three more paraphrases of every request, written blind (by someone who
never saw the code, the ranking or the other sets) and added after all tuning;
nothing is tuned on it. It has only ids and texts: each case is judged by its
request's ``accept`` and ``tools`` in ``tests/search_paraphrases.toml``, its
split is ``fresh`` and its ``half`` the request's half there. A second blind
set, ``tests/search_paraphrases_blind2.toml`` (:func:`load_blind2_cases`), was
written the same way by another writer after issue 20's last tuning, and
measured once; a third, ``tests/search_paraphrases_blind3.toml``
(:func:`load_blind3_cases`), four paraphrases of every request, was written
before the ranking was tuned again, and measured once after; a fourth,
``tests/search_paraphrases_blind4.toml`` (:func:`load_blind4_cases`), in other
styles (input and output, a field's jargon, an agent's terse spec, casual), the
same way.

Examples
--------
>>> summarize([]) == {}
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import NeedsModelError
from ..host.fsutil import load_toml
from ..registry.base import CrateCandidate, Registry
from ..stages import search as search_stage
from ..stages.choose import choose_without_model

__all__ = [
    "BLIND2",
    "BLIND2_PARAPHRASES",
    "BLIND3",
    "BLIND3_PARAPHRASES",
    "BLIND4",
    "BLIND4_PARAPHRASES",
    "FRESH",
    "FRESH_PARAPHRASES",
    "PARAPHRASES",
    "VERDICTS",
    "Case",
    "Outcome",
    "evaluate",
    "judge",
    "load_blind2_cases",
    "load_blind3_cases",
    "load_blind4_cases",
    "load_cases",
    "load_fresh_cases",
    "summarize",
]

#: the data file in a source checkout
PARAPHRASES = Path(__file__).resolve().parents[2] / "tests" / "search_paraphrases.toml"
#: the blind set, in a source checkout
FRESH_PARAPHRASES = PARAPHRASES.with_name("search_paraphrases_fresh.toml")
#: the split (and kind) of the blind set's cases
FRESH = "fresh"
#: the second blind set (written later, by another writer who read only the requests), and its split
BLIND2_PARAPHRASES = PARAPHRASES.with_name("search_paraphrases_blind2.toml")
BLIND2 = "blind2"
#: the third blind set (four paraphrases of every request, by a third writer who read only the requests), and its split
BLIND3_PARAPHRASES = PARAPHRASES.with_name("search_paraphrases_blind3.toml")
BLIND3 = "blind3"
#: the fourth blind set (four paraphrases of every request in four other styles, by a fourth writer), and its split
BLIND4_PARAPHRASES = PARAPHRASES.with_name("search_paraphrases_blind4.toml")
BLIND4 = "blind4"
#: the fitness verdicts, best first
VERDICTS = ("deploy", "refuse", "miss", "wrong")
#: how many of a NeedsModelError's candidates count as "named" by it
NAMED = 5


@dataclass(frozen=True)
class Case:
    """One paraphrase of one request, and what answers it."""

    request: str
    text: str
    kind: str
    split: str
    accept: tuple[str, ...]
    tools: tuple[str, ...]
    half: str = ""  # a blind case's request's half in the paraphrase file ("" for that file's own cases)


@dataclass(frozen=True)
class Outcome:
    """Where the accepted crates ranked for one case, and the fitness decision on it."""

    case: Case
    ranked: tuple[str, ...]
    verdict: str
    decided: str  # the deployed crate, or the first candidates the refusal named

    def top(self, k: int) -> bool:
        return bool(set(self.ranked[:k]) & set(self.case.accept))


def load_cases(path: Path = PARAPHRASES) -> list[Case]:
    """Every paraphrase in ``path`` as a :class:`Case`, in file order."""
    cases = []
    for request in load_toml(path)["request"]:
        for paraphrase in request["paraphrases"]:
            cases.append(
                Case(
                    request=request["id"],
                    text=paraphrase["text"],
                    kind=paraphrase["kind"],
                    split=request["split"],
                    accept=tuple(request["accept"]),
                    tools=tuple(request["tools"]),
                )
            )
    return cases


def load_fresh_cases(path: Path = FRESH_PARAPHRASES, judged_by: Path = PARAPHRASES) -> list[Case]:
    """Every paraphrase of the blind set ``path`` as a :class:`Case`, judged by its request in ``judged_by``.

    Split and kind are :data:`FRESH`; ``half`` is the request's half in
    ``judged_by``. An id that ``judged_by`` lacks is a :class:`KeyError`.
    """
    requests = {r["id"]: r for r in load_toml(judged_by)["request"]}
    cases = []
    for fresh in load_toml(path)["request"]:
        request = requests[fresh["id"]]
        cases += [_blind_case(request, text, FRESH) for text in fresh["paraphrases"]]
    return cases


def load_blind2_cases(path: Path = BLIND2_PARAPHRASES, judged_by: Path = PARAPHRASES) -> list[Case]:
    """Every paraphrase of the second blind set ``path`` as a :class:`Case`, judged by its request in ``judged_by``.

    That set names each paraphrase's request by its ``original`` wording (its
    writer read only ``tests/search_requests.toml``); split and kind are
    :data:`BLIND2`, ``half`` the request's half in ``judged_by``. An original
    that ``judged_by`` lacks is a :class:`KeyError`.
    """
    return _original_cases(path, judged_by, BLIND2)


def load_blind3_cases(path: Path = BLIND3_PARAPHRASES, judged_by: Path = PARAPHRASES) -> list[Case]:
    """Every paraphrase of the third blind set ``path`` (the second's format), judged by its request in ``judged_by``.

    Split and kind are :data:`BLIND3`.
    """
    return _original_cases(path, judged_by, BLIND3)


def load_blind4_cases(path: Path = BLIND4_PARAPHRASES, judged_by: Path = PARAPHRASES) -> list[Case]:
    """Every paraphrase of the fourth blind set ``path`` (the second's format), judged by its request in ``judged_by``.

    Split and kind are :data:`BLIND4`.
    """
    return _original_cases(path, judged_by, BLIND4)


def _original_cases(path: Path, judged_by: Path, split: str) -> list[Case]:
    """A blind set that names each paraphrase's request by its ``original`` wording, as cases of ``split``."""
    requests = {r["original"]: r for r in load_toml(judged_by)["request"]}
    return [_blind_case(requests[e["original"]], e["text"], split) for e in load_toml(path)["paraphrase"]]


def _blind_case(request: dict[str, Any], text: str, split: str) -> Case:
    """A blind set's paraphrase ``text`` of ``request`` (from the paraphrase file), in ``split`` (its kind too)."""
    return Case(
        request=request["id"],
        text=text,
        kind=split,
        split=split,
        accept=tuple(request["accept"]),
        tools=tuple(request["tools"]),
        half=request["split"],
    )


def judge(case: Case, candidates: list[CrateCandidate]) -> tuple[str, str]:
    """``(verdict, what was decided)`` for the pipeline's choice without a model among ``candidates``."""
    try:
        choice = choose_without_model(candidates, case.text)
    except NeedsModelError as refused:
        named = [c.name for c in refused.candidates[:NAMED]]
        return ("refuse" if set(named) & set(case.accept) else "miss"), ", ".join(named)
    name = choice.candidate.name
    return ("deploy" if name in case.tools else "wrong"), name


def evaluate(
    registry: Registry,
    cases: Iterable[Case],
    *,
    search: Callable[[Registry, str], list[CrateCandidate]] | None = None,
) -> list[Outcome]:
    """Search each case as the pipeline does without a model (binaries preferred), then judge its choice.

    ``search`` replaces :func:`~flakebot_magic.stages.search.search` (a
    ranker being measured); it returns the ten best candidates.
    """
    outcomes = []
    for case in cases:
        if search is None:
            found = search_stage.search(registry, case.text, limit=10, prefer_bin=True)
        else:
            found = search(registry, case.text)
        verdict, decided = judge(case, found) if found else ("miss", "")
        outcomes.append(Outcome(case, tuple(c.name for c in found), verdict, decided))
    return outcomes


def summarize(outcomes: Iterable[Outcome]) -> dict[str, dict[str, Any]]:
    """Per half: cases, top-1/3/10 accuracy, and how many of each verdict."""
    halves: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        halves.setdefault(outcome.case.split, []).append(outcome)
    summary: dict[str, dict[str, Any]] = {}
    for split, chosen in halves.items():
        n = len(chosen)
        summary[split] = {
            "n": n,
            "requests": len({o.case.request for o in chosen}),
            **{f"top{k}": sum(o.top(k) for o in chosen) / n for k in (1, 3, 10)},
            **{verdict: sum(o.verdict == verdict for o in chosen) for verdict in VERDICTS},
        }
    return summary
