"""The edit loop: one session of the model editing a workspace, within its budget, until a green check run.

The model works through seven protocol functions (:mod:`.protocol`; see
``docs/edit-protocol.md``). On ``run_checks`` and ``finish`` the loop runs a
check run (:mod:`.checkrun`). What code, not the prompt, decides: containment
(:mod:`.files`), compiler fixes first, a commit per check run, the ratchet
(:mod:`.ratchet`), the build policy on disk after every run, and the budget:
at most ``max_iterations`` check runs asked for by the model, a token budget,
and an early stop when two check runs in a row fail the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ..clients.kinds import unasked
from ..config import LoopLimits
from ..errors import BudgetExhausted, EditError, PolicyError
from ..events import EventBus, outcome_of
from ..host.fsutil import UnsafePath
from ..host.git import Git
from ..llm.budget import Budget
from ..llm.channel import ModelChannel
from ..llm.context import cap_middle, compact
from ..llm.dialects import strict_form
from ..llm.limits import ReplyLimits
from ..llm.model import ModelConfig
from ..llm.reply import Reply
from ..llm.usage import estimate_tokens
from ..records.journal import EndStatus, Journal, ResumePoint
from ..records.steering import Inbox
from ..registry.base import CrateCandidate
from ..sandbox.cargo import Cargo
from ..sandbox.policy import PUBLISHED_REF, Baseline, Violation
from .checkrun import CheckRun, CheckRunner, clippy_available, kind_at
from .files import PathRefused, WorkspaceFiles
from .prompt import PromptContext, system_prompt
from .protocol import FUNCTION_NAMES, FUNCTION_SCHEMAS, BadCall, decode_call, decode_reply, text_argument
from .ratchet import Ratchet
from .report import cap, report
from .resume import known_check, paired, ratchet_of
from .state import EditOutcome, EditState

__all__ = ["MAX_RESULT_BYTES", "MAX_TEXT_REPLIES", "EditLoop", "engineer_channel"]

#: replies in a row without a function call before the session ends
MAX_TEXT_REPLIES = 3
#: one protocol function's result (a file, a report, test output), as the model gets it: head and tail kept
MAX_RESULT_BYTES = 24 * 1024


def engineer_channel(
    model: ModelConfig,
    *,
    bus: EventBus,
    budget: Budget,
    limits: ReplyLimits,
    candidate: int | None = None,
    sampling: dict[str, Any] | None = None,
    workspace: Path | None = None,
) -> ModelChannel:
    """An engineer's channel to ``model``: the edit protocol's functions offered, the run's budget charged."""
    return ModelChannel(
        model,
        role="engineer",
        bus=bus,
        budget=budget,
        limits=limits,
        candidate=candidate,
        sampling=sampling,
        tools=FUNCTION_SCHEMAS,
        workspace=workspace,
    )


