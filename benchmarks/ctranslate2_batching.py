"""CTranslate2 beam batches across source lengths, against the one-limit batches they replaced and the engine itself.

    python benchmarks/ctranslate2_batching.py --model outputs/tatoeba_en_de/final \\
        --sources data/tatoeba_en_de/test.en.gz
    python benchmarks/ctranslate2_batching.py --model outputs/multi30k-de-en-15min/final \\
        --sources ../shared/data/multi30k/test_2016_flickr.de --name multi30k-de-en

The model is exported once per quantization (int8 and float32). Every sentence of ``--sources`` is translated
with beam 4, α 0.6 and the paper's per-sentence limit (source length + 50) three ways, in batches of 32:

* ``exact``: ``CTranslate2Translator.translate_ids(..., group_by_limit=True)``: only sentences of one limit
  share a beam batch, so each search runs with its own limit (the path before batches were mixed);
* ``package``: ``translate_ids`` as it is called by default: beam batches of similar source length whatever
  their limits, and a second decoding for the sentences that came near their own limit;
* ``translate_batch``: ``ctranslate2.Translator.translate_batch`` called directly on the same batches, each with
  the batch's longest limit (no per-sentence limit at all), on tokens prepared before the clock starts: the
  engine's own speed, the bar for ``package``;
* ``translate_batch_text``: the same, from text to token ids, as a user calling the engine directly would
  have it: the tokenizer's call, ``translate_batch`` and the tokens' ids back.

Reported: the share of sentences whose tokens equal the exact path's (and which ones differ), the sentences
decoded twice, and each way's time (median of ``--repeats`` runs taken in turn). Writes
``benchmarks/results/ctranslate2-batching-NAME.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reporting import cpu_name, read_lines, shown_command, write_report  # noqa: E402  (benchmarks/reporting.py)

from vanilla_transformer.deployment import CTranslate2Translator, export_ctranslate2  # noqa: E402

BEAMS, ALPHA, BATCH = 4, 0.6, 32


def direct_run(translator: CTranslate2Translator, texts: list[str], from_text: bool = False):
    """``translate_batch`` on the package's batches (similar source lengths, longest first), each with its
    batch's longest limit, all queued at once so that the engine's workers decode them in parallel: what the
    engine costs with no per-sentence limit. ``from_text``: tokenizing the texts and converting the outputs to
    ids are timed too."""
    tokenizer = translator.tokenizer
    offset = int(translator.generation_config.source_length_offset)

    def tokenize() -> list[list[str]]:
        return [encoding.tokens for encoding in tokenizer(texts, add_special_tokens=True).encodings]

    prepared = tokenize()
    order = sorted(range(len(texts)), key=lambda i: (-len(prepared[i]), i))
    batches = [order[k : k + BATCH] for k in range(0, len(order), BATCH)]

    def run() -> None:
        tokens = tokenize() if from_text else prepared
        queued = []
        for batch in batches:
            queued += translator.translator.translate_batch(
                [tokens[i] for i in batch],
                beam_size=BEAMS,
                length_penalty=ALPHA,
                min_decoding_length=0,
                max_decoding_length=max(len(tokens[i]) for i in batch) + offset - 1,
                max_input_length=0,
                return_end_token=True,
                max_batch_size=0,
                asynchronous=True,
            )
        outputs = [waiting.result() for waiting in queued]
        if from_text:  # the ids a user would go on with
            for result in outputs:
                tokenizer.convert_tokens_to_ids(result.hypotheses[0])

    return run


def measure(translator: CTranslate2Translator, texts: list[str], repeats: int) -> dict:
    def package() -> list[list[int]]:
        return translator.translate_ids(texts, batch_size=BATCH, num_beams=BEAMS, length_penalty=ALPHA)

    def exact() -> list[list[int]]:
        return translator.translate_ids(
            texts, batch_size=BATCH, num_beams=BEAMS, length_penalty=ALPHA, group_by_limit=True
        )

    reference, mixed = exact(), package()
    redecoded = translator.redecoded
    differing = [i for i, (a, b) in enumerate(zip(reference, mixed)) if a != b]
    runs = {
        "exact": exact,
        "package": package,
        "translate_batch": direct_run(translator, texts),
        "translate_batch_text": direct_run(translator, texts, from_text=True),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):  # in turn: a drift of the machine touches each way alike
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    decode = translator.tokenizer.batch_decode
    return {
        "sentences": len(texts),
        "identical": len(texts) - len(differing),
        "identical_share": (len(texts) - len(differing)) / len(texts),
        "redecoded": redecoded,
        "differing": [
            {
                "index": i,
                "source": texts[i],
                "exact": decode([reference[i]], skip_special_tokens=True)[0],
                "package": decode([mixed[i]], skip_special_tokens=True)[0],
            }
            for i in differing
        ],
        "seconds": median,
        "package_vs_translate_batch": median["package"] / median["translate_batch"],
        "package_vs_translate_batch_text": median["package"] / median["translate_batch_text"],
        "exact_vs_package": median["exact"] / median["package"],
    }


def markdown(report: dict) -> str:
    lines = [
        f"`{report['command']}`",
        "",
        f"{report['machine']}; {report['threads']} threads (batches decoded {report['threads']} at once, one thread "
        f"each; `translate_batch`'s queued likewise); CTranslate2 {report['ctranslate2']}; "
        f"beam {BEAMS}, α {ALPHA}, "
        f"batches of {BATCH}, per-sentence limit source length + 50.",
        "",
        "| quantization | sentences | identical to the exact path | decoded twice | exact s | package s | "
        "translate_batch s (tokens; text) | package / translate_batch (tokens; text) | exact / package |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in report["quantizations"].items():
        s = row["seconds"]
        lines.append(
            f"| {name} | {row['sentences']} | {row['identical']} ({100 * row['identical_share']:.1f} %) "
            f"| {row['redecoded']} "
            f"| {s['exact']:.2f} | {s['package']:.2f} | {s['translate_batch']:.2f}; {s['translate_batch_text']:.2f} "
            f"| {row['package_vs_translate_batch']:.2f}×; {row['package_vs_translate_batch_text']:.2f}× "
            f"| {row['exact_vs_package']:.2f}× |"
        )
    for name, row in report["quantizations"].items():
        for d in row["differing"]:
            lines += [
                "",
                f"{name}, sentence {d['index']}: {d['source']!r}",
                f"- exact: {d['exact']!r}",
                f"- package: {d['package']!r}",
            ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a saved model folder (RUN/final)")
    parser.add_argument("--sources", type=Path, required=True, help="source sentences, one a line (.gz read too)")
    parser.add_argument("--name", default=None, help="the results' name (default: the model folder's parent)")
    parser.add_argument("--sentences", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--quantizations", nargs="+", default=["int8", "float32"])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    import ctranslate2

    texts = read_lines(args.sources, args.sentences)
    name = args.name or args.model.resolve().parent.name
    report = {
        "command": shown_command("ctranslate2_batching.py", argv if argv is not None else sys.argv[1:]),
        "machine": cpu_name(),
        "threads": args.threads,
        "ctranslate2": ctranslate2.__version__,
        "quantizations": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in args.quantizations:
            folder = export_ctranslate2(args.model, Path(tmp) / quantization, quantization=quantization)
            row = measure(CTranslate2Translator(folder, threads=args.threads), texts, args.repeats)
            report["quantizations"][quantization] = row
            print(
                f"{quantization}: {row['identical']}/{row['sentences']} identical, {row['redecoded']} decoded twice, "
                f"package {row['package_vs_translate_batch']:.2f}× translate_batch's time "
                f"({row['package_vs_translate_batch_text']:.2f}× from text), "
                f"exact {row['exact_vs_package']:.2f}× package's"
            )
    write_report(args.results_dir, f"ctranslate2-batching-{name}", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
