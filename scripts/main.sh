#!/usr/bin/env bash
# The README's main job: set up the development environment (if needed) and run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/vanilla-transformer demo "$@"
