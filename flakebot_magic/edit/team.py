"""Roles as actors: an architect who plans, engineers who edit, a judge who scores, a manager who decides.

One edit session is a :class:`Team`. The manager (the calling thread) owns a
mailbox; every other actor is a thread that posts to it:

* the **architect** (``--plan``): one request (``X-Flakebot-Role: architect``,
  its own model with ``--architect-model``) that reads the crate and the
  request and writes a plan (with examples of use when the cell has none:
  words for the engineers, never run; only the person's examples are checks);
* the **engineers**: :class:`~flakebot_magic.edit.session.EditLoop` sessions.
  With ``--candidates N`` each works in its own clone of the warm workspace
  (:mod:`.forks`), from the same check run 0, with its own sampling and its own
  ``X-Flakebot-Candidate`` header, all spending one shared
  :class:`~flakebot_magic.llm.budget.Budget`;
* the **judge**: code, not a model. It scores each finished candidate
  structurally (:mod:`.judge`: contract, the cell's examples run against the
  candidate's binary, passing tests, clippy, the smaller diff).

The manager stops the others as soon as one candidate is fully green (no other
can beat it), picks the best score, and brings the winner's commits into the
tool's workspace. A cancel (the Cancel button, Ctrl-C, kernel shutdown) stops
every actor: each engineer's model request is cut (:mod:`..llm.http`) and its
cargo killed (its own :class:`~flakebot_magic.host.process.LinkedToken`), within
:data:`STOP_SECONDS`.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import LoopLimits
from ..errors import BudgetExhausted, Cancelled, EditError
from ..events import CandidateUpdate, EventBus, outcome_of
from ..host.git import Git
from ..host.process import LinkedToken, ProcessRunner
from ..llm.budget import Budget
from ..llm.channel import ModelChannel
from ..llm.limits import ReplyLimits
from ..llm.model import ModelConfig
from ..records.journal import Journal, ResumePoint
from ..records.steering import Inbox
from ..registry.base import CrateCandidate
from ..sandbox.cargo import Cargo
from ..sandbox.layout import CANDIDATES_DIR
from ..stages.accept import Example
from ..stages.fork import Workspace
from .candidates import CandidateBus, CandidateResult, Fanout, TeamOutcome
from .checkrun import CheckRun
from .forks import adopt, candidate_path, clone_candidate
from .judge import Score, best, judge
from .session import EditLoop, engineer_channel
from .state import EditState

__all__ = ["STOP_SECONDS", "CandidateResult", "JournalFor", "Team", "TeamOutcome"]

#: makes a candidate's journal: (index, path, crate or None, base commit, clippy at check run 0, plan, resumed point)
JournalFor = Callable[[int, Path, CrateCandidate | None, str, int, str, ResumePoint | None], Journal | None]


#: every actor and process of a session is stopped within this many seconds of a cancel
STOP_SECONDS = 2.0
#: each candidate's sampling: the first stays close to the model's default, the others spread out
TEMPERATURES = (0.2, 0.7, 1.0, 0.4, 0.85, 0.55, 1.1, 0.3)


class Team:
    """Runs one edit session on ``workspace``: one engineer, or ``candidates`` racing from clones; returns the best.

    ``cargo_for(path, runner)`` gives the (sandboxed) cargo for a workspace
    path; every engineer gets ``limits`` (iterations, time limits) and every
    model request ``reply_limits``.
    """

    def __init__(
        self,
        workspace: Path,
        model: ModelConfig,
        *,
        runner: ProcessRunner,
        bus: EventBus,
        cargo_for: Callable[[Path, ProcessRunner], Cargo],
        crate: CrateCandidate | None,
        budget: Budget,
        limits: LoopLimits,
        reply_limits: ReplyLimits,
        candidates: int = 1,
        plan: bool = False,
        architect: ModelConfig | None = None,
        examples: list[Example] | None = None,
        journal: Journal | None = None,
        inbox: Inbox | None = None,
        resume: ResumePoint | None = None,
        name: str = "",
        alternatives: list[CrateCandidate] | None = None,
        fork_other: Callable[[CrateCandidate, Path], str] | None = None,
        journal_for: JournalFor | None = None,
        race_resume: dict[int, ResumePoint] | None = None,
    ) -> None:
        self.root = workspace
        #: the tool's name (the acceptance examples call it by that name)
        self.name = name
        #: close seconds in the search: the last candidates start from them (``fork_other`` forks one
        #: into a path and returns the commit it starts from)
        self.alternatives = list(alternatives or []) if fork_other is not None else []
        self.fork_other = fork_other
        #: each candidate's journal (index, path, crate, base commit, clippy at check run 0, plan, resumed point)
        self.journal_for = journal_for
        #: an interrupted race: each candidate's resume point (the plan is in their journals)
        self.race_resume = race_resume
        self.model = model
        self.runner = runner
        self.bus = bus
        self.cargo_for = cargo_for
        self.crate = crate
        self.budget = budget
        self.limits = limits
        self.reply_limits = reply_limits
        self.count = max(1, candidates)
        self.plan_wanted = plan
        self.architect = architect or model
        self.examples = list(examples or [])
        self.journal = journal
        self.inbox = inbox
        self.resume = resume
        self.mail: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._stoppers: list[Callable[[str], None]] = []
        #: each candidate's stop, by its index
        self._stop: dict[int, Callable[[str], None]] = {}
        self._threads: list[threading.Thread] = []
        self._fanouts: list[Fanout] = []
        self._delivered: set[tuple[str, float]] = set()

    # -- the manager -----------------------------------------------------------

    def run(self, request: str, *, follow_up: bool = False) -> TeamOutcome:
        """The session, start to end; raises the session's error when no candidate gets green."""
        try:
            if self.race_resume:
                return self._race_resumed(request, follow_up)
            plan = self._plan(request) if self.plan_wanted and self.resume is None else ""
            if self.count == 1:
                return self._alone(request, follow_up, plan)
            return self._race(request, follow_up, plan)
        finally:
            self._stop_all("the session ended")

    def _alone(self, request: str, follow_up: bool, plan: str) -> TeamOutcome:
        """One engineer, in the tool's workspace itself (no clone), on its own thread so a cancel can cut it."""
        result = CandidateResult(0, self.root, state="editing")
        loop = self._engineer(
            self.root, None, self.bus, plan=plan, journal=self.journal, resume=self.resume, baseline=None
        )
        self._start(0, loop, request, follow_up)
        self._wait({0: result})
        if result.outcome is None:
            assert result.error is not None
            raise result.error
        result.state = "winner"
        return TeamOutcome(result.outcome, None, [result], plan, self.examples)

    def _race(self, request: str, follow_up: bool, plan: str) -> TeamOutcome:
        """N engineers from clones of the workspace after its check run 0; the judge's best wins."""
        git = Git(self.root, self.runner)
        crate = self.crate.name if self.crate else ""
        first = self._engineer(self.root, None, self.bus, plan="", journal=None, resume=None, baseline=None)
        self.bus.notice("edit", f"check run 0 once, then {self.count} candidates from clones of the warm workspace")
        try:
            baseline = first.prepare()
        finally:
            first.channel.close(report=False)  # check run 0 alone: no request was sent
        base_commit = baseline.commit or git.head()
        results: dict[int, CandidateResult] = {}
        starts = self._starting_crates()
        for index in range(self.count):
            self._check_cancel()
            started = time.monotonic()
            other = starts.get(index)
            if other is None:
                path = clone_candidate(self.root, index, runner=self.runner)
                result = CandidateResult(
                    index, path, state="editing", base_commit=base_commit, base_clippy=len(baseline.clippy)
                )
                how, known = f"cloned in {time.monotonic() - started:.1f} s", baseline
            else:
                assert self.fork_other is not None
                path = candidate_path(self.root, index)
                result = CandidateResult(index, path, state="editing", crate=other)
                result.base_commit = self.fork_other(other, path)
                how, known = f"forked {other.id}: the search found it close", None
            results[index] = result
            label = result.crate.name if result.crate is not None else crate
            self.bus.emit(CandidateUpdate(index, "editing", detail=how, crate=label))
            cbus = CandidateBus(self.bus, index, label, self._delivered)
            journal = self._journal(result, plan, None)
            loop = self._engineer(
                path, index, cbus, plan=plan, journal=journal, resume=None, baseline=known, crate=result.crate
            )
            self._start(index, loop, request, follow_up)
        return self._decide(results, plan)

    def _race_resumed(self, request: str, follow_up: bool) -> TeamOutcome:
        """An interrupted race, each candidate from its journal in its own workspace; then judged as usual."""
        assert self.race_resume
        crate = self.crate.name if self.crate else ""
        results: dict[int, CandidateResult] = {}
        plan = ""
        for index, point in sorted(self.race_resume.items()):
            start = point.start
            path = candidate_path(self.root, index)
            own = Workspace.load(path)
            other = own.crate if own is not None and self.crate is not None and own.crate.id != self.crate.id else None
            clippy = start.get("base_clippy")
            result = CandidateResult(
                index,
                path,
                state="editing",
                crate=other,
                base_commit=str(start.get("base_commit") or ""),
                base_clippy=clippy if isinstance(clippy, int) else 0,
            )
            plan = plan or str(start.get("plan") or "")
            results[index] = result
            label = other.name if other is not None else crate
            finished = point.status == "finished"
            self.bus.emit(
                CandidateUpdate(
                    index, "editing", detail="finished before: checked again" if finished else "resumed", crate=label
                )
            )
            loop = self._engineer(
                path,
                index,
                CandidateBus(self.bus, index, label, self._delivered),
                plan=plan,
                journal=self._journal(result, plan, point),
                resume=point,
                baseline=None,
                crate=other,
            )
            if finished:
                loop.conclude = "(finished before the interruption)"
            self._start(index, loop, request, follow_up)
        return self._decide(results, plan)

    def _journal(self, result: CandidateResult, plan: str, resumes: ResumePoint | None) -> Journal | None:
        if self.journal_for is None:
            return None
        return self.journal_for(
            result.index, result.path, result.crate, result.base_commit, result.base_clippy, plan, resumes
        )

    def _decide(self, results: dict[int, CandidateResult], plan: str) -> TeamOutcome:
        """Wait for the engineers (judging each as it finishes), then keep the best."""
        git = Git(self.root, self.runner)
        crate = self.crate.name if self.crate else ""
        self._wait(results)
        scored = {i: r.score for i, r in results.items() if r.outcome is not None and r.score is not None}
        if not scored:
            lines = "\n".join(
                f"  #{r.index}: {r.state}: {str(r.error).splitlines()[0][:200] if r.error else ''}"
                for r in results.values()
            )
            raise EditError(
                f"None of the {self.count} candidates got green:\n{lines}\n"
                f"Their workspaces are kept under {self.root / CANDIDATES_DIR}.",
                workspace=self.root,
                reason="candidates",
            )
        winner = best(scored)
        for index, result in results.items():
            if index == winner:
                result.state = "winner"
            elif result.outcome is not None:
                result.state = "lost"
            self.bus.emit(
                CandidateUpdate(
                    index,
                    result.state,  # type: ignore[arg-type]
                    iteration=result.iteration,
                    score=result.score.describe() if result.score else "",
                    crate=crate,
                )
            )
        chosen = results[winner]
        assert chosen.outcome is not None
        self.bus.notice("edit", f"candidate #{winner} wins: {chosen.score.describe() if chosen.score else ''}")
        if chosen.crate is not None:  # another crate's fork: the caller puts its workspace in place
            return TeamOutcome(chosen.outcome, winner, list(results.values()), plan, self.examples, switched=chosen)
        same = {i: r.path for i, r in results.items() if i != winner and r.crate is None}
        adopt(self.root, chosen.path, winner, git, losers=same)
        EditState.load(chosen.path).save(self.root)
        return TeamOutcome(chosen.outcome, winner, list(results.values()), plan, self.examples)

    def _starting_crates(self) -> dict[int, CrateCandidate]:
        """Which candidates start from a close second of the search: the last ones, keeping most on the choice.

        With N candidates at most N // 2 start elsewhere (one of two, one of three, two of four ...).
        """
        others = self.alternatives[: self.count // 2]
        return {self.count - 1 - i: crate for i, crate in enumerate(others)}

    def _wait(self, results: dict[int, CandidateResult]) -> None:
        """The manager's loop: read the mailbox until every engineer is done (or stopped); judge as they finish."""
        running = set(results)
        judging = 0
        while running or judging:
            self._check_cancel()
            try:
                message = self.mail.get(timeout=0.1)
            except queue.Empty:
                self._steer(len(results))
                continue
            kind, index = message[0], message[1]
            result = results[index]
            if kind == "iteration":
                run: CheckRun = message[2]
                result.iteration = max(result.iteration, run.iteration)
                result.runs.append(run)
                if run.iteration == 0:  # a candidate from another crate ran its own check run 0
                    result.base_clippy = len(run.clippy)
            elif kind == "done":
                running.discard(index)
                result.outcome, result.error = message[2], message[3]
                if result.outcome is None:
                    result.state = "cancelled" if outcome_of(result.error) == "cancelled" else "failed"
                    if len(results) > 1:
                        detail = str(result.error).splitlines()[0][:200] if result.error else ""
                        self.bus.emit(
                            CandidateUpdate(index, result.state, iteration=result.iteration, detail=detail)  # type: ignore[arg-type]
                        )
                elif len(results) > 1:
                    result.state = "green"
                    judging += 1
                    self._judge(result, result.base_commit)
            elif kind == "scored":
                judging -= 1
                result.score = message[2]
                self.bus.emit(
                    CandidateUpdate(index, "green", iteration=result.iteration, score=result.score.describe())
                )
                if result.score.perfect and running:
                    self.bus.notice(
                        "edit",
                        f"candidate #{index} is fully green ({result.score.describe()}); no other can beat it, "
                        f"stopping {', '.join(f'#{i}' for i in sorted(running))}",
                    )
                    for other in running:
                        self._stop[other](f"candidate #{index} won")

    # -- the actors ----------------------------------------------------------------

    def _engineer(
        self,
        path: Path,
        index: int | None,
        bus: EventBus,
        *,
        plan: str,
        journal: Journal | None,
        resume: ResumePoint | None,
        baseline: CheckRun | None,
        crate: CrateCandidate | None = None,
    ) -> EditLoop:
        token = LinkedToken(self.runner.cancel)
        runner = ProcessRunner(token)
        inbox = Fanout()
        self._fanouts.append(inbox)
        sampling: dict[str, Any] = {}
        if index is not None:
            sampling = {"temperature": TEMPERATURES[index % len(TEMPERATURES)], "seed": index}

        channel = engineer_channel(
            self.model,
            bus=bus,
            budget=self.budget,
            limits=self.reply_limits,
            candidate=index,
            sampling=sampling,
            workspace=path,
        )

        def stop(reason: str) -> None:
            channel.stop(reason)
            token.cancel()

        self._stoppers.append(stop)
        self._stop[index or 0] = stop
        loop = EditLoop(
            path,
            channel,
            limits=self.limits,
            cargo=self.cargo_for(path, runner),
            bus=bus,
            git=Git(path, runner),
            crate=crate or self.crate,
            journal=journal,
            inbox=inbox,  # type: ignore[arg-type]
            plan=plan,
            resume=resume,
            baseline=baseline,
        )
        loop.on_iteration = lambda run: self.mail.put(("iteration", index or 0, run))
        return loop

    def _start(self, index: int, loop: EditLoop, request: str, follow_up: bool) -> None:
        def work() -> None:
            try:
                self.mail.put(("done", index, loop.run(request, follow_up=follow_up), None))
            except BaseException as exc:  # every ending is the manager's to judge
                self.mail.put(("done", index, None, exc))

        thread = threading.Thread(target=work, name=f"flakebot-engineer-{index}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _judge(self, result: CandidateResult, base_commit: str) -> None:
        """The judge actor: scores a finished candidate on its own thread and posts the score."""
        outcome = result.outcome
        assert outcome is not None

        def work() -> None:
            try:
                runner = ProcessRunner(LinkedToken(self.runner.cancel))
                score = judge(
                    outcome.runs[-1],
                    result.path,
                    base_commit,
                    self.examples,
                    git=Git(result.path, runner),
                    name=self.name or None,
                    clippy_baseline=result.base_clippy,
                )
            except BaseException as exc:  # a judge that cannot score says so; the candidate scores lowest
                self.bus.notice("edit", f"the judge could not score candidate #{result.index}: {exc}", "warning")
                score = Score(contract_met=False)
            self.mail.put(("scored", result.index, score))

        thread = threading.Thread(target=work, name=f"flakebot-judge-{result.index}", daemon=True)
        self._threads.append(thread)
        thread.start()

    def _plan(self, request: str) -> str:
        """The architect actor: one request, before any engineer; its plan goes to every engineer as words.

        A model's plan carries no acceptance examples: its ``>>>`` lines are words for the engineers, never
        run by the judge (only the person's examples are, :attr:`examples`)."""
        from .architect import ask_architect

        channel = ModelChannel(
            self.architect, role="architect", bus=self.bus, budget=self.budget, limits=self.reply_limits
        )
        self._stoppers.append(channel.stop)
        done: queue.Queue[tuple[str, BaseException | None]] = queue.Queue()

        def work() -> None:
            try:
                with channel:
                    text = ask_architect(
                        channel, request, self.root, crate=self.crate, bus=self.bus, want_examples=not self.examples
                    )
                done.put((text, None))
            except BaseException as exc:
                done.put(("", exc))

        thread = threading.Thread(target=work, name="flakebot-architect", daemon=True)
        self._threads.append(thread)
        thread.start()
        while True:
            self._check_cancel()
            try:
                text, error = done.get(timeout=0.1)
                break
            except queue.Empty:
                continue
        if isinstance(error, (Cancelled, BudgetExhausted)) or (error is not None and not isinstance(error, Exception)):
            raise error
        if error is not None:  # the engineers can do without a plan: a notice, not a failed run
            self.bus.notice(
                "edit",
                f"the architect ({self.architect.describe()}) gave no plan ({type(error).__name__}: "
                f"{str(error).splitlines()[0][:200] if str(error) else ''}); the engineers start without one",
                "warning",
            )
            return ""
        return text

    # -- stopping -------------------------------------------------------------------

    def _steer(self, engineers: int) -> None:
        """Give each engineer a copy of every steering message that arrived."""
        if self.inbox is None:
            return
        for message in self.inbox.take():
            for fanout in self._fanouts:
                fanout.put(message)

    def _check_cancel(self) -> None:
        if self.runner.cancel.cancelled:
            self._stop_all("the run was cancelled")
            raise Cancelled("Stopped during the edit session.", workspace=self.root)

    def _stop_all(self, reason: str) -> None:
        """Stop every actor (model requests cut, processes killed) and wait for them, at most STOP_SECONDS."""
        for stop in self._stoppers:
            stop(reason)
        deadline = time.monotonic() + STOP_SECONDS
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
