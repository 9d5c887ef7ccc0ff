"""Screenshot of a report's sample explorer in headless Chromium (Debian's /usr/bin/chromium,
driven by Playwright; nothing downloaded): the training run's data map with a hovered point
and the card of one sample open.

    python examples/screenshot_explorer.py report.html docs/explorer.png --card train-1
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import sync_playwright


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report")
    ap.add_argument("png")
    ap.add_argument("--card", default="train-1", help="the sample whose card is open")
    ap.add_argument("--run", default="train", choices=("test", "train"),
                    help="the run whose data map is shown")
    ap.add_argument("--hover", type=int, default=None,
                    help="row of the sample to hover on the data map")
    args = ap.parse_args(argv)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
            "--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 960})
        page.goto(Path(args.report).resolve().as_uri() + "#" + args.card)
        page.wait_for_selector("#fk-explorer[data-ready=true]", timeout=60_000)
        page.click(f".fk-tabs button[data-run={args.run}]")
        page.evaluate("document.getElementById('fk-explorer').scrollIntoView()")
        if args.hover is not None:
            x, y = page.evaluate(f"fkExplorer.toScreen('{args.run}', {args.hover})")
            page.mouse.move(x, y)
        page.screenshot(path=args.png)
        browser.close()


if __name__ == "__main__":
    main()
