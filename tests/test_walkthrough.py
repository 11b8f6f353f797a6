"""docs/walkthrough: the notebook runs top to bottom, and the committed .ipynb is a rendering of the committed source.

The notebook's checking cells assert what the text claims, so running it checks the claims. It is executed
from docs/walkthrough.py (never from, nor into, the committed docs/walkthrough.ipynb), in a temporary working
directory, by a kernel of the interpreter running the tests (about 2.5 minutes on 2 CPU cores).
"""

import base64
import sys
from pathlib import Path

import nbformat
import pytest
from test_docs import relative_links

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from render_walkthrough import NOTEBOOK, SOURCE, cells, execute, notebook_from_source, problems  # noqa: E402

MIN_PICTURES = 7  # positions, masks, schedule, label smoothing, the loss curve, two attention maps


def committed() -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOK, as_version=4)


def test_the_committed_notebook_is_a_rendering_of_the_source():
    """Same cells, same text, same order: the .ipynb is no stale copy (python scripts/render_walkthrough.py)."""
    expected, found = cells(notebook_from_source()), cells(committed())
    assert len(found) == len(expected), "docs/walkthrough.ipynb is stale: run python scripts/render_walkthrough.py"
    for index, (want, have) in enumerate(zip(expected, found)):
        assert have == want, f"cell {index} differs from docs/walkthrough.py: run python scripts/render_walkthrough.py"


def test_the_committed_notebook_holds_the_outputs_of_one_run_top_to_bottom():
    notebook = committed()
    assert problems(notebook) == []  # execution counts 1, 2, 3 … in order; no error; no machine path
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.outputs for cell in code), "a code cell without output: render the notebook again"
    pictures = [
        base64.b64decode(output.data["image/png"])
        for cell in code
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert len(pictures) >= MIN_PICTURES and all(p.startswith(b"\x89PNG") for p in pictures)
    assert NOTEBOOK.stat().st_size < 600_000, "keep the rendered notebook small (pictures are shown at 900 px)"


def test_the_notebook_links_resolve():
    text = "\n".join(cell.source for cell in notebook_from_source().cells if cell.cell_type == "markdown")
    links = relative_links(text)
    assert links and [link for link in links if not (SOURCE.parent / link).exists()] == []


@pytest.mark.slow
def test_the_walkthrough_runs_top_to_bottom(tmp_path):
    """Every cell of docs/walkthrough.py runs without error (its asserts included), in a kernel of this Python."""
    before = NOTEBOOK.read_bytes()
    notebook = notebook_from_source()
    check = nbformat.v4.new_code_cell("import sys\nprint(sys.prefix)")
    notebook.cells.append(check)
    # One thread: the walkthrough's model is tiny, and a second torch thread makes every operation wait for a
    # core that another process may hold. Timed beside two busy processes on 2 cores, a training step of this
    # size took 0.97-1.02 s with 2 threads and 0.43-0.47 s with 1, and this test 170 s with 1 (it had run past
    # its 900 s limit with 2 beside one busy process).
    execute(notebook, tmp_path, environment={"OMP_NUM_THREADS": "1"})  # raises CellExecutionError at the first error
    assert check.outputs[0].text.strip() == sys.prefix  # the kernel ran in this environment (.venv)
    notebook.cells.remove(check)  # (it prints a machine path)
    assert problems(notebook) == []
    assert NOTEBOOK.read_bytes() == before  # the committed notebook is never rewritten by the test
