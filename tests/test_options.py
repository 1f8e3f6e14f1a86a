"""The options table reaches every front door: the magic, the command, build() and the settings."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import shlex
from pathlib import Path

import pytest

import flakebot_magic
from flakebot_magic import cli
from flakebot_magic.config import Settings, apply
from flakebot_magic.errors import UsageError
from flakebot_magic.options import OPTIONS, option
from flakebot_magic.request import BuildRequest, RunFlags, split_run_flags

# a value of each type that differs from every default
_SAMPLE = {str: "sample", int: 7, float: 2.5, bool: True}


def _sample(opt: object) -> object:
    choices = opt.choices
    return choices[-1] if choices else _SAMPLE[opt.type]


def _clear_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for opt in OPTIONS:
        if opt.env:
            monkeypatch.delenv(opt.env, raising=False)


def test_every_option_is_a_setting_or_a_run_flag_with_the_same_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch)
    fields = {f.name for f in dataclasses.fields(Settings)}
    settings, request = Settings(), BuildRequest("")
    for opt in OPTIONS:
        if opt.run_flag:
            given = request.follow_up if opt.name == "follow_up" else getattr(request.flags, opt.name)
            assert given == opt.default, opt.name
            continue
        assert opt.name in fields, f"option {opt.name} has no Settings field"
        assert getattr(settings, opt.name) == opt.default, opt.name


def test_settings_hold_no_per_run_flag() -> None:
    """Settings are the configuration; how one run goes is the request's (issue 22): no Settings field is a run
    flag, every run flag is a field of the request, and the flags that say how one run goes are marked so."""
    settings = {f.name for f in dataclasses.fields(Settings)}
    run_flags = {o.name for o in OPTIONS if o.run_flag}
    assert run_flags >= {"rebuild", "resume", "follow_up", "candidates", "plan"}
    assert settings & run_flags == set()
    request = {f.name for f in dataclasses.fields(BuildRequest)} | {f.name for f in dataclasses.fields(RunFlags)}
    assert run_flags <= request
    assert {f.name for f in dataclasses.fields(RunFlags)} == run_flags - {"follow_up"}
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(RunFlags))  # defaults: the table's
    with pytest.raises(UsageError, match="rebuild is an option of one build, not a setting"):
        apply(Settings(), {"rebuild": True})


def test_run_flags_are_frozen_and_checked_as_options() -> None:
    flags = RunFlags.given({"candidates": 3, "plan": None})
    assert (flags.candidates, flags.plan) == (3, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.rebuild = True  # type: ignore[misc]
    with pytest.raises(UsageError, match="candidates must be from 1 to 8, not 9"):
        RunFlags.given({"candidates": 9})
    with pytest.raises(TypeError, match="'model' is not a run flag"):
        RunFlags.given({"model": "m"})
    request = BuildRequest("x").with_options({"follow_up": True, "rebuild": True, "candidates": None})
    assert (request.follow_up, request.flags) == (True, RunFlags(rebuild=True))


def test_environment_variables_give_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKEBOT_MODEL", "from-env")
    assert option("model").default_value() == "from-env"
    assert Settings().model == "from-env"


# -- defaults in one place: the table ----------------------------------------------------------------------------

PACKAGE = Path(flakebot_magic.__file__).parent
#: an environment variable's text and the setting it gives, per option type
_ENV_SAMPLE = {str: ("from-env", "from-env"), int: ("7", 7), float: ("2.5", 2.5), bool: ("1", True)}


def test_every_env_variable_is_read_by_the_table_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """With each option's variable set, Settings holds what the option's own reader makes of it."""
    _clear_env(monkeypatch)
    monkeypatch.setenv("FLAKEBOT_PRICES", "m=1/2")
    monkeypatch.setenv("FLAKEBOT_TOOL_ENV", "RUST_LOG=debug")
    for opt in OPTIONS:
        if opt.env and opt.type in _ENV_SAMPLE:
            monkeypatch.setenv(opt.env, _ENV_SAMPLE[opt.type][0])
    settings = Settings()
    with_env = [opt for opt in OPTIONS if opt.env]
    assert {opt.env for opt in with_env} >= {"FLAKEBOT_MODEL", "FLAKEBOT_TOOL_ENV", "FLAKEBOT_REGISTRY"}
    for opt in with_env:
        assert getattr(settings, opt.name) == opt.default_value() != opt.default, opt.name


def _settings_defaults() -> dict[str, ast.expr | None]:
    """Each field of the ``Settings`` class in config.py, and the expression that gives its default."""
    tree = ast.parse((PACKAGE / "config.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings"]
    return {n.target.id: n.value for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def test_settings_write_no_default_of_their_own() -> None:
    """Every option field's default is ``_option(its name)``: no literal, no environment read beside the table."""
    written = {
        name: ast.unparse(value) if value is not None else "(none)"
        for name, value in _settings_defaults().items()
        if name != "cache_dir" and (value is None or ast.unparse(value) != f"_option({name!r})")
    }
    assert written == {}, f"Settings fields with a default outside OPTIONS: {written}"
    assert set(_settings_defaults()) == {o.name for o in OPTIONS if not o.run_flag} | {"cache_dir"}


