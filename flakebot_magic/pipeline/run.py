"""The pipeline: search, fork, edit, build and test, flake, deploy, client, with events.

One :class:`Pipeline` is behind every front door (the magic, the command,
:func:`flakebot_magic.build`). It holds only what every run uses (settings,
registry, process runner, event bus); what one run computes travels in a
:class:`~flakebot_magic.stages.state.RunState` from step to step, so one pipeline
may run several requests, even at once. It emits :mod:`flakebot_magic.events`;
front ends only observe them. Building is the backend's
(:mod:`flakebot_magic.backends`: cargo or nix, one path for both).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ..backends import Backend, Built, backend_for, decide, fallback_for
from ..clients import ToolClient
from ..config import Settings
from ..errors import BuildError, ConfigError, FlakebotError, ForkError, NeedsModelError, SearchError, UsageError
from ..events import EventBus, Observer, RunFinished
from ..host.git import Git
from ..host.locks import tool_lock
from ..host.names import check_tool_name, tool_name
from ..host.process import CancelToken, ProcessRunner
from ..host.storage import storage_errors
from ..host.trees import remove_tree
from ..llm.budget import Budget
from ..llm.model import HOW_TO_CONFIGURE, ModelConfig
from ..manage.doctor import prepare
from ..registry.base import CrateCandidate, Registry
from ..request import BuildRequest, PersonText, UntrustedText, keep_origin
from ..sandbox import Sandbox, release_source, release_target
from ..sandbox.cargo import Cargo
from ..sandbox.policy import Baseline, TreePolicy
from ..stages import search as search_stage
from ..stages.accept import Example, run_examples, split_request, words_only
from ..stages.build import BUILD_FLAGS
from ..stages.choose import Choice, choose_by_model, choose_without_model, chooser_channel
from ..stages.fork import FORK_FORMAT, Workspace, fork
from ..stages.state import RunDeps, RunState, Stage
from .deployed import (
    answered_choice,
    check_agent_may_replace,
    contract_of,
    deployed_tool,
    disk_full,
    from_cache,
    main_binary,
)

if TYPE_CHECKING:
    from ..records.journal import ResumePoint
    from ..records.races import RacePoint

__all__ = ["Pipeline"]

#: how many times failing acceptance examples go back to the edit loop
ACCEPTANCE_ROUNDS = 2
#: how many candidates a run tries when a published crate cannot be forked or built
MAX_TRIES = 3


class Pipeline:
    """Turns a :class:`~flakebot_magic.request.BuildRequest` into a deployed tool (a :class:`ToolClient`).

    Parameters
    ----------
    settings
        Cache dir, registry, backend, model, time limits.
    registry
        A registry object; by default one is opened from ``settings.registry``.
    runner
        Runs every child process (inject one to observe or cancel).
    observers
        Called with every event.
    cancel
        Stops the running child process (and so the run) when set.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        registry: Registry | None = None,
        runner: ProcessRunner | None = None,
        observers: Iterable[Observer] = (),
        cancel: CancelToken | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.bus = EventBus(observers)
        self.runner = runner or ProcessRunner(cancel)
        self._registry = registry

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = search_stage.open_registry(
                self.settings.registry, self.settings.cache_dir, self.settings.embedding_model
            )
        return self._registry

    @property
    def deps(self) -> RunDeps:
        return RunDeps(self.settings, self.registry, self.runner, self.bus)

    # -- the run ------------------------------------------------------------

    def run(
        self,
        request: BuildRequest | str,
        *,
        name: str | None = None,
        crate: str | None = None,
        follow_up: bool = False,
    ) -> ToolClient:
        """Build (or find in the cache) the tool ``request`` asks for, and return it.

        ``request`` is a :class:`BuildRequest`, or its text with ``name``,
        ``crate`` and ``follow_up`` beside it. With a model configured
        (``settings.model``), the edit loop turns the forked crate into the
        tool the request describes. ``follow_up`` (``--continue``) applies the
        request to the existing tool ``name``: its workspace and history, then
        rebuilds and redeploys it. How the run goes (rebuild, resume,
        candidates, plan) is the request's :class:`~flakebot_magic.request.RunFlags`.
        """
        build = BuildRequest.of(request, name=name, crate=crate, follow_up=follow_up)
        started = time.monotonic()
        try:
            build = replace(build, text=keep_origin(build.text, build.text.strip()))
            # what a dead process left unfinished is finished (or undone), a damaged registry rebuilt
            for note in prepare(self.settings):
                self.bus.notice("search", note, "warning")
            model = self.settings.model_config()
            point = None
            if build.flags.resume:
                from .edit_stage import resume_point  # the edit loop loads only when a run needs it

                point = resume_point(self.settings, build, model)
            if point is not None:  # the request is the interrupted session's: recorded, the person's only if equal
                recorded = str(point.start.get("request", ""))
                text = build.text if recorded == build.text else UntrustedText(recorded)
                build = replace(build, text=text, follow_up=bool(point.start.get("follow_up")))
            # ">>>" examples in the person's words are acceptance checks; nobody else's are, and none are search words
            search_text, examples = self._read_request(build)
            _check_request(build, search_text)
            choice = decide(self.settings, self.runner)
            run = RunState(build, model, choice, examples=examples, budget=self._budget(model))
            with storage_errors("building", self.settings.cache_dir):  # what the stages did not translate
                tool = self._resumed(run, point) if point is not None else self._run(run, search_text)
            if examples:
                tool = self._accept(run, tool, examples, search_text)
        except BaseException as exc:
            self.bus.emit(RunFinished(ok=False, error=exc, elapsed=time.monotonic() - started))
            raise
        self.bus.emit(RunFinished(ok=True, tool=tool, elapsed=time.monotonic() - started))
        return tool

    def _read_request(self, build: BuildRequest) -> tuple[str, list[Example]]:
        """The search words and the acceptance examples of ``build``: examples only from the person's own words."""
        if isinstance(build.text, PersonText):
            return split_request(build.text, name=build.name)
        words, passed_over = words_only(build.text)
        if passed_over:
            who = f"the agent {build.requested_by!r}" if build.requested_by else "a recorded request or a tool's output"
            self.bus.notice(
                "search",
                f"{passed_over} '>>>' example(s) in this request are read as words, not run: it is not your own "
                f"words ({who}), and only your own cell or command line carries acceptance examples",
                "warning",
            )
        return words, []

    def _run(self, run: RunState, search_text: str) -> ToolClient:
        answered = self._answered(run)
        if answered is not None:
            return answered
        with Stage(self.bus, "search") as stage:
            # a registry's first search on this machine builds its index: said, with progress (issue 37)
            search_stage.indexing(
                self.registry,
                lambda line: self.bus.log("search", line),
                announce=lambda t: self.bus.notice("search", t),
            )
            choice = self._choose(run, search_text)
            stage.detail = f"{choice.candidate.name} {choice.candidate.version}"
        # a published crate the registry cannot fork or build gives way to the next that fits
        tries = [choice.candidate]
        if choice.by in ("fitness", "model", "ranking"):
            tries += choice.alternatives[: MAX_TRIES - 1]
        for candidate in tries:
            run.candidate, run.workspace = candidate, None
            run.name = run.request.name or tool_name(candidate.name)
            try:
                # one build per tool name at a time, across kernels: fork may move the workspace aside,
                # deploy swaps the store entry, and `clean` skips what a held lock covers
                with tool_lock(self.settings.cache, run.name, rebuild=run.flags.rebuild):
                    return self._build(run, choice if candidate is choice.candidate else _next(choice, candidate))
            except (ForkError, BuildError) as exc:
                # a model's edits are not thrown away for another crate; the last candidate's error stands
                if candidate is tries[-1] or (run.model is not None and run.workspace is not None):
                    raise
                self.bus.notice(
                    "search",
                    f"{candidate.id} cannot be built from {self.registry.id} as published "
                    f"({str(exc).splitlines()[0][:200]}); trying the next candidate",
                    "warning",
                )
        raise RuntimeError("unreachable: the loop returns or raises")

    def _answered(self, run: RunState) -> ToolClient | None:
        """The tool built under this name for this very request, by its recipe, with no search (None: the usual way)."""
        choice = answered_choice(self.deps, run)
        if choice is None:
            return None
        run.candidate, run.workspace, run.name = choice.candidate, None, str(run.request.name)
        with tool_lock(self.settings.cache, run.name):
            _, backend, recipe = self._recipe_of(run)
            if backend.lookup(recipe, run.name) is None:
                return None
            with Stage(self.bus, "search") as stage:
                stage.status, stage.detail = "cached", f"{choice.candidate.id}: the tool built for this request"
            check_agent_may_replace(self.settings, run.request, run.name)
            return self._from_cache(run, choice, backend, recipe)

    def _resumed(self, run: RunState, point: ResumePoint | RacePoint) -> ToolClient:
        """Continue an interrupted session in its own workspace, then build and deploy as usual."""
        from .edit_stage import resumed_run

        choice = resumed_run(self.settings, run, point, self.bus)
        with tool_lock(self.settings.cache, run.name, rebuild=True):  # a resumed session always builds
            return self._build(run, choice)

    def _build(self, run: RunState, choice: Choice) -> ToolClient:
        """Everything after the search, under the tool's lock; each step is one method below, in this order."""
        check_agent_may_replace(self.settings, run.request, run.name)
        cargo, backend, recipe = self._recipe_of(run)
        cached = self._from_cache(run, choice, backend, recipe)
        if cached is not None:
            return cached
        run.alternatives = choice.close_alternatives()
        self._say_backend(run)
        with self._failure_kept(run), storage_errors(f"building {run.name!r}", self.settings.cache_dir):
            if run.resume is None:  # a resumed session is in its workspace already
                self._fork(run, cargo)
            cargo = self._edit(run, self._confined(run, cargo))
            self._enforce_policy(run)
            built, backend, recipe = self._built(run, cargo, backend, recipe)
            tool = self._deploy(run, choice, built, backend, recipe)
        self._drop_build_outputs(run)
        return tool

    def _from_cache(self, run: RunState, choice: Choice, backend: Backend, recipe: Path) -> ToolClient | None:
        """The tool its recipe built before, when the run may take it (not --rebuild, --continue or a resume)."""
        settings, deps = self.settings, self.deps
        if run.flags.rebuild or run.follow_up or run.resume is not None:
            return None
        cached = backend.lookup(recipe, run.name)
        fallback = fallback_for(backend, deps, run.choice) if cached is None else None
        if fallback is not None:  # auto takes what is cached: an earlier offline run may have built with cargo
            cached = fallback.lookup(self._recipe_path(run, fallback), run.name)
        if cached is None:
            return None
        with storage_errors(f"taking {run.name!r} from the cache", settings.cache_dir):
            return from_cache(deps, run, cached, choice)

    @contextmanager
    def _failure_kept(self, run: RunState) -> Iterator[None]:
        """A failed or interrupted build keeps its workspace, says the tool it would replace is unchanged, and
        names a full disk as such."""
        try:
            yield
        except FlakebotError as exc:
            self._unchanged(run)
            attempt = run.workspace.path if run.workspace is not None else exc.workspace
            if attempt is not None:
                exc.keep_workspace(attempt)
            full = disk_full(self.deps, run, exc, attempt)
            if full is not None:
                raise full from exc
            raise
        except KeyboardInterrupt:
            self._unchanged(run)
            if run.workspace is not None:
                self.bus.notice("fork", f"interrupted; the workspace is kept at {run.workspace.path}", "warning")
            raise

    def _fork(self, run: RunState, cargo: Cargo) -> None:
        """Fork the candidate into the tool's workspace (a copy for --continue, beside it for a rebuild)."""
        candidate = run.crate()
        with Stage(self.bus, "fork", candidate.id) as stage:
            workspace = run.workspace = fork(
                candidate,
                self.registry,
                self.settings.cache.workspaces,
                run.name,
                runner=self.runner,
                bus=self.bus,
                cargo=cargo,
                fresh=run.flags.rebuild or self._fork_afresh(run),
                # --continue edits a copy: the tool's workspace stays as it is until the build succeeds
                copy=run.follow_up,
            )
            # a rebuild forks beside the tool's workspace (.next/) and is swapped in when deployed: the
            # row names where the workspace will be (the notice above it says where it is meanwhile)
            stage.detail = str(workspace.replaces or workspace.path)

    def _enforce_policy(self, run: RunState) -> None:
        """The build policy on the tree on disk, before either backend builds it (policy.py)."""
        workspace = run.forked()  # a candidate that started from another crate may have won
        baseline = Baseline.from_git(Git(workspace.path, self.runner))
        run.policy = TreePolicy(self.settings.allow_build_scripts, baseline)
        run.policy.enforce(workspace.path)
        run.main_program = main_binary(workspace.crate, list(workspace.crate.bin_names), workspace.path, built=False)

    def _built(self, run: RunState, cargo: Cargo, backend: Backend, recipe: Path) -> tuple[Built, Backend, Path]:
        """Build and test with ``backend``; auto falls back to cargo when nix could not lock nixpkgs after all
        (the backend said so). The backend that built, and its recipe, come back with what it built."""
        built = backend.build(run, cargo)
        if built is not None:
            return built, backend, recipe
        fallback = fallback_for(backend, self.deps, run.choice)
        if fallback is None:
            raise RuntimeError(f"the {backend.name} backend built nothing and has no fallback")
        backend = fallback
        built = backend.build(run, cargo)
        if built is None:
            raise RuntimeError(f"the {backend.name} backend always builds")
        return built, backend, self._recipe_path(run, backend)

    def _deploy(self, run: RunState, choice: Choice, built: Built, backend: Backend, recipe: Path) -> ToolClient:
        """Deploy what was built, then make the workspace, its tool card and the record the tool, together
        (transaction.py)."""
        workspace = run.forked()
        # the contract the proven commit declares (its exported files), not what a test rewrote on disk since
        where = built.source.path if built.source is not None else workspace.path
        contract = {} if built.cached is not None else contract_of(where, list(built.binaries))
        run.store = store = backend.deploy(run, built, contract)
        return deployed_tool(
            self.deps,
            run,
            store,
            choice,
            workspace,
            commit=Git(workspace.path, self.runner).head(),
            forked_by=run.name,
            recipe=(recipe, {"store": str(store.path), "hash": store.hash, "backend": backend.name}),
            reused=built.cached is not None,
        )

    def _drop_build_outputs(self, run: RunState) -> None:
        """After a success, unless ``keep_workspace``: the git history stays (it is the tool's provenance); build
        outputs go."""
        if not self.settings.keep_workspace:
            for path in (run.forked().path / "target", release_target(run.forked().path)):
                remove_tree(path, ignore_errors=True)
            remove_tree(release_source(run.forked().path), ignore_errors=True)

    def _say_backend(self, run: RunState) -> None:
        """Which backend builds, and why, once per build that builds (a cache hit builds nothing: it says nothing)."""
        choice = run.choice
        if choice.fallback:
            self.bus.notice(
                "deploy",
                f"backend: cargo ({choice.why}); auto is falling back to the cargo backend. "
                "Point --nixpkgs at a local nixpkgs, or choose with --backend cargo|nix.",
                "warning",
            )
        else:
            self.bus.notice("deploy", f"backend: {choice.name} ({choice.why})")

    def _unchanged(self, run: RunState) -> None:
        """Say that a failed build left the tool it would have replaced as it was."""
        workspace = run.workspace
        if workspace is not None and workspace.replaces is not None:
            self.bus.notice(
                "deploy",
                f"{run.name!r} is unchanged: its workspace {workspace.replaces}, record and log are as before "
                f"(this attempt is kept at {workspace.path})",
                "warning",
            )

    def _choose(self, run: RunState, request: str) -> Choice:
        registry, crate = self.registry, run.request.crate
        if run.follow_up:
            return Choice(self._continued(run), "user", "--continue: the tool's own crate")
        if crate:
            candidate = registry.get(crate)
            if run.model is None and not search_stage.tools_of(candidate):
                what = "it has no binary target" if not candidate.has_bin else "its only binaries are test fixtures"
                raise NeedsModelError(
                    f"{candidate.id} is a library: {what} to deploy. "
                    "Turning a library into a tool needs a language model (the edit loop). "
                    f"Pick a crate with a binary, or configure a model. {HOW_TO_CONFIGURE}",
                    candidates=[candidate],
                )
            return Choice(candidate, "user", f"--crate {crate}")
        if run.model is not None:
            self._say_words_only(registry)
            return self._choose_for_model(run, request)
        candidates = search_stage.search(registry, request, limit=10, prefer_bin=True)
        if candidates:
            # when none fits, the refusal says why the search weighed words only: a notice too would say it twice
            choice = choose_without_model(candidates, request, words_only=search_stage.words_only(registry))
        self._say_words_only(registry)
        if not candidates:
            raise SearchError(
                f"No crate in {registry.id} matches {request!r}. Describe the tool with other "
                "words (what it reads and what it prints), or name a crate with --crate NAME."
            )
        return choice

    def _say_words_only(self, registry: Registry) -> None:
        """Why the search weighs words only, as a notice, the first time this process searches so."""
        note = search_stage.semantic_notice(registry)
        if note:
            self.bus.notice("search", note, "info")

    def _recipe_of(self, run: RunState) -> tuple[Cargo, Backend, Path]:
        """The cargo of a build (its toolchain kept for the next process), the run's backend and its recipe."""
        cargo = Cargo(self.registry, self.runner, memo=self.settings.cache.toolchain_memo)
        run.rustc = cargo.rustc_version()
        backend = backend_for(run.choice.name, self.deps, run.choice)
        return cargo, backend, self._recipe_path(run, backend)

    def _recipe_path(self, run: RunState, backend: Backend) -> Path:
        """The recipe: what decides the tool before any fork (crate, registry, toolchain, request, model, backend)."""
        candidate, model = run.crate(), run.model
        signature = getattr(self.registry, "signature", None)
        parts = [
            candidate.id,
            candidate.registry,
            candidate.checksum or "",
            signature() if signature is not None else "",
            run.rustc,
            " ".join(BUILD_FLAGS),
            str(FORK_FORMAT),
        ]
        if model is not None:  # the model wrote the tool: the request and the model decide it too
            parts += ["edit", run.request.text, model.model, model.base_url]
        parts += backend.recipe_parts()
        key = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
        return self.settings.cache.recipes / f"{key}.json"

    # -- the edit loop ----------------------------------------------------------

    def _choose_for_model(self, run: RunState, request: str) -> Choice:
        """With a model a library is a fine start: the model chooses among the best matches (one request)."""
        registry, model = self.registry, run.model
        if not request or model is None:
            raise UsageError("The request is empty: say what the tool should do (the model needs it).")
        candidates = search_stage.boost_exact_terms(search_stage.search(registry, request, limit=10), request)
        if not candidates:
            raise SearchError(
                f"No crate in {registry.id} matches {request!r}. Describe the tool with other "
                "words (what it reads and what it prints), or name a crate with --crate NAME."
            )
        assert run.budget is not None
        with chooser_channel(
            model,
            bus=self.bus,
            budget=run.budget,
            limits=self.settings.reply_limits(),
            cancel=self.runner.cancel,
        ) as channel:
            return choose_by_model(channel, registry, request, candidates, self.bus)

    def _budget(self, model: ModelConfig | None) -> Budget | None:
        """What a run's model requests may spend together (the crate choice, the architect, the engineers)."""
        if model is None:
            return None
        settings = self.settings
        return Budget(settings.token_budget, max_cost=settings.max_cost, prices=settings.prices)

    def _continued(self, run: RunState) -> CrateCandidate:
        """The crate of the tool a ``--continue`` run changes (checks the options first)."""
        name = run.request.name
        if run.model is None:
            raise UsageError(
                f"--continue applies new instructions with the edit loop, which needs a model. {HOW_TO_CONFIGURE}"
            )
        if not name:
            raise UsageError("--continue needs --name: the tool whose workspace and history to continue.")
        if run.request.crate or run.flags.rebuild:
            raise UsageError("--continue keeps the tool's workspace: it does not go with --crate or --rebuild.")
        if not run.request.text:
            raise UsageError("--continue needs new instructions, e.g. 'also accept a --upper flag'.")
        workspace = Workspace.load(self.settings.cache.workspaces / name)
        if workspace is None:
            raise UsageError(
                f"There is no workspace for a tool named {name!r} to continue "
                f"(looked in {self.settings.cache.workspaces}). Build it first, without --continue."
            )
        return workspace.crate

    def _fork_afresh(self, run: RunState) -> bool:
        """A new request on a model-edited workspace starts over (the old one is moved aside)."""
        from ..edit.state import EditState  # the edit loop's modules load only when a run needs them

        return not run.follow_up and EditState.exists(self.settings.cache.workspaces / run.name)

    def _confined(self, run: RunState, cargo: Cargo) -> Cargo:
        """The cargo that builds and tests the fork: in the sandbox (crate code is untrusted, edited or not).

        Without bubblewrap a published crate still builds, with a warning;
        a model's edits are refused unless ``allow_unsandboxed`` says otherwise.
        """
        settings, workspace = self.settings, run.forked()
        sandbox = Sandbox(workspace.path)
        if not sandbox.isolated:
            if run.model is not None and not settings.allow_unsandboxed:
                raise ConfigError(
                    f"Refusing to let a model edit and build {workspace.crate.name} without a sandbox: "
                    f"{sandbox.why_not}. Model-written code would run with your files, secrets and network. "
                    "Install bubblewrap (`apt-get install bubblewrap`, or `make install`), or, accepting that "
                    "risk, opt in with the `allow_unsandboxed` setting.",
                    workspace=workspace.path,
                )
            self.bus.notice("build", sandbox.notice, "warning")
            return cargo
        self.bus.notice("build", f"cargo runs in a sandbox: {sandbox.describe()}")
        if sandbox.notice:
            self.bus.notice("build", sandbox.notice, "warning")
        return cargo.confined_to(sandbox)

    def _edit(self, run: RunState, cargo: Cargo) -> Cargo:
        """Run the edit session when a model is configured (:func:`~flakebot_magic.pipeline.edit_stage.edit_session`)."""
        if run.model is None:
            return cargo
        from .edit_stage import edit_session  # the edit loop loads only when a model is configured

        return edit_session(self.deps, run, cargo)

    def _accept(self, run: RunState, tool: ToolClient, examples: list[Example], search_text: str) -> ToolClient:
        """Run the cell's ``>>>`` examples against the deployed tool; report each failure.

        With a model configured, failing examples go back to the edit loop as
        new instructions (a follow-up session on the same workspace), then the
        tool is rebuilt and the examples run again, up to
        ``ACCEPTANCE_ROUNDS`` times or until the loop's budget ends.
        """
        rounds = 0
        while True:
            with Stage(self.bus, "accept", f"{len(examples)} examples") as stage:
                report = run_examples(examples, {tool.name: tool})
                stage.detail = report.summary()
                for failure in report.failures:
                    self.bus.notice("accept", failure.describe(), "warning")
            tool.acceptance = report
            if report.ok or run.model is None or rounds >= ACCEPTANCE_ROUNDS:
                return tool
            rounds += 1
            self.bus.notice(
                "accept", f"sending {report.failed} failing examples back to the edit loop (round {rounds})"
            )
            # untrusted (it quotes the tool's output), and never recorded as the person's request (run.origin)
            request = BuildRequest(
                report.as_request(run.request.text),
                name=tool.name,
                follow_up=True,
                requested_by=run.request.requested_by,
                # the race and the plan as the first round's; a follow-up never forks afresh, nor resumes
                flags=replace(run.flags, rebuild=False, resume=False),
            )
            run = RunState(
                request,
                run.model,
                run.choice,
                examples=run.examples,
                budget=self._budget(run.model),
                origin=run.origin or run.request,
            )
            tool.close()
            tool = self._run(run, search_text)


def _next(choice: Choice, candidate: CrateCandidate) -> Choice:
    """The choice after ``choice.candidate`` failed to fork or build: ``candidate``, and why."""
    return Choice(candidate, choice.by, f"{choice.candidate.name} could not be built as published; next best", [])


def _check_request(build: BuildRequest, search_text: str) -> None:
    """The usage errors a request can have before anything runs."""
    if not search_text and not build.crate:
        raise UsageError(
            "The request is empty. Say what the tool should do, for example:\n"
            "    %%flakebot --name md\n    Render Markdown text to HTML.\n"
            "or name a crate with --crate NAME."
        )
    if build.name is not None:
        check_tool_name(build.name, what="--name")
