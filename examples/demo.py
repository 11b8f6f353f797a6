"""A demo that needs no data: train a tiny model to reverse token strings, save it, reload it, translate.

    python examples/demo.py                  # about a minute on a laptop CPU
    python examples/demo.py --steps 300 --output-dir outputs/demo

The model is reloaded through ``AutoModelForSeq2SeqLM``, as anyone with the saved folder would load it,
and decodes with the paper's defaults (beam 4, length penalty 0.6).
"""

import argparse
import json
from pathlib import Path

import torch
from toy import reverse_batch, train_reverse
from transformers import AutoModelForSeq2SeqLM


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="outputs/demo", help="where to save the model (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=1200, help="maximum training steps (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="also print the summary as JSON")
    args = parser.parse_args(argv)

    model, summary = train_reverse(steps=args.steps, seed=args.seed, progress=True)
    print(
        f"trained {summary['steps']} steps in {summary['seconds']:.0f} s, final loss {summary['loss']:.4f}, "
        f"exact match on 200 held-out strings: {summary['exact_match']:.1%}"
    )
    output = Path(args.output_dir)
    model.save_pretrained(output)
    print(f"saved to {output}/: {', '.join(sorted(p.name for p in output.iterdir()))}")

    reloaded = AutoModelForSeq2SeqLM.from_pretrained(output).eval()
    input_ids, attention_mask, _ = reverse_batch(3, model.config.vocab_size, 3, 7, torch.Generator().manual_seed(7))
    generated = reloaded.generate(input_ids, attention_mask=attention_mask)
    for source, mask, target in zip(input_ids, attention_mask, generated):
        source = source[: int(mask.sum()) - 1].tolist()
        target = [t for t in target.tolist()[1:] if t > 3]
        print(f"  {source} -> {target}  {'ok' if target == source[::-1] else 'WRONG'}")
    if args.json:
        print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
