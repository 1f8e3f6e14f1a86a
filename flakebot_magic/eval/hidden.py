"""Running a task's hidden checks after its session: pytest against the deployed tool, or Rust tests on a copy.

The checks are copied out of the suite only now, into the attempt's own
directory beside (never inside) the workspace, after the model's session has
ended: nothing of them is in the prompt, in the workspace, or visible to
sandboxed code while the model works.

* ``pytest`` checks (a task's ``test_hidden.py``) run in a child Python
  with :mod:`flakebot_magic.eval.pytest_plugin`, whose fixture ``tool`` loads
  the deployed tool from the attempt's cache and runs it confined.
* ``cargo`` checks (an aider polyglot exercise's ``tests/*.rs``, with the rest
  of its ``tests/`` tree) are added to a copy of the final workspace; each
  file's tests are listed (``--list``: what runs, with the task's features),
  then run with ``cargo test --test STEM -- --include-ignored`` in the sandbox,
  without the caller's ``RUST_BACKTRACE``, and counted by libtest's own report
  of each listed test (a test it never reported, as when the binary dies, did
  not pass). The model's code runs in the same process as these tests, so code
  that prints a forged libtest report and exits early could fool them (as it
  could aider's own harness); only listed tests count, a test reported failed
  anywhere stays failed, and a run that exits non-zero never passes whole.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..host.fsutil import UnsafePath, atomic_write, copy_regular, is_real_dir, load_json, read_inside, real_dir
from ..host.git import Git
from ..host.process import Completed, ProcessRunner, scrubbed_env
from ..host.trees import remove_tree
from ..registry.base import Registry
from ..sandbox import Sandbox
from ..sandbox.cargo import Cargo
from ..sandbox.diagnostics import actionable, parse_cargo_messages, parse_test_list, parse_test_output
from ..sandbox.policy import TreePolicy
from .pytest_plugin import ENV_CACHE, ENV_REPORT, ENV_TOOL
from .results import HiddenResult, cut
from .task import MAX_FILE_BYTES, Task

__all__ = ["run_cargo_tests", "run_pytest", "stage_hidden"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: the most a hidden test file may hold
_MAX_TEST_BYTES = 16 * 1024 * 1024


def run_pytest(
    task: Task, *, cache_dir: Path, tool_name: str, work: Path, runner: ProcessRunner, timeout: float
) -> HiddenResult:
    """Run ``task``'s ``test_hidden.py`` against the tool ``tool_name`` deployed in ``cache_dir``."""
    work.mkdir(parents=True, exist_ok=True)
    for source in task.hidden.files:  # never through a symlink, never blocking, capped (a suite's files)
        (work / source.name).unlink(missing_ok=True)
        copy_regular(source, work / source.name, executable=False, limit=_MAX_TEST_BYTES)
    # an empty config of its own: the suite's or this repository's pytest settings must not apply
    (work / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    report = work / "report.json"
    report.unlink(missing_ok=True)
    env = scrubbed_env(
        {
            ENV_CACHE: str(cache_dir),
            ENV_TOOL: tool_name,
            ENV_REPORT: str(report),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONPATH": str(_PACKAGE_ROOT),
            # only this plugin: the environment's other pytest plugins are not the task's, and cost seconds to load
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        }
    )
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "flakebot_magic.eval.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "-c",
        str(work / "pytest.ini"),
        "--rootdir",
        str(work),
        *(str(work / source.name) for source in task.hidden.files),
    ]
    done = runner.run(argv, cwd=work, env=env, timeout=timeout, label=["pytest", "test_hidden.py"])
    try:
        data = load_json(report.read_text(encoding="utf-8"))
        tests: dict[str, Any] = dict(data["tests"])
        status = int(data["exitstatus"])
    except (OSError, ValueError, KeyError, TypeError):
        return HiddenResult(
            0, 0, error=f"pytest did not finish (exit {done.returncode}):\n" + cut(done.stdout + done.stderr, 3000)
        )
    outcomes = {node: entry for node, entry in tests.items() if entry.get("outcome") != "skipped"}
    collection = [entry for node, entry in outcomes.items() if "::" not in node]
    counted = {node: entry for node, entry in outcomes.items() if "::" in node}
    passed = sum(1 for entry in counted.values() if entry.get("outcome") == "passed")
    failing = "\n\n".join(
        f"{node}: {entry.get('outcome')}\n{entry.get('text', '')}"
        for node, entry in counted.items()
        if entry.get("outcome") != "passed"
    )
    error = ""
    if collection or status in (2, 3, 4) or not counted:
        error = f"the hidden tests could not be collected or run (pytest exit {status}):\n" + cut(
            "\n".join(str(e.get("text", "")) for e in collection) or done.stdout, 3000
        )
    elif all(entry.get("outcome") == "error" for entry in counted.values()):  # the fixture: no tool to test
        error = "no hidden test could reach the tool:\n" + cut(failing, 3000)
    first = next(((node, entry) for node, entry in counted.items() if entry.get("outcome") != "passed"), None)
    cause = ""
    if first is not None:  # the failing test, and the line pytest marks with E (the assertion)
        said = [line[1:].strip() for line in str(first[1].get("text", "")).splitlines() if line.startswith("E ")]
        cause = " ".join([f"{first[0]}:", *said[:2]])[:500]
    tests = {node: str(entry.get("outcome")) for node, entry in counted.items()}
    return HiddenResult(passed, len(counted), output=cut(failing), error=error, tests=tests, cause=cause)


