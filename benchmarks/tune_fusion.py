"""The fusion of words and meaning, swept on the TUNING half only (issue 20): how its weights were chosen.

    .venv/bin/python benchmarks/tune_fusion.py

For each semantic weight and pool size (:data:`flakebot_magic.registry.ranking.SEMANTIC_WEIGHT`,
:data:`~flakebot_magic.registry.ranking.SEMANTIC_POOL`), it prints top-1/3/10 and the fitness verdicts
over the tuning half of ``tests/search_paraphrases.toml`` and top-1/3 over the tuning half of
``tests/search_requests.toml``. It never reads the held-out half. The rule that chose the shipped values:
the best top-3 + top-10 with no wrong deploy and the requests' top-3 kept at 1.00; within one paraphrase,
the cheaper or simpler design. (The normalisations and the text each crate's embedding reads were compared
the same way, on the same half, before this script: score / best vs rank fusion, the similarity's share of
the best crate's lead over the registry's mean vs its raw value, description alone vs with the README's
start vs both as two vectors; the shipped choice was within one paraphrase of the best at half the index
build time.) Since, the crates' three views (:func:`flakebot_magic.registry.embedding.crate_texts`) and the
weight 0.65 were chosen on the tuning split of every evaluation file: ``benchmarks/tune_search.py``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from flakebot_magic.config import DEBIAN_REGISTRY  # noqa: E402
from flakebot_magic.host.fsutil import load_toml  # noqa: E402
from flakebot_magic.registry import ranking  # noqa: E402
from flakebot_magic.registry.directory import DirectoryRegistry  # noqa: E402
from flakebot_magic.stages import search as search_stage  # noqa: E402
from flakebot_magic.testing.search_eval import evaluate, load_cases, summarize  # noqa: E402

WEIGHTS = (0.0, 0.4, 0.5, 0.6, 0.7, 1.0)
POOLS = (20, 40)


def main() -> int:
    registry = DirectoryRegistry(DEBIAN_REGISTRY, Path(tempfile.mkdtemp(prefix="fb-tune-")))
    if registry.semantic_off:
        print(registry.semantic_off, file=sys.stderr)
        return 1
    cases = [c for c in load_cases() if c.split == "tune"]
    requests = [r for r in load_toml(ROOT / "tests" / "search_requests.toml")["request"] if r["split"] == "tune"]
    print("weight pool | top1 top3 top10 | deploy refuse miss wrong | requests top1 top3")
    for weight in WEIGHTS:
        for pool in POOLS:
            ranking.SEMANTIC_WEIGHT, ranking.SEMANTIC_POOL = weight, pool
            half = summarize(evaluate(registry, cases))["tune"]
            top1 = top3 = 0
            for request in requests:
                names = [c.name for c in search_stage.search(registry, request["text"], limit=10)]
                top1 += bool(names) and names[0] in request["accept"]
                top3 += bool(set(names[:3]) & set(request["accept"]))
            print(
                f"{weight:6.1f} {pool:4d} | {half['top1']:.3f} {half['top3']:.3f} {half['top10']:.3f} | "
                f"{half['deploy']:6d} {half['refuse']:6d} {half['miss']:4d} {half['wrong']:5d} | "
                f"{top1 / len(requests):.3f} {top3 / len(requests):.3f}",
                flush=True,
            )
    registry.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
