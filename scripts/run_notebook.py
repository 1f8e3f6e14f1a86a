"""Run a notebook headlessly in a real kernel and print each cell's text output.

Used by `make demo`. Exits non-zero when a cell fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def main(path: str) -> int:
    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(Path(path).parent)}}
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
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "notebooks/quickstart.ipynb"))
