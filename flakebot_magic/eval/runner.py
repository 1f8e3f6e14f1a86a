"""Running an eval: every task, model and attempt built through the pipeline in a cache of its own, then checked.

An attempt is one build (:func:`~flakebot_magic.pipeline.background.start_build`, as
every front door builds) of the task's request with one model, in
``OUT/work/<model>/<task>/attempt-<i>/cache``: its own workspace, journal,
sandbox and store. When it has deployed a tool, the task's hidden checks run
(:mod:`.hidden`); then the attempt's record is journalled
(:class:`~.results.ResultStore`). ``--jobs N`` runs N attempts at once;
models run side by side, task after task.

``--feedback``: attempt ``i+1`` of a task whose attempt ``i`` deployed a tool
that failed its hidden checks continues that tool (a ``--continue`` session
on its workspace) with the failures as its instructions, as aider's second
try does, and a task that passed gets no further attempt; without it every
attempt is independent. ``--resume``: attempts
with a record are not run again; one that was interrupted continues its edit
session from its journal when it can (a replay starts it over: its script
starts over too).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..config import Settings, apply
from ..errors import Cancelled, UsageError
from ..host.process import CancelToken, ProcessRunner
from ..host.trees import remove_tree
from ..llm.usage import Usage, cost_usd
from ..pipeline.background import start_build
from ..records.journal import spent
from ..registry.base import Registry
from ..request import BuildRequest, UntrustedText, split_run_flags
from .hidden import run_cargo_tests, run_pytest
from .outcome import (
    Meter,
    TimedOut,
    cause_of,
    classify,
    failure_message,
    feedback_request,
    headline,
    hidden_verdict,
    proof_of,
    usage_fields,
)
from .reference import ReferenceError, reference_script, starting_manifest
from .replay import REPLAY_MODEL_NAME, replay_server
from .results import REFERENCE_MODEL, REPLAY_MODEL, AttemptResult, HiddenResult, ResultStore, cut, document
from .task import Suite, Task

__all__ = ["DEFAULT_TIMEOUT", "Eval", "EvalPlan", "Progress"]

#: seconds one attempt (build and hidden checks) may take when its task does not say
DEFAULT_TIMEOUT = 1800.0
#: the settings a resumed eval must share with the one it continues
_IDENTITY = ("source", "polyglot", "models", "replay", "reference", "attempts", "feedback")


class Progress(Protocol):
    """What an eval tells a front end: how many attempts, then each one as it finishes."""

    def started(self, total: int, already: int, problems: list[str]) -> None: ...

    def finished(self, result: AttemptResult, *, resumed: bool) -> None: ...

    def ended(self) -> None: ...


@dataclass(frozen=True)
class EvalPlan:
    """What to run: the suite, the models (or a replay), attempts, and the build options every attempt gets."""

    suite: Suite
    models: tuple[str, ...]
    out: Path
    replay: bool = False
    attempts: int = 1
    feedback: bool = False
    jobs: int = 1
    timeout: float = DEFAULT_TIMEOUT
    #: build options (the options table's names): base_url, provider, registry, backend, ...
    options: dict[str, Any] = field(default_factory=dict)
    #: what the user named: the suite's path, or the polyglot checkout's
    source: str = ""
    polyglot: bool = False
    #: a replay of each task's reference solution (``--reference``) instead of its solution.json
    reference: bool = False

    def config(self) -> dict[str, Any]:
        """The plan as ``results.json``'s ``config`` (and ``eval.json``, what ``--resume`` checks)."""
        shown = {k: v for k, v in self.options.items() if v is not None and k != "prices"}
        return {
            "source": self.source,
            "polyglot": self.polyglot,
            "models": list(self.models),
            "replay": self.replay,
            "reference": self.reference,
            "attempts": self.attempts,
            "feedback": self.feedback,
            "jobs": self.jobs,
            "timeout": self.timeout,
            "options": {k: str(v) for k, v in sorted(shown.items())},
        }

    def model_entries(self) -> list[dict[str, Any]]:
        if self.reference:
            return [
                {
                    "model": REFERENCE_MODEL,
                    "kind": "reference",
                    "label": "reference solutions (not a model)",
                    "endpoint": "fake OpenAI-compatible server (a test double) sending each task's reference solution",
                }
            ]
        if self.replay:
            return [
                {
                    "model": REPLAY_MODEL,
                    "kind": "replay",
                    "label": "replay (not a model)",
                    "endpoint": "fake OpenAI-compatible server (a test double) serving solution.json",
                }
            ]
        endpoint = str(self.options.get("base_url") or self.options.get("provider") or "")
        return [{"model": m, "kind": "model", "label": m, "endpoint": endpoint} for m in self.models]


