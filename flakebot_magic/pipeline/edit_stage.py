"""The edit session of a pipeline run: the team that runs it, its journal and steering, what the manifest records.

:func:`edit_session` is the pipeline's ``edit`` stage. The session is a
:class:`~flakebot_magic.edit.team.Team`: one engineer, or ``candidates``
racing from clones of the warm workspace, with an architect's plan when
``plan`` is set. A one-engineer session is journalled
(:mod:`~flakebot_magic.records.journal`) so that :func:`resume_point` and
:func:`resumed_run` can continue it after a crash, a ``kill -9``, a cancel or
a spent budget; while it runs it reads steering messages
(:mod:`~flakebot_magic.records.steering`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..commands import typed
from ..config import Settings
from ..edit.team import Team, TeamOutcome
from ..errors import FlakebotError, ForkError, UsageError
from ..events import EventBus
from ..host.process import LinkedToken, ProcessRunner
from ..llm.budget import Budget
from ..llm.model import HOW_TO_CONFIGURE, ModelConfig
from ..records import steering
from ..records.journal import Journal, ResumePoint, journals_dir
from ..records.races import RacePoint, RaceRecord, unfinished_race
from ..registry.base import CrateCandidate
from ..request import BuildRequest
from ..sandbox import Sandbox
from ..sandbox.cargo import Cargo
from ..sandbox.layout import CANDIDATES_DIR
from ..stages.choose import Choice
from ..stages.fork import Workspace, fork
from ..stages.state import RunDeps, RunState, Stage

__all__ = ["edit_session", "resume_point", "resumed_run", "session_record"]


def edit_session(deps: RunDeps, run: RunState, cargo: Cargo) -> Cargo:
    """Run the edit session when a model is configured (with ``cargo``, the sandboxed one); return ``cargo``."""
    model, workspace = run.model, run.forked()
    if model is None:
        return cargo
    settings, bus = deps.settings, deps.bus
    try:
        with (
            Stage(bus, "edit", model.describe()) as stage,
            steering.running(settings.cache, run.name, keep_queued=run.resume is not None) as inbox,
        ):
            team = _team(deps, run, cargo, inbox)
            done = team.run(run.request.text, follow_up=run.follow_up)
            if run.race is not None:  # a winner is kept: nothing of this race is left to resume
                run.race.decide(settings.cache_dir, run.name)
            if done.switched is not None:
                _switch_workspace(run, done.switched.path, bus)
            outcome = done.outcome
            run.iterations = outcome.iterations
            run.session = session_record(team, done)
            won = f"candidate #{done.winner} of {len(done.candidates)} won; " if done.winner is not None else ""
            stage.detail = (
                f"{won}green after {outcome.iterations} iteration(s), {outcome.model_calls} model call(s), "
                f"{team.budget.tokens:,} tokens{_cost_text(team.budget)}; {outcome.contract}: {outcome.summary[:200]}"
            )
    except FlakebotError as exc:
        exc.keep_workspace(workspace.path)
        if (run.journal is not None or run.race is not None) and not isinstance(exc, UsageError):
            exc.args = (
                f"{exc}\nTo carry on where it stopped: "
                f"{typed(f'build --name {run.name} --resume', 'the same cell with --resume')}.",
            )
        raise
    except KeyboardInterrupt:
        bus.notice("edit", f"interrupted; the workspace is kept at {workspace.path}", "warning")
        raise
    return cargo


def _team(deps: RunDeps, run: RunState, cargo: Cargo, inbox: steering.Inbox) -> Team:
    """The session's actors, wired to this run: sandboxed cargo per workspace, one budget, the journal."""
    settings, workspace, model = deps.settings, run.forked(), run.model
    assert model is not None
    race_resume = run.resume if isinstance(run.resume, RacePoint) else None
    count = _candidate_count(run, race_resume)
    journal_for = _journals(settings, run, count, race_resume)  # sets run.journal (one session) or run.race
    return Team(
        workspace.path,
        model,
        runner=deps.runner,
        bus=deps.bus,
        cargo_for=_cargo_for(cargo),
        crate=workspace.crate,
        budget=_budget(settings, run, model.model),
        limits=settings.loop_limits(),
        reply_limits=settings.reply_limits(),
        candidates=count,
        plan=run.flags.plan,
        architect=model.with_options(model=settings.architect_model) if settings.architect_model else model,
        examples=run.examples,
        journal=run.journal,
        inbox=inbox,
        resume=run.resume if isinstance(run.resume, ResumePoint) else None,
        race_resume=race_resume.points if race_resume is not None else None,
        journal_for=journal_for,
        name=run.name,
        alternatives=run.alternatives if not run.follow_up and run.resume is None else [],
        fork_other=_fork_other(deps, cargo),
    )


