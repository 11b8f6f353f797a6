"""Speed and memory, side by side with transformers' MarianMTModel built with the same sizes.

    python benchmarks/speed.py                  # everything: small and base sizes (~15 min on 2 cores)
    python benchmarks/speed.py --sections train generate
    python benchmarks/speed.py --precisions fp32   # a CPU without bf16 units (no AMX / AVX512-BF16),
                                                   # where bf16 is emulated
    python benchmarks/speed.py --smoke          # tiny sizes, one repeat: checks the script itself

MarianMTModel is the nearest built-in model (post-LN, sinusoidal positions, tied embeddings); it is
configured here like the paper (ReLU, embeddings × √d_model, no attention dropout). Both models get
the same batches in the same process; every figure is the median of several repeats after warm-up,
the models' repeats taken in turn (ours, Marian, ours, Marian, ...) so that a drift in the machine's
speed reaches both sides of a ratio alike. Sections:

* ``train``: one optimizer step (forward, backward, fused Adam) on a batch of 64 pairs × 24/26 tokens, fp32
  and bf16 autocast (through Accelerate's ``mixed_precision``), label smoothing 0.1 on both sides
  (ours: the model's ``label_smoothing`` with ``skip_logits``, as the training command runs it;
  Marian: transformers' ``LabelSmoother`` on its logits, as ``Seq2SeqTrainer`` runs it). Target
  tokens/s, step time, peak memory (resident-set growth, sampled every millisecond, of a fresh
  process running only that model), and MFU.
* ``generate``: a fixed amount of work (``min_new_tokens = max_new_tokens``), greedy and beam 4, batch
  1 and 32: new tokens/s and ms per decoding step.
* ``length``: a training step and greedy decoding of 8 sentences at source lengths 16 … 512, with
  attention's share of the step's FLOPs and the cost per target token: where that cost stops being flat,
  attention's n² shows (drawn in ``speed-length.png``).
* ``epoch`` (needs Multi30k beside the repository): non-padding target tokens/s of our model over a
  Multi30k training epoch, with this package's token-bucket batches and with
  ``DataCollatorForSeq2Seq`` on randomly drawn batches of 64 pairs.

MFU = model FLOPs per second / the machine's matmul peak for the dtype, measured at start-up with
``torch.nn.functional.linear`` on 4096 × 4096 matrices. Model FLOPs per training step = 3 × forward,
forward = 2 × (weights applied per source token × S + weights applied per target token × T) + 4 × d_model ×
(S² per encoder layer + T² + S·T per decoder layer) per sentence, where a source token meets the encoder
layers and the cross-attention key/value projections (6d² + 2·d·d_ff per layer), a target token the
decoder's other projections and FFN (6d² + 2·d·d_ff per layer) and the output layer (d × vocabulary); the
attention term counts scores and weighted sums (the causal half is not discounted).

Writes ``benchmarks/results/speed.{json,md}`` and, from the ``length`` section, ``speed-length.png``
(``--smoke``: under ``--output``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
SIZES = {  # the two sizes; vocabulary as the paper (base) and a joint 8k BPE (small)
    "small": dict(vocab_size=8000, d_model=256, layers=3, heads=4, ffn=1024),
    "base": dict(vocab_size=37000, d_model=512, layers=6, heads=8, ffn=2048),
    "smoke": dict(vocab_size=500, d_model=32, layers=2, heads=4, ffn=64),
}


# --------------------------------------------------------------------------------------------
# The two models with the same sizes
# --------------------------------------------------------------------------------------------
#: MarianConfig's settings that make it the paper's model: ReLU, embeddings × √d_model, sinusoidal positions (Marian's
#: table), one matrix for both embeddings and the output layer; no forced end token.
MARIAN_AS_THE_PAPER = dict(
    activation_function="relu",
    scale_embedding=True,
    max_position_embeddings=1024,
    share_encoder_decoder_embeddings=True,
    tie_word_embeddings=True,
    forced_eos_token_id=None,
)


def build(kind: str, size: dict, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=size["vocab_size"],
        d_model=size["d_model"],
        encoder_layers=size["layers"],
        decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["ffn"],
        decoder_ffn_dim=size["ffn"],
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=1,
    )
    if kind == "ours":
        from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration

        return VanillaTransformerForConditionalGeneration(
            VanillaTransformerConfig(**common, bos_token_id=1, unk_token_id=3)
        )
    from transformers import MarianConfig, MarianMTModel

    return MarianMTModel(MarianConfig(**common, **MARIAN_AS_THE_PAPER))


def batch(size: dict, n: int, src_len: int, tgt_len: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, size["vocab_size"], (n, src_len), generator=g)
    labels = torch.randint(4, size["vocab_size"], (n, tgt_len), generator=g)
    return {"input_ids": src, "attention_mask": torch.ones_like(src), "labels": labels}


def flop_parts(size: dict, n: int, src_len: int, tgt_len: int) -> tuple[float, float]:
    """FLOPs of one training step (see the module docstring): (weights applied to tokens, attention's
    scores and weighted sums). The first grows with the number of tokens, the second with its square."""
    d, f, layers, v = size["d_model"], size["ffn"], size["layers"], size["vocab_size"]
    per_source_token = layers * (4 * d * d + 2 * d * f + 2 * d * d)  # encoder layers + cross-attention keys/values
    per_target_token = layers * (6 * d * d + 2 * d * f) + d * v  # self-attention, cross queries/output, FFN, logits
    linear = per_source_token * src_len + per_target_token * tgt_len
    attention = 4 * d * layers * (src_len**2 + tgt_len**2 + src_len * tgt_len)
    return 3 * 2 * n * linear, 3 * 2 * n * attention / 2


def model_flops(size: dict, n: int, src_len: int, tgt_len: int) -> float:
    """FLOPs of one training step (see the module docstring)."""
    return sum(flop_parts(size, n, src_len, tgt_len))


def matmul_peak(dtype: torch.dtype, n: int = 4096, repeats: int = 5) -> float:
    """Measured FLOP/s of F.linear on n × n matrices in ``dtype`` (the best of ``repeats``)."""
    a, w = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.nn.functional.linear(a, w)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.nn.functional.linear(a, w)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------
def _median_seconds(fn, warmup: int, repeats: int) -> float:
    return _interleaved_medians({"only": fn}, warmup, repeats)["only"]


def _interleaved_medians(fns: dict, warmup: int, repeats: int) -> dict:
    """Median seconds of each function, the repeats taken in turn (a, b, c, a, b, c, ...): a shared
    machine's speed drifts by tens of percent over minutes, and measuring one model after the other
    put that drift into the ratios (measured: the same base fp32 ratio read 1.42 and 1.05 in two runs)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _accelerator(precision: str):
    """A CPU Accelerator with this mixed precision (Accelerate's process-wide state is reset first)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()
    return Accelerator(cpu=True, mixed_precision=precision)


def adam(model) -> torch.optim.Optimizer:
    """The paper's Adam through torch's fused kernel, for both models: our training command's
    optimizer (``make_optimizer_and_schedule``) and, but for the betas and ε, the one Seq2SeqTrainer
    gives Marian by default (``adamw_torch_fused``, weight decay 0), which does the same work."""
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)


def train_step(kind: str, size: dict, data: dict, accelerator, attention: str | None = None):
    """A function running one optimizer step (forward, backward, Adam) through ``accelerator``."""
    from transformers.trainer_pt_utils import LabelSmoother

    model = build(kind, size)
    if attention:
        model.set_attn_implementation(attention)
    optimizer = adam(model)
    model, optimizer = accelerator.prepare(model, optimizer)
    model.train()
    smoother = LabelSmoother(epsilon=0.1)
    workspace = {}  # the loss's logits kept from step to step, as the training loop keeps them

    def step():
        with accelerator.autocast():
            if kind == "ours":  # how the training command computes its loss
                loss = model(**data, smoothing=0.1, skip_logits=True, loss_workspace=workspace).loss
            else:  # how Seq2SeqTrainer(label_smoothing_factor=0.1) computes Marian's
                inputs = {k: v for k, v in data.items() if k != "labels"}
                outputs = model(**inputs, decoder_input_ids=model.prepare_decoder_input_ids_from_labels(data["labels"]))
                loss = smoother(outputs, data["labels"], shift_labels=False)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def train_step_seconds(
    kind: str, size: dict, data: dict, precision: str, warmup: int, repeats: int, attention: str | None = None
) -> float:
    """Median seconds of one optimizer step of one model."""
    return _median_seconds(train_step(kind, size, data, _accelerator(precision), attention), warmup, repeats)


def train_peak_memory(kind: str, size_name: str, precision: str, attention: str | None) -> int:
    """Peak resident-set growth (bytes) while a fresh process builds the model and runs 3 training steps.

    A thread samples the process's resident set every millisecond; the baseline is taken after every
    import, so the figure is the model, its gradients and optimizer state, and the step's activations."""
    code = (  # everything imported before the baseline is read
        "import sys, json, threading, time; sys.path.insert(0, sys.argv[1]); import speed, accelerate, transformers; "
        "import vanilla_transformer; from transformers import MarianMTModel; "
        "from transformers.trainer_pt_utils import LabelSmoother; "
        "size = speed.SIZES[sys.argv[3]]; before = speed._rss_bytes(); peak = [before]; done = threading.Event()\n"
        "def sample():\n"
        "    while not done.is_set(): peak[0] = max(peak[0], speed._rss_bytes()); time.sleep(0.001)\n"
        "thread = threading.Thread(target=sample); thread.start()\n"
        "speed.train_step_seconds(sys.argv[2], size, speed.batch(size, *speed.TRAIN_BATCH), sys.argv[4], 1, 2, "
        "sys.argv[5] or None)\n"
        "done.set(); thread.join(); print(json.dumps(peak[0] - before))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(Path(__file__).parent), kind, size_name, precision, attention or ""],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    return int(out.stdout.strip().splitlines()[-1])


def generation_run(model, size: dict, n: int, new_tokens: int, beams: int, precision: str, src_len: int = 24):
    """A function that generates exactly ``new_tokens`` tokens for ``n`` random sentences."""
    data = batch(size, n, src_len, 1)
    kwargs = dict(
        input_ids=data["input_ids"],
        attention_mask=data["attention_mask"],
        num_beams=beams,
        do_sample=False,
        min_new_tokens=new_tokens,
        max_new_tokens=new_tokens,
        length_penalty=0.6,
        early_stopping=True,
    )

    def run():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = model.generate(**kwargs)
        assert out.shape[-1] >= new_tokens, out.shape  # the fixed amount of work was done

    return run


TRAIN_BATCH = (64, 24, 26)  # pairs, source tokens, target tokens: the batch


def section_train(args, sizes: list[str]) -> list[dict]:
    rows = []
    for size_name in sizes:
        size = SIZES[size_name]
        data = batch(size, *TRAIN_BATCH)
        flops = model_flops(size, *TRAIN_BATCH)
        for precision in args.mixed_precisions:
            peak = args.peaks["bf16" if precision == "bf16" else "fp32"]
            # ours: the training command's attention choice (eager for bf16 on CPU, else sdpa);
            # Marian: the faster of its two implementations, measured
            ours_attention = "eager" if precision == "bf16" else "sdpa"
            accelerator = _accelerator(precision)
            steps = {"ours": train_step("ours", size, data, accelerator, ours_attention)}
            steps.update({a: train_step("marian", size, data, accelerator, a) for a in ("sdpa", "eager")})
            seconds = _interleaved_medians(steps, args.warmup, args.repeats)
            del steps
            ours = seconds.pop("ours")
            marian_by_attention = seconds
            marian_attention = min(marian_by_attention, key=marian_by_attention.get)
            marian = marian_by_attention[marian_attention]
            tokens = TRAIN_BATCH[0] * TRAIN_BATCH[2]
            row = {
                "size": size_name,
                "precision": "fp32" if precision == "no" else precision,
                "ours_attention": ours_attention,
                "marian_attention": marian_attention,
                "ours_step_ms": 1000 * ours,
                "marian_step_ms": 1000 * marian,
                "ours_tokens_per_s": tokens / ours,
                "marian_tokens_per_s": tokens / marian,
                "marian_tokens_per_s_by_attention": {a: tokens / s for a, s in marian_by_attention.items()},
                "ratio": marian / ours,
                "ours_mfu": flops / ours / peak,
                "marian_mfu": flops / marian / peak,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def section_memory(args, sizes: list[str]) -> list[dict]:
    """Peak training memory of each model, each in a fresh process (attention as in ``section_train``)."""
    rows = []
    for size_name in sizes:
        for precision in args.mixed_precisions:
            attention = "eager" if precision == "bf16" else "sdpa"
            ours = train_peak_memory("ours", size_name, precision, attention) / 2**20
            marian = min(train_peak_memory("marian", size_name, precision, a) for a in ("sdpa", "eager")) / 2**20
            row = {
                "size": size_name,
                "precision": "fp32" if precision == "no" else precision,
                "ours_peak_mb": ours,
                "marian_peak_mb": marian,
                "ratio": ours / marian,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def section_generate(args, sizes: list[str]) -> list[dict]:
    rows = []
    new_tokens = 4 if args.smoke else 32
    for size_name in sizes:
        size = SIZES[size_name]
        models = {kind: build(kind, size).eval() for kind in ("ours", "marian")}
        for precision in args.mixed_precisions:
            for beams, n in ((1, 1), (1, 32), (4, 1), (4, 32)):
                runs = {k: generation_run(m, size, n, new_tokens, beams, precision) for k, m in models.items()}
                seconds = _interleaved_medians(runs, args.warmup, args.repeats)
                row = {
                    "size": size_name,
                    "precision": "fp32" if precision == "no" else precision,
                    "beams": beams,
                    "batch": n,
                    "new_tokens": new_tokens,
                    "ours_tokens_per_s": n * new_tokens / seconds["ours"],
                    "marian_tokens_per_s": n * new_tokens / seconds["marian"],
                    "ours_ms_per_step": 1000 * seconds["ours"] / new_tokens,
                    "marian_ms_per_step": 1000 * seconds["marian"] / new_tokens,
                    "ratio": seconds["marian"] / seconds["ours"],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def section_length(args, sizes: list[str]) -> list[dict]:
    rows = []
    lengths = [16, 32] if args.smoke else [16, 32, 64, 128, 256, 512]
    for size_name in sizes[:1]:
        size = SIZES[size_name]
        for length in lengths:
            data = batch(size, 8, length, length)
            accelerator = _accelerator("bf16")
            steps = {
                k: train_step(k, size, data, accelerator, "eager" if k == "ours" else None) for k in ("ours", "marian")
            }
            train = _interleaved_medians(steps, 1, args.repeats)
            del steps
            runs = {
                k: generation_run(build(k, size).eval(), size, 8, 8, 1, "bf16", src_len=length)
                for k in ("ours", "marian")
            }
            gen = {k: s / 8 for k, s in _interleaved_medians(runs, 1, args.repeats).items()}
            linear, attention = flop_parts(size, 8, length, length)
            row = {
                "size": size_name,
                "precision": "bf16",
                "length": length,
                "ours_train_ms": 1000 * train["ours"],
                "marian_train_ms": 1000 * train["marian"],
                "ours_ms_per_step": 1000 * gen["ours"],
                "marian_ms_per_step": 1000 * gen["marian"],
                "train_ratio": train["marian"] / train["ours"],
                "generate_ratio": gen["marian"] / gen["ours"],
                "attention_flop_share": attention / (linear + attention),
                "ours_train_us_per_token": 1e6 * train["ours"] / (8 * length),
                "marian_train_us_per_token": 1e6 * train["marian"] / (8 * length),
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def draw_length(rows: list[dict], path: Path) -> Path:
    """Where attention's O(n²) shows: training cost per target token and decoding cost per step
    against length, both models, with attention's share of the training step's FLOPs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [r["length"] for r in rows]
    fig, (train_ax, decode_ax) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=110)
    for kind, color in (("ours", "tab:blue"), ("marian", "tab:orange")):
        name = "ours" if kind == "ours" else "MarianMTModel"
        train_ax.plot(lengths, [r[f"{kind}_train_us_per_token"] for r in rows], "o-", color=color, label=name)
        decode_ax.plot(lengths, [r[f"{kind}_ms_per_step"] for r in rows], "o-", color=color, label=name)
    share_ax = train_ax.twinx()
    share_ax.plot(
        lengths,
        [100 * r["attention_flop_share"] for r in rows],
        "s--",
        color="0.5",
        label="attention's share of the FLOPs",
    )
    share_ax.set_ylim(0, 100)
    share_ax.set_ylabel("attention's share of the step's FLOPs (%)", color="0.4")
    train_ax.set_title(
        "training step, bf16: µs per target token\n"
        "(falling: fixed costs shared by more tokens; rising: attention's n²)",
        fontsize=9,
    )
    train_ax.set_ylabel("µs per target token")
    decode_ax.set_title("greedy decoding, bf16: ms per step\n(each step attends to the whole source)", fontsize=9)
    decode_ax.set_ylabel("ms per decoding step")
    for ax in (train_ax, decode_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("source = target length (tokens), 8 sentences")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    lines = train_ax.get_legend_handles_labels()[0] + share_ax.get_legend_handles_labels()[0]
    train_ax.legend(lines, [line.get_label() for line in lines], fontsize=8, loc="upper center")
    decode_ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def section_epoch(args) -> list[dict]:
    """Non-padding target tokens/s over one Multi30k epoch: token buckets vs random batches."""
    from transformers import DataCollatorForSeq2Seq

    from vanilla_transformer.data import TokenBucketBatchSampler, collate_batch, load_parallel_corpus, tokenize_corpus
    from vanilla_transformer.tokenization import train_joint_bpe

    if not args.multi30k.is_dir():
        print(f"epoch: skipped, {args.multi30k} not found", flush=True)
        return []
    train_split = load_parallel_corpus(str(args.multi30k), "de", "en", split="train")
    if args.smoke:
        train_split = train_split.select(range(300))
    tokenizer = train_joint_bpe(
        list(train_split["source"]) + list(train_split["target"]), vocab_size=1000 if args.smoke else 8000
    )
    tokenized, _ = tokenize_corpus(train_split, tokenizer, max_length=128)
    examples = [{"input_ids": s, "labels": t} for s, t in zip(tokenized["input_ids"], tokenized["labels"])]
    size = {**SIZES["smoke" if args.smoke else "small"], "vocab_size": len(tokenizer)}
    accelerator = _accelerator("bf16")
    rows = []
    g = torch.Generator().manual_seed(0)
    random_batches = torch.randperm(len(examples), generator=g).split(64)
    bucket_batches = list(
        TokenBucketBatchSampler([(len(e["input_ids"]), len(e["labels"])) for e in examples], max_tokens=2500, seed=0)
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=None, label_pad_token_id=-100)
    for name, batches, collate in (
        (
            "token buckets (max_tokens 2500)",
            bucket_batches,
            lambda idx: collate_batch([examples[i] for i in idx], tokenizer.pad_token_id),
        ),
        (
            "DataCollatorForSeq2Seq, random 64",
            [b.tolist() for b in random_batches],
            lambda idx: collator([examples[i] for i in idx]),
        ),
    ):
        model = build("ours", size)
        model.set_attn_implementation("eager")
        optimizer = adam(model)
        model, optimizer = accelerator.prepare(model, optimizer)
        model.train()
        real = padded = 0
        workspace = {}
        start = time.perf_counter()
        for indices in batches[: 3 if args.smoke else None]:
            b = collate(indices)
            b = {k: b[k] for k in ("input_ids", "attention_mask", "labels")}
            with accelerator.autocast():
                loss = model(**b, smoothing=0.1, skip_logits=True, loss_workspace=workspace).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            real += int((b["labels"] != -100).sum())
            padded += b["labels"].numel()
        seconds = time.perf_counter() - start
        row = {
            "batching": name,
            "batches": len(batches),
            "target_tokens": real,
            "padding_fraction": 1 - real / padded,
            "seconds": seconds,
            "tokens_per_s": real / seconds,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def markdown(results: dict) -> str:
    env = results["environment"]
    lines = [
        f"Measured {env['date']} on {env['cpu']} ({env['threads']} threads), torch {env['torch']}, transformers "
        f"{env['transformers']}; matmul peak fp32 {env['peak_fp32'] / 1e9:.0f} GFLOP/s"
        + (f", bf16 {env['peak_bf16'] / 1e9:.0f} GFLOP/s." if env["peak_bf16"] else "."),
        "",
    ]
    if results.get("train"):
        lines += [
            "**Training step** (64 pairs × 24/26 tokens, fused Adam, label smoothing 0.1): target tokens/s",
            "",
            "| size | precision | ours | Marian | ours / Marian | MFU ours | MFU Marian |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results["train"]:
            lines.append(
                f"| {r['size']} | {r['precision']} | {r['ours_tokens_per_s']:,.0f} | "
                f"{r['marian_tokens_per_s']:,.0f} ({r['marian_attention']}) | "
                f"**{r['ratio']:.2f}** | {100 * r['ours_mfu']:.1f} % | {100 * r['marian_mfu']:.1f} % |"
            )
        fp32 = {r["size"]: r for r in results["train"] if r["precision"] == "fp32"}
        for r in results["train"]:
            if r["precision"] == "bf16" and r["size"] in fp32:
                lines.append(
                    f"\n{r['size']}: ours bf16 / Marian fp32 = "
                    f"**{r['ours_tokens_per_s'] / fp32[r['size']]['marian_tokens_per_s']:.2f}**"
                )
        lines.append("")
    if results.get("memory"):
        lines += [
            "**Peak training memory** (resident-set growth over 3 steps, fresh process per model; MB)",
            "",
            "| size | precision | ours | Marian | ours / Marian |",
            "|---|---|---|---|---|",
        ]
        for r in results["memory"]:
            lines.append(
                f"| {r['size']} | {r['precision']} | {r['ours_peak_mb']:,.0f} | {r['marian_peak_mb']:,.0f} | "
                f"{r['ratio']:.2f} |"
            )
        lines.append("")
    if results.get("generate"):
        lines += [
            "**Generation** (fixed work: min = max new tokens): new tokens/s",
            "",
            "| size | precision | search | batch | ours | Marian | ours / Marian | ms/step ours | ms/step Marian |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["generate"]:
            search = "greedy" if r["beams"] == 1 else f"beam {r['beams']}"
            lines.append(
                f"| {r['size']} | {r['precision']} | {search} | {r['batch']} | {r['ours_tokens_per_s']:,.0f} | "
                f"{r['marian_tokens_per_s']:,.0f} | "
                f"**{r['ratio']:.2f}** | {r['ours_ms_per_step']:.1f} | {r['marian_ms_per_step']:.1f} |"
            )
        lines.append("")
    if results.get("length"):
        lines += [
            "**Cost against length** (bf16, 8 sentences, source = target length; attention: its share of the "
            "training step's FLOPs)",
            "",
            "| length | attention | train step ms ours | Marian | ratio | µs per target token ours | Marian | "
            "greedy ms/step ours | Marian | ratio |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results["length"]:
            lines.append(
                f"| {r['length']} | {100 * r['attention_flop_share']:.0f} % | {r['ours_train_ms']:.0f} | "
                f"{r['marian_train_ms']:.0f} | "
                f"{r['train_ratio']:.2f} | {r['ours_train_us_per_token']:.0f} | {r['marian_train_us_per_token']:.0f} | "
                f"{r['ours_ms_per_step']:.1f} | {r['marian_ms_per_step']:.1f} | {r['generate_ratio']:.2f} |"
            )
        lines.append("")
    if results.get("epoch"):
        lines += [
            "**One Multi30k epoch** (our model, small size, bf16): non-padding target tokens/s",
            "",
            "| batching | batches | padding | tokens/s |",
            "|---|---|---|---|",
        ]
        for r in results["epoch"]:
            lines.append(
                f"| {r['batching']} | {r['batches']} | {100 * r['padding_fraction']:.1f} % | {r['tokens_per_s']:,.0f} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    import transformers

    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    sections = ["train", "memory", "generate", "length", "epoch"]
    parser.add_argument("--sections", nargs="+", default=sections, choices=sections)
    parser.add_argument("--sizes", nargs="+", default=["small", "base"], choices=list(SIZES))
    parser.add_argument(
        "--precisions",
        nargs="+",
        default=["fp32", "bf16"],
        choices=["fp32", "bf16"],
        help="of the train, memory and generate sections (bf16: autocast)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one repeat (tests use it)")
    parser.add_argument("--multi30k", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.smoke:
        args.sizes, args.repeats, args.warmup = ["smoke"], 1, 1
    args.mixed_precisions = ["no" if p == "fp32" else p for p in args.precisions]  # Accelerate's names
    bf16_peak_needed = "bf16" in args.precisions or {"length", "epoch"} & set(args.sections)
    args.peaks = {
        "fp32": matmul_peak(torch.float32, 512 if args.smoke else 4096),
        "bf16": matmul_peak(torch.bfloat16, 512 if args.smoke else 4096) if bf16_peak_needed else None,
    }
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    results = {
        "environment": {
            "date": time.strftime("%Y-%m-%d"),
            "cpu": cpu,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "peak_fp32": args.peaks["fp32"],
            "peak_bf16": args.peaks["bf16"],
            "command": " ".join(["python", "benchmarks/speed.py", *(argv if argv is not None else sys.argv[1:])]),
        }
    }
    if "train" in args.sections:
        results["train"] = section_train(args, args.sizes)
    if "memory" in args.sections:
        results["memory"] = section_memory(args, args.sizes)
    if "generate" in args.sections:
        results["generate"] = section_generate(args, args.sizes)
    if "length" in args.sections:
        results["length"] = section_length(args, args.sizes)
    if "epoch" in args.sections:
        results["epoch"] = section_epoch(args)
    args.output.mkdir(parents=True, exist_ok=True)
    stem = "-".join(
        [
            "speed",
            *([] if args.sections == sections else args.sections),
            *([] if args.precisions == ["fp32", "bf16"] else args.precisions),
        ]
    )
    (args.output / f"{stem}.json").write_text(json.dumps(results, indent=2))
    (args.output / f"{stem}.md").write_text(markdown(results))
    if results.get("length"):
        draw_length(
            results["length"], args.output / (f"{stem}.png" if stem.endswith("-length") else f"{stem}-length.png")
        )
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
