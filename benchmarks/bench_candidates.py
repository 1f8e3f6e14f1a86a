"""The cost of racing candidates (issue 13): an edit session with 3 candidates beside the same session with 1.

Both sessions run through the whole pipeline (``Pipeline.run`` with
``candidates=1`` or ``3``, ``backend="cargo"``, real cargo in the sandbox) on
sha2 from the Debian registry (a crate with dependencies: 19 units in check
run 0). The fake OpenAI server (a scripted test double, not a model) answers
every engineer with the same green two-reply script of
``flakebot_magic/testing/scripts/sha256.json`` (a binary that does not compile, then its fix
and ``finish``), each reply after 1.5 s of simulated model latency. The
single engineer reads the default queue, each candidate its own copy of it.
The judge scores that result green but not perfect (clippy counts 5
warnings), so no candidate is stopped early: all three finish and the judge
picks, the slowest case of a race.

What is timed is the pipeline's ``edit`` stage (``StageFinished.elapsed``):
check run 0, the clones, the engineers, the judge, the winner's adoption. The
floor is the 1-candidate session; the runs alternate, and the best of each is
kept. Reported beside it: the same two sessions after check run 0, which
both share.

Dependency units: each engineer's check runs reach the manager's mailbox
(``Team.mail``, an ``("iteration", index, CheckRun)`` message each); the
benchmark taps that mailbox and reads ``CheckRun.dependency_units`` of each
candidate's first check run after check run 0. Every extra candidate's must
be 0: its clone's target dir is warm.
"""

from __future__ import annotations

import json
import queue
import shutil
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: simulated model latency per reply, seconds
DELAY = 1.5
CANDIDATES = 3
REQUEST = "a command that prints the SHA-256 of its standard input"


def race_script(delay: float = DELAY, candidates: int = CANDIDATES) -> dict[str, Any]:
    """The sha256 edit session for the default queue and for every candidate, each reply after ``delay`` s."""
    replies = json.loads((ROOT / "flakebot_magic" / "testing" / "scripts" / "sha256.json").read_text())["responses"]
    # the pipeline is given the crate, so the script's crate choice is never asked for
    session = [r for r in replies if r["tool_calls"][0]["function"]["name"] != "choose_crate"]
    return {
        "responses": session,
        "candidates": {str(i): {"responses": session} for i in range(candidates)},
        "delay": delay,
    }


class _TappedMail(queue.Queue[tuple[Any, ...]]):
    """The manager's mailbox, tapped: every engineer's check runs by its index, as they are posted."""

    def __init__(self, runs: dict[int, list[Any]]) -> None:
        super().__init__()
        self.runs = runs

    def put(self, item: tuple[Any, ...], block: bool = True, timeout: float | None = None) -> None:
        if item and item[0] == "iteration":
            self.runs.setdefault(int(item[1]), []).append(item[2])
        super().put(item, block, timeout)


