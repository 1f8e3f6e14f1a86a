"""The fitness verdicts over every paraphrase set, per half: what a change to the rule does to each.

    .venv/bin/python benchmarks/fitness_sets.py [--save FILE | --load FILE]

For each set (tests/search_paraphrases.toml's tuning and held-out halves, and the
blind sets' cases by their request's half) it prints the cases, top-3 and the
fitness verdicts: right deploy, honest refusal, refusal missing the crate, and
**wrong deploy**. A rule is tuned on the tuning half only; the held-out halves and
the blind sets are read to report, never to choose. ``--save`` keeps each case's
candidates (searched once, the slow part) in a pickle; ``--load`` judges them again
with the rule as it is now, so a before/after is two runs of the same searches.
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry  # noqa: E402
from flakebot_magic.stages import search as search_stage  # noqa: E402
from flakebot_magic.testing import search_eval  # noqa: E402

SETS = {
    "paraphrases": search_eval.load_cases,
    "blind1": search_eval.load_fresh_cases,
    "blind2": search_eval.load_blind2_cases,
    "blind3": search_eval.load_blind3_cases,
    "blind4": search_eval.load_blind4_cases,
}


def searched(cache: Path) -> dict[str, list[tuple[search_eval.Case, list]]]:
    """Every set's cases, each with the registry's candidates (before the stage's re-ranking)."""
    registry = DirectoryRegistry(DEBIAN_REGISTRY, cache)
    out = {}
    for name, load in SETS.items():
        out[name] = [(case, registry.search(case.text, limit=30)) for case in load()]
    return out


def stage_candidates(query: str, found: list) -> list:
    """What :func:`~flakebot_magic.stages.search.search` makes of a registry's ``found`` (its re-ranking)."""

    class Fixed:
        def search(self, _query: str, limit: int = 10) -> list:
            return found

    return search_stage.search(Fixed(), query, limit=10, prefer_bin=True)  # type: ignore[arg-type]


def report(results: dict[str, list]) -> None:
    print(f"{'set':<12}{'half':<8}{'n':>5}{'top3':>7}{'deploy':>8}{'refuse':>8}{'miss':>6}{'wrong':>7}")
    for name, cases in results.items():
        halves: dict[str, list] = {}
        for case, found in cases:
            halves.setdefault(case.half or case.split, []).append((case, found))
        for half, chosen in sorted(halves.items()):
            counts = dict.fromkeys(search_eval.VERDICTS, 0)
            top3 = 0
            for case, found in chosen:
                ranked = stage_candidates(case.text, found)
                top3 += bool({c.name for c in ranked[:3]} & set(case.accept))
                verdict, _ = search_eval.judge(case, ranked) if ranked else ("miss", "")
                counts[verdict] += 1
            n = len(chosen)
            print(
                f"{name:<12}{half:<8}{n:>5}{top3 / n:>7.2f}{counts['deploy']:>8}{counts['refuse']:>8}"
                f"{counts['miss']:>6}{counts['wrong']:>7}"
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path)
    parser.add_argument("--load", type=Path)
    args = parser.parse_args()
    if args.load:
        results = pickle.loads(args.load.read_bytes())
    else:
        with tempfile.TemporaryDirectory() as cache:
            results = searched(Path(cache))
        if args.save:
            args.save.write_bytes(pickle.dumps(results))
    report(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
