"""CTranslate2 against transformers' generate(), on the same trained model, the same sentences and threads.

    python benchmarks/multi30k.py --minutes 15 --directions de-en          # a model to serve (or use yours)
    python benchmarks/deployment.py --model outputs/multi30k-de-en-15min/final --bleu
    python benchmarks/deployment.py --model outputs/tatoeba_en_de/final --bleu --name tatoeba-en-de \
        --sources data/tatoeba_en_de/test.en.gz --references data/tatoeba_en_de/test.de.gz   # the main job's model

Four engines translate the first ``--sentences`` sentences of Multi30k's test_2016_flickr (de->en), or of
``--sources``:

* ``ours``: this package's ``generate`` (transformers' beam search, the paper's per-sentence limit);
* ``Marian``: transformers' ``MarianMTModel`` with the same sizes *carrying the same weights* (its position
  table replaced by the paper's interleaved one), so it computes the same function and produces the same
  tokens: the peer's speed on exactly the same work;
* ``CTranslate2 float32`` and ``CTranslate2 int8``: the model exported by ``vanilla_transformer.deployment``.

Speed is target tokens per second (each output's tokens and its ``</s>``) for beam 4 in batches of 32 and for
greedy search one sentence at a time, each engine's runs taken in turn and the median kept. Memory is the peak
RSS of a fresh process that loads one engine and translates the beam batches, and that peak minus the RSS after
the imports (what the model and its decoding add). ``--bleu`` also scores the whole test set with each engine
(sacreBLEU). Writes benchmarks/results/deployment.{json,md}, or deployment-NAME.{json,md} with ``--name``.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from reporting import check_multi30k, cpu_name, multi30k_folder, read_lines  # benchmarks/reporting.py

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ("ours", "Marian", "CTranslate2 float32", "CTranslate2 int8")
BEAM, GREEDY = {"num_beams": 4, "batch_size": 32}, {"num_beams": 1, "batch_size": 1}


# --------------------------------------------------------------------------------------------
# The peer: MarianMTModel with the same sizes and the same weights
# --------------------------------------------------------------------------------------------
def marian_with_weights_of(model):
    """A ``MarianMTModel`` of ``model``'s sizes holding its weights (Marian names its modules as we do, except our
    FFN's ``ffn.`` prefix) and the paper's interleaved position table in place of Marian's sines-then-cosines.
    Marian's attention projections always have biases: for a model without them (the paper's), they are zero."""
    from transformers import MarianConfig, MarianMTModel

    from vanilla_transformer.modeling_vanilla_transformer import sinusoidal_position_encoding

    c = model.config
    config = MarianConfig(
        vocab_size=c.vocab_size,
        d_model=c.d_model,
        encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers,
        encoder_attention_heads=c.encoder_attention_heads,
        decoder_attention_heads=c.decoder_attention_heads,
        encoder_ffn_dim=c.encoder_ffn_dim,
        decoder_ffn_dim=c.decoder_ffn_dim,
        activation_function="relu",
        scale_embedding=c.scale_embedding,
        max_position_embeddings=1024,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=c.pad_token_id,
        eos_token_id=c.eos_token_id,
        decoder_start_token_id=c.decoder_start_token_id,
        forced_eos_token_id=None,
        dropout=0.0,
    )
    marian = MarianMTModel(config).eval()
    state = {name.replace(".ffn.", "."): value for name, value in model.state_dict().items()}
    table = sinusoidal_position_encoding(torch.arange(config.max_position_embeddings), c.d_model)
    state["model.encoder.embed_positions.weight"] = table
    state["model.decoder.embed_positions.weight"] = table
    for name, value in marian.state_dict().items():
        if "_proj.bias" in name and name not in state:  # attention_bias=False: the same function with zero biases
            state[name] = torch.zeros_like(value)
    missing, unexpected = marian.load_state_dict(state, strict=False)
    assert set(missing) <= {
        "final_logits_bias",
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
    }, missing
    assert not unexpected, unexpected
    return marian


def check_same_function(model, marian, tokenizer, sources: list[str]) -> float:
    """Largest difference of the two models' logits on a padded batch (a wrong copy would show at once)."""
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    start = torch.full((len(sources), 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        ours = model(**batch, decoder_input_ids=start).logits
        theirs = marian(**batch, decoder_input_ids=start).logits
    return float((ours - theirs).abs().max())


# --------------------------------------------------------------------------------------------
# One translation run per engine: returns the target tokens it produced
# --------------------------------------------------------------------------------------------
def hf_batches(tokenizer, texts: list[str], batch_size: int) -> list[dict]:
    """Longest first, ``batch_size`` sentences a batch, right-padded (as ``evaluation.translate`` batches)."""
    order = sorted(range(len(texts)), key=lambda i: -len(tokenizer(texts[i])["input_ids"]))
    return [
        tokenizer([texts[i] for i in order[s : s + batch_size]], padding=True, return_tensors="pt")
        for s in range(0, len(order), batch_size)
    ]


def generated_tokens(sequences: torch.Tensor, eos: int) -> int:
    """Tokens after the start token, up to and including each row's first </s>."""
    count = 0
    for row in sequences[:, 1:].tolist():
        count += row.index(eos) + 1 if eos in row else len(row)
    return count


def hf_run(engine: str, model, tokenizer, texts: list[str], num_beams: int, batch_size: int):
    batches = hf_batches(tokenizer, texts, batch_size)
    eos = model.config.eos_token_id

    def run() -> int:
        tokens = 0
        for batch in batches:
            kwargs = {"num_beams": num_beams, "length_penalty": 0.6}
            if engine == "Marian":  # no per-sentence limit: the batch's longest source + 50 (ours ends long before)
                kwargs["max_new_tokens"] = int(batch["attention_mask"].sum(-1).max()) + 50
            with torch.inference_mode():
                tokens += generated_tokens(model.generate(**batch, **kwargs), eos)
        return tokens

    return run


def ct2_run(translator, texts: list[str], num_beams: int, batch_size: int):
    def run() -> int:
        ids = translator.translate_ids(texts, batch_size=batch_size, num_beams=num_beams, length_penalty=0.6)
        return sum(len(row) + 1 for row in ids)

    return run


def load_engine(engine: str, model_dir: Path, exports: dict, threads: int, threads_per_batch: int = 1):
    """(model or translator, tokenizer) of one engine."""
    from vanilla_transformer.deployment import CTranslate2Translator
    from vanilla_transformer.loading import load_model_and_tokenizer

    if engine.startswith("CTranslate2"):
        translator = CTranslate2Translator(exports[engine], threads=threads, threads_per_batch=threads_per_batch)
        return translator, translator.tokenizer
    model, tokenizer = load_model_and_tokenizer(model_dir)
    return (marian_with_weights_of(model) if engine == "Marian" else model), tokenizer


def runner(engine: str, loaded, texts: list[str], setting: dict):
    model, tokenizer = loaded
    if engine.startswith("CTranslate2"):
        return ct2_run(model, texts, **setting)
    return hf_run(engine, model, tokenizer, texts, **setting)


def speed(args, loaded: dict, texts: dict) -> list[dict]:
    rows = []
    for name, setting in (("beam 4, batch 32", BEAM), ("greedy, batch 1", GREEDY)):
        sentences = texts["beam" if setting is BEAM else "greedy"]
        runs = {engine: runner(engine, loaded[engine], sentences, setting) for engine in ENGINES}
        seconds, tokens = {e: [] for e in ENGINES}, {}
        for engine, run in runs.items():  # warm-up
            tokens[engine] = run()
        for _ in range(args.repeats):  # in turn, so that a drift of the machine touches every engine alike
            for engine, run in runs.items():
                start = time.perf_counter()
                run()
                seconds[engine].append(time.perf_counter() - start)
        for engine in ENGINES:
            median = statistics.median(seconds[engine])
            rows.append(
                {
                    "setting": name,
                    "engine": engine,
                    "sentences": len(sentences),
                    "target_tokens": tokens[engine],
                    "seconds": median,
                    "tokens_per_s": tokens[engine] / median,
                }
            )
        marian = next(r["tokens_per_s"] for r in rows if r["setting"] == name and r["engine"] == "Marian")
        for row in rows:
            if row["setting"] == name:
                row["vs_marian"] = row["tokens_per_s"] / marian
        print(
            f"{name}: "
            + ", ".join(f"{r['engine']} {r['tokens_per_s']:.0f} tok/s" for r in rows if r["setting"] == name)
        )
    return rows


# --------------------------------------------------------------------------------------------
# Memory: one fresh process per engine
# --------------------------------------------------------------------------------------------
def memory_child(args) -> None:
    """(In a fresh process.) Load one engine, translate the beam batches once, print RSS figures as JSON."""
    torch.set_num_threads(args.threads)
    from vanilla_transformer import deployment  # noqa: F401  (every engine pays the same imports)

    after_imports = _rss()
    loaded = load_engine(args.memory_child, args.model, json.loads(args.exports), args.threads, args.threads_per_batch)
    runner(args.memory_child, loaded, read_lines(args.sources, args.sentences), BEAM)()
    print(json.dumps({"peak_rss": _peak_rss(), "after_imports": after_imports}))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    """This process's RSS high-water mark (VmHWM). Not ``getrusage``'s ``ru_maxrss``: Linux carries that over
    ``exec`` from the parent, so every child of a large parent would report the parent's peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def memory(args, exports: dict) -> list[dict]:
    rows = []
    for engine in ENGINES:
        command = [
            sys.executable,
            __file__,
            "--model",
            str(args.model),
            "--sources",
            str(args.sources),
            "--threads",
            str(args.threads),
            "--threads-per-batch",
            str(args.threads_per_batch),
            "--sentences",
            str(args.sentences),
            "--memory-child",
            engine,
            "--exports",
            json.dumps({k: str(v) for k, v in exports.items()}),
        ]
        out = subprocess.run(
            command, capture_output=True, text=True, check=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        )
        figures = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(
            {
                "engine": engine,
                "peak_rss_mb": figures["peak_rss"] / 2**20,
                "added_rss_mb": (figures["peak_rss"] - figures["after_imports"]) / 2**20,
            }
        )
    marian = next(r for r in rows if r["engine"] == "Marian")
    for row in rows:
        row["peak_vs_marian"] = row["peak_rss_mb"] / marian["peak_rss_mb"]
        row["added_vs_marian"] = row["added_rss_mb"] / marian["added_rss_mb"]
    return rows


# --------------------------------------------------------------------------------------------
# Quality: the whole test set
# --------------------------------------------------------------------------------------------
def bleu(args, loaded: dict) -> list[dict]:
    from vanilla_transformer.evaluation import score, translate, translate_with

    sources, references = read_lines(args.sources), read_lines(args.references)
    if len(sources) != len(references):
        raise SystemExit(f"{args.sources} has {len(sources)} lines and {args.references} {len(references)}: not pairs.")
    model, tokenizer = loaded["ours"]
    outputs = {"ours": translate(model, tokenizer, sources, batch_size=32)}
    model.generation_config.early_stopping = True  # transformers stops beam search as CTranslate2 does
    outputs["ours, early_stopping=True"] = translate(model, tokenizer, sources, batch_size=32)
    model.generation_config.early_stopping = False
    for engine in ("CTranslate2 float32", "CTranslate2 int8"):
        outputs[engine] = translate_with(loaded[engine][0], sources, batch_size=32)
    rows = []
    for name, hypotheses in outputs.items():
        result = score(hypotheses, references)
        same = sum(a == b for a, b in zip(hypotheses, outputs["ours"]))
        rows.append(
            {
                "engine": name,
                "bleu": result["bleu"],
                "chrf": result["chrf"],
                "signature": result["bleu_signature"],
                "same_as_ours": same,
                "sentences": len(sources),
            }
        )
        print(f"{name}: sacreBLEU {result['bleu']:.2f}, {same}/{len(sources)} translations as ours")
    return rows


# --------------------------------------------------------------------------------------------
def ct2_layout(results: dict) -> str:
    per_batch = results.get("threads_per_batch", 1)
    workers = max(1, results["threads"] // per_batch)
    default = ", the package's default" if per_batch == 1 else ""
    return f"{workers} batch(es) at once, {per_batch} thread(s) each{default}"


def markdown(results: dict) -> str:
    lines = [
        "# CTranslate2 against transformers' generate()",
        "",
        f"`{results['command']}` on {results['machine']}, {results['threads']} thread(s) for every engine "
        f"(transformers: one batch at a time with all of them; CTranslate2: {ct2_layout(results)}), "
        f"{results['date']}. Model: {results['model']} "
        f"({results['parameters'] / 1e6:.1f}M parameters); Marian holds the same weights "
        f"(largest logit difference {results['marian_logit_difference']:.1e}).",
        "",
        "| setting | engine | sentences | target tokens | seconds | tokens/s | vs MarianMTModel |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["speed"]:
        lines.append(
            f"| {r['setting']} | {r['engine']} | {r['sentences']} | {r['target_tokens']} | {r['seconds']:.2f} | "
            f"{r['tokens_per_s']:.0f} | **{r['vs_marian']:.2f}×** |"
        )
    if results.get("memory"):
        lines += [
            "",
            "Memory of a fresh process that loads the engine and translates the beam batches:",
            "",
            "| engine | peak RSS (MB) | vs Marian | added after imports (MB) | vs Marian |",
            "|---|---|---|---|---|",
        ]
        for r in results["memory"]:
            lines.append(
                f"| {r['engine']} | {r['peak_rss_mb']:.0f} | {r['peak_vs_marian']:.2f} | {r['added_rss_mb']:.0f} | "
                f"{r['added_vs_marian']:.2f} |"
            )
    if results.get("bleu"):
        lines += [
            "",
            f"Whole test set ({results['sources']}, {results['bleu'][0]['sentences']:,} sentences, beam 4, α = 0.6, "
            "source + 50):",
            "",
            "| engine | sacreBLEU | chrF | translations equal to ours |",
            "|---|---|---|---|",
        ]
        for r in results["bleu"]:
            lines.append(
                f"| {r['engine']} | {r['bleu']:.2f} | {r['chrf']:.2f} | {r['same_as_ours']} / {r['sentences']} |"
            )
        lines += ["", f"Signature: `{results['bleu'][0]['signature']}`"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", type=Path, required=True, help="a saved model folder (e.g. RUN/final of a Multi30k run)"
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=multi30k_folder(),
        help="Multi30k task 1 files (python scripts/get_multi30k.py puts them in data/multi30k)",
    )
    parser.add_argument("--sources", type=Path, help="source sentences (.gz too); default: DATA/test_2016_flickr.de")
    parser.add_argument(
        "--references", type=Path, help="their references, for --bleu; default: DATA/test_2016_flickr.en"
    )
    parser.add_argument("--name", help="writes deployment-NAME.{json,md} (default: deployment.{json,md})")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count(), help="threads of every engine (default: all cores)"
    )
    parser.add_argument(
        "--threads-per-batch",
        type=int,
        default=1,
        help="CTranslate2's threads per batch; it decodes threads // this many batches at once (default: 1)",
    )
    parser.add_argument("--sentences", type=int, default=256, help="sentences of the beam-search runs")
    parser.add_argument("--greedy-sentences", type=int, default=64, help="sentences of the greedy, batch-1 runs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bleu", action="store_true", help="also score the whole test set with each engine")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    parser.add_argument("--results-dir", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--memory-child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--exports", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sources is None:
        check_multi30k(args.data, parser, splits=("test_2016_flickr",), gz=False)
        args.sources = args.data / "test_2016_flickr.de"
        args.references = args.references or args.data / "test_2016_flickr.en"
    for given in (args.sources, args.references if args.bleu else None):
        if given is not None and not given.is_file():
            parser.error(f"{given} is not a file")
    if args.bleu and args.references is None:
        parser.error("--bleu with --sources needs --references")
    if args.memory_child:
        memory_child(args)
        return {}

    from vanilla_transformer.deployment import export_ctranslate2

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="deployment-") as tmp:
        exports = {
            f"CTranslate2 {q}": export_ctranslate2(args.model, Path(tmp) / q, quantization=q)
            for q in ("float32", "int8")
        }
        loaded = {
            engine: load_engine(engine, args.model, exports, args.threads, args.threads_per_batch) for engine in ENGINES
        }
        test = read_lines(args.sources)
        texts = {"beam": test[: args.sentences], "greedy": test[: args.greedy_sentences]}
        model, tokenizer = loaded["ours"]
        results = {
            "command": "python benchmarks/deployment.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "machine": cpu_name(),
            "sources": args.sources.name,
            "threads": args.threads,
            "threads_per_batch": args.threads_per_batch,
            "date": time.strftime("%Y-%m-%d"),
            "model": args.model.name if args.model.name != "final" else f"{args.model.parent.name}/final",
            "parameters": sum(p.numel() for p in model.parameters()),
            "marian_logit_difference": check_same_function(model, loaded["Marian"][0], tokenizer, test[:8]),
            "versions": {
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "ctranslate2": __import__("ctranslate2").__version__,
            },
        }
        results["speed"] = speed(args, loaded, texts)
        if not args.no_memory:
            results["memory"] = memory(args, exports)
        if args.bleu:
            results["bleu"] = bleu(args, loaded)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    name = "deployment" if args.name is None else f"deployment-{args.name}"
    (args.results_dir / f"{name}.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    (args.results_dir / f"{name}.md").write_text(markdown(results), encoding="utf-8")
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
