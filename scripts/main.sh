#!/usr/bin/env bash
# The README's main job: set up the development environment (if needed), train a small English->German
# Transformer for a few minutes on the bundled Tatoeba split, report sacreBLEU on its test split,
# translate a few sentences, and leave the Hub-ready folder in outputs/tatoeba_en_de/final.
# Extra arguments go to `vanilla-transformer train` (e.g. --max-minutes 2).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=outputs/tatoeba_en_de
rm -rf "$OUT"
.venv/bin/vanilla-transformer train --config configs/tatoeba_en_de_small.yaml --output-dir "$OUT" "$@"
echo "Translations by $OUT/final:"
.venv/bin/vanilla-transformer translate --model "$OUT/final" \
    "I love you." "Where is the train station?" "Tom is reading a book." "We have to go home now."
