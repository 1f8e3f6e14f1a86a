"""The options table reaches every front door: the magic, the command, build() and the settings."""

from __future__ import annotations

import dataclasses
import inspect
import shlex

import pytest

import flakebot_magic
from flakebot_magic import cli
from flakebot_magic.config import Settings
from flakebot_magic.errors import UsageError
from flakebot_magic.options import OPTIONS, apply, option

# a value of each type that differs from every default
_SAMPLE = {str: "sample", int: 7, float: 2.5, bool: True}


def _sample(opt: object) -> object:
    choices = opt.choices
    return choices[-1] if choices else _SAMPLE[opt.type]


def _clear_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for opt in OPTIONS:
        if opt.env:
            monkeypatch.delenv(opt.env, raising=False)


def test_every_option_is_a_setting_with_the_same_default(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch)
    fields = {f.name for f in dataclasses.fields(Settings)}
    settings = Settings()
    for opt in OPTIONS:
        assert opt.name in fields, f"option {opt.name} has no Settings field"
        assert getattr(settings, opt.name) == opt.default, opt.name


def test_environment_variables_give_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAKEBOT_MODEL", "from-env")
    assert option("model").default_value() == "from-env"
    assert Settings().model == "from-env"


def test_every_per_build_option_is_a_flag_of_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_env(monkeypatch)
    parser = cli._parser()
    for opt in (o for o in OPTIONS if o.per_build):
        argv = ["build", "a request", opt.flags[0]]
        if opt.type is not bool:
            argv.append(str(_sample(opt)))
        args = parser.parse_args(argv)
        settings = apply(Settings(), {o.name: getattr(args, o.name, None) for o in OPTIONS if o.per_build})
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
    from IPython.core.magic_arguments import parse_argstring

    from flakebot_magic.magics import FlakebotMagics

    _clear_env(monkeypatch)
    magics = FlakebotMagics(shell=None)
    magics.max_iterations = 3
    assert magics._settings(parse_argstring(FlakebotMagics.flakebot, "")).max_iterations == 3
    assert magics._settings(parse_argstring(FlakebotMagics.flakebot, "--max-iterations 5")).max_iterations == 5
    assert magics._settings(parse_argstring(FlakebotMagics.flakebot, "")).token_budget == option("token_budget").default


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