def _candidate_count(run: RunState, race_resume: RacePoint | None) -> int:
    """How many edit sessions race: the resumed race's, else ``--candidates`` (a one-candidate session resumes
    alone)."""
    if run.flags.candidates > 1 and isinstance(run.resume, ResumePoint):
        raise UsageError(
            f"--resume continues {run.name!r}'s last session, which had one candidate; drop --candidates to resume it."
        )
    return race_resume.record.candidates if race_resume is not None else run.flags.candidates


def _cargo_for(cargo: Cargo) -> Callable[[Path, ProcessRunner], Cargo]:
    """Each candidate's cargo: sandboxed to its own workspace, with the session's one CARGO_HOME."""

    def cargo_for(path: Path, runner: ProcessRunner) -> Cargo:
        # one CARGO_HOME for the session, what the workspace's check run 0 downloaded: read-only in every
        # candidate's builds, written only by cargo's own downloads (the fetch profile), so no candidate
        # can plant anything another reads
        home = cargo.sandbox.cargo_home if cargo.sandbox is not None else None
        isolate = cargo.sandbox.isolated if cargo.sandbox is not None else None
        return cargo.confined_to(Sandbox(path, cargo_home=home, isolate=isolate), runner)

    return cargo_for


def _fork_other(deps: RunDeps, cargo: Cargo) -> Callable[[CrateCandidate, Path], str]:
    """How a candidate forks a close second of the search: the commit its diff is measured from."""

    def fork_other(crate: CrateCandidate, path: Path) -> str:
        runner = ProcessRunner(LinkedToken(deps.runner.cancel))
        other = fork(
            crate,
            deps.registry,
            path.parent,
            path.name,
            runner=runner,
            bus=deps.bus,
            cargo=Cargo(deps.registry, runner, executable=cargo.executable, isolate=cargo.isolate),
            fresh=True,
        )
        return other.published_commit

    return fork_other


def _budget(settings: Settings, run: RunState, model: str) -> Budget:
    """The run's one budget; a resumed session's spending counts in it (one budget, one usage record)."""
    budget = run.budget or Budget(settings.token_budget, max_cost=settings.max_cost, prices=settings.prices)
    if run.resume is not None:
        budget.charge(model, run.resume.usage)
    return budget


def _journals(
    settings: Settings, run: RunState, count: int, race_resume: RacePoint | None
) -> Callable[..., Journal] | None:
    """The session's journal: one (``run.journal``) for a single session; for a race, its record (``run.race``)
    and how each candidate's journal is made (returned)."""
    workspace, model = run.forked(), run.model
    assert model is not None
    if count <= 1:
        if run.journal is None:
            run.journal = _journal(
                settings,
                run,
                model.model,
                model.base_url,
                workspace=str(workspace.path),
                replaces=str(workspace.replaces or ""),
                crate=workspace.crate.id,
            )
        return None
    run.race = (
        race_resume.record
        if race_resume is not None
        else RaceRecord.start(
            settings.cache_dir,
            run.name,
            workspace=str(workspace.path),
            replaces=str(workspace.replaces or ""),
            candidates=count,
            request=run.request.text,
            follow_up=run.follow_up,
        )
    )
    race = run.race.race

    def journal_for(
        index: int,
        path: Path,
        crate: CrateCandidate | None,
        base_commit: str,
        base_clippy: int,
        plan: str,
        resumes: ResumePoint | None,
    ) -> Journal:
        return _journal(
            settings,
            run,
            model.model,
            model.base_url,
            candidate=index,
            workspace=str(path),
            base_commit=base_commit,
            resumes=resumes,
            run=race,
            crate=(crate or workspace.crate).id,
            base_clippy=base_clippy,
            plan=plan,
        )

    return journal_for


def _switch_workspace(run: RunState, winner: Path, bus: EventBus) -> None:
    """Put the winner's fork (another crate) where the tool's workspace is; keep the rest among the candidates.

    The winner moves out from under the workspace, the losers' directory moves into it, the workspace itself
    (the first crate, at its check run 0) goes there too as ``base``, and the winner takes its path.
    """
    old = run.forked()
    chosen = Workspace.load(winner)
    if chosen is None:
        raise ForkError(f"The winning candidate's workspace {winner} has no fork record.", workspace=winner)
    beside = old.path.parent / f".{old.path.name}.winner-{time.time_ns()}"
    os.rename(winner, beside)
    os.rename(old.path / CANDIDATES_DIR, beside / CANDIDATES_DIR)
    os.rename(old.path, beside / CANDIDATES_DIR / "base")
    os.rename(beside, old.path)
    run.workspace = replace(chosen, path=old.path, replaces=old.replaces, reused=old.reused)
    run.workspace.save()
    run.candidate = chosen.crate
    bus.notice(
        "edit",
        f"the winner started from {chosen.crate.id}: it is the tool's workspace now; the fork of "
        f"{old.crate.id} is kept at {old.path / CANDIDATES_DIR / 'base'}",
    )


