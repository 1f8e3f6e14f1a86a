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
from pathlib import Path
from typing import Any

from ..cargo import Cargo
from ..errors import BudgetExhausted, EditError, PolicyError
from ..events import EventBus, ModelUsage
from ..fsutil import UnsafePath
from ..git import Git
from ..model import ModelConfig
from ..policy import Baseline
from ..registry.base import CrateCandidate
from .checkrun import CheckRun, CheckRunner, clippy_available
from .files import PathRefused, WorkspaceFiles
from .model_io import MAX_REPLY_BYTES, MAX_REPLY_SECONDS, ModelChannel
from .prompt import PromptContext, system_prompt
from .protocol import BadCall, decode_call, text_argument
from .ratchet import Ratchet
from .report import cap, report
from .state import EditOutcome, EditState

__all__ = ["MAX_TEXT_REPLIES", "EditLoop"]

#: replies in a row without a function call before the session ends
MAX_TEXT_REPLIES = 3


class EditLoop:
    """Runs one edit session on a forked workspace.

    Parameters
    ----------
    workspace
        The workspace (a git repository on the ``flakebot`` branch).
    client
        An ``openai.OpenAI`` (or anything with ``chat.completions.create``).
    model
        The model configuration (its name is sent; ``stream`` is honoured).
    cargo
        Runs cargo; pass a :class:`~flakebot_magic.sandbox.SandboxedCargo`.
    bus
        Receives :class:`~flakebot_magic.events.IterationResult` and log events.
    git
        The workspace's git (flakebot's identity).
    crate
        Where the workspace came from (for the prompt).
    """

    def __init__(
        self,
        workspace: Path,
        client: Any,
        model: ModelConfig,
        *,
        cargo: Cargo,
        bus: EventBus,
        git: Git,
        crate: CrateCandidate | None = None,
        max_iterations: int = 8,
        token_budget: int = 400_000,
        allow_build_scripts: bool = False,
        build_timeout: float = 900.0,
        test_timeout: float = 300.0,
        clippy: bool | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        max_reply_seconds: float = MAX_REPLY_SECONDS,
    ) -> None:
        self.root = workspace.resolve()
        self.model = model
        self.bus = bus
        self.git = git
        self.crate = crate
        self.max_iterations = max_iterations
        self.token_budget = token_budget
        self.allow_build_scripts = allow_build_scripts
        self.clippy = clippy_available(cargo) if clippy is None else clippy
        self.files = WorkspaceFiles(self.root, allow_build_scripts)
        self.checks = CheckRunner(
            self.files, cargo=cargo, git=git, bus=bus, build_timeout=build_timeout, test_timeout=test_timeout
        )
        self.channel = ModelChannel(
            client,
            model,
            bus=bus,
            workspace=self.root,
            max_reply_bytes=max_reply_bytes,
            max_reply_seconds=max_reply_seconds,
        )
        self.ratchet = Ratchet(self.root)
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
        try:
            return self._run(request, follow_up=follow_up)
        finally:
            self.bus.emit(ModelUsage(self.tokens, self.model_calls))

    def _run(self, request: str, *, follow_up: bool) -> EditOutcome:
        state = EditState.load(self.root)
        self.checks.session = len(state.sessions) + 1
        self.files.published = Baseline.from_git(self.git)
        found = self.checks.policy()
        if found:  # before any cargo run; nothing good to go back to yet
            listed = "\n".join(f"  - {v}" for v in found[:20])
            raise PolicyError(
                f"The workspace holds what flakebot does not build, before the edit loop started:\n{listed}\n"
                "Fix or remove these files in the workspace, then run again.",
                violations=found,
                workspace=self.root,
            )
        baseline = self._baseline()
        context = PromptContext(
            request=request,
            baseline_report=report(baseline, self.root, best_passed=self.ratchet.best_passed, limit=2500),
            sessions=state.sessions,
            follow_up=follow_up,
            crate=self.crate,
            allow_build_scripts=self.allow_build_scripts,
            max_iterations=self.max_iterations,
        )
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": system_prompt(self.root, self.git, context)},
            {
                "role": "user",
                "content": (f"Follow-up instructions for the existing tool: {request}" if follow_up else request),
            },
        ]
        text_replies = 0
        while self._finished is None:
            reply = self.channel.complete(messages, check_budget=self._check_budget)
            if not reply.calls:
                text_replies += 1
                if text_replies > MAX_TEXT_REPLIES:
                    raise EditError(
                        f"The model stopped using the tools ({MAX_TEXT_REPLIES + 1} replies in a row without a tool call). "
                        f"Its last words: {reply.content[:300]!r}",
                        diagnostics=self._last_report(),
                        workspace=self.root,
                        reason="no-tools",
                    )
                messages.append({"role": "assistant", "content": reply.content})
                messages.append(
                    {
                        "role": "user",
                        "content": "Reply with tool calls: edit the files, then call run_checks, "
                        "and finish(summary) once the checks pass and the contract is met.",
                    }
                )
                continue
            text_replies = 0
            messages.append({"role": "assistant", "content": reply.content or None, "tool_calls": reply.calls})
            for call in reply.calls:
                if self._finished is not None:
                    answer = "not run: finish ended the session"
                else:
                    answer = self._call(call)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": answer})
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
        refused = self.checks.policy()
        if refused:  # the crate's own tests wrote what the policy refuses: back to the fork
            self.ratchet.best_commit = before
            self.checks.refuse(run, refused, to=before)
            return run
        run.commit = self.checks.commit(run)
        self.ratchet.best_commit = run.commit
        self.checks.emit(run)
        return run

    def _iteration(self, *, finish: str | None) -> str:
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
            run, refused = self.checks.check(iteration, clippy=self.clippy)
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
        # the whole iteration: ratchet scan, cargo, fixes, commits, events, the report
        run.seconds, run.cargo_seconds = time.monotonic() - started, self.checks.cargo_seconds - cargo_before
        previous = next((r for r in reversed(self.runs) if r.iteration == iteration - 1), None)
        if run.green and finish is not None:
            self._finished = finish
            return text + "\nFinished."
        if run.green and iteration >= self.max_iterations:
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
        if iteration >= self.max_iterations:
            raise BudgetExhausted(
                f"The edit loop used all {self.max_iterations} iterations and the workspace is not green. "
                f"Last diagnostics:\n{cap(text, 1500)}{ratchet.hint()}",
                diagnostics=text,
                workspace=self.root,
                reason="iterations",
            )
        if finish is not None:
            return text + "\nNot finished: the checks must pass and the contract must be met first."
        return text

    # -- the budget and the record ------------------------------------------------

    def _check_budget(self) -> None:
        if self.tokens >= self.token_budget:
            raise BudgetExhausted(
                f"The token budget ({self.token_budget:,} tokens) is spent after {self.iterations} "
                f"iteration(s) and the workspace is not green yet.{self._last_words()}",
                diagnostics=self._last_report(),
                workspace=self.root,
                reason="tokens",
            )

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
