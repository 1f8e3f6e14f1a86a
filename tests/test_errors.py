"""Every error a run can end in: the right class, a message that says what to do, nothing left running."""

from __future__ import annotations

import inspect
import re
import subprocess
import threading
from pathlib import Path

import pytest
from tinycrates import Recorder, process_group, processes_in, write_registry

from flakebot_magic import errors
from flakebot_magic.config import Settings
from flakebot_magic.errors import (
    BuildError,
    Cancelled,
    ConfigError,
    FlakebotError,
    NeedsModelError,
    SearchError,
    StageTimeout,
    TestError,
    UpstreamTestError,
    UsageError,
)
from flakebot_magic.events import RunFinished, StageFinished
from flakebot_magic.host.process import CancelToken, ProcessRunner
from flakebot_magic.pipeline import Pipeline
from flakebot_magic.records.inventory import Inventory


@pytest.fixture(scope="module")
def registry_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_registry(tmp_path_factory.mktemp("registry"))


@pytest.fixture
def settings(registry_path: Path, tmp_path: Path) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", registry=str(registry_path))


def _fail(
    settings: Settings, request: str = "", *, name: str | None = None, crate: str | None = None
) -> tuple[FlakebotError, Recorder]:
    recorder = Recorder()
    with pytest.raises(FlakebotError) as caught:
        Pipeline(settings, observers=[recorder]).run(request, name=name, crate=crate)
    [finished] = recorder.of(RunFinished)
    assert finished.ok is False and finished.error is caught.value
    return caught.value, recorder


def _statuses(recorder: Recorder) -> dict[str, str]:
    return {e.stage: e.status for e in recorder.of(StageFinished)}


# -- before anything is built ------------------------------------------------------------


@pytest.mark.parametrize("request_text", ["", "   \n\t"])
def test_empty_request_is_a_usage_error(settings: Settings, request_text: str) -> None:
    error, recorder = _fail(settings, request_text)
    assert type(error) is UsageError
    assert "The request is empty" in str(error)
    assert "--crate NAME" in str(error) and "%%flakebot" in str(error)  # what to write instead
    assert recorder.of(StageFinished) == []


def test_a_bad_tool_name_is_a_usage_error(settings: Settings) -> None:
    error, _ = _fail(settings, "echo", name="my-tool")
    assert type(error) is UsageError
    assert str(error) == (
        "--name 'my-tool' is not a valid tool name (a Python identifier: letters, digits and '_', not a keyword); "
        "try 'my_tool'."
    )


def test_unknown_crate_is_a_search_error(settings: Settings) -> None:
    error, recorder = _fail(settings, crate="nope")
    assert type(error) is SearchError
    assert "There is no crate named 'nope' in the registry" in str(error)
    assert "Check the spelling" in str(error)
    assert _statuses(recorder) == {"search": "failed"}


def test_missing_registry_path_is_a_config_error(tmp_path: Path) -> None:
    settings = Settings(cache_dir=tmp_path / "cache", registry=str(tmp_path / "no-such-registry"))
    error, _ = _fail(settings, "echo words")
    assert type(error) is ConfigError
    assert f"The registry path {tmp_path / 'no-such-registry'} does not exist" in str(error)
    assert "--registry" in str(error)


def test_no_candidates_is_a_search_error(settings: Settings) -> None:
    error, _ = _fail(settings, "quantum chromodynamics lattice")
    assert type(error) is SearchError
    assert "No crate in dir:" in str(error) and "matches 'quantum chromodynamics lattice'" in str(error)
    assert "--crate NAME" in str(error)
    assert error.candidates == []


def test_a_library_needs_a_model_and_lists_the_candidates(settings: Settings) -> None:
    error, _ = _fail(settings, "uppercase helper library")
    assert type(error) is NeedsModelError
    message = str(error)
    assert message.startswith("No crate does 'uppercase helper library' as published: ")
    assert "\n  tinylib 0.1.3: Uppercase helper library for text\n" in message
    assert "--crate NAME" in message and "Configure a model" in message
    assert [c.name for c in error.candidates][0] == "tinylib"


