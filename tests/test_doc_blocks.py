"""Every fenced ``bash`` and ``python`` block of README.md and docs/*.md runs, as a reader would run it.

Sybil parses the pages: its Markdown code-block parser finds the blocks, and the blocks of one page share one
Python namespace, in page order, as in a reader's session. (pytest-markdown-docs was the other candidate: it
runs Python blocks only, and marks blocks with info-string flags that a rendered page does not show; Sybil's
evaluators run the shell blocks through the same parser, and see the text before each block.)

Each page runs in a workspace that looks like a clone after a short run (see ``workspace``): copies of
benchmarks/, scripts/, configs/ and examples/, the bundled corpus cut to a few thousand pairs, a tiny
Multi30k-shaped folder in data/multi30k, and ``RUN``, a 4-step run of ``RUN.yaml``, with ``test.en`` and
``test.de``. The package is the one installed from this checkout; the results files written are the
workspace's copies.

A block that would take too long, or cannot run here, has a line right above it that a reader sees too:

* ``*The tests run this block with `A` → `B`, `C` → `D`.*``: each A replaced by B before it runs (the
  reader sees what the tests change, and why where the marker says it);
* ``*Not run by the tests: REASON.*``: not run, and listed in ``NOT_RUN`` below.

docs/tests.md describes this for contributors.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sybil = pytest.importorskip("sybil")
from sybil.example import SybilFailure  # noqa: E402
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser  # noqa: E402
from sybil.region import Lexeme  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^\*(Not run by the tests|The tests run this block with):? (.+)\*$")
REPLACEMENT = re.compile(r"`([^`]+)` → `([^`]*)`")
RUNNABLE = ("bash", "python")

#: The blocks not run, by page and first line, and why: checked both ways against the pages' markers.
NOT_RUN = {
    ("README.md", "bash scripts/main.sh     # set up, then run the main job"):
        "the first trains for 6 minutes; the second is the test suite itself",
    ("docs/benchmarks.md", "python scripts/get_multi30k.py        # once: Multi30k task 1 into data/multi30k, "
                           "checked against recorded SHA-256s"):
        "it downloads from GitHub; tests/test_get_multi30k.py runs it against a local server",
    ("docs/benchmarks.md", "python benchmarks/table3.py                        # every row not yet recorded "
                           "(many CPU-hours; resumable)"):
        "it trains for many CPU-hours; tests/test_benchmarks.py runs its --smoke mode",
    ("docs/benchmarks.md", "python benchmarks/table3_converged.py --pilot                       "
                           "# base and N=6 under each candidate recipe"):
        "it trains for CPU-hours; tests/test_benchmarks.py runs its --smoke mode",
    ("docs/benchmarks.md", "bash scripts/gpu_check.sh             # on a machine with a CUDA GPU: about 8 minutes"):
        "the first needs a CUDA GPU; tests/test_benchmarks.py runs the second",
    ("docs/benchmarks.md", "python benchmarks/deployment.py --model outputs/tatoeba_en_de/final "
                           "--sentences 128 --greedy-sentences 32 --bleu \\"):
        "it needs the main job's model (6 minutes of training); the block above runs the same scripts",
    ("docs/benchmarks.md", "python benchmarks/deployment.py --model outputs/table3-converged/D-drop0.3-seed0/final "
                           "--sentences 128 --greedy-sentences 32 \\"):
        "it needs that model of Table 3 (about 45 minutes of training); the block above runs the same scripts",
    ("docs/deployment.md", "pip install -e '.[ctranslate2]'"): "it installs packages; the development set-up has them",
    ("docs/explorer.md", "pip install -e '.[app]'                       # gradio and matplotlib; "
                         "the dev set-up has them"):
        "it installs packages, and the app serves until stopped; tests/test_explorer.py drives the app in a browser",
    ("docs/explorer.md", "python scripts/screenshot_explorer.py --model RUN/final "
                         "--output docs/images/explorer.png \\"):
        "it drives Chromium for a minute; tests/test_explorer.py drives the same app in it",
    ("docs/tests.md", "bash scripts/test.sh            # set up, then run the whole test suite (CI runs exactly this)"):
        "it is the test suite itself",
    ("docs/training.md", "accelerate launch --config_file configs/accelerate/8gpu.yaml "
                         "-m vanilla_transformer train --config RUN.yaml"):
        "it needs 8 GPUs; tests/test_distributed.py runs torchrun with 2 and 3 processes",
    ("docs/training.md", "accelerate launch --config_file configs/accelerate/8gpu.yaml "
                         "-m vanilla_transformer train --config configs/wmt14_en_de_base.yaml"):
        "it needs 8 GPUs and the Hub; tests/test_recipes.py runs the recipe for two steps on local data",
    ("docs/transformers.md", "accelerate launch --config_file configs/accelerate/8gpu.yaml "
                             "-m vanilla_transformer train --config RUN.yaml"):
        "it needs 8 GPUs; tests/test_distributed.py runs torchrun with 2 and 3 processes",
}  # laid out by hand, long first lines split in two: the table reads as a list  # fmt: skip


# --------------------------------------------------------------------------------------------
# The pages' blocks and their markers
# --------------------------------------------------------------------------------------------
class BashEvaluator:
    """Sybil evaluator of ``bash`` blocks: the block as one ``bash -euo pipefail`` script in the workspace,
    with this environment's commands first on the PATH; it fails with the output when the script does."""

    def __init__(self, cwd: Path):
        self.cwd = cwd

    def __call__(self, example) -> str | None:
        done = _run_bash(str(example.parsed), self.cwd)
        if done.returncode != 0:
            return (
                f"the block exited with {done.returncode}\n{example.parsed}\n--- stdout\n{done.stdout[-2000:]}\n"
                f"--- stderr\n{done.stderr[-4000:]}"
            )
        return None


