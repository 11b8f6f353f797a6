#!/usr/bin/env bash
# The GPU check (benchmarks/gpu_check.py): the tests marked `gpu`, bf16 training throughput and MFU against
# MarianMTModel, a 3-minute single-GPU run of the main job with its sacreBLEU, CTranslate2 on the GPU against
# generate(). At most ~8 minutes on one CUDA GPU; writes benchmarks/results/gpu-check.json.
#   bash scripts/gpu_check.sh             # needs a CUDA GPU and the dev environment (bash scripts/setup.sh, or PYTHON=...)
#   bash scripts/gpu_check.sh --dry-run   # every step on the CPU at tiny sizes: the test suite runs this
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" benchmarks/gpu_check.py "$@"
