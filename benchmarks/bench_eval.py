"""The starter suite proven (issues 25, 35): ``flakebot eval --reference`` on every task of ``starter`` (the built-in suite).

Each task's reference solution is sent by the fake OpenAI-compatible server
(a scripted test double, not a model) and built through the whole pipeline
in a cache of its own (real cargo in the sandbox, real git), then its hidden
tests run against the deployed tool. The row says how many tasks passed (all
must: the suite and the harness agree) and what it took: the wall time of the
eval with ``--jobs 2`` (the machine's two cores), and the p50 and slowest
attempt. ``make bench BENCH_ARGS=--only-eval`` measures only this.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from flakebot_magic.eval.task import BUILTIN_SUITES

ROOT = Path(__file__).resolve().parent.parent
STARTER = BUILTIN_SUITES["starter"]

__all__ = ["eval_bench", "eval_rows"]


def eval_bench(registry: str, jobs: int = 2) -> dict[str, Any]:
    """Run the whole starter suite with its reference solutions; the numbers of the row."""
    import flakebot_magic.eval

    with tempfile.TemporaryDirectory(prefix="flakebot-bench-eval-") as out:
        started = time.monotonic()
        results = flakebot_magic.eval.run(
            STARTER, reference=True, jobs=jobs, out=out, registry=registry, backend="cargo", progress=False
        )
        wall = time.monotonic() - started
    attempts = results.attempts
    slowest = max(attempts, key=lambda a: a.seconds)
    return {
        "tasks": len(attempts),
        "passed": sum(a.passed for a in attempts),
        "failed": sorted(f"{a.task}: {a.failure}" for a in attempts if not a.passed),
        "problems": len(results.data["suite"]["problems"]),
        "jobs": jobs,
        "wall_s": wall,
        "task_p50_s": statistics.median(a.seconds for a in attempts),
        "task_max_s": slowest.seconds,
        "slowest": slowest.task,
        "iterations_p50": statistics.median(a.iterations for a in attempts),
    }


def eval_rows(results: dict[str, Any]) -> list[tuple[str, str, str]]:
    if "eval" not in results:
        return []
    e = results["eval"]
    failed = f" (failed: {', '.join(e['failed'])})" if e["failed"] else ""
    return [
        (
            f"`flakebot eval --reference` of the starter suite (jobs {e['jobs']}): tasks passed, wall time "
            "(per task p50 / slowest)",
            f"**{e['passed']}/{e['tasks']}**{failed} in {e['wall_s']:.0f} s "
            f"({e['task_p50_s']:.0f} s / {e['task_max_s']:.0f} s, {e['slowest']})",
            "all pass",
        )
    ]
