"""The README's picture of the attention explorer: serve it for a saved model, drive it in headless Chromium
(the system's, through playwright), and save a screenshot of the page.

    python scripts/screenshot_explorer.py --model RUN/final --output docs/images/explorer.png \
        --source "Tom is reading a book."

The page may reach 127.0.0.1 only, as in tests/test_explorer.py; every other request is aborted and
counted. Needs the dev set-up (`bash scripts/setup.sh`: gradio, playwright) and Chromium.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
from pathlib import Path

from PIL import Image
from playwright.sync_api import expect, sync_playwright

from vanilla_transformer.explorer import KIND_NAMES, launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a saved model folder (model + tokenizer)")
    parser.add_argument("--output", default="docs/images/explorer.png", help="the PNG to write")
    parser.add_argument("--source", default="Tom is reading a book.", help="the sentence to translate")
    parser.add_argument("--kind", default="cross", choices=list(KIND_NAMES), help="the attention shown")
    parser.add_argument("--head", default=None, help="a head number; default: all heads")
    parser.add_argument("--width", type=int, default=1100, help="width of the browser window, in pixels")
    args = parser.parse_args(argv)

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print(
            "No Chromium: install it (sudo apt-get install chromium), or run bash scripts/setup.sh as root.",
            file=sys.stderr,
        )
        return 1
    app, url, explorer = launch(args.model, block=False, quiet=True, source=args.source)
    blocked = []

    def only_this_machine(route):
        host = route.request.url.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]
        if host == "127.0.0.1":
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium, headless=True, args=["--no-sandbox"] if os.geteuid() == 0 else []
            )
            page = browser.new_page(viewport={"width": args.width, "height": 900})
            page.route("**/*", only_this_machine)
            page.goto(url)
            page.locator("#translate").click()
            expect(page.locator("#translation textarea")).not_to_have_value("", timeout=120_000)
            if args.kind != "cross":
                page.locator("#kind label").filter(has_text=KIND_NAMES[args.kind]).click()
            if args.head is not None:
                page.locator("#head label").filter(has_text=f"head {args.head}").click()
            page.wait_for_timeout(500)
            expect(page.locator("#heatmap img").first).to_be_visible(timeout=120_000)
            page.wait_for_function(
                "() => { const i = document.querySelector('#heatmap img'); "
                "return i && i.complete && i.naturalWidth > 0; }",
                timeout=120_000,
            )
            translation = page.locator("#translation textarea").input_value()
            png = page.screenshot(full_page=True)
            browser.close()
    finally:
        app.close()
        explorer.close()

    image = Image.open(io.BytesIO(png)).convert("RGB")
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(output, format="PNG", optimize=True)
    print(
        f"{args.source!r} -> {translation!r}; {output}: {image.width}×{image.height}, {output.stat().st_size:,} bytes; "
        f"requests outside 127.0.0.1 blocked: {len(blocked)}"
    )
    return 0 if not blocked else 1


if __name__ == "__main__":
    sys.exit(main())
