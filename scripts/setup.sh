#!/usr/bin/env bash
# Development set-up used by the README's two commands: a virtual environment in .venv with torch
# pinned (TORCH_INDEX_URL picks its build: CPU or a CUDA version; an open-ended `torch` pulls the newest CUDA build),
# transformers pinned to a release the model's fast paths were tested with (see TESTED_TRANSFORMERS_VERSIONS
# in vanilla_transformer/generation_vanilla_transformer.py; pyproject.toml keeps the honest range),
# and this package installed in editable mode with its `dev` extra.
# The environment is reused when its inputs (this script and pyproject.toml) have not changed.
# The explorer's browser test drives the system's Chromium (playwright cannot download browsers
# everywhere): scripts/install_chromium.sh installs Debian's `chromium` when it is missing and apt is usable.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install_chromium.sh

TORCH_PIN="torch==2.13.0"
TRANSFORMERS_PIN="transformers==5.24.0"
VENV=.venv
stamp_inputs() { { cat scripts/setup.sh pyproject.toml; echo "${TORCH_INDEX_URL:-}"; } | sha256sum | cut -d' ' -f1; }
want=$(stamp_inputs)

if [ -x "$VENV/bin/python" ] && [ -f "$VENV/.setup-stamp" ] && [ "$(cat "$VENV/.setup-stamp")" = "$want" ]; then
    exit 0
fi

echo "Setting up $VENV (first run, or pyproject.toml changed) ..."
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# TORCH_INDEX_URL chooses torch's build, e.g. https://download.pytorch.org/whl/cpu (on Linux, PyPI's is CUDA's)
"$VENV/bin/python" -m pip install --quiet ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_PIN"
"$VENV/bin/python" -m pip install --quiet -e ".[dev]" "$TORCH_PIN" "$TRANSFORMERS_PIN"
echo "$want" > "$VENV/.setup-stamp"
echo "Environment ready: $("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "| transformers", transformers.__version__)')"