def blocks(page: str, cwd: Path | None = None) -> list:
    """The bash and python examples of a page, in order, each with ``.marker`` ((kind, text) or None) and
    ``.first_line``; the page's Python blocks share the document's namespace."""
    parsers = [PythonCodeBlockParser(), CodeBlockParser("bash", evaluator=BashEvaluator(cwd or ROOT))]
    document = sybil.Document.parse(str(ROOT / page), *parsers)
    examples = []
    for example in document.examples():
        before = document.text[: example.start].rstrip("\n").splitlines()
        previous = next((line.strip() for line in reversed(before) if line.strip()), "")
        match = MARKER.match(previous)
        example.marker = (match.group(1), match.group(2)) if match else None
        example.first_line = str(example.parsed).strip().splitlines()[0]
        examples.append(example)
    return examples


def prepare(example) -> bool:
    """Apply the block's marker: False when it is not to run, else True, with its replacements made."""
    if example.marker is None:
        return True
    kind, text = example.marker
    if kind == "Not run by the tests":
        return False
    pairs = REPLACEMENT.findall(text)
    assert pairs, f"{example.path}:{example.line}: the marker names no `A` → `B` replacement: {text}"
    source = str(example.parsed)
    for old, new in pairs:
        assert old in source, f"{example.path}:{example.line}: the marker replaces `{old}`, which is not in the block"
        source = source.replace(old, new)
    example.parsed = Lexeme(source, example.parsed.offset, example.parsed.line_offset)
    return True


def test_every_block_marked_not_to_run_is_listed_with_its_reason():
    marked = {}
    for page in PAGES:
        for example in blocks(page):
            if example.marker and example.marker[0] == "Not run by the tests":
                marked[(page, example.first_line)] = example.marker[1].rstrip(".")
    assert marked == NOT_RUN, "NOT_RUN and the pages' markers differ"
    print(
        "\nblocks not run by the tests:\n"
        + "\n".join(f"  {page}: {line}\n    ({why})" for (page, line), why in marked.items())
    )