def test_a_library_named_with_crate_needs_a_model(settings: Settings) -> None:
    error, _ = _fail(settings, crate="tinylib")
    assert type(error) is NeedsModelError
    assert "tinylib@0.1.3 is a library: it has no binary target to deploy" in str(error)
    assert [c.name for c in error.candidates] == ["tinylib"]


def test_cargo_missing_is_a_config_error_that_says_how_to_install(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.cargo/bin either
    error, _ = _fail(settings, crate="tinyecho")
    assert type(error) is ConfigError
    assert "cargo is not installed (not on PATH, not in ~/.cargo/bin)" in str(error)
    assert "https://rustup.rs" in str(error) and "make install" in str(error)
    assert not (settings.cache.workspaces / "tinyecho").exists()


def test_a_missing_program_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"`no-such-program-here` is not on PATH\. Install it"):
        ProcessRunner().run(["no-such-program-here"], cwd=tmp_path)


# -- after the fork: the workspace is kept --------------------------------------------------


@pytest.mark.cargo
def test_a_build_failure_keeps_the_workspace(settings: Settings) -> None:
    error, recorder = _fail(settings, crate="brokenbin")
    assert type(error) is BuildError
    workspace = settings.cache.workspaces / "brokenbin"
    assert error.workspace == workspace
    message = str(error)
    assert "cargo build failed for brokenbin" in message
    assert "error[E0308]: mismatched types" in message and "src/main.rs:2:18" in message
    assert f"The workspace is kept at {workspace}" in message
    assert (workspace / "src" / "main.rs").is_file()
    assert subprocess.run(["git", "rev-parse", "published"], cwd=workspace, capture_output=True).returncode == 0
    assert error.diagnostics[0].code == "E0308"
    assert _statuses(recorder) == {"search": "done", "fork": "done", "build": "failed", "test": "failed"}
    assert not any(settings.cache.store.iterdir()) and Inventory(settings.cache.tools).all() == []  # no tool made


@pytest.mark.cargo
def test_a_test_failure_keeps_the_workspace(settings: Settings) -> None:
    error, recorder = _fail(settings, crate="failingtest")
    # nothing of the published crate was edited: its own tests fail on this toolchain, and the error says so
    assert type(error) is UpstreamTestError and isinstance(error, TestError) and error.upstream
    assert "this is the crate's own failure, not one flakebot caused" in str(error)
    workspace = settings.cache.workspaces / "failingtest"
    assert error.workspace == workspace and workspace.is_dir()
    assert error.failed == ["tests::breaks_on_purpose"]
    message = str(error)
    assert "Failing: tests::breaks_on_purpose" in message
    assert "`flakebot cargo failingtest test`" in message  # in the sandbox, never unconfined
    assert f"The workspace is kept at {workspace}" in message
    assert _statuses(recorder)["test"] == "failed"


# -- time limits and cancelling: nothing is left running -------------------------------------


@pytest.mark.cargo
def test_a_build_past_its_time_limit_is_stopped_with_its_children(settings: Settings) -> None:
    settings.build_timeout = settings.test_timeout = 2.0
    error, _ = _fail(settings, crate="slowbuild")  # its build script sleeps for a minute
    assert type(error) is StageTimeout
    workspace = settings.cache.workspaces / "slowbuild"
    message = str(error)
    assert "ran past its time limit of 2 s and was stopped" in message
    assert "build_timeout" in message  # what to raise
    assert error.seconds == 2.0 and "cargo" in error.command[0]
    assert error.workspace == workspace and workspace.is_dir()
    # cargo, rustc and the build script all ran in the workspace; none of them is left
    assert processes_in(workspace) == []


def _group_script(tmp_path: Path) -> list[str]:
    # the shell records its process group, starts a grandchild in it, and waits
    return ["sh", "-c", f"echo $$ > {tmp_path / 'pgid'}; sleep 30 & sleep 30; wait"]


