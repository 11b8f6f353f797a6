"""The training recipe of the paper, written out with the package's building blocks.

`vanilla-transformer train` (vanilla_transformer/training.py) runs the same steps on Accelerate,
with checkpoints, resumption and several processes; this script shows them in one screen:

    python examples/train_translation.py --data data/tatoeba_en_de --steps 300
"""

import argparse
import itertools

import torch

from vanilla_transformer import VanillaTransformerConfig, VanillaTransformerForConditionalGeneration
from vanilla_transformer.data import TokenBucketBatchSampler, collate_batch, load_parallel_corpus, tokenize_corpus
from vanilla_transformer.evaluation import score, translate
from vanilla_transformer.schedule import make_optimizer_and_schedule
from vanilla_transformer.tokenization import train_joint_bpe


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="data/tatoeba_en_de")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--train-pairs", type=int, default=20000, help="use the first N training pairs")
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument("--eval-sentences", type=int, default=100)
    args = parser.parse_args(argv)
    torch.manual_seed(0)

    # 1. Data: a parallel corpus, a joint BPE over both languages (§5.1), tokenised pairs.
    corpus = load_parallel_corpus(args.data, args.src_lang, args.tgt_lang)
    train_text = corpus["train"].select(range(min(args.train_pairs, len(corpus["train"]))))
    tokenizer = train_joint_bpe(itertools.chain(train_text["source"], train_text["target"]), vocab_size=args.vocab_size)
    train_set, dropped = tokenize_corpus(train_text, tokenizer, max_length=64)
    print(f"{len(train_set):,} training pairs ({dropped} dropped as too long)")

    # 2. The model: the base preset, scaled down.
    config = VanillaTransformerConfig.base(
        vocab_size=len(tokenizer),
        d_model=args.d_model,
        encoder_layers=2,
        decoder_layers=2,
        encoder_ffn_dim=4 * args.d_model,
        decoder_ffn_dim=4 * args.d_model,
    )
    model = VanillaTransformerForConditionalGeneration(config)

    # 3. Adam(0.9, 0.98, 1e-9) with warm-up and inverse square-root decay (§5.3).
    optimizer, schedule = make_optimizer_and_schedule(
        model, config.d_model, warmup_steps=max(args.steps // 4, 1), lr_factor=0.7
    )

    # 4. Batches of similar lengths, capped in tokens (§5.1); label-smoothed loss (§5.4).
    sampler = TokenBucketBatchSampler(list(zip(train_set["src_len"], train_set["tgt_len"])), max_tokens=args.max_tokens)
    input_ids, labels = train_set["input_ids"], train_set["labels"]
    model.train()
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for indices in sampler:
            batch = collate_batch(
                [{"input_ids": input_ids[i], "labels": labels[i]} for i in indices], tokenizer.pad_token_id
            )
            out = model(**batch, smoothing=0.1, skip_logits=True)  # mean over target tokens
            out.loss.backward()
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            if step % 50 == 0 or step == args.steps:
                print(f"step {step}: loss {out.loss.item():.3f} (NLL {out.nll_loss.item():.3f})")
            if step == args.steps:
                break
        epoch += 1

    # 5. Beam search (beam 4, alpha 0.6, source length + 50; §6.1) and sacreBLEU.
    test = corpus["test"].select(range(min(args.eval_sentences, len(corpus["test"]))))
    hypotheses = translate(model, tokenizer, test["source"])
    result = score(hypotheses, test["target"])
    print(f"sacreBLEU {result['bleu']:.2f} ({result['bleu_signature']}) on {result['n']} test sentences")
    for source, hypothesis in list(zip(test["source"], hypotheses))[:3]:
        print(f"  {source}  ->  {hypothesis}")
    return result


if __name__ == "__main__":
    main()