def one_session(registry: str, server_url: str, candidates: int) -> dict[str, Any]:
    """One pipeline run on sha2 in a fresh cache: the edit stage's seconds and each engineer's check runs."""
    from flakebot_magic.config import Settings
    from flakebot_magic.edit.team import Team
    from flakebot_magic.events import CandidateUpdate, IterationResult, StageFinished, StageStarted
    from flakebot_magic.pipeline import Pipeline
    from flakebot_magic.pipeline import edit_stage as editing
    from flakebot_magic.registry.directory import DirectoryRegistry
    from flakebot_magic.request import BuildRequest, RunFlags

    runs: dict[int, list[Any]] = {}

    class TappedTeam(Team):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.mail = _TappedMail(runs)

    events: list[Any] = []
    cache = Path(tempfile.mkdtemp(prefix=f"fb-bench-candidates-{candidates}-"))
    # the pipeline's edit stage builds its Team by this name; the real one is put back below
    setattr(editing, "Team", TappedTeam)  # noqa: B010
    try:
        DirectoryRegistry(registry, cache).search("warm up")  # the index is per registry, not per request
        settings = Settings(
            cache_dir=cache,
            registry=registry,
            backend="cargo",
            model="scripted-test-double",
            base_url=server_url,
        )
        race = BuildRequest(REQUEST, crate="sha2", name="sha", flags=RunFlags(candidates=candidates))
        tool = Pipeline(settings, observers=[events.append]).run(race)
        provenance = dict(tool.provenance)
    finally:
        setattr(editing, "Team", Team)  # noqa: B010
        shutil.rmtree(cache, ignore_errors=True)
    edit = next(e for e in events if isinstance(e, StageFinished) and e.stage == "edit")
    started = next(e.at for e in events if isinstance(e, StageStarted) and e.stage == "edit")
    baseline = next(e for e in events if isinstance(e, IterationResult) and e.iteration == 0)
    first = {i: next(r for r in listed if r.iteration >= 1) for i, listed in runs.items()}
    base_run = next(r for listed in runs.values() for r in listed if r.iteration == 0)
    return {
        "edit_s": edit.elapsed,
        "after_run0_s": edit.at - baseline.at,
        "baseline_dependency_units": base_run.dependency_units,
        "first_run_dependency_units": {i: r.dependency_units for i, r in sorted(first.items())},
        "first_run_cargo_s": {i: round(r.cargo_seconds, 2) for i, r in sorted(first.items())},
        # when each candidate changed state, seconds into the edit stage (where the time goes)
        "timeline": sorted(
            [
                (round(u.at - started, 2), u.index, u.state, u.detail[:60])
                for u in events
                if isinstance(u, CandidateUpdate)
            ]
            + [
                (round(e.at - started, 2), None, f"check run {e.iteration}", e.summary[:60])
                for e in events
                if isinstance(e, IterationResult)
            ],
            key=lambda t: t[0],
        ),
        "winner": provenance.get("winner"),
        "scores": {c["index"]: (c["status"], c["score"]) for c in provenance.get("candidates", [])},
        "status": edit.status,
    }


def candidates_bench(registry: str, rounds: int = 2) -> dict[str, Any]:
    """Alternate the 1-candidate and the 3-candidate session ``rounds`` times; the best of each, and their ratio."""
    from flakebot_magic.testing.fake_openai import FakeOpenAIServer

    sessions: dict[int, list[dict[str, Any]]] = {1: [], CANDIDATES: []}
    for _ in range(rounds):
        for count in (1, CANDIDATES):
            with FakeOpenAIServer(race_script()) as server:
                sessions[count].append(one_session(registry, server.base_url, count))
    one = min(sessions[1], key=lambda s: s["edit_s"])
    many = min(sessions[CANDIDATES], key=lambda s: s["edit_s"])
    # each extra candidate's first check run (candidate 0 starts where the single engineer does)
    extra = [units for s in sessions[CANDIDATES] for i, units in s["first_run_dependency_units"].items() if i > 0]
    return {
        "delay_s": DELAY,
        "candidates": CANDIDATES,
        "one_s": one["edit_s"],
        "many_s": many["edit_s"],
        "ratio": many["edit_s"] / one["edit_s"],
        "one_after_run0_s": one["after_run0_s"],
        "many_after_run0_s": many["after_run0_s"],
        "ratio_after_run0": many["after_run0_s"] / one["after_run0_s"],
        "baseline_dependency_units": many["baseline_dependency_units"],
        "extra_candidate_first_runs": len(extra),
        "dependency_units_per_extra_candidate": max(extra) if extra else None,
        "sessions": sessions,
    }


def candidate_rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    c = results.get("candidates")
    if not c:
        return []
    return [
        (
            f"edit session, {c['candidates']} candidates / 1 candidate (sha2, scripted, {c['delay_s']} s per reply; "
            f"after check run 0: {c['many_after_run0_s']:.1f} s / {c['one_after_run0_s']:.1f} s "
            f"= {c['ratio_after_run0']:.2f}x)",
            f"{c['many_s']:.1f} s / {c['one_s']:.1f} s = **{c['ratio']:.2f}x**",
            "<= 1.5x",
        ),
        (
            "dependency units compiled per extra candidate (its first check run; "
            f"check run 0: {c['baseline_dependency_units']})",
            f"**{c['dependency_units_per_extra_candidate']}**",
            "0",
        ),
    ]