class _Interrupted(Exception):
    """The eval was stopped: the attempt is not recorded (``--resume`` runs it again)."""


class Eval:
    """One eval: :meth:`run` builds and checks every attempt not yet recorded under ``plan.out``."""

    def __init__(
        self, plan: EvalPlan, *, registry: Registry, resume: bool = False, progress: Progress | None = None
    ) -> None:
        self.plan = plan
        self.registry = registry
        self.resume = resume
        self.progress = progress
        self.store = ResultStore(plan.out)
        self.stop = threading.Event()
        self._started = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    # -- the run -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run what is left; write and return ``results.json``. Ctrl-C stops it (finished attempts are kept)."""
        self._check_out()
        plan = self.plan
        jobs: list[tuple[str, Task, list[int]]] = []
        already = 0
        for task in plan.suite.tasks:
            for attempt in range(1, plan.attempts + 1):
                for model in self._models():
                    if self.store.read(model, task.id, attempt) is not None:
                        already += 1
            for model in self._models():
                if plan.feedback:
                    jobs.append((model, task, list(range(1, plan.attempts + 1))))
                else:
                    jobs += [(model, task, [attempt]) for attempt in range(1, plan.attempts + 1)]
        jobs.sort(key=lambda job: (job[2][0], plan.suite.tasks.index(job[1])))
        total = len(plan.suite.tasks) * plan.attempts * len(self._models())
        if self.progress is not None:
            left_out = plan.suite.problems + plan.suite.unrunnable
            self.progress.started(total, already, [f"{p.id}: {p.message}" for p in left_out])
        finished: list[tuple[AttemptResult, bool]] = []
        lock = threading.Lock()

        def report(result: AttemptResult, resumed: bool) -> None:
            with lock:
                finished.append((result, resumed))

        with ThreadPoolExecutor(max_workers=plan.jobs, thread_name_prefix="flakebot-eval") as pool:
            pending: set[Future[None]] = {
                pool.submit(self._job, model, task, attempts, report) for model, task, attempts in jobs
            }
            try:
                while pending:
                    _, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                    self._deliver(finished, lock)
            except KeyboardInterrupt:
                self.stop.set()
                for future in pending:
                    future.cancel()
                wait(pending)
                self._deliver(finished, lock)
                self.store.write_results(self.document(finished=None))
                raise Cancelled(
                    f"The eval was interrupted; the attempts that finished are kept in {plan.out}. "
                    "Run the same command with --resume to carry on."
                ) from None
        self._deliver(finished, lock)
        if self.progress is not None:
            self.progress.ended()
        data = self.document(finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.store.write_results(data)
        return data

    def document(self, *, finished: str | None) -> dict[str, Any]:
        """``results.json`` from every record under ``plan.out`` (earlier runs' too, when resumed)."""
        records = [
            record
            for task in self.plan.suite.tasks
            for model in self._models()
            for attempt in range(1, self.plan.attempts + 1)
            if (record := self.store.read(model, task.id, attempt)) is not None
        ]
        config = self.store.read_config() or self.plan.config()
        return document(
            suite=self.plan.suite,
            models=self.plan.model_entries(),
            attempts=records,
            config={**config, "jobs": self.plan.jobs},
            started=str(config.get("started") or self._started),
            finished=finished,
        )

    def _deliver(self, finished: list[tuple[AttemptResult, bool]], lock: threading.Lock) -> None:
        with lock:
            batch, finished[:] = list(finished), []
        for result, resumed in batch:
            if self.progress is not None:
                self.progress.finished(result, resumed=resumed)
        if batch:
            self.store.write_results(self.document(finished=None))

    def _models(self) -> tuple[str, ...]:
        if self.plan.reference:
            return (REFERENCE_MODEL,)
        return (REPLAY_MODEL,) if self.plan.replay else self.plan.models

    def _check_out(self) -> None:
        """``OUT`` is new, or (``--resume``) holds this same eval; then its settings are recorded."""
        config = self.plan.config()
        earlier = self.store.read_config()
        if self.resume:
            if earlier is None:
                raise UsageError(f"There is no eval to resume in {self.plan.out}: run it without --resume first.")
            differ = [key for key in _IDENTITY if earlier.get(key) != config.get(key)]
            if differ:
                raise UsageError(
                    f"--resume continues the eval in {self.plan.out}, which ran with other settings ("
                    + ", ".join(f"{k}: {earlier.get(k)!r} then, {config.get(k)!r} now" for k in differ)
                    + "). Use the same ones, or another --out."
                )
            config["started"] = earlier.get("started") or self._started
        elif self.store.has_results():
            raise UsageError(
                f"{self.plan.out} holds the results of an earlier eval. Continue it with --resume, "
                "or give another --out."
            )
        else:
            config["started"] = self._started
        self.store.write_config(config)

    # -- one task ------------------------------------------------------------------

    def _job(self, model: str, task: Task, attempts: list[int], report: Callable[[AttemptResult, bool], None]) -> None:
        previous: AttemptResult | None = None
        for attempt in attempts:
            if self.stop.is_set():
                return
            recorded = self.store.read(model, task.id, attempt)
            if recorded is not None:
                report(recorded, True)
                previous = recorded
                if self.plan.feedback and recorded.passed:
                    return
                continue
            try:
                result = self._attempt(model, task, attempt, previous)
            except _Interrupted:
                return
            except Exception:  # a bug in the harness: recorded as such, the other tasks go on
                result = AttemptResult(
                    task=task.id,
                    model=model,
                    attempt=attempt,
                    replay=self.plan.replay,
                    passed=False,
                    green=False,
                    failure="harness",
                    message=cut(traceback.format_exc()),
                    cause=f"a bug in the eval harness: {traceback.format_exc().strip().splitlines()[-1]}"[:300],
                )
            self.store.write(result)
            report(result, False)
            previous = result
            if self.plan.feedback and result.passed:  # solved within this many tries: the rest are not needed
                return

    def _attempt(self, model: str, task: Task, attempt: int, previous: AttemptResult | None) -> AttemptResult:
        started = time.monotonic()
        plan = self.plan
        follow = bool(
            plan.feedback
            and previous is not None
            and previous.green
            and previous.hidden is not None
            and not previous.passed
        )
        if follow and previous is not None:
            cache = Path(previous.cache_dir)
        else:
            cache = self.store.work_dir(model, task.id, attempt) / "cache"
        hidden_dir = self.store.work_dir(model, task.id, attempt) / "hidden"
        build = BuildRequest(
            # the hidden checks' output (a tool's) is untrusted: the follow-up's ">>>" lines are never examples
            UntrustedText(feedback_request(previous)) if follow and previous is not None else task.request,
            name=task.name,
            crate=None if follow else task.crate,
            follow_up=follow,
        )
        deadline = started + (task.timeout or plan.timeout)
        meter = Meter()
        # a follow-up shares the cache of the attempt it continues: only what it adds is its own
        before = spent(cache, task.name)[0] if follow else Usage()
        base: dict[str, Any] = {
            "task": task.id,
            "model": model,
            "attempt": attempt,
            "replay": plan.replay,
            "cache_dir": str(cache),
        }
        settings: Settings | None = None
        deployed: dict[str, Any] = {}  # once the build succeeded: its proof, iterations and workspace
        try:
            with self._endpoint(model, task) as (model_name, base_url):
                settings = self._settings(task, cache, model_name, base_url)
                build = build.with_options(split_run_flags(self.plan.options)[1])
                if self._prepare(settings, build, cache, follow):
                    build = build.with_options({"resume": True})
                tool = self._build(settings, build, meter, deadline)
            try:
                deployed = {
                    "proof": proof_of(tool),
                    "iterations": int(tool.provenance.get("iterations") or meter.iterations),
                    "workspace": str(settings.cache.workspaces / task.name),
                }
            finally:
                tool.close()
            hidden = self._hidden(task, settings, Path(deployed["workspace"]), hidden_dir, deadline)
        except _Interrupted:
            raise
        except BaseException as exc:
            if isinstance(exc, Cancelled) and self.stop.is_set():
                raise _Interrupted() from None
            if isinstance(exc, KeyboardInterrupt):
                self.stop.set()
                raise _Interrupted() from None
            if not isinstance(exc, Exception):
                raise
            failure = classify(exc, meter)
            message = failure_message(exc, failure, meter)
            usage, cost = self._spent(cache, task.name, before, meter, settings)
            return AttemptResult(
                **base,
                passed=False,
                green=bool(deployed),  # a timeout of the hidden checks comes after a green session
                proof=deployed.get("proof", {}),
                iterations=deployed.get("iterations", meter.iterations),
                **usage_fields(usage),
                cost_usd=cost,
                seconds=round(time.monotonic() - started, 3),
                failure=failure,
                message=message,
                reverts=meter.reverts,
                workspace=deployed.get("workspace") or str(getattr(exc, "workspace", "") or ""),
                cause=cause_of(exc, message),
            )
        usage, cost = self._spent(cache, task.name, before, meter, settings)
        verdict, message = hidden_verdict(hidden)
        return AttemptResult(
            **base,
            passed=hidden.ok,
            green=True,
            hidden=hidden,
            proof=deployed["proof"],
            iterations=deployed["iterations"],
            **usage_fields(usage),
            cost_usd=cost,
            seconds=round(time.monotonic() - started, 3),
            failure=verdict,
            message=message,
            reverts=meter.reverts,
            workspace=deployed["workspace"],
            cause=(hidden.cause or headline(message)) if verdict else "",
        )

    @contextmanager
    def _endpoint(self, model: str, task: Task) -> Iterator[tuple[str, str | None]]:
        """The model name and base URL an attempt's requests go to: the user's, or a replay server's."""
        if not self.plan.replay:
            yield model, None  # the base URL (or provider) is the build options'
            return
        script: Any = task.solution
        if self.plan.reference:
            try:
                script = reference_script(task, starting_manifest(task, self.registry))
            except (ReferenceError, OSError) as exc:
                raise UsageError(f"The reference solution of {task.id!r} cannot be applied: {exc}") from None
        with replay_server(script, task.id) as url:
            yield REPLAY_MODEL_NAME, url

    def _settings(self, task: Task, cache: Path, model_name: str, base_url: str | None) -> Settings:
        given = split_run_flags(self.plan.options)[0]  # the run flags (--candidates...) go into the request
        values: dict[str, Any] = {**given, **task.overrides(), "cache_dir": cache}
        if model_name:
            values["model"] = model_name
        settings = apply(Settings(), values)
        if self.plan.replay:  # the fake server, whatever provider the environment names
            settings.model, settings.base_url, settings.provider = model_name, base_url, None
        return settings

    def _prepare(self, settings: Settings, build: BuildRequest, cache: Path, follow: bool) -> bool:
        """An attempt that was interrupted: with --resume its edit session continues when it can (True: the
        build resumes it), else it starts over."""
        if not cache.exists():
            return False
        if self.resume and not self.plan.replay:
            from ..pipeline.edit_stage import resume_point  # the edit loop's, as `flakebot build --resume` finds it

            try:
                resume_point(settings, build, settings.model_config())
            except UsageError:
                pass
            else:
                return True
        if not follow:  # a fresh start (a follow-up's cache is the tool it continues: kept)
            remove_tree(cache.parent)
        return False

    def _build(self, settings: Settings, build: BuildRequest, meter: Meter, deadline: float) -> Any:
        run = start_build(settings, build, registry=self.registry)
        timed_out = False

        def tick() -> None:
            nonlocal timed_out
            if self.stop.is_set():
                run.cancel("the eval was interrupted")
            elif time.monotonic() > deadline and not timed_out:
                timed_out = True
                run.cancel("the task's time limit passed")

        try:
            return run.wait([meter], tick=tick)
        except Cancelled:
            if self.stop.is_set():
                raise _Interrupted() from None
            if timed_out:
                raise TimedOut("the task's time limit passed") from None
            raise

    def _hidden(self, task: Task, settings: Settings, workspace: Path, work: Path, deadline: float) -> HiddenResult:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimedOut("the task's time limit passed before its hidden checks ran")
        token = CancelToken()
        runner = ProcessRunner(token)
        finished = threading.Event()

        def watch() -> None:  # a stopped eval kills the checks' processes too
            while not finished.wait(0.25):
                if self.stop.is_set():
                    token.cancel()
                    return

        threading.Thread(target=watch, name="flakebot-eval-watch", daemon=True).start()
        try:
            if task.hidden.kind == "cargo":
                return run_cargo_tests(
                    task, workspace=workspace, registry=self.registry, work=work, runner=runner, timeout=remaining
                )
            return run_pytest(
                task, cache_dir=settings.cache_dir, tool_name=task.name, work=work, runner=runner, timeout=remaining
            )
        except Cancelled:
            raise _Interrupted() from None
        finally:
            finished.set()

    def _spent(
        self, cache: Path, name: str, before: Usage, meter: Meter, settings: Settings | None
    ) -> tuple[Usage, float | None]:
        """What the attempt's sessions spent (from their journals; the architect's from its events), and the cost."""
        after, _ = spent(cache, name)
        usage = (
            Usage(
                max(after.prompt_tokens - before.prompt_tokens, 0),
                max(after.completion_tokens - before.completion_tokens, 0),
                max(after.cached_tokens - before.cached_tokens, 0),
                max(after.calls - before.calls, 0),
            )
            + meter.architect
        )
        if settings is None or not settings.model:
            return usage, None
        return usage, cost_usd(usage, settings.model, settings.prices) if usage.calls else 0.0
