"""Counts that say how wide the package's types are and how long its functions run (issue 38).

``python scripts/type_counts.py`` prints them; ``tests/test_structure.py`` holds each to a ceiling, so none grows.

- ``any``: the ``Any`` written in function signatures (parameters and returns), one per occurrence; of them,
  ``any_json``: those that are the values of a JSON document (``dict[str, Any]``, ``Mapping[str, Any]``), where a
  tool's, a model's or a client's decoded JSON is passed on and its shape is checked where it is read;
- ``functions_with_any``: the functions whose signature names ``Any`` at least once, and ``functions``: all of them;
- ``cache_dir``: parameters named ``cache_dir`` annotated as a bare path (``Path``, ``str | Path``, ...), where a
  :class:`~flakebot_magic.host.cache.CacheLayout` is meant;
- ``long``: the functions longer than :data:`LONG` lines, by dotted name, with their length.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "flakebot_magic"
#: a function longer than this many lines (its ``def`` to its last line, decorators and docstring included) is long
LONG = 80

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Counts:
    any: int = 0
    any_json: int = 0
    functions_with_any: int = 0
    functions: int = 0
    cache_dir: int = 0
    long: dict[str, int] = field(default_factory=dict)


def _functions(tree: ast.AST, prefix: str) -> Iterator[tuple[str, Function]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _annotations(function: Function) -> Iterator[ast.expr]:
    arguments = function.args
    every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    every += [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    yield from (a.annotation for a in every if a.annotation is not None)
    if function.returns is not None:
        yield function.returns


def _any_in(annotation: ast.expr) -> int:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a quoted annotation
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return 0
    return sum(
        1
        for node in ast.walk(annotation)
        if (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")
    )


def _json_values_in(annotation: ast.expr) -> int:
    """The ``Any`` that are a mapping's values keyed by ``str``: ``dict[str, Any]``, ``Mapping[str, Any]``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return 0
    found = 0
    for node in ast.walk(annotation):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) == 2:
            container = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
            key, value = node.slice.elts
            if container in {"dict", "Mapping", "MutableMapping"} and getattr(key, "id", "") == "str":
                found += _any_in(value) if isinstance(value, ast.Name | ast.Attribute) else 0
    return found


def _names_a_bare_path(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation).strip("'\"")
    return any(word in {"Path", "str", "os.PathLike", "PathLike"} for word in text.replace("|", " ").split())


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts) or "__init__"


def count(package: Path = PACKAGE) -> Counts:
    counts = Counts()
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        module = module_name(path, package)
        for name, function in _functions(tree, ""):
            counts.functions += 1
            found = sum(_any_in(a) for a in _annotations(function))
            counts.any += found
            counts.any_json += sum(_json_values_in(a) for a in _annotations(function))
            counts.functions_with_any += found > 0
            arguments = function.args
            for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if argument.arg == "cache_dir" and argument.annotation and _names_a_bare_path(argument.annotation):
                    counts.cache_dir += 1
            start = min([function.lineno, *(d.lineno for d in function.decorator_list)])
            length = (function.end_lineno or function.lineno) - start + 1
            if length > LONG:
                counts.long[f"{module}.{name}"] = length
    return counts


def main() -> int:
    counts = count()
    share = counts.functions_with_any / max(counts.functions, 1)
    print(f"Any in signatures: {counts.any} ({counts.functions_with_any} of {counts.functions} functions, {share:.0%})")
    print(f"  of them JSON documents' values (dict[str, Any], Mapping[str, Any]): {counts.any_json}")
    print(f"cache_dir parameters typed as a bare path: {counts.cache_dir}")
    print(f"functions over {LONG} lines: {len(counts.long)}")
    for name, length in sorted(counts.long.items(), key=lambda item: -item[1]):
        print(f"  {length:4d}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
