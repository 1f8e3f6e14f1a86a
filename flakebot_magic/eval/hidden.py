"""Running a task's hidden checks after its session: pytest against the deployed tool, or Rust tests on a copy.

The checks are copied out of the suite only now, into the attempt's own
directory beside (never inside) the workspace, after the model's session has
ended: nothing of them is in the prompt, in the workspace, or visible to
sandboxed code while the model works.

* ``pytest`` checks (a task's ``test_hidden.py``) run in a child Python
  with :mod:`flakebot_magic.eval.pytest_plugin`, whose fixture ``tool`` loads
  the deployed tool from the attempt's cache and runs it confined.
* ``cargo`` checks (an aider polyglot exercise's ``tests/*.rs``) are added to
  a copy of the final workspace and run with ``cargo test -- --include-ignored``
  in the sandbox. The model's code runs in the same process as these tests, so
  code that prints a forged libtest report and exits early could fool them (as
  it could aider's own harness); the count is capped at the tests the files
  hold.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from ..edit.ratchet import scan_tests
from ..host.fsutil import atomic_write, copy_regular, is_real_dir, load_json, read_regular, real_dir
from ..host.git import Git
from ..host.process import ProcessRunner, scrubbed_env
from ..host.trees import remove_tree
from ..registry.base import Registry
from ..sandbox import Sandbox
from ..sandbox.cargo import Cargo
from ..sandbox.policy import TreePolicy
from .pytest_plugin import ENV_CACHE, ENV_REPORT, ENV_TOOL
from .results import HiddenResult, cut
from .task import Task

__all__ = ["run_cargo_tests", "run_pytest", "rust_test_names"]

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: the most a hidden test file may hold
_MAX_TEST_BYTES = 16 * 1024 * 1024
_RUST_RESULT = re.compile(r"^test (\S+) \.\.\. (ok|FAILED|ignored)")


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
    return HiddenResult(passed, len(counted), output=cut(failing), error=error)


def rust_test_names(files: tuple[Path, ...]) -> list[str]:
    """The ``#[test]`` functions in Rust test files (what a hidden check counts), found as the ratchet finds them."""
    names: list[str] = []
    for directory in sorted({path.parent for path in files}):
        wanted = {path.name for path in files if path.parent == directory}
        names += [
            test.name for test in scan_tests(directory) if Path(test.file).name in wanted and "/" not in test.file
        ]
    return names


def run_cargo_tests(
    task: Task, *, workspace: Path, registry: Registry, work: Path, runner: ProcessRunner, timeout: float
) -> HiddenResult:
    """Write the final commit of ``workspace`` into ``work``, add the task's Rust tests, run them in the sandbox.

    The crate is written from git's objects (:meth:`~flakebot_magic.host.git.Git.export_commit`), never
    copied from the work tree, where the session's sandboxed code could have planted a ``tests`` symlink to
    another attempt's workspace; the hidden tests go into a ``tests/`` made real, never through a symlink.
    """
    names = rust_test_names(task.hidden.files)
    crate = work / "crate"
    remove_tree(crate, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    if not is_real_dir(workspace / ".git"):
        return HiddenResult(0, len(names), error=f"the final workspace {workspace} has no git history to test")
    Git(workspace, runner).export_commit("HEAD", crate)
    tests_dir = real_dir(crate, crate / "tests")
    for source in task.hidden.files:  # a checkout's file: read without following a symlink, capped
        data, more = read_regular(source, _MAX_TEST_BYTES)
        if more:
            return HiddenResult(0, len(names), error=f"{source.name} is larger than {_MAX_TEST_BYTES:,} bytes")
        atomic_write(tests_dir / source.name, data, mode=0o644, root=crate)
    cargo = Cargo(registry, runner, Sandbox(crate))
    # an online registry: what the tests need is downloaded first (the fetch profile), once the policy passes
    # the copy; build scripts only ever run in the sandbox, so the gate here is about where code comes from
    cargo.fetch(crate, policy=TreePolicy(allow_build_scripts=True), timeout=timeout)
    seen: dict[str, str] = {}
    outputs: list[str] = []
    failed_run = False
    for source in task.hidden.files:
        done = cargo.run(
            "test", "--test", source.stem, "--no-fail-fast", "--", "--include-ignored", cwd=crate, timeout=timeout
        )
        failed_run = failed_run or done.returncode != 0
        for line in done.stdout.splitlines():
            match = _RUST_RESULT.match(line)
            if match:
                seen.setdefault(match.group(1).rsplit("::", 1)[-1], match.group(2))
        if done.returncode != 0:
            outputs.append(cut(done.stdout[-6000:] + "\n" + done.stderr[-6000:], 4000))
    passed = sum(1 for name in set(names) if seen.get(name) == "ok")
    if failed_run:  # a failing run passed fewer than all, whatever its output claims
        passed = min(passed, max(len(names) - 1, 0))
    error = ""
    if not seen and failed_run:
        error = "the hidden Rust tests did not build against the final workspace:\n" + cut("\n".join(outputs), 3000)
    return HiddenResult(passed, len(names), output=cut("\n".join(outputs)), error=error)