def _reads_an_option_variable(path: Path) -> list[str]:
    """Reads of an option's environment variable by name in ``path`` (``os.environ.get("FLAKEBOT_MODEL")`` ...)."""
    names = {o.env for o in OPTIONS if o.env}
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and node.value in names:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} names ${node.value}")
    return found


def test_no_module_reads_an_option_variable_by_hand() -> None:
    table = PACKAGE / "options.py"
    hits = [hit for path in sorted(PACKAGE.rglob("*.py")) if path != table for hit in _reads_an_option_variable(path)]
    assert hits == [], "read options' variables through options.Option.default_value:\n" + "\n".join(hits)
    assert len(_reads_an_option_variable(table)) == len([o for o in OPTIONS if o.env])  # the check sees them


def test_the_loop_and_its_runners_have_no_defaults_of_their_own() -> None:
    """The edit loop's limits come from the settings: no option-named parameter with a default of its own."""
    from flakebot_magic.backends.nix_command import Nix
    from flakebot_magic.config import LoopLimits
    from flakebot_magic.edit.checkrun import CheckRunner
    from flakebot_magic.edit.session import EditLoop
    from flakebot_magic.edit.team import Team

    limits = {f.name for f in dataclasses.fields(LoopLimits)}
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(LoopLimits))
    assert limits <= {o.name for o in OPTIONS}
    # what bounds a session: the loop's limits, the reply caps, the budget, the model's time
    names = limits | {"token_budget", "max_cost", "max_reply_bytes", "max_reply_seconds", "model_timeout"}
    defaulted = [
        f"{owner.__name__}.{parameter.name}"
        for owner in (EditLoop, Team, CheckRunner)
        for parameter in inspect.signature(owner).parameters.values()
        if parameter.name in names and parameter.default is not inspect.Parameter.empty
    ]
    assert defaulted == []
    assert inspect.signature(Nix.build).parameters["timeout"].default is inspect.Parameter.empty


def test_every_per_build_option_is_a_flag_of_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch)
    parser = cli._parser()
    for opt in (o for o in OPTIONS if o.per_build):
        argv = ["build", "a request", opt.flags[0]]
        if opt.type is not bool:
            argv.append(str(_sample(opt)))
        args = parser.parse_args(argv)
        given, flags = split_run_flags({o.name: getattr(args, o.name, None) for o in OPTIONS if o.per_build})
        settings = apply(Settings(), given)
        request = BuildRequest("a request").with_options(flags)
        if opt.name == "follow_up":
            assert request.follow_up is True
        elif opt.run_flag:
            assert getattr(request.flags, opt.name) == _sample(opt), opt.name
            assert cli._run_flags(args)[opt.name] == _sample(opt), opt.name
        else:
            assert getattr(settings, opt.name) == _sample(opt), opt.name


def test_every_option_reaches_the_magic() -> None:
    from IPython.core.magic_arguments import parse_argstring

    from flakebot_magic.magics import FlakebotMagics

    traits = FlakebotMagics.class_traits(config=True)
    for opt in OPTIONS:
        if opt.config:
            assert opt.name in traits, f"{opt.name} is not a FlakebotMagics config trait"
        if opt.per_build:
            line = opt.flags[0] + ("" if opt.type is bool else " " + shlex.quote(str(_sample(opt))))
            args = parse_argstring(FlakebotMagics.flakebot, line)
            assert getattr(args, opt.name) == _sample(opt), opt.name


def test_the_magic_line_wins_over_the_kernel_setting_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:

    from flakebot_magic.magics import FlakebotMagics

    _clear_env(monkeypatch)
    magics = FlakebotMagics(shell=None)
    magics.max_iterations = 3
    assert magics._settings(magics._parse("")).max_iterations == 3
    assert magics._settings(magics._parse("--max-iterations 5")).max_iterations == 5
    assert magics._settings(magics._parse("")).token_budget == option("token_budget").default


