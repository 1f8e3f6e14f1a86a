"""The package's public names: what ``flakebot_magic`` exports is there, documented, and cheap to import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import flakebot_magic

PUBLIC = {
    "build",
    "search",
    "load",
    "agent_tools",
    "call",
    "acall",
    "load_ipython_extension",
    "unload_ipython_extension",
    "__version__",
}


def test_every_exported_name_exists_and_is_documented() -> None:
    for name in flakebot_magic.__all__:
        member = getattr(flakebot_magic, name)
        if name != "__version__":
            assert inspect.getdoc(member), f"flakebot_magic.{name} has no docstring"


def test_the_front_door_functions_are_exported() -> None:
    assert set(flakebot_magic.__all__) >= PUBLIC
    errors = {
        n for n in flakebot_magic.__all__ if n.endswith("Error") or n in ("Cancelled", "BudgetExhausted", "ToolBusy")
    }
    assert {"FlakebotError", "ToolError", "NeedsModelError", "PolicyError", "ToolBusy"} <= errors


#: what a plain import never loads: the model client, the kernel and server side, semantic search's model libraries
HEAVY = (
    "openai",
    "IPython",
    "ipywidgets",
    "tornado",
    "jupyter_server",
    "numpy",
    "tokenizers",
    "safetensors",
    "onnx",
    "onnxruntime",
)


def test_importing_the_package_imports_nothing_heavy() -> None:
    # the search index's module too: the embedding model's libraries load with the model, not before
    code = (
        "import sys, flakebot_magic, flakebot_magic.registry.directory; "
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_package_exports_every_error_from_the_one_list() -> None:
    """The error classes are listed once, in ``errors.__all__``; the package exports exactly that list."""
    from flakebot_magic import errors

    exported = {n for n in flakebot_magic.__all__ if hasattr(errors, n) and n != "__version__"}
    assert exported == set(errors.__all__)
    for name in errors.__all__:
        assert getattr(flakebot_magic, name) is getattr(errors, name)
