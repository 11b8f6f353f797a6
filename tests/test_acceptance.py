"""The user's path, as docs/training.md tells it, through the installed `vanilla-transformer` command.

One test, each step feeding the next: a user's own TSV files (training and validation), training that is
killed and resumed, averaging the checkpoints, translating a file with blank lines (and one with a line that
is not UTF-8), evaluating gzipped test files, exporting to CTranslate2 and translating with both engines.
"""

import gzip
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

COMMAND = str(Path(sys.executable).with_name("vanilla-transformer"))
TINY = (
    '{"d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4, '
    '"decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128}'
)
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def run(*args: str, stdin: bytes | None = None, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([COMMAND, *args], input=stdin, capture_output=True, env=ENV, timeout=600)
    if ok:
        assert done.returncode == 0, done.stderr.decode()[-3000:]
    return done


def lines_of(corpus: Path, split: str, lang: str) -> list[str]:
    return (corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_users_path_from_own_files_to_both_engines(corpus, tmp_path):
    assert Path(COMMAND).is_file(), "the console script is installed with the package (pip install -e .)"
    # --- the user's own files: one TSV of training pairs, one of validation pairs, gzipped test files
    for split, name in (("train", "pairs.tsv"), ("valid", "dev.tsv")):
        pairs = zip(lines_of(corpus, split, "en"), lines_of(corpus, split, "de"))
        (tmp_path / name).write_text("".join(f"{en}\t{de}\n" for en, de in pairs), encoding="utf-8")
    for lang in ("en", "de"):
        with gzip.open(tmp_path / f"test.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("\n".join(lines_of(corpus, "test", lang)[:12]) + "\n")

    # --- train, killed once it has written a checkpoint, then resumed
    run_dir = tmp_path / "run"
    train = [
        COMMAND,
        "train",
        "--train_file",
        str(tmp_path / "pairs.tsv"),
        "--validation_file",
        str(tmp_path / "dev.tsv"),
        "--vocab_size",
        "400",
        "--config_overrides",
        TINY,
        "--max_tokens",
        "512",
        "--max_steps",
        "24",
        "--warmup_steps",
        "4",
        "--lr_factor",
        "1",
        "--save_steps",
        "4",
        "--eval_steps",
        "12",
        "--eval_bleu_sentences",
        "4",
        "--generation_num_beams",
        "1",
        "--output_dir",
        str(run_dir),
        "--disable_tqdm",
    ]
    first = subprocess.Popen(train, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 300
    while (
        not (run_dir / "checkpoints" / "checkpoint-4").is_dir() and first.poll() is None and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, (
        "the run ended before it could be killed: " + first.stderr.read().decode()[-2000:]
    )
    assert not (run_dir / "final").exists()
    resumed = subprocess.run([*train, "--resume_from_checkpoint"], env=ENV, capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()[-3000:]
    assert re.search(r"resumed from checkpoint-(4|8|12|16|20)", resumed.stdout.decode())
    assert "trained 24 steps" in resumed.stdout.decode()

    # --- average the checkpoints into a folder that translates like any saved model
    checkpoints = sorted((run_dir / "checkpoints").glob("checkpoint-*"))
    run(
        "average",
        *map(str, checkpoints[-3:]),
        "--model_name_or_path",
        str(run_dir / "final"),
        "--output_dir",
        str(tmp_path / "avg"),
    )

    # --- translate a file with blank lines: one output line per input line, blank for blank, each sentence's own
    # (greedy: beam search over a model trained for 24 steps may find an immediate </s> best, an empty line)
    sentences = ["I love you.", "Where is the train station?", "Tom is reading a book."]
    by_transformers = run(
        "translate", "--model_name_or_path", str(tmp_path / "avg"), "--num_beams", "1", *sentences
    ).stdout
    alone = by_transformers.decode().split("\n")[:-1]
    assert len(alone) == 3 and all(alone) and len(set(alone)) == 3, alone  # three different outputs to tell apart
    text = "I love you.\n\nWhere is the train station?\n   \nTom is reading a book.\n"
    out = run(
        "translate", "--model_name_or_path", str(tmp_path / "avg"), "--num_beams", "1", stdin=text.encode()
    ).stdout
    printed = out.decode().split("\n")[:-1]
    assert printed == [alone[0], "", alone[1], "", alone[2]], printed
    # ... and one with a line that is not UTF-8: the line is named, the lines before it are translated
    bad = run(
        "translate",
        "--model_name_or_path",
        str(tmp_path / "avg"),
        stdin="Hello.\n".encode() + "Grüße.\n".encode("latin-1"),
        ok=False,
    )
    assert bad.returncode == 1 and bad.stdout.decode().count("\n") == 1
    assert "standard input, line 2, is not UTF-8" in bad.stderr.decode() and "Traceback" not in bad.stderr.decode()

    # --- evaluate on gzipped files
    scored = run(
        "evaluate",
        "--model_name_or_path",
        str(tmp_path / "avg"),
        "--source",
        str(tmp_path / "test.en.gz"),
        "--reference",
        str(tmp_path / "test.de.gz"),
        "--output",
        str(tmp_path / "test.hyp.de"),
    ).stdout.decode()
    assert re.search(r"^BLEU \d+\.\d\d  nrefs:1\|case:mixed", scored, re.M)
    assert len((tmp_path / "test.hyp.de").read_text(encoding="utf-8").splitlines()) == 12

    # --- export, then translate with both engines
    pytest.importorskip("ctranslate2")
    run("export", "--model_name_or_path", str(tmp_path / "avg"), "--output_dir", str(tmp_path / "ct2"))
    by_ctranslate2 = run(
        "translate",
        "--model_name_or_path",
        str(tmp_path / "ct2"),
        "--engine",
        "ctranslate2",
        "--num_beams",
        "1",
        *sentences,
    ).stdout
    assert by_ctranslate2.decode().count("\n") == by_transformers.decode().count("\n") == 3
    assert by_ctranslate2 == by_transformers  # greedy search, float32: the same tokens