def test_build_takes_every_option_as_a_keyword() -> None:
    parameters = inspect.signature(flakebot_magic.build).parameters
    for opt in OPTIONS:
        assert opt.name in parameters, opt.name
        assert opt.name in (flakebot_magic.build.__doc__ or ""), opt.name


def test_unknown_and_invalid_options_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="Unknown option 'modle'"):
        apply(Settings(), {"modle": "x"})
    with pytest.raises(UsageError, match="backend must be one of"):
        apply(Settings(), {"backend": "docker"})


# -- the options of edit sessions: candidates, roles, cost, context, resume ---------------------------


def test_candidates_are_bounded_at_every_door(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from IPython.core.error import UsageError as IPythonUsageError

    from flakebot_magic.magics import FlakebotMagics

    _clear_env(monkeypatch)
    assert RunFlags.given({"candidates": 8}).candidates == 8
    for wrong in (0, 9):
        with pytest.raises(UsageError, match=rf"candidates must be from 1 to 8, not {wrong}\."):
            RunFlags.given({"candidates": wrong})
    with pytest.raises(UsageError, match="candidates must be a number"):
        RunFlags.given({"candidates": "3"})
    with pytest.raises(UsageError, match="candidates must be from 1 to 8"):
        flakebot_magic.build("a request", candidates=9, cache_dir="/nonexistent/never-used")
    assert cli.main(["build", "a request", "--candidates", "9", "--cache-dir", "/nonexistent/never-used"]) == 1
    assert "candidates must be from 1 to 8, not 9." in capsys.readouterr().err
    magics = FlakebotMagics(shell=None)
    with pytest.raises(IPythonUsageError, match="candidates must be from 1 to 8"):
        magics._request(magics._parse("--candidates 12"), "x", name=None, crate=None)
    magics.candidates = 0  # the kernel's setting is checked too
    with pytest.raises(IPythonUsageError, match="candidates must be from 1 to 8, not 0"):
        magics._request(magics._parse(""), "x", name=None, crate=None)


def test_max_cost_and_context_tokens_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch)
    assert Settings().max_cost is None and Settings().context_tokens == 128_000
    assert apply(Settings(), {"max_cost": 0.25}).max_cost == 0.25
    assert cli._settings(cli._parser().parse_args(["build", "x", "--max-cost", "1.5"])).max_cost == 1.5
    with pytest.raises(UsageError, match="max_cost must be at least 0"):
        apply(Settings(), {"max_cost": -1.0})
    with pytest.raises(UsageError, match="context_tokens must be at least 1024"):
        apply(Settings(), {"context_tokens": 10})
    assert not option("context_tokens").per_build  # a setting of the kernel, not a flag
    assert "context_tokens" in inspect.signature(flakebot_magic.build).parameters


def test_resume_is_a_flag_but_not_a_kernel_setting() -> None:
    from IPython.core.magic_arguments import parse_argstring

    from flakebot_magic.magics import FlakebotMagics

    assert "resume" not in FlakebotMagics.class_traits(config=True)
    assert parse_argstring(FlakebotMagics.flakebot, "--resume").resume is True
    assert cli._parser().parse_args(["build", "x", "--resume"]).resume is True
    magics = FlakebotMagics(shell=None)
    resumed = magics._request(magics._parse("--name md --resume"), "", name="md", crate=None)
    assert resumed.flags.resume is True
    assert magics._request(magics._parse(""), "x", name=None, crate=None).flags.resume is False