class EditLoop:
    """Runs one edit session on a forked workspace.

    Parameters
    ----------
    workspace
        The workspace (a git repository on the ``flakebot`` branch).
    channel
        The engineer's :class:`~flakebot_magic.llm.channel.ModelChannel`: its
        model, the run's shared budget, the reply caps; its ``stop`` ends the
        session, even mid-request.
    limits
        What the session may do (:class:`~flakebot_magic.config.LoopLimits`:
        check runs, cargo's time limits, the context, build scripts).
    cargo
        Runs cargo (in the workspace's sandbox: :meth:`~flakebot_magic.sandbox.cargo.Cargo.confined_to`).
    bus
        Receives :class:`~flakebot_magic.events.IterationResult` and log events.
    git
        The workspace's git (flakebot's identity).
    crate
        Where the workspace came from (for the prompt).
    journal, inbox
        Where the session is recorded (to resume it), and where steering
        messages arrive.
    plan
        The architect's plan, given to the model with the request.
    resume
        A :class:`~flakebot_magic.records.journal.ResumePoint`: continue that
        session's conversation instead of starting one.
    """

    def __init__(
        self,
        workspace: Path,
        channel: ModelChannel,
        *,
        limits: LoopLimits,
        cargo: Cargo,
        bus: EventBus,
        git: Git,
        crate: CrateCandidate | None = None,
        clippy: bool | None = None,
        journal: Journal | None = None,
        inbox: Inbox | None = None,
        plan: str = "",
        resume: ResumePoint | None = None,
        baseline: CheckRun | None = None,
        conclude: str = "",
    ) -> None:
        self.root = workspace.resolve()
        self.channel = channel
        self.limits = limits
        self.model = channel.model
        self.candidate = channel.candidate
        self.budget = channel.budget
        self.journal = journal
        self.inbox = inbox
        self.plan = plan
        self.resume = resume
        #: a resumed session that had finished: check (a known green tree: no cargo) and finish, no model call
        self.conclude = conclude
        #: check run 0 done elsewhere (the workspace this one was cloned from, at the same commit)
        self.known_baseline = baseline
        self.bus = bus
        self.git = git
        self.crate = crate
        self.clippy = clippy_available(cargo) if clippy is None else clippy
        self.files = WorkspaceFiles(self.root, limits.allow_build_scripts)
        self.checks = CheckRunner(
            self.files,
            cargo=cargo,
            git=git,
            bus=bus,
            build_timeout=limits.build_timeout,
            test_timeout=limits.test_timeout,
        )
        self.ratchet = Ratchet(self.root)
        #: the iteration of the last check run (the widget's candidate rows)
        self.on_iteration: Callable[[CheckRun], None] | None = None
        self.iterations = 0
        self._finished: str | None = None

    @property
    def runs(self) -> list[CheckRun]:
        return self.checks.runs

    @property
    def tokens(self) -> int:
        return self.channel.tokens

    @property
    def model_calls(self) -> int:
        return self.channel.calls

    # -- public -------------------------------------------------------------

    def run(self, request: str, *, follow_up: bool = False) -> EditOutcome:
        """Edit until the checks pass and the model finishes; raise :class:`EditError` otherwise.

        However the session ends, the bus then gets one
        :class:`~flakebot_magic.events.ModelUsage`: the tokens it spent.
        """
        status: EndStatus = "failed"
        error = ""
        try:
            outcome = self._run(request, follow_up=follow_up)
            status = "finished"
            return outcome
        except BudgetExhausted as exc:
            status, error = "budget", str(exc)
            raise
        except BaseException as exc:
            status, error = ("cancelled" if outcome_of(exc) == "cancelled" else "failed"), str(exc)
            raise
        finally:
            self.channel.close()  # its last word: what the session spent
            if self.journal is not None:
                self.journal.end(status, error=error[:2000])

    def _run(self, request: str, *, follow_up: bool) -> EditOutcome:
        state = EditState.load(self.root)
        self.checks.session = len(state.sessions) + 1
        # the kind the tool had when this work began: the model may keep it, or make one the request asks for
        start = str(self.resume.start.get("base_commit") or PUBLISHED_REF) if self.resume is not None else "HEAD"
        self.checks.kind_rule = partial(unasked, request=request, had=kind_at(self.git, start))
        self.files.published = Baseline.from_git(self.git)
        self._refuse_policy()
        messages = self._resumed() if self.resume is not None else self._opening(request, state, follow_up)
        if self.conclude:  # it had finished before the interruption: its result stands if its tree is still green
            text = self._iteration(finish=self.conclude)
            if self._finished is None:
                self._say(messages, {"role": "user", "content": f"Your finished work was checked again:\n{text}"})
        text_replies = 0
        while self._finished is None:
            reply = self._next_reply(messages)
            if reply.refusal or not reply.calls:  # no call, or calls written as text that cannot be read whole
                text_replies += 1
                if text_replies > MAX_TEXT_REPLIES:
                    raise EditError(
                        self._no_calls(reply),
                        diagnostics=self._last_report(),
                        workspace=self.root,
                        reason="no-tools",
                    )
                self._say(messages, {"role": "assistant", "content": reply.content})
                self._say(messages, {"role": "user", "content": reply.refusal or self._ask_for_calls()})
                continue
            text_replies = 0
            self._say(messages, {"role": "assistant", "content": reply.content or None, "tool_calls": reply.calls})
            refused = decode_reply(reply.calls, cut=reply.finish_reason == "length")
            for call, error in zip(reply.calls, refused, strict=True):
                if error:
                    answer = error
                elif self._finished is not None:
                    answer = "not run: finish ended the session"
                else:
                    answer = self._call(call)
                self._say(messages, {"role": "tool", "tool_call_id": call["id"], "content": answer})
        self._record(state, request)
        last = self.runs[-1]
        assert last.contract is not None
        return EditOutcome(
            summary=self._finished,
            contract=last.contract,
            runs=self.runs,
            iterations=self.iterations,
            model_calls=self.model_calls,
            tokens=self.tokens,
            head=self.git.head(),
        )

    # -- the conversation ---------------------------------------------------------

    def prepare(self) -> CheckRun:
        """Check run 0 alone (the policy first): the baseline clones of this workspace start from."""
        self.files.published = Baseline.from_git(self.git)
        self._refuse_policy()
        return self._baseline()

    def _refuse_policy(self) -> None:
        found = self.checks.policy()
        if found:  # before any cargo run; nothing good to go back to yet
            listed = "\n".join(f"  - {v}" for v in found[:20])
            raise PolicyError(
                f"The workspace holds what flakebot does not build, before the edit loop started:\n{listed}\n"
                "Fix or remove these files in the workspace, then run again.",
                violations=found,
                workspace=self.root,
            )

    def _opening(self, request: str, state: EditState, follow_up: bool) -> list[dict[str, Any]]:
        """A new conversation: check run 0, the system prompt, the request (and the architect's plan)."""
        if self.known_baseline is not None:
            baseline = self.known_baseline
            self.ratchet.protect()
            self.ratchet.best_passed = baseline.passed if baseline.tests_ran else 0
            self.ratchet.best_commit = baseline.commit or self.checks.head()
            self.checks.runs.append(baseline)
        else:
            baseline = self._baseline()
        context = PromptContext(
            request=request,
            baseline_report=report(baseline, self.root, best_passed=self.ratchet.best_passed, limit=2500),
            sessions=state.sessions,
            follow_up=follow_up,
            crate=self.crate,
            allow_build_scripts=self.limits.allow_build_scripts,
            max_iterations=self.limits.max_iterations,
        )
        ask = f"Follow-up instructions for the existing tool: {request}" if follow_up else request
        if self.plan:
            ask += f"\n\nThe architect's plan (follow it unless the checks prove it wrong):\n{self.plan}"
        messages: list[dict[str, Any]] = []
        self._say(messages, {"role": "system", "content": system_prompt(self.root, self.git, context)})
        self._say(messages, {"role": "user", "content": ask})
        return messages

    def _resumed(self) -> list[dict[str, Any]]:
        """The conversation of the session being resumed, and the ratchet where it stood (no check run repeated)."""
        point = self.resume
        assert point is not None
        self.ratchet.protect()
        known = ratchet_of(point)
        if known is None:  # the session died before its first check run finished: run it now
            self._baseline()
        else:
            self.ratchet.best_commit, self.ratchet.best_passed = known
            self.iterations = point.iterations
            self.bus.notice(
                "edit",
                f"resumed after iteration {point.iterations}: the best commit {known[0][:12]} "
                f"({known[1]} test{'' if known[1] == 1 else 's'} passing) is known, so no check run is repeated",
            )
        messages: list[dict[str, Any]] = []
        for message in paired(point.messages):
            self._say(messages, message)
        self._say(
            messages,
            {
                "role": "user",
                "content": "The session was interrupted and is resumed here; the workspace is as you left it "
                f"(last check run's commit {point.last_commit[:12] or 'none'}). Re-read any file you were changing, "
                "then carry on.",
            },
        )
        return messages

    def _say(self, messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
        """Add ``message`` to the conversation (capped when it is a function's result) and to the journal."""
        if message.get("role") == "tool" and isinstance(message.get("content"), str):
            message = {**message, "content": cap_middle(message["content"], MAX_RESULT_BYTES)}
        messages.append(message)
        if self.journal is not None:
            self.journal.message(message)

    def _next_reply(self, messages: list[dict[str, Any]]) -> Reply:
        """Steering delivered, the conversation kept within the context, the budget checked; the model's reply."""
        self._deliver_steering(messages)
        fitted = compact(messages, self.limits.context_tokens)
        if fitted != messages:
            before = estimate_tokens(messages)
            messages[:] = fitted
            self.bus.notice(
                "edit",
                f"the conversation neared the model's context ({self.limits.context_tokens:,} tokens): older turns "
                f"compacted, ~{before:,} -> ~{estimate_tokens(messages):,} tokens",
            )
        try:
            reply = self.channel.complete(messages)
        except BudgetExhausted as exc:
            raise BudgetExhausted(
                f"{exc} The session stopped after {self.iterations} iteration(s) and the workspace is not green "
                f"yet.{self._last_words()}\nTo continue it, raise the budget and run the same cell with --resume.",
                diagnostics=self._last_report(),
                workspace=self.root,
                reason=exc.reason,
            ) from None
        if self.journal is not None:
            marks: dict[str, Any] = {}
            if reply.dialect:  # calls read from text: marked, with their ids (the next message holds them)
                marks["read_from_text"] = {"dialect": reply.dialect, "calls": [c["id"] for c in reply.calls]}
            if reply.refusal:
                marks["refused"] = reply.refusal
            if reply.finish_reason:
                marks["finish_reason"] = reply.finish_reason
            self.journal.reply(reply.usage, estimated=reply.estimated, **marks)
        return reply

    def _ask_for_calls(self) -> str:
        """What the model is told after a reply without a call (with the one form, under the text protocol)."""
        ask = (
            "Reply with tool calls: edit the files, then call run_checks, "
            "and finish(summary) once the checks pass and the contract is met."
        )
        if self.channel.text_protocol:
            ask += f" Write each call exactly as:\n{strict_form('qwen', FUNCTION_NAMES)}"
        return ask

    def _no_calls(self, reply: Reply) -> str:
        if reply.refusal:
            return (
                f"The model wrote its function calls as text that could not be read {MAX_TEXT_REPLIES + 1} times "
                f"in a row. The last refusal: {reply.refusal[:400]}"
            )
        return (
            f"The model stopped using the tools ({MAX_TEXT_REPLIES + 1} replies in a row without a tool call). "
            f"Its last words: {reply.content[:300]!r}"
        )

    def _deliver_steering(self, messages: list[dict[str, Any]]) -> None:
        if self.inbox is None:
            return
        for steer in self.inbox.take():
            self._say(
                messages,
                {"role": "user", "content": f"A message from the user, sent while you work: {steer.text}"},
            )
            if self.journal is not None:
                self.journal.steer(steer.text, steer.source)
            self.bus.emit(replace(steer, delivered=True))  # the same message (its `at`), now delivered

    # -- the protocol functions -------------------------------------------------

    def _call(self, call: dict[str, Any]) -> str:
        """Carry out one call of a protocol function; the text is the reply to the model."""
        try:
            name, args = decode_call(call)
            if name == "list_files":
                return self.files.list_files(str(args.get("path") or "."))
            if name == "read_file":
                return self.files.read_file(
                    text_argument(name, args, "path"), args.get("start_line"), args.get("end_line")
                )
            if name == "write_file":
                return self.files.write_file(text_argument(name, args, "path"), text_argument(name, args, "content"))
            if name == "replace_in_file":
                path, search = text_argument(name, args, "path"), text_argument(name, args, "search")
                return self.files.replace_in_file(path, search, text_argument(name, args, "replace"))
            if name == "delete_file":
                return self.files.delete_file(text_argument(name, args, "path"))
            if name == "run_checks":
                return self._iteration(finish=None)
            return self._iteration(finish=str(args.get("summary") or "").strip() or "(no summary)")
        except BadCall as exc:
            return str(exc)
        except PathRefused as exc:
            return f"error: refused: {exc}"
        except UnsafePath as exc:  # a symlink planted on the way; nothing was written
            return f"error: refused: {exc}"

    # -- check runs -------------------------------------------------------------

    def _baseline(self) -> CheckRun:
        """Check run 0: the state before any model edit; it sets the ratchet."""
        self.ratchet.protect()
        before = self.checks.head()
        run = self.checks.cargo_run(0, clippy=True)
        self.ratchet.best_passed = run.passed if run.tests_ran else 0
        refused = self.checks.policy(run)
        if refused:  # the crate's own tests wrote what the policy refuses: back to the fork
            self.ratchet.best_commit = before
            self.checks.refuse(run, refused, to=before)
            return run
        run.commit = self.checks.commit(run)
        self.ratchet.best_commit = run.commit
        self.checks.emit(run)
        self._journal_check(run, report(run, self.root, best_passed=self.ratchet.best_passed))
        return run

    def _known_check(self, iteration: int) -> tuple[CheckRun, list[Violation]] | None:
        return known_check(self.resume, self.checks, self.root, self.bus, iteration)

    def _journal_check(self, run: CheckRun, text: str) -> None:
        """Record a check run (and where the ratchet stands after it) in the journal; tell the manager."""
        if self.journal is not None:
            self.journal.check(
                iteration=run.iteration,
                run=run.run,
                commit=run.commit or self.ratchet.best_commit,
                tree=self.git.tree(run.commit) if run.commit else "",
                green=run.green,
                report=text,
                best_commit=self.ratchet.best_commit,
                best_passed=self.ratchet.best_passed,
                passed=run.passed,
                ignored=run.tests.ignored if run.tests else 0,
                binaries=sorted(run.binaries),
            )
        if self.on_iteration is not None:
            self.on_iteration(run)

    def _iteration(self, *, finish: str | None) -> str:
        self.channel.check()
        started, cargo_before = time.monotonic(), self.checks.cargo_seconds
        self.iterations += 1
        iteration = self.iterations
        ratchet = self.ratchet
        violations = ratchet.violations()
        if violations:
            run = self.checks.new_run(iteration)
            run.reason = "; ".join(violations)
            self.checks.revert(run, to=ratchet.best_commit)
        else:
            known = self._known_check(iteration)
            run, refused = known if known is not None else self.checks.check(iteration, clippy=self.clippy)
            if refused:
                self.checks.refuse(run, refused, to=ratchet.best_commit)
            elif run.tests_ran and run.passed < ratchet.best_passed:
                run.reason = f"passing tests went down from {ratchet.best_passed} to {run.passed}"
                self.checks.revert(run, to=ratchet.best_commit)
            else:
                run.commit = self.checks.commit(run)
                if run.tests_ran and run.passed >= ratchet.best_passed:
                    ratchet.advance(run.commit, run.passed)
                self.checks.emit(run)
        text = report(run, self.root, best_passed=ratchet.best_passed)
        self._journal_check(run, text)
        # the whole iteration: ratchet scan, cargo, fixes, commits, events, the report
        run.seconds, run.cargo_seconds = time.monotonic() - started, self.checks.cargo_seconds - cargo_before
        previous = next((r for r in reversed(self.runs) if r.iteration == iteration - 1), None)
        if run.green and finish is not None:
            self._finished = finish
            return text + "\nFinished."
        if run.green and iteration >= self.limits.max_iterations:
            self._finished = "(the checks passed at the last iteration; the model did not call finish)"
            return text
        if (
            not run.green
            and previous is not None
            and previous.iteration > 0
            and not previous.green
            and previous.signature() == run.signature()
        ):
            raise EditError(
                f"The edit loop is stuck: check runs {previous.run} and {run.run} failed the same way. "
                f"Last diagnostics:\n{cap(text, 1500)}{ratchet.hint()}",
                diagnostics=text,
                workspace=self.root,
                reason="stuck",
            )
        if iteration >= self.limits.max_iterations:
            raise BudgetExhausted(
                f"The edit loop used all {self.limits.max_iterations} iterations and the workspace is not green. "
                f"Last diagnostics:\n{cap(text, 1500)}{ratchet.hint()}",
                diagnostics=text,
                workspace=self.root,
                reason="iterations",
            )
        if finish is not None:
            return text + "\nNot finished: the checks must pass and the contract must be met first."
        return text

    # -- the budget and the record ------------------------------------------------

    def _last_report(self) -> str:
        return report(self.runs[-1], self.root, best_passed=self.ratchet.best_passed) if self.runs else ""

    def _last_words(self) -> str:
        return f" Last diagnostics:\n{cap(self._last_report(), 1500)}{self.ratchet.hint()}" if self.runs else ""

    def _record(self, state: EditState, request: str) -> None:
        state.sessions.append(
            {
                "request": request,
                "summary": self._finished,
                "model": self.model.model,
                "base_url": self.model.base_url,
                "iterations": self.iterations,
                "head": self.git.head(),
                "at": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
        )
        state.save(self.root)
