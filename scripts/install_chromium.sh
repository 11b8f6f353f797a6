#!/usr/bin/env bash
# Chromium for the explorer's browser test (tests/test_explorer.py drives it through playwright with
# executable_path, since playwright's own browser downloads need the internet).
# Installs Debian's `chromium` package with apt when no Chromium is on the PATH and apt can be used
# (as root, or with passwordless sudo). Otherwise it says so and succeeds: the browser test is then
# skipped with the reason. Set VANILLA_TRANSFORMER_NO_APT=1 to never call apt.
set -uo pipefail

for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done
if [ "${VANILLA_TRANSFORMER_NO_APT:-0}" = "1" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "No Chromium found and apt is not used here: the explorer's browser test will be skipped."
    exit 0
fi
if [ "$(id -u)" = "0" ]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "No Chromium found, and apt needs root: the explorer's browser test will be skipped" \
         "(install it with: sudo apt-get install chromium)."
    exit 0
fi
echo "Installing Chromium with apt (for the explorer's browser test) ..."
if "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq \
    && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; then
    echo "Chromium installed: $(command -v chromium)"
else
    echo "Could not install Chromium with apt: the explorer's browser test will be skipped."
fi
exit 0
