"""Style: ruff's lint and format checks (configured in pyproject.toml) pass on the whole repository, and each
``# fmt: skip`` says why the statement keeps its own layout."""

import io
import re
import shutil
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
pytestmark = pytest.mark.skipif(RUFF is None, reason="ruff is not installed (the dev extra has it)")


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_passes(command):
    done = subprocess.run([RUFF, *command, "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (
        f"ruff {' '.join(command)}: fix with `ruff check --fix .` / `ruff format .`\n{done.stdout[-4000:]}"
    )


def python_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    return [ROOT / name for name in tracked] or sorted(p for p in ROOT.rglob("*.py") if ".venv" not in p.parts)


def test_every_fmt_skip_says_why():
    # Only comments count (tokenize), so strings that mention the marker, like this file's, are not flagged.
    bare = []
    for path in python_files():
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
        for token in tokens:
            if token.type != tokenize.COMMENT or not re.search(r"fmt:\s*skip", token.string):
                continue
            if not re.fullmatch(r"#\s*\S.*#\s*fmt:\s*skip\s*", token.string):
                bare.append(f"{path.relative_to(ROOT)}:{token.start[0]}")
    assert not bare, "a `# fmt: skip` without a reason before it (`# why  # fmt: skip`): " + ", ".join(bare)
