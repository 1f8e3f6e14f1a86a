"""The fitness rule's thresholds, swept on the TUNING half only (issue 20): how they were chosen.

    .venv/bin/python benchmarks/tune_fitness.py

A binary is deployed as published only when its own words cover at least
:data:`~flakebot_magic.stages.search.EVIDENCE` of the request, what it says of
itself is at least :data:`~flakebot_magic.stages.search.SEMANTIC_EVIDENCE`
similar to the request in meaning, and it is among the first
:data:`~flakebot_magic.stages.search.AGREEMENT` candidates by words and by
meaning. For each combination this prints the fitness verdicts over the
tuning half of ``tests/search_paraphrases.toml`` (right deploys, wrong
deploys: the tradeoff curve), and the rule before (words OR meaning, a
similarity below 0.3 vetoing). It never reads the held-out half nor the
blind set. The rule that chose the shipped values: no wrong deploy, and none
either with any one threshold loosened a step (a margin), then the most right
deploys.

The registry is searched once per paraphrase; each combination re-ranks
(the binary boost depends on the rule) and decides, as the pipeline does.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402
from flakebot_magic.registry.base import CrateCandidate  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry  # noqa: E402
from flakebot_magic.stages import search as search_stage  # noqa: E402
from flakebot_magic.testing.search_eval import Case, judge, load_cases  # noqa: E402

SIMILARITIES = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6)
EVIDENCES = (0.0, 0.5, 0.65, 0.75)
AGREEMENTS = (10, 3, 2, 1)


def verdicts(searched: list[tuple[Case, list[CrateCandidate]]]) -> tuple[int, int]:
    """``(right deploys, wrong deploys)`` with the module's current thresholds."""
    right = wrong = 0
    for case, found in searched:
        verdict, _ = judge(case, search_stage.rank(found, prefer_bin=True)[:10])
        right += verdict == "deploy"
        wrong += verdict == "wrong"
    return right, wrong


def _old_rule(candidate: CrateCandidate) -> str:
    """The rule before: words (evidence >= 0.65) OR meaning (similarity >= 0.65), a similarity below 0.3 vetoing."""
    parts, base = candidate.parts, _unfit(replace(candidate, parts={}))
    if base:
        return base
    means = parts.get("own_similarity", 0.0) >= 0.65
    if parts.get("evidence", 1.0) < 0.65 and not means:
        return "words"
    return "veto" if parts.get("own_similarity", 1.0) < 0.3 else ""


_unfit: Callable[[CrateCandidate], str] = search_stage.unfit


def main() -> int:
    registry = DirectoryRegistry(DEBIAN_REGISTRY, Path(tempfile.mkdtemp(prefix="fb-tune-fitness-")))
    if registry.semantic_off:
        print(registry.semantic_off, file=sys.stderr)
        return 1
    cases = [c for c in load_cases() if c.split == "tune"]
    searched = [(case, registry.search(case.text, limit=30)) for case in cases]
    registry.close()
    shipped = (search_stage.SEMANTIC_EVIDENCE, search_stage.EVIDENCE, search_stage.AGREEMENT)

    search_stage.unfit, search_stage.AGREEMENT = _old_rule, 1000
    print(f"the rule before: right, wrong deploys = {verdicts(searched)}")
    search_stage.unfit = _unfit
    print(f"{len(cases)} paraphrases of the tuning half; right, wrong deploys per similarity x evidence x agreement")
    print(
        "similarity | "
        + " | ".join(f"evidence {e:.2f}: " + " ".join(f"a{a:<2d}" for a in AGREEMENTS) for e in EVIDENCES)
    )
    for similarity in SIMILARITIES:
        cells = []
        for evidence in EVIDENCES:
            row = []
            for agreement in AGREEMENTS:
                search_stage.SEMANTIC_EVIDENCE, search_stage.EVIDENCE = similarity, evidence
                search_stage.AGREEMENT = agreement
                right, wrong = verdicts(searched)
                row.append(f"{right}/{wrong}")
            cells.append(" ".join(f"{r:>5s}" for r in row))
        print(f"{similarity:10.2f} | " + " | ".join(f"{' ' * 15}{c}" for c in cells), flush=True)
    search_stage.SEMANTIC_EVIDENCE, search_stage.EVIDENCE, search_stage.AGREEMENT = shipped
    print(f"shipped: similarity {shipped[0]}, evidence {shipped[1]}, agreement {shipped[2]}: {verdicts(searched)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
