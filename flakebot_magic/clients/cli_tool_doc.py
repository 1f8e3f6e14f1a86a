"""How a command-line tool is described to Python: its :class:`inspect.Signature` and its numpydoc docstring,
made from what :func:`~.cli_tool_help.parse_help` read in its ``--help`` (:class:`~.cli_tool.CliTool` shows both).
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Optional, Union

from ..untrusted import safe_text
from .cli_tool_help import CliArgument, CliOption, CliSpec

__all__ = ["cli_docstring", "cli_signature"]


def _option_annotation(option: CliOption) -> Any:
    if not option.takes_value:
        return Union[bool, int] if option.repeatable else bool
    base: Any = Literal[option.choices] if option.choices else Union[str, int, float]
    if option.value_optional:
        base = Union[base, bool]
    return Union[base, Sequence[str]] if option.repeatable else base


def _argument_annotation(argument: CliArgument) -> Any:
    return (
        Union[str, os.PathLike[str], Sequence[Union[str, os.PathLike[str]]]]
        if argument.repeatable
        else Union[str, os.PathLike[str]]
    )


def cli_signature(spec: CliSpec) -> inspect.Signature:
    """The call's signature: ``*args``, the call's own keywords, then a keyword per option and argument."""
    kw = inspect.Parameter.KEYWORD_ONLY
    parameters = [
        inspect.Parameter(
            "args", inspect.Parameter.VAR_POSITIONAL, annotation=Union[str, os.PathLike[str], int, float]
        ),
        inspect.Parameter("input", kw, default=None, annotation=Optional[str | bytes]),
        inspect.Parameter("timeout", kw, default=None, annotation=Optional[float]),
        inspect.Parameter("env", kw, default=None, annotation=Optional[Mapping[str, str]]),
        inspect.Parameter("raw", kw, default=False, annotation=bool),
    ]
    for option in spec.options:
        annotation = _option_annotation(option)
        default = False if not option.takes_value else None
        parameters.append(
            inspect.Parameter(
                option.name,
                kw,
                default=default,
                annotation=annotation if default is False else Optional[annotation],
            )
        )
    for argument in spec.arguments:
        parameters.append(
            inspect.Parameter(argument.name, kw, default=None, annotation=Optional[_argument_annotation(argument)])
        )
    return inspect.Signature(parameters, return_annotation=str)


def cli_docstring(spec: CliSpec, *, summary: str, name: str, timeout: float, reads_stdin: bool, example: str) -> str:
    """The call's numpydoc docstring (made safe to show: the help text is the tool's)."""
    lines = [
        summary,
        "",
        "Runs the tool and returns its standard output (a str).",
    ]
    if not spec.parsed:
        lines += [
            "",
            "flakebot could not parse this tool's --help into options, so it takes plain",
            f'command-line arguments only: {name}("--flag", "value", Path("file")).',
            f"See {name}.help for what the tool accepts.",
        ]
    lines += [
        "",
        "Parameters",
        "----------",
        "*args : str, os.PathLike, int or float",
        "    Command-line arguments, as they are.",
    ]
    if reads_stdin:
        lines.append("    This tool reads standard input: a first plain str is sent there (when input= is not given).")
    lines += [
        "input : str or bytes, optional",
        "    Text or bytes for the tool's standard input.",
        "timeout : float, optional",
        f"    Seconds before the tool is stopped (default {timeout:g}).",
        "env : mapping, optional",
        "    Variables added to the tool's environment for this call. The tool starts with an",
        "    allowlisted environment (PATH, HOME, LANG, ...; no API keys), plus the tool_env setting.",
    ]
    for option in spec.options:
        kind = (
            "bool"
            if not option.takes_value
            else (" | ".join(repr(c) for c in option.choices) if option.choices else "str or number")
        )
        if option.repeatable:
            kind += " (repeatable: a list gives it several times)" if option.takes_value else " or int (a count)"
        lines.append(f"{option.name} : {kind}{'' if not option.takes_value else ', optional'}")
        form = ", ".join(option.flags) + (f" <{option.value}>" if option.takes_value else "")
        text = re.sub(r"(?<!\s)\s*\[(default|possible values): [^\][]*\]", "", option.help).strip()
        lines.append(f"    {form}: {text}" if text else f"    {form}")
        if option.default is not None:
            lines.append(f"    The tool's default: {option.default}.")
    for argument in spec.arguments:
        lines.append(f"{argument.name} : str or os.PathLike{' (or a list)' if argument.repeatable else ''}, optional")
        lines.append(
            f"    <{argument.placeholder}>{': ' + argument.help if argument.help else ''} (positional, after the options)"
        )
    if spec.commands:
        lines += ["", f"Subcommands (pass as the first argument): {', '.join(spec.commands)}."]
    lines += [
        "",
        "Returns",
        "-------",
        "str",
        "    The tool's standard output.",
        "",
        "Raises",
        "------",
        "ToolError",
        "    The tool exited non-zero (``returncode``, ``stderr``) or ran past ``timeout``.",
        "",
        "Examples",
        "--------",
        f">>> {example}  # doctest: +SKIP",
    ]
    return safe_text("\n".join(lines))
