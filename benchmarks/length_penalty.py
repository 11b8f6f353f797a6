"""The length penalty's two forms on one model: transformers' |Y|^α against GNMT's ((5 + |Y|) / 6)^α, the paper's.

    python benchmarks/length_penalty.py --model outputs/tatoeba_en_de/final \\
        --source data/tatoeba_en_de/test.en.gz --reference data/tatoeba_en_de/test.de.gz --name tatoeba-en-de
    python benchmarks/length_penalty.py --model outputs/multi30k-de-en-60min/final \\
        --source ../shared/data/multi30k/test_2016_flickr.de --reference ../shared/data/multi30k/test_2016_flickr.en \\
        --name multi30k-de-en

§6.1 decodes with "beam search with a beam size of 4 and length penalty α = 0.6" and cites GNMT (Wu et al.
2016), whose penalty divides a hypothesis's log-probability by lp(Y) = ((5 + |Y|) / 6)^α; transformers and
CTranslate2 divide by |Y|^α. Every sentence is translated with the model's own decoding (beam 4, α 0.6, source
length + 50) once with each form (``length_penalty_form``, computed by the package's beam search). Reported:
sacreBLEU and chrF of each, with their signatures; sacreBLEU's paired bootstrap test of GNMT's form against
|Y|^α (1,000 resamples); the share of identical outputs; and the mean output length against the references'.
Writes ``benchmarks/results/length-penalty-NAME.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reporting import cpu_name, read_lines, shown_command, write_report  # noqa: E402  (benchmarks/reporting.py)

from vanilla_transformer.evaluation import score, translate  # noqa: E402
from vanilla_transformer.loading import load_model_and_tokenizer  # noqa: E402

FORMS = {"power": "|Y|^α (transformers, CTranslate2)", "gnmt": "((5 + |Y|) / 6)^α (GNMT, the paper)"}


def paired_bootstrap(references: list[str], outputs: dict[str, list[str]]) -> dict:
    """sacrebleu's paired bootstrap resampling (its ``--paired-bs``): GNMT's form against the |Y|^α baseline."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest(
        [("power", outputs["power"]), ("gnmt", outputs["gnmt"])],
        {"BLEU": BLEU(references=[references])},
        references=None,
        test_type="bs",
        n_samples=1000,
    )
    _, scores = test()
    gnmt = scores["BLEU"][1]
    return {"p_value": float(gnmt.p_value), "gnmt_mean": float(gnmt.mean), "gnmt_ci": float(gnmt.ci)}


def markdown(report: dict) -> str:
    d = report["decoding"]
    lines = [
        f"`{report['command']}`",
        "",
        f"{report['machine']}; model `{report['model']}`; beam {d['num_beams']}, α {d['length_penalty']}, "
        f"per-sentence limit source length + {d['source_length_offset']}; {report['sentences']} sentences.",
        "",
        "| length penalty | sacreBLEU | chrF | mean output length (words) |",
        "|---|---|---|---|",
    ]
    for form, row in report["forms"].items():
        label = FORMS[form].replace("|", "\\|")  # |Y| inside a Markdown table
        lines.append(f"| {label} | {row['bleu']:.2f} | {row['chrf']:.2f} | {row['mean_words']:.2f} |")
    b = report["paired_bootstrap"]
    lines += [
        "",
        f"References: {report['reference_mean_words']:.2f} words on average. "
        f"Identical outputs: {report['identical']} of "
        f"{report['sentences']} ({100 * report['identical_share']:.1f} %).",
        f"Paired bootstrap (sacreBLEU, 1,000 resamples), GNMT against |Y|^α: p = {b['p_value']:.4f}.",
        "",
        f"BLEU: `{report['forms']['power']['bleu_signature']}`; chrF: `{report['forms']['power']['chrf_signature']}`",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a saved model folder (RUN/final)")
    parser.add_argument("--source", type=Path, required=True, help="source sentences, one a line (.gz read too)")
    parser.add_argument("--reference", type=Path, required=True, help="their references, one a line")
    parser.add_argument("--name", default=None, help="the results' name (default: the model folder's parent)")
    parser.add_argument("--sentences", type=int, default=None, help="only the first N sentences")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    sources, references = read_lines(args.source, args.sentences), read_lines(args.reference, args.sentences)
    if len(sources) != len(references):
        parser.error(f"{args.source} has {len(sources)} lines but {args.reference} has {len(references)}.")
    model, tokenizer = load_model_and_tokenizer(args.model)
    config = model.generation_config
    outputs, forms = {}, {}
    for form in FORMS:
        config.length_penalty_form = form
        outputs[form] = translate(model, tokenizer, sources, progress=True)
        forms[form] = {
            **score(outputs[form], references),
            "mean_words": sum(len(t.split()) for t in outputs[form]) / len(sources),
        }
        print(f"{FORMS[form]}: sacreBLEU {forms[form]['bleu']:.2f}, chrF {forms[form]['chrf']:.2f}")
    identical = sum(a == b for a, b in zip(outputs["power"], outputs["gnmt"]))
    name = args.name or args.model.resolve().parent.name
    report = {
        "command": shown_command("length_penalty.py", argv if argv is not None else sys.argv[1:]),
        "machine": cpu_name(),
        "model": args.model.name,
        "decoding": {k: getattr(config, k, None) for k in ("num_beams", "length_penalty", "source_length_offset")},
        "sentences": len(sources),
        "forms": forms,
        "identical": identical,
        "identical_share": identical / len(sources),
        "reference_mean_words": sum(len(t.split()) for t in references) / len(references),
        "paired_bootstrap": paired_bootstrap(references, outputs),
        "differing": [
            {"index": i, "source": sources[i], "power": outputs["power"][i], "gnmt": outputs["gnmt"][i]}
            for i in range(len(sources))
            if outputs["power"][i] != outputs["gnmt"][i]
        ],
    }
    print(f"identical: {identical}/{len(sources)}; paired bootstrap p = {report['paired_bootstrap']['p_value']:.4f}")
    write_report(args.results_dir, f"length-penalty-{name}", report, markdown(report))
    return report


if __name__ == "__main__":
    main()
