"""Execute notebooks in place and store their outputs, deterministically.

    .venv/bin/python scripts/run_notebooks.py book/02_two_layers.ipynb [...]

Each notebook runs with its own folder as the working directory, with a fixed
hash seed, and without execution timestamps in the cell metadata, so that a
re-run changes nothing that nbval compares. Cells tagged ``raises-exception``
may raise; any other error stops the run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent


def merge_streams(outputs: list) -> list:
    """Join consecutive stdout (or stderr) chunks: the kernel flushes on a timer, so one
    cell's prints may arrive in several pieces, which would show as several boxes in the book."""
    merged: list = []
    for output in outputs:
        previous = merged[-1] if merged else None
        if (
            output.get("output_type") == "stream"
            and previous is not None
            and previous.get("output_type") == "stream"
            and previous.get("name") == output.get("name")
        ):
            previous["text"] += output["text"]
        else:
            merged.append(output)
    return merged


def run(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    os.environ["PYTHONHASHSEED"] = "0"
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )  # fmt: skip
    client.execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = merge_streams(cell.outputs)
    text = nbformat.writes(nb)
    for machine_path in {str(REPO), str(Path.home())}:
        if machine_path in text:
            raise SystemExit(f"{path}: stored outputs mention the machine path {machine_path!r}; hide or remove them")
    path.write_text(text + "\n")  # as nbformat.write ends a file
    print(f"executed {path.relative_to(REPO)}")


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__)
    for arg in sys.argv[1:]:
        run(Path(arg).resolve())