def _journal(settings: Settings, state: RunState, model: str, base_url: str, **fields: Any) -> Journal:
    """A new journal for a session of the run ``state`` (its request and model in the start record, and ``fields``)."""
    return Journal.create(
        settings.cache_dir,
        state.name,
        request=state.request.text,
        follow_up="yes" if state.follow_up else "",
        model=model,
        base_url=base_url,
        **fields,
    )


def session_record(team: Team, done: TeamOutcome) -> dict[str, object]:
    """What the manifest records of a session: usage and cost; with candidates, each one and the winner."""
    budget = team.budget
    usage: dict[str, object] = {
        **budget.spent.to_json(),
        "cost_usd": None if budget.unpriced and not budget.cost_usd else round(budget.cost_usd, 6),
    }
    record: dict[str, object] = {"usage": usage}
    if done.winner is not None:
        record["winner"] = done.winner
        record["candidates"] = [c.to_json() for c in done.candidates]
    if done.plan:
        record["plan"] = done.plan
    return record


def _cost_text(budget: Budget) -> str:
    if budget.unpriced and not budget.cost_usd:
        return ""
    return f", ${budget.cost_usd:.4f}" + (" (some replies unpriced)" if budget.unpriced else "")


# -- resuming -------------------------------------------------------------------------


def resume_point(settings: Settings, build: BuildRequest, model: ModelConfig | None) -> ResumePoint | RacePoint:
    """The tool's last unfinished session (``--resume``), checked before anything runs."""
    if model is None:
        raise UsageError(f"--resume continues an edit session, which needs a model. {HOW_TO_CONFIGURE}")
    if not build.name:
        raise UsageError("--resume needs --name: the tool whose interrupted session to continue.")
    race = unfinished_race(settings.cache_dir, build.name)
    if race is not None and Path(race.record.workspace).is_dir():
        return race
    point = Journal.last_unfinished(settings.cache_dir, build.name)
    if point is None:
        raise UsageError(
            f"There is no unfinished edit session of {build.name!r} to resume (looked in "
            f"{journals_dir(settings.cache_dir, build.name)}). Run the cell without --resume."
        )
    if not Path(str(point.start.get("workspace", ""))).is_dir():
        raise UsageError(
            f"The workspace of {build.name!r}'s interrupted session ({point.start.get('workspace')}) is gone "
            f"({typed('clean')} removes interrupted builds). Run the cell without --resume."
        )
    return point


def resumed_run(settings: Settings, run: RunState, point: ResumePoint | RacePoint, bus: EventBus) -> Choice:
    """Point ``run`` at the interrupted session's workspace and journal; the crate choice to build it with."""
    if isinstance(point, RacePoint):
        return _resumed_race(run, point, bus)
    path = Path(str(point.start["workspace"]))
    workspace = Workspace.load(path)
    if workspace is None:
        raise UsageError(f"{path} is not a flakebot workspace; run the cell without --resume.")
    replaces = str(point.start.get("replaces") or "")
    run.workspace = replace(workspace, replaces=Path(replaces) if replaces else None)
    run.candidate, run.name = workspace.crate, str(run.request.name)
    run.resume = point
    run.journal = _journal(
        settings,
        run,
        str(point.start.get("model", "")),
        str(point.start.get("base_url", "")),
        resumes=point,
        workspace=str(path),
        replaces=replaces,
        crate=workspace.crate.id,
    )
    bus.notice("edit", f"resuming the session of {run.name!r} from {point.path} (after iteration {point.iterations})")
    return Choice(workspace.crate, "user", "--resume: the interrupted session's crate")


def _resumed_race(run: RunState, race: RacePoint, bus: EventBus) -> Choice:
    """Point ``run`` at an interrupted race's workspace; every candidate resumes from its own journal."""
    record = race.record
    workspace = Workspace.load(Path(record.workspace))
    if workspace is None:
        raise UsageError(f"{record.workspace} is not a flakebot workspace; run the cell without --resume.")
    run.workspace = replace(workspace, replaces=Path(record.replaces) if record.replaces else None)
    run.candidate, run.name = workspace.crate, str(run.request.name)
    run.resume = race
    states = ", ".join(
        f"#{i} {p.status or 'interrupted'} after iteration {p.iterations}" for i, p in race.points.items()
    )
    bus.notice("edit", f"resuming the race of {record.candidates} candidates of {run.name!r}: {states}")
    return Choice(workspace.crate, "user", "--resume: the interrupted race's crate")