def stage_hidden(task: Task, crate: Path) -> None:
    """Write every file ``task``'s Rust tests need (the exercise's whole ``tests/`` tree) into ``crate``.

    The crate's own ``tests/`` (from the model's commit) is removed first, and
    each directory is made real (:func:`~flakebot_magic.host.fsutil.real_dir`):
    nothing lands through a link the model committed. Each file is read from
    the suite without following a link (:func:`~flakebot_magic.host.fsutil.read_inside`).
    """
    remove_tree(crate / "tests")
    root = task.hidden.root
    # a check without a tree of its own: its files, each in tests/
    files = [(root, relative) for relative in task.hidden.staged] if root is not None else []
    files += [(path.parent, path.name) for path in task.hidden.files if root is None]
    for directory, relative in files:
        data, more = read_inside(directory, relative, MAX_FILE_BYTES)
        if more:
            raise UnsafePath(f"{relative} is larger than {MAX_FILE_BYTES} bytes")
        target = crate / relative if root is not None else crate / "tests" / relative
        real_dir(crate, target.parent)
        atomic_write(target, data, mode=0o644, root=crate)


def run_cargo_tests(
    task: Task, *, workspace: Path, registry: Registry, work: Path, runner: ProcessRunner, timeout: float
) -> HiddenResult:
    """Write the final commit of ``workspace`` into ``work``, add the task's Rust tests, run them in the sandbox.

    The crate is written from git's objects (:meth:`~flakebot_magic.host.git.Git.export_commit`), never
    copied from the work tree, where the session's sandboxed code could have planted a ``tests`` symlink to
    another attempt's workspace; the hidden tests go into a ``tests/`` made real, never through a symlink.

    Each test file is listed first (``--list``: the tests that will run, with the task's features), then
    run; a test counts as passed only when libtest reported it ``ok``, keyed by its file and full path
    (``tests/forth.rs::dup::can_dup``), so tests of one name in two modules or two files are two tests.
    """
    crate = work / "crate"
    remove_tree(crate, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    if not is_real_dir(workspace / ".git"):
        return HiddenResult(0, 0, error=f"the final workspace {workspace} has no git history to test")
    Git(workspace, runner).export_commit("HEAD", crate)
    try:
        stage_hidden(task, crate)
    except OSError as exc:
        return HiddenResult(0, 0, error=f"the hidden tests could not be staged: {exc}")
    cargo = Cargo(registry, runner, Sandbox(crate))
    # an online registry: what the tests need is downloaded first (the fetch profile), once the policy passes
    # the copy; build scripts only ever run in the sandbox, so the gate here is about where code comes from
    cargo.fetch(crate, policy=TreePolicy(allow_build_scripts=True), timeout=timeout)
    features = ("--features", ",".join(task.hidden.features)) if task.hidden.features else ()
    quiet = {"RUST_BACKTRACE": "0"}  # the caller's backtraces would bury the assertion under stack frames
    root = task.hidden.root
    results: dict[str, str] = {}
    failures: list[str] = []
    problems: list[str] = []
    uncompiled: list[str] = []
    cause = ""
    died = False
    for source in task.hidden.files:
        shown = source.relative_to(root).as_posix() if root is not None else f"tests/{source.name}"
        base = ("test", "--test", source.stem, *features)
        listing = cargo.run(
            *base, "--message-format=json", "--", "--list", "--include-ignored", cwd=crate, timeout=timeout, env=quiet
        )
        diagnostics, _, other = parse_cargo_messages(listing.stdout.splitlines())
        names = parse_test_list(other)
        if listing.returncode != 0:
            errors = [d for d in actionable(diagnostics) if d.level == "error"]
            if errors:  # rustc refused the tests against the model's code: its public items are not what they call
                rendered = "\n".join((d.rendered or str(d)).rstrip() for d in errors[:5])
                uncompiled.append(f"{shown}:\n{cut(rendered, 3000)}")
                cause = cause or f"{shown} does not compile against the code: {errors[0].headline()}"
                continue
            problems.append(f"{shown}: cargo could not build the tests:\n" + cut(listing.stderr, 2000))
            continue
        done = cargo.run(*base, "--", "--include-ignored", cwd=crate, timeout=timeout, env=quiet)
        report = parse_test_output(done.stdout.splitlines())
        for name in names:
            outcome = report.outcomes.get(name)
            key = f"{shown}::{name}"
            results[key] = "passed" if outcome == "ok" else ("failed" if outcome == "FAILED" else "did not report")
            if results[key] != "passed":
                said = "\n".join(f"  {line}" for line in report.output.get(name, [])) or _unreported(done)
                failures.append(f"FAILED {key}\n{said}")
        if done.returncode != 0 and all(results.get(f"{shown}::{name}") == "passed" for name in names):
            # every test said ok and the run failed all the same: the binary died after, or printed a forged report
            failures.append(
                f"FAILED {shown}: the test binary exited with status {done.returncode} though every test said ok\n"
                + _unreported(done)
            )
            died = True
    total = len(results)
    passed = sum(1 for outcome in results.values() if outcome == "passed")
    if died:  # a run that exits non-zero never passes whole, whatever its output claims
        passed = min(passed, max(total - 1, 0))
    error = ""
    if uncompiled:
        error = "the code does not compile against the hidden tests:\n" + "\n\n".join(uncompiled)
    elif problems:
        error = "the hidden tests could not run:\n" + "\n".join(problems)
    elif total == 0:
        error = "the hidden test files hold no test that libtest lists"
    return HiddenResult(
        passed,
        total,
        output=cut("\n\n".join(failures)),
        error=cut(error, 6000),
        tests=results,
        cause=cause or (_cause(failures[0]) if failures else error.split("\n", 1)[0]),
        compile=bool(uncompiled),
    )


def _unreported(done: Completed) -> str:
    """What a run whose test said nothing of its own shows: the tail of its output (a crash, an abort)."""
    tail = (done.stdout[-1500:] + "\n" + done.stderr[-1500:]).strip()
    return "\n".join(f"  {line}" for line in tail.splitlines()[-20:]) or f"  (exit status {done.returncode}, no output)"


def _cause(failure: str) -> str:
    """One failure's name and its assertion, on one line: what a report shows of it."""
    lines = [line.strip() for line in failure.splitlines() if line.strip()]
    head = lines[0].removeprefix("FAILED ")
    said = [line for line in lines[1:] if not line.startswith(("thread '", "note: run with"))]
    return " ".join([head + ":", *said[:3]])[:500]
