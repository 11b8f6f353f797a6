#!/usr/bin/env bash
# The README's main job: set up the development environment (if needed), train a small English->German
# Transformer for a few minutes on the bundled Tatoeba split, report sacreBLEU on its test split,
# translate a few sentences, and leave the Hub-ready folder in outputs/tatoeba_en_de/final.
# Extra arguments go to `vanilla-transformer train` (e.g. --max_minutes 2). A new run replaces the last one;
# with --resume_from_checkpoint the last one goes on. OUTPUT_DIR sets where the run lives.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT="${OUTPUT_DIR:-outputs/tatoeba_en_de}"
case " $* " in
    *" --resume_from_checkpoint"* | *" --resume-from-checkpoint"* | *" --resume "* | *" --resume="*) ;;  # keep the run
    *) rm -rf "$OUT" ;;
esac
.venv/bin/vanilla-transformer train --config configs/tatoeba_en_de_small.yaml --output_dir "$OUT" "$@"
echo "Translations by $OUT/final:"
.venv/bin/vanilla-transformer translate --model_name_or_path "$OUT/final" \
    "I love you." "Where is the train station?" "Tom is reading a book." "We have to go home now."