def test_plan_and_the_architects_model(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:

    from flakebot_magic.magics import FlakebotMagics

    _clear_env(monkeypatch)
    magics = FlakebotMagics(shell=None)
    magics.architect_model = "planner-1"  # %config FlakebotMagics.architect_model = ...
    args = magics._parse("--plan --candidates 3")
    flags = magics._request(args, "x", name=None, crate=None).flags
    assert (flags.plan, magics._settings(args).architect_model, flags.candidates) == (True, "planner-1", 3)
    magics.candidates = 2  # %config FlakebotMagics.candidates = 2: the kernel's, under the line's
    assert magics._request(magics._parse(""), "x", name=None, crate=None).flags.candidates == 2
    line = magics._parse("--architect-model other")
    assert magics._settings(line).architect_model == "other"  # the line wins
    with pytest.raises(SystemExit):
        cli.main(["build", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--architect-model ARCHITECT_MODEL The architect's model for --plan. Default: the edit loop's model." in (
        help_text
    )
    assert "--candidates CANDIDATES Edit sessions racing from forks of the workspace (1 to 8)" in help_text


def test_prices_from_build_the_kernel_setting_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from IPython.core.error import UsageError as IPythonUsageError

    from flakebot_magic.errors import ConfigError
    from flakebot_magic.llm.usage import Price
    from flakebot_magic.magics import FlakebotMagics

    _clear_env(monkeypatch)
    assert Settings().prices == {}
    # build(prices=...) and apply() take a mapping (or the text form) and keep the parsed table
    assert apply(Settings(), {"prices": {"m": (2.5, 10)}}).prices == {"m": Price(2.5, 10.0)}
    assert apply(Settings(), {"prices": "m=1/2,n=0.1/0.2/0.05"}).prices["n"] == Price(0.1, 0.2, 0.05)
    with pytest.raises(UsageError, match="The price"):
        apply(Settings(), {"prices": {"m": (1,)}})
    # the kernel's setting: %config FlakebotMagics.prices = {...}
    magics = FlakebotMagics(shell=None)
    magics.prices = {"gpt-test": [0.4, 1.6]}
    assert magics._settings(magics._parse("")).prices == {"gpt-test": Price(0.4, 1.6)}
    # $FLAKEBOT_PRICES, read by Settings and by the options table alike
    monkeypatch.setenv("FLAKEBOT_PRICES", "gpt-test=0.4/1.6, local=0/0")
    assert (
        Settings().prices
        == option("prices").default_value()
        == {
            "gpt-test": Price(0.4, 1.6),
            "local": Price(0.0, 0.0),
        }
    )
    monkeypatch.setenv("FLAKEBOT_PRICES", "gpt-test=cheap")
    with pytest.raises(ConfigError, match=r"\$FLAKEBOT_PRICES='gpt-test=cheap'.*Fix or unset \$FLAKEBOT_PRICES"):
        Settings()
    with pytest.raises(ConfigError, match="Fix or unset"):
        option("prices").default_value()
    with pytest.raises(IPythonUsageError, match="FLAKEBOT_PRICES"):  # the magic: one line, no traceback
        FlakebotMagics(shell=None)._settings(magics._parse(""))


#: where each time limit is decided by its option: a tool call's (the clients) and a model request's (the channel)
TIMEOUT_OWNERS = {"tool_timeout": "clients", "model_timeout": "llm"}


def _literal_timeouts(path: Path, copies: set[float]) -> list[str]:
    """Where a parameter, field or argparse default named like a timeout is written as one of ``copies``."""
    tree = ast.parse(path.read_text())
    hits = []
    for node in ast.walk(tree):
        pairs: list[tuple[str, ast.expr | None]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = [*args.posonlyargs, *args.args]
            pairs += list(
                zip([a.arg for a in positional[len(positional) - len(args.defaults) :]], args.defaults, strict=True)
            )
            pairs += [(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs.append((node.target.id, node.value))
        elif isinstance(node, ast.Call) and any(k.arg == "default" for k in node.keywords):
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            pairs += [(f, k.value) for f in flags for k in node.keywords if k.arg == "default"]
        for name, value in pairs:
            if "timeout" in name and isinstance(value, ast.Constant) and value.value in copies:
                hits.append(f"{path.name}:{value.lineno}: {name} = {value.value}")
    return hits


def test_no_module_copies_a_timeout_option_by_hand(tmp_path: Path) -> None:
    """A tool call's and a model request's time limits come from their options (issue 22: 60 and 120 were
    written in six places of the clients and the model channel)."""
    hits = [
        f"{package}/{hit}"
        for name, package in TIMEOUT_OWNERS.items()
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for hit in _literal_timeouts(path, {option(name).default})
    ]
    assert hits == [], "take the default from options.option(NAME).default:\n" + "\n".join(hits)
    # the check sees a copy written the old ways
    old = tmp_path / "old.py"
    old.write_text(
        "import argparse\n"
        "def call(x, timeout: float = 60.0): ...\n"
        "class C:\n    timeout: float = 60.0\n"
        "argparse.ArgumentParser().add_argument('--timeout', type=float, default=60.0)\n"
    )
    assert len(_literal_timeouts(old, {60.0})) == 3