def test_code_blocks_are_bash_or_python_or_plain_text():
    """A shell block under another name (sh, console, shell) would not run: the pages use ``bash``."""
    fences = {page: re.findall(r"^```(\S*)", (ROOT / page).read_text(encoding="utf-8"), re.M) for page in PAGES}
    languages = {language for found in fences.values() for language in found[::2]}  # opening fences
    assert languages <= {"bash", "python", "text", "yaml", "json", ""}, languages


def test_a_failing_block_fails_its_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```bash\nvanilla-transformer translate --no-such-option x\n```\n", encoding="utf-8")
    (example,) = sybil.Document.parse(str(page), CodeBlockParser("bash", evaluator=BashEvaluator(tmp_path))).examples()
    with pytest.raises(SybilFailure, match="--no-such-option"):
        example.evaluate()


# --------------------------------------------------------------------------------------------
# The workspace, and running a page
# --------------------------------------------------------------------------------------------
def _environment() -> dict:
    bin_dir = str(Path(sys.executable).parent)  # the venv's python, vanilla-transformer, accelerate, torchrun
    return {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }


def _run_bash(source: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", source],
        cwd=cwd,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


RUN_YAML = """\
# The tests' stand-in for a run of the docs: a tiny model trained for 4 steps on the cut corpus.
dataset_name: data/tatoeba_en_de
source_lang: en
target_lang: de
vocab_size: 300
config_overrides: {d_model: 32, encoder_layers: 1, decoder_layers: 1, encoder_attention_heads: 2,
                   decoder_attention_heads: 2, encoder_ffn_dim: 64, decoder_ffn_dim: 64}
max_tokens: 600
max_steps: 4
warmup_steps: 2
save_steps: 2
eval_steps: 4
eval_bleu_sentences: 4
generation_num_beams: 1
average_last: 2
disable_tqdm: true
output_dir: RUN
"""


def _cut(source: Path, target: Path, n: int) -> None:
    with gzip.open(source, "rt", encoding="utf-8") as f:
        lines = [line for _, line in zip(range(n), f)]
    with gzip.open(target, "wt", encoding="utf-8") as f:
        f.writelines(lines)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("docs-workspace"))


def make_workspace(work: Path) -> Path:
    """A clone after a run, at tiny sizes (see the module's docstring)."""
    for name in ("benchmarks", "scripts", "configs", "examples"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    bundled, corpus = ROOT / "data" / "tatoeba_en_de", work / "data" / "tatoeba_en_de"
    corpus.mkdir(parents=True)
    for split, n in {"train": 3000, "valid": 60, "test": 40}.items():  # kill_resume.py reads 50 validation pairs
        for lang in ("en", "de"):
            _cut(bundled / f"{split}.{lang}.gz", corpus / f"{split}.{lang}.gz", n)
    multi30k = work / "data" / "multi30k"  # Multi30k's names, German-English pairs of the bundled corpus
    multi30k.mkdir()
    for split, (name, n) in {"train": ("train", 3000), "valid": ("val", 20), "test": ("test_2016_flickr", 12)}.items():
        for lang in ("en", "de"):
            with gzip.open(bundled / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                (multi30k / f"{name}.{lang}").write_text(
                    "".join(line for _, line in zip(range(n), f)), encoding="utf-8"
                )
    for lang in ("en", "de"):
        shutil.copy(multi30k / f"test_2016_flickr.{lang}", work / f"test.{lang}")
    (work / "RUN.yaml").write_text(RUN_YAML, encoding="utf-8")
    done = _run_bash("vanilla-transformer train --config RUN.yaml", work)
    assert done.returncode == 0, done.stderr[-3000:]
    return work


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(page, workspace, monkeypatch):
    examples = blocks(page, workspace)
    if not examples:
        pytest.skip(f"{page} has no bash or python block")
    monkeypatch.chdir(workspace)  # the Python blocks' relative paths, as for the shell blocks
    for example in examples:
        if prepare(example):
            with contextlib.redirect_stdout(sys.stderr):
                example.evaluate()
