"""``flakebot eval``: how often a model makes a working tool, at what cost, on a suite of tasks with hidden tests.

From a notebook::

    import flakebot_magic.eval
    results = flakebot_magic.eval.run("starter", models=["gpt-4.1-mini", "qwen2.5-coder"],
                                      base_url="http://localhost:11434/v1", attempts=2)
    results          # an HTML table: per model and per task
    results.plot()   # pass rate against cost, one point per model

From a terminal: ``flakebot eval starter --model M [--model N] ...``.

One job per module:

=================  ===============================================================
``task``           the task format (``task.toml``, ``test_hidden.py``, ``solution.json``)
``polyglot``       aider's polyglot Rust exercises as tasks
``runner``         each attempt built through the pipeline in its own cache, then checked
``outcome``        what one attempt's build says: reverts, the failure class, the proof
``hidden``         the hidden checks: pytest against the tool, or Rust tests on a copy
``pytest_plugin``  the hidden tests' fixture ``tool``
``replay``         ``--replay``/``--reference``: scripts served by the fake server (not a model)
``reference``      ``--reference``: a task's reference solution as the replies that apply it
``preflight``      which tasks can run here at all, before any model spends a token
``results``        records, pass@k, the summary, ``results.json``
``report``         the terminal's progress and tables, the notebook's HTML
``plot``           pass rate against cost (matplotlib, an optional extra)
``command``        the ``flakebot eval`` command line
=================  ===============================================================

The format and the schema of ``results.json`` are in ``docs/eval.md``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import UsageError
from .report import EvalResults, TerminalProgress
from .results import FAILURES, FAULTS, REFERENCE_LABEL, REFERENCE_MODEL, REPLAY_LABEL, REPLAY_MODEL, SCHEMA, pass_at_k
from .task import Suite, Task, TaskProblem, load_suite

if TYPE_CHECKING:
    from .runner import Progress

__all__ = [
    "FAILURES",
    "FAULTS",
    "REFERENCE_LABEL",
    "REPLAY_LABEL",
    "SCHEMA",
    "EvalResults",
    "Suite",
    "Task",
    "TaskProblem",
    "default_out",
    "load_suite",
    "pass_at_k",
    "run",
]

#: build options an eval decides itself, per attempt
_OWN = ("model", "resume", "follow_up", "rebuild", "cache_dir")


def default_out(source: str | Path, *, replay: bool = False, reference: bool = False) -> Path:
    """Where an eval writes when ``out`` is not given: ``./flakebot-eval-<suite>`` (``-replay``, ``-reference``)."""
    name = Path(source).expanduser().resolve().name or "suite"
    return Path.cwd() / f"flakebot-eval-{name}{'-reference' if reference else '-replay' if replay else ''}"


def run(
    suite: str | Path | None = None,
    *,
    models: Sequence[str] = (),
    replay: bool = False,
    reference: bool = False,
    polyglot: str | Path | None = None,
    attempts: int = 1,
    feedback: bool = False,
    jobs: int = 1,
    resume: bool = False,
    out: str | Path | None = None,
    tasks: Iterable[str] = (),
    timeout: float | None = None,
    progress: bool | Progress = True,
    **options: Any,
) -> EvalResults:
    """Run an eval; return its results (also written to ``OUT/results.json``).

    Parameters
    ----------
    suite
        A directory of tasks (``docs/eval.md``), e.g. ``starter`` (the built-in suite).
    models
        The models to compare, side by side (default: the ``model`` setting).
    replay
        Serve each task's ``solution.json`` from the fake server instead of a
        model: a check of the suite and the harness, labelled "replay".
    reference
        Send each task's reference solution (``reference/``, a polyglot
        exercise's ``.meta/example.rs``) from the fake server instead of a
        model: every task that can run here must pass (labelled "reference").
    polyglot
        An aider polyglot-benchmark checkout's ``rust/`` directory, instead of ``suite``.
    attempts
        Attempts per task and model (pass@k for k up to this).
    feedback
        Later attempts continue the last tool, told which hidden checks failed.
    jobs
        Attempts run at once.
    resume
        Continue the eval in ``out``: finished attempts are kept, the rest run.
    out
        Where records and ``results.json`` go (default :func:`default_out`).
    tasks
        Only these task ids.
    timeout
        Seconds per attempt for tasks that do not set theirs (default 1800).
    progress
        Print progress on stderr (or a :class:`~flakebot_magic.eval.runner.Progress`).
    options
        Build options, as for :func:`flakebot_magic.build`: ``base_url``,
        ``provider``, ``registry``, ``backend``, ``max_iterations``,
        ``token_budget``, ``prices``, ... (a task's own ``max_iterations`` and
        ``token_budget`` win for it).
    """
    from ..config import Settings, apply
    from ..request import RunFlags, split_run_flags
    from ..stages.search import open_registry
    from .polyglot import ExerciseRegistry, polyglot_suite
    from .preflight import preflight
    from .runner import DEFAULT_TIMEOUT, Eval, EvalPlan

    given = {k: v for k, v in options.items() if v is not None}
    refused = sorted(set(given) & set(_OWN))
    if "model" in refused and not models and not replay:
        models, refused = [str(given.pop("model"))], [k for k in refused if k != "model"]
    if refused:
        raise UsageError(f"An eval sets {', '.join(refused)} itself for each attempt; drop it from the options.")
    # unknown options and bad values fail here, before anything runs; the run flags go into each attempt's request
    configured, flags = split_run_flags(given)
    RunFlags.given(flags)
    settings = apply(Settings(), configured)
    if replay and reference:
        raise UsageError("--replay serves solution.json, --reference the reference solutions: choose one.")
    if (suite is None) == (polyglot is None):
        raise UsageError("Give a suite directory, or --polyglot PATH (an aider polyglot-benchmark rust/ directory).")
    if attempts < 1 or jobs < 1 or (timeout is not None and timeout <= 0):
        raise UsageError("--attempts and --jobs must be at least 1, and --timeout a positive number of seconds.")
    models = _models(models, replay=replay or reference, feedback=feedback, default=settings.model)
    for name in models:  # an endpoint or a key that is wrong fails here, once, not in every attempt
        endpoint = apply(Settings(), {**configured, "model": name}).model_config()
        if endpoint is not None:
            endpoint.api_key()
    source = Path(str(polyglot if polyglot is not None else suite)).expanduser()
    target = Path(out).expanduser() if out is not None else default_out(source, replay=replay, reference=reference)
    loaded = polyglot_suite(source, target / "polyglot") if polyglot is not None else load_suite(source)
    loaded = loaded.only(list(tasks))
    if replay:
        loaded = _replayable(loaded)
    if reference:
        loaded = _with_reference(loaded)
    registry = open_registry(settings.registry, target, settings.embedding_model)
    if polyglot is not None:
        registry = ExerciseRegistry(registry, loaded.tasks)
    loaded = preflight(loaded, registry)  # before any attempt: what this machine lacks is no one's failure
    plan = EvalPlan(
        suite=loaded,
        models=tuple(models),
        out=target,
        replay=replay or reference,
        reference=reference,
        attempts=attempts,
        feedback=feedback,
        jobs=jobs,
        timeout=timeout or DEFAULT_TIMEOUT,
        options=given,
        source=str(source.resolve()),
        polyglot=polyglot is not None,
    )
    shown: Progress | None
    if isinstance(progress, bool):
        shown = TerminalProgress(sys.stderr, replay=replay, reference=reference) if progress else None
    else:
        shown = progress
    try:
        data = Eval(plan, registry=registry, resume=resume, progress=shown).run()
    finally:
        close = getattr(getattr(registry, "base", registry), "close", None)
        if close is not None:
            close()
    return EvalResults(data, target / "results.json")


def _models(models: Sequence[str], *, replay: bool, feedback: bool, default: str | None) -> list[str]:
    names = [str(m).strip() for m in models if str(m).strip()]
    if replay:
        if names:
            raise UsageError("--replay and --reference serve scripts instead of a model: drop --model.")
        if feedback:
            raise UsageError("--feedback needs a model that reads the hidden failures; a replay's script does not.")
        return []
    if not names and default:
        names = [default]
    if not names:
        raise UsageError(
            "Which model? Give --model NAME (several to compare them side by side) with --base-url or "
            "--provider, or --replay to check the suite with its solution scripts."
        )
    if len(set(names)) != len(names):
        raise UsageError(f"--model names a model twice: {', '.join(names)}.")
    for kept in (REPLAY_MODEL, REFERENCE_MODEL):  # a model's results must never read as a test double's
        if kept in names:
            raise UsageError(
                f"The model name {kept!r} is kept for --replay's and --reference's results: a model called so "
                "cannot be evaluated under that name."
            )
    return names


def _replayable(suite: Suite) -> Suite:
    """In a replay, a task without a solution.json is a problem of the suite, not a failure."""
    missing = tuple(
        TaskProblem(t.id, t.path, "it has no solution.json to replay") for t in suite.tasks if t.solution is None
    )
    kept = tuple(t for t in suite.tasks if t.solution is not None)
    return Suite(suite.path, kept, suite.problems + missing, suite.unrunnable)


def _with_reference(suite: Suite) -> Suite:
    """In a reference run, a task without a reference solution is a problem of the suite, not a failure."""
    missing = tuple(
        TaskProblem(t.id, t.path, "it has no reference solution (reference/, or a polyglot .meta/example.rs)")
        for t in suite.tasks
        if t.reference is None
    )
    kept = tuple(t for t in suite.tasks if t.reference is not None)
    return Suite(suite.path, kept, suite.problems + missing, suite.unrunnable)
