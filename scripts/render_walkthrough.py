"""Rebuild docs/walkthrough.ipynb from its source, docs/walkthrough.py, with outputs.

    python scripts/render_walkthrough.py

The source (jupytext's percent format) is converted to a notebook, executed top to bottom in a fresh
kernel of this Python environment, from a temporary working directory, and written with its outputs.
Volatile metadata (execution timestamps, random cell ids, the exact Python version) is left out, so
that rendering twice gives the same file up to what the cells print and draw.
tests/test_walkthrough.py runs the same execution and checks that the committed notebook matches the source.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "docs" / "walkthrough.py"
NOTEBOOK = ROOT / "docs" / "walkthrough.ipynb"
KERNEL = "python3"  # ipykernel's kernel: jupyter_client starts it with this interpreter (sys.executable)
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# Absolute paths of a machine have no place in committed outputs.
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:tmp|home|root|work|Users|private|var/folders)/")


def notebook_from_source(source: Path = SOURCE) -> nbformat.NotebookNode:
    """The notebook jupytext makes of ``source``, with cell ids that depend only on the cells' order."""
    notebook = jupytext.read(source)
    notebook.metadata.pop("jupytext", None)
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:02d}"
    return notebook


def cells(notebook: nbformat.NotebookNode) -> list[tuple[str, str]]:
    """What must agree between source and rendered notebook: each cell's kind and text."""
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def execute(
    notebook: nbformat.NotebookNode, working_dir: Path, timeout: int = 900, environment: dict[str, str] | None = None
) -> nbformat.NotebookNode:
    """Run every cell in order in a fresh kernel started in ``working_dir``; raise on the first error.
    ``environment``: variables the kernel gets besides ``ENVIRONMENT``."""
    environment = {**ENVIRONMENT, **(environment or {})}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)  # the kernel inherits this process's environment
    try:
        client = NotebookClient(
            notebook, timeout=timeout, kernel_name=KERNEL, resources={"metadata": {"path": str(working_dir)}}
        )
        client.execute()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return notebook


def strip_volatile(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what changes from run to run without meaning anything: timestamps and the Python patch version."""
    for cell in notebook.cells:
        cell.metadata.pop("execution", None)
    language = notebook.metadata.get("language_info", {})
    for key in ("version", "pygments_lexer"):
        language.pop(key, None)
    return notebook


def problems(notebook: nbformat.NotebookNode) -> list[str]:
    """Why a rendered notebook must not be committed: a cell not run in order, an error, a machine path."""
    found = []
    count = 0
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        count += 1
        if cell.execution_count != count:
            found.append(f"cell {index}: execution count {cell.execution_count}, expected {count} (top to bottom)")
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                found.append(f"cell {index}: {output.ename}: {output.evalue}")
            text = output.get("text", "") + "".join(
                value for kind, value in output.get("data", {}).items() if kind.startswith("text/")
            )
            if MACHINE_PATH.search(text):
                found.append(f"cell {index}: a machine path in its output: {MACHINE_PATH.search(text).group(0)}…")
    return found


def render(source: Path = SOURCE, target: Path = NOTEBOOK) -> float:
    """Execute ``source`` and write ``target``; returns the seconds the execution took."""
    notebook = notebook_from_source(source)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="walkthrough-render-") as working_dir:
        execute(notebook, Path(working_dir))
    seconds = time.monotonic() - start
    strip_volatile(notebook)
    found = problems(notebook)
    if found:
        rejected = Path(tempfile.gettempdir()) / target.name
        nbformat.write(notebook, rejected)
        raise SystemExit(f"{target.name} not written (the rendered notebook is in {rejected}):\n" + "\n".join(found))
    nbformat.write(notebook, target)
    return seconds


if __name__ == "__main__":
    seconds = render()
    size = NOTEBOOK.stat().st_size
    print(f"{NOTEBOOK.relative_to(ROOT)}: executed in {seconds:.0f} s, {size / 1000:.0f} kB", file=sys.stderr)
