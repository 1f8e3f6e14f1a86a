"""Run a notebook headlessly in a real kernel and print each cell's text output.

Used by `make demo`. Exits non-zero when a cell fails.

With ``--inplace`` the outputs are written back into the notebook, so the
stored outputs nbval compares against are the real current ones (re-run after
a change that alters what a checked cell prints). Widget state and per-cell
timings are not stored: they differ on every run and a fresh kernel has no
widget models to match. The cache dir the run used (a temporary one, or
yours) is written as ``~/.cache/flakebot``, where a reader's own tools would
be, the Python environment (an MCP config names its interpreter) as
``$VIRTUAL_ENV``, and this checkout (``make demo``'s nixpkgs stand-in is in it)
as ``~/flakebot-magic``: a committed notebook names no one's machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from flakebot_magic.config import Settings

#: what a committed notebook calls the cache dir (the default one, platformdirs' on Linux) and the environment
SHOWN_CACHE, SHOWN_ENV, SHOWN_CHECKOUT = "~/.cache/flakebot", "$VIRTUAL_ENV", "~/flakebot-magic"
#: this checkout (the environment is usually inside it, so it is replaced after the environment)
CHECKOUT = str(Path(__file__).resolve().parent.parent)


def _without(paths: dict[str, str], value: object) -> object:
    """``value`` (an output's text, HTML or metadata) with each of ``paths`` written as what it maps to."""
    text = json.dumps(value)
    for path, shown in paths.items():
        text = text.replace(json.dumps(path)[1:-1], shown)
    return json.loads(text)


def main(path: str, *, inplace: bool = False) -> int:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=1800,
        kernel_name="python3",
        resources={"metadata": {"path": str(Path(path).parent)}},
        record_timing=False,
        store_widget_state=False,
    )
    failed = False
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = True
        print(exc, file=sys.stderr)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        print(f"\n>>> {cell.source}")
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                print(output.text, end="")
            elif output.output_type in ("execute_result", "display_data"):
                print(output.get("data", {}).get("text/plain", ""))
            elif output.output_type == "error":
                print(f"{output.ename}: {output.evalue}")
    if inplace:
        if failed:
            print(f"{path}: not written back, a cell failed", file=sys.stderr)
        else:
            # the kernel's: the same environment
            paths = {str(Settings().cache_dir): SHOWN_CACHE, sys.prefix: SHOWN_ENV, CHECKOUT: SHOWN_CHECKOUT}
            for cell in notebook.cells:
                cell.metadata.pop("execution", None)  # timings left by earlier runs
                if cell.cell_type == "code":
                    cell.outputs = nbformat.from_dict(_without(paths, cell.outputs))
            notebook.metadata.pop("widgets", None)
            nbformat.write(notebook, path)
            print(f"\n{path}: outputs written back", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="?", default="notebooks/quickstart.ipynb")
    parser.add_argument("--inplace", action="store_true", help="write the outputs back into the notebook")
    arguments = parser.parse_args()
    raise SystemExit(main(arguments.notebook, inplace=arguments.inplace))
