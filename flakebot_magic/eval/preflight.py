"""The preflight: before any model spends a token, which tasks can run here at all.

A task can run when the registry has what its crate needs: the crate itself
(a task that names one), every dependency its starting ``Cargo.toml``
requires (what the fork keeps: not a dev-dependency, not an optional one),
and every dependency its reference solution adds (the reference proves the
task solvable; a task whose reference cannot build here proves nothing). One
that cannot is "not runnable: dependency itertools ^0.5 missing (the registry
has 0.10.3)": the environment's lack, not the model's failure, so it is left
out of every score and counted apart (``results.json``'s
``suite.not_runnable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import FlakebotError
from ..host.fsutil import load_toml
from ..registry.base import Registry
from ..sandbox.manifest import dependencies
from .reference import starting_manifest
from .task import Suite, Task, TaskProblem

__all__ = ["missing", "preflight"]

#: the dependency tables the fork drops an unsatisfiable entry of (it never stops a build)
_DROPPED = ("dev-dependencies", "dev_dependencies")


def preflight(suite: Suite, registry: Registry) -> Suite:
    """``suite`` with each task that cannot run here moved from ``tasks`` to ``unrunnable``, saying why."""
    tasks: list[Task] = []
    unrunnable = list(suite.unrunnable)
    for task in suite.tasks:
        why = missing(task, registry)
        if why:
            unrunnable.append(TaskProblem(task.id, task.path, "not runnable: " + "; ".join(why)))
        else:
            tasks.append(task)
    return Suite(suite.path, tuple(tasks), suite.problems, tuple(unrunnable))


def missing(task: Task, registry: Registry) -> list[str]:
    """What the registry lacks for ``task`` (empty when it can run), each as ``dependency NAME REQ missing``."""
    if task.crate and task.source is None:
        try:
            registry.get(task.crate)
        except FlakebotError:
            return [f"crate {task.crate} missing from the registry"]
    found: list[str] = []
    try:
        start = load_toml(starting_manifest(task, registry)) if task.source is not None or task.crate else {}
    except (OSError, ValueError, FlakebotError):
        start = {}  # a crate whose manifest cannot be read here: the fork says why, in the attempt
    found += _unsatisfied(start, registry, keep_dev=False)
    if task.reference is not None:
        found += [why for why in _unsatisfied(task.reference.manifest, registry, keep_dev=True) if why not in found]
    return found


def _unsatisfied(manifest: Mapping[str, Any], registry: Registry, *, keep_dev: bool) -> list[str]:
    found = []
    for dependency in dependencies(manifest):
        spec = dependency.spec
        table = dependency.where.rsplit(".", 1)[-1]
        if isinstance(spec, Mapping):
            if spec.get("optional") or "path" in spec or (table in _DROPPED and not keep_dev):
                continue
            name, requirement = str(spec.get("package") or dependency.name), str(spec.get("version") or "*")
        elif table in _DROPPED and not keep_dev:
            continue
        else:
            name, requirement = dependency.name, str(spec)
        can_satisfy = getattr(registry, "can_satisfy", None)
        if can_satisfy is None or can_satisfy(name, requirement):
            continue
        versions = getattr(registry, "versions", None)
        have = list(versions(name)) if versions is not None else []
        shown = requirement if requirement[:1] in "^~=<>*" else f"^{requirement}"
        found.append(
            f"dependency {name} {shown} missing"
            + (f" (the registry has {', '.join(have)})" if have else " (the registry has no version of it)")
        )
    return found