def test_a_process_past_its_time_limit_is_killed_with_its_group(tmp_path: Path) -> None:
    with pytest.raises(StageTimeout) as caught:
        ProcessRunner().run(_group_script(tmp_path), cwd=tmp_path, timeout=0.3, workspace=tmp_path)
    assert str(caught.value).startswith("`sh -c echo")
    assert caught.value.seconds == 0.3 and caught.value.workspace == tmp_path
    assert process_group(int((tmp_path / "pgid").read_text())) == []


def test_a_sub_second_time_limit_is_shown_as_it_was_given(tmp_path: Path) -> None:
    with pytest.raises(StageTimeout) as caught:
        ProcessRunner().run(["sleep", "5"], cwd=tmp_path, timeout=0.3)
    assert "time limit of 0.3 s" in str(caught.value)


def test_cancel_kills_the_group(tmp_path: Path) -> None:
    token = CancelToken()
    timer = threading.Timer(0.3, token.cancel)
    timer.start()
    try:
        with pytest.raises(Cancelled, match=f"^Stopped during `sh`.\nThe workspace is kept at {tmp_path}$") as caught:
            ProcessRunner(token).run(_group_script(tmp_path), cwd=tmp_path, timeout=30, workspace=tmp_path)
    finally:
        timer.cancel()
    assert caught.value.workspace == tmp_path
    assert process_group(int((tmp_path / "pgid").read_text())) == []


# -- the hierarchy -----------------------------------------------------------------------------------


def _classes() -> list[type[FlakebotError]]:
    return [getattr(errors, name) for name in errors.__all__]


def test_every_error_is_a_flakebot_error() -> None:
    assert issubclass(FlakebotError, Exception) and not issubclass(FlakebotError, (KeyboardInterrupt, SystemExit))
    classes = inspect.getmembers(errors, inspect.isclass)
    # an old name kept as an alias is not a class of its own
    members = {name for name, obj in classes if obj.__module__ == errors.__name__ and obj.__name__ == name}
    assert members == set(errors.__all__)
    assert getattr(errors, "Registry" + "Damaged") is errors.InventoryDamaged  # the old name still catches it
    for cls in _classes():
        assert issubclass(cls, FlakebotError), cls
        assert cls is FlakebotError or cls.stage, cls


def test_the_tree_in_the_docstring_lists_every_class() -> None:
    tree = (errors.__doc__ or "").split("The tree::", 1)[1]
    for cls in _classes():
        assert re.search(rf"(^ *|── ){cls.__name__}( |$)", tree, re.M), cls


@pytest.mark.parametrize("cls", _classes(), ids=lambda c: c.__name__)
def test_render_traceback_is_the_message_alone(cls: type[FlakebotError]) -> None:
    error = cls("Something happened. Do this next.")
    assert error._render_traceback_() == [f"{cls.__name__}: Something happened. Do this next."]
    assert error.message == "Something happened. Do this next."


def test_the_workspace_is_named_once(tmp_path: Path) -> None:
    error = BuildError("cargo build failed.", workspace=tmp_path)
    assert str(error) == f"cargo build failed.\nThe workspace is kept at {tmp_path}"
    error.keep_workspace(tmp_path / "other")  # already known: unchanged
    assert error.workspace == tmp_path and str(error).count("kept at") == 1

    late = SearchError("no such crate")
    late.keep_workspace(tmp_path)
    assert late.workspace == tmp_path
    assert str(late) == f"no such crate\nThe workspace is kept at {tmp_path}"
    assert late._render_traceback_() == [f"SearchError: no such crate\nThe workspace is kept at {tmp_path}"]


def test_errors_carry_their_context() -> None:
    test_error = TestError("x", failed=["a::b"], command=["cargo", "test"])
    assert (test_error.failed, test_error.command, test_error.stage) == (["a::b"], ["cargo", "test"], "test")
    assert isinstance(test_error, BuildError)
    timeout = StageTimeout("y", command=["cargo"], seconds=3.0)
    assert (timeout.command, timeout.seconds) == (["cargo"], 3.0)
    tool_error = errors.ToolError("z", returncode=2, stderr="bad")
    assert (tool_error.returncode, tool_error.stderr) == (2, "bad")
    assert issubclass(errors.RegistryError, SearchError)
