"""``flakebot eval``: its arguments, and what it prints (the report, or ``results.json`` with ``--json``).

Exit status: 0 when every attempt ran (a model's failures are results, not
errors); 1 for a usage error, and for a replay or a reference run in which a
task failed or is wrong (they check the suite: they should agree; a task that
cannot run here is counted apart, not a failure); 130 when interrupted
(``--resume`` carries on).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..config import add_arguments as add_build_arguments
from ..llm.usage import PRICE_FORMAT
from ..options import OPTIONS

__all__ = ["add_arguments", "run"]

#: build options the eval sets per attempt (or that do not apply to it)
_SKIP = ("model", "resume", "follow_up", "rebuild")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``eval`` subcommand's flags; the build options (``--base-url``, ``--provider``, ...) come from the table."""
    parser.add_argument(
        "suite", nargs="?", help="A directory of tasks (see docs/eval.md), e.g. starter (the built-in suite)."
    )
    parser.add_argument(
        "--polyglot",
        metavar="PATH",
        help="Run aider's polyglot Rust exercises from your checkout (PATH/rust) instead of a suite.",
    )
    parser.add_argument(
        "--model",
        "-m",
        dest="models",
        action="append",
        default=[],
        metavar="MODEL",
        help="A model to evaluate; repeat it to compare models side by side. Default: $FLAKEBOT_MODEL.",
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="Serve each task's solution.json from the fake OpenAI-compatible server (a test double) instead of "
        "a model: checks the suite and the harness, and says 'replay' everywhere.",
    )
    parser.add_argument(
        "--reference",
        action="store_true",
        help="Send each task's reference solution (reference/, or a polyglot exercise's .meta/example.rs) from the "
        "fake OpenAI-compatible server (a test double) instead of a model: every task that can run here must pass.",
    )
    parser.add_argument("--attempts", "-k", type=int, default=1, metavar="K", help="Attempts per task (pass@k).")
    parser.add_argument(
        "--feedback",
        action="store_true",
        help="A later attempt continues the last one's tool and is told which hidden checks failed (aider's "
        "second try); without it attempts are independent.",
    )
    parser.add_argument("--jobs", "-j", type=int, default=1, metavar="N", help="Attempts to run at once.")
    parser.add_argument(
        "--resume",
        dest="resume_eval",
        action="store_true",
        help="Continue the eval in --out: finished attempts are kept, interrupted ones carry on.",
    )
    parser.add_argument(
        "--out", "-o", metavar="DIR", help="Where records and results.json go. Default: ./flakebot-eval-SUITE."
    )
    parser.add_argument(
        "--task", "-t", dest="tasks", action="append", default=[], metavar="ID", help="Only this task (repeatable)."
    )
    parser.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="Seconds per attempt for tasks that set none. Default: 1800."
    )
    parser.add_argument("--prices", metavar="TABLE", help=f"Model prices for the cost columns: {PRICE_FORMAT}.")
    parser.add_argument("--json", action="store_true", help="Print results.json on stdout instead of the tables.")
    parser.add_argument("--quiet", "-q", action="store_true", help="No progress on stderr.")
    add_build_arguments(parser, skip=_SKIP)


def run(args: argparse.Namespace) -> int:
    """Run the eval the arguments describe; print its report (or its JSON); return the exit status."""
    from . import run as run_eval

    options: dict[str, Any] = {
        o.name: getattr(args, o.name, None) for o in OPTIONS if o.per_build and o.name not in _SKIP
    }
    if args.prices:
        options["prices"] = args.prices
    results = run_eval(
        args.suite,
        models=args.models,
        replay=args.replay,
        reference=args.reference,
        polyglot=args.polyglot,
        attempts=args.attempts,
        feedback=args.feedback,
        jobs=args.jobs,
        resume=args.resume_eval,
        out=args.out,
        tasks=args.tasks,
        timeout=args.timeout,
        progress=not args.quiet,
        **options,
    )
    if args.json:
        print(json.dumps(results.to_json(), indent=2))
    else:
        print(results.table())
        print(f"\nresults: {results.path}", file=sys.stderr)
    if results.replay:
        failed = any(not a.passed for a in results.attempts) or bool(results.data["suite"]["problems"])
        return 1 if failed else 0
    return 0
